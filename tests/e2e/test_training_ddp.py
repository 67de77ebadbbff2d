"""``coursepkg train`` under ``torchrun`` with 2 gloo ranks on 127.0.0.1: the same model as one
process (with PyTorch's DDP and with the course's, with sharded optimizer state and fully
sharded: every ``--parallel`` scheme), exact resume, a rank killed for real, and the
multi-machine form on loopback."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import processes
import pytest
import torch
from processes import Command, budget

from coursepkg.data.text import load_tinyshakespeare
from coursepkg.training import TrainSettings, train
from coursepkg.training.checkpoint import load_checkpoint

BIN = Path(sys.executable).parent
MODEL = dict(d_model=32, n_heads=2, d_ff=64, n_layers=1, bias=False)  # see training/test_loop.EXACT
# 2 ranks x 4 windows each, or 1 rank x 8: the global batch is --batch-size 8 either way.
FLAGS = dict(batch_size=8, block_size=16, warmup_steps=2, eval_every=4, eval_batches=2)
FLAGS |= dict(checkpoint_every=4, sample_tokens=20, device="cpu", lr=3e-3)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "shakespeare.txt"
    path.write_text(load_tinyshakespeare()[:20_000])
    return path


def _flags(corpus: Path, out: Path, model: dict, **changes) -> list[str]:
    args = [str(corpus), "--out", str(out), "--no-progress"]
    for key, value in {**FLAGS, **changes}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args + [f"--model={k}={str(v).lower()}" for k, v in model.items()]


def _torchrun(*launcher: str) -> list[str]:
    return [str(BIN / "torchrun"), *launcher, "--no-python", str(BIN / "coursepkg"), "train"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


def _run(cmd: list[str]) -> str:
    done = processes.run(cmd, env=_env(), idle=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(**extra: str) -> list[str]:
    rdzv = f"127.0.0.1:{_free_port()}"
    launcher = ["--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d"]
    launcher += [
        "--rdzv-endpoint",
        rdzv,
        *[f"--{k.replace('_', '-')}={v}" for k, v in extra.items()],
    ]
    return _torchrun(*launcher)


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(out / "checkpoint.pt")["model"]


def _losses(out: Path) -> torch.Tensor:
    return torch.tensor([row[2] for row in load_checkpoint(out / "checkpoint.pt")["rows"]])


@pytest.fixture(scope="module")
def one_rank(corpus, tmp_path_factory) -> Path:
    """The reference: one process, the whole batch of 8, 8 steps."""
    out = tmp_path_factory.mktemp("one")
    settings = TrainSettings(data=str(corpus), out=str(out), steps=8, model=MODEL, **FLAGS)
    train(settings, progress=False)
    return out


def test_two_ranks_of_batch_4_equal_one_rank_of_batch_8(corpus, one_rank, tmp_path):
    out = tmp_path / "two"
    printed = _run(_two_ranks() + _flags(corpus, out, MODEL, steps=8))
    assert "rank 1 of 2" in printed and "held-out loss" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in one_rank.iterdir())
    torch.testing.assert_close(_losses(out), _losses(one_rank), rtol=1e-5, atol=1e-6)
    ours, ref = _weights(out), _weights(one_rank)
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=1e-4, atol=1e-5)


# The schemes that shard (the optimizer state, or everything) are PyTorch's zero1 and fsdp and
# the course's course-zero1 and course-fsdp. Each scheme's exact resume is proven once, by a stop
# and --resume or by a rank killed and restarted by torchrun (both compare the log, the weights
# and the optimizer state with an uninterrupted run), not by both: every run here starts two
# ranks, and the suite's time is budgeted (DEVELOPING.md). A killed rank's clear end is the
# trainer's, shown for two schemes.
STOP_AND_RESUME = ("course-bucketed", "course-zero1", "fsdp")
KILLED_AND_RESTARTED = ("ddp", "zero1", "course-fsdp")
KILLED = ("ddp", "fsdp")


@pytest.mark.parametrize(
    "scheme, accum",
    [("course-ddp", 1), ("course-bucketed", 2), ("zero1", 2), ("course-zero1", 1)]
    + [("fsdp", 1), ("course-fsdp", 2)],
)
def test_each_scheme_equals_one_rank(corpus, one_rank, tmp_path, scheme, accum):
    """``--parallel course-ddp`` / ``course-bucketed`` (the course's DDP), ``zero1`` /
    ``course-zero1`` (sharded optimizer state), ``fsdp`` / ``course-fsdp`` (everything
    sharded, the checkpoint gathered whole): the model of one rank, with gradient
    accumulation too."""
    out = tmp_path / scheme
    flags = _flags(corpus, out, MODEL, steps=8, grad_accum=accum, parallel=scheme)
    printed = _run(_two_ranks() + flags)
    assert "rank 1 of 2" in printed
    torch.testing.assert_close(_losses(out), _losses(one_rank), rtol=1e-5, atol=1e-6)
    ours, ref = _weights(out), _weights(one_rank)
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("scheme", STOP_AND_RESUME)
def test_each_scheme_resumes_bit_identical(corpus, tmp_path, scheme):
    """8 steps straight = 4 steps, stop, resume 4: the log, the weights and the optimizer
    state (a sharded one gathered whole on rank 0) bit for bit."""
    model, flags = {**MODEL, "dropout": 0.1}, dict(steps=8, parallel=scheme)
    _run(_two_ranks() + _flags(corpus, tmp_path / "whole", model, **flags))
    out = tmp_path / "part"
    _run(_two_ranks() + _flags(corpus, out, model, stop_after=4, **flags))
    _run(_two_ranks() + _flags(corpus, out, model, **flags) + ["--resume"])
    _same_run(out, tmp_path / "whole")


def _documented_commands() -> list[list[str]]:
    """The ``torchrun ... --parallel`` commands of docs/training.md, split into words."""
    text = (Path(__file__).parents[2] / "docs" / "training.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("torchrun --standalone")]
    return [shlex.split(line) for line in lines if "--parallel" in line]


def test_the_documented_sharded_commands_run_as_written(corpus, tmp_path):
    """docs/training.md's commands, run in a folder holding its data.txt, with a shorter run's
    flags after them (the later flag wins)."""
    commands = _documented_commands()
    assert {c[c.index("--parallel") + 1] for c in commands} == {"zero1", "course-fsdp"}
    (tmp_path / "data.txt").write_text(corpus.read_text())
    for words in commands:
        words = [str(BIN / "torchrun"), *words[1:]]
        words[words.index("coursepkg")] = str(BIN / "coursepkg")
        out = tmp_path / words[words.index("--out") + 1]
        short = _flags(corpus, out, MODEL, steps=4)[3:]  # all but the data and --out
        done = processes.run([*words, *short], cwd=tmp_path, env=_env(), idle=600)
        assert done.returncode == 0, done.stdout + done.stderr
        scheme = words[words.index("--parallel") + 1]
        assert load_checkpoint(out / "checkpoint.pt")["optimizer_layout"] == scheme


def test_a_batch_the_world_size_does_not_divide_is_refused(corpus, tmp_path):
    flags = _flags(corpus, tmp_path / "odd", MODEL, steps=8, batch_size=6, grad_accum=2)
    done = processes.run(
        _two_ranks() + flags + ["--parallel", "course-fsdp"],
        env=_env(),
        idle=600,
    )
    assert done.returncode != 0
    assert (
        "batch_size=6 must be divisible by world_size * grad_accum = 2 * 2"
        in done.stdout + done.stderr
    )


def test_multi_machine_form_on_loopback(corpus, one_rank, tmp_path):
    """`torchrun --nnodes 2 --rdzv-endpoint HOST:PORT` as on two machines, both on 127.0.0.1
    (sharing the run's folder, as machines with a shared file system would)."""
    out = tmp_path / "nodes"
    rdzv = f"127.0.0.1:{_free_port()}"
    launcher = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    launcher += ["--rdzv-endpoint", rdzv, "--rdzv-id", "loopback"]
    cmd = _torchrun(*launcher) + _flags(corpus, out, MODEL, steps=8)
    nodes = [Command(cmd, what=f"torchrun node {i}", env=_env()) for i in range(2)]
    try:  # the nodes progress together: either one's output is a sign for both
        outputs = [
            "".join(n.wait(idle=600, progress=lambda: [m.sizes() for m in nodes])) for n in nodes
        ]
    finally:
        for node in nodes:
            node.end()
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(outputs)
    assert any("rank 1 of 2" in o for o in outputs)
    for name, value in _weights(one_rank).items():
        torch.testing.assert_close(_weights(out)[name], value, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory):
    """2 ranks, dropout on (each rank its own masks), 40 steps, never stopped: one run per
    scheme, made when a test first asks for it."""
    runs: dict[str, Path] = {}

    def run(scheme: str) -> Path:
        if scheme not in runs:
            out = tmp_path_factory.mktemp(f"whole-{scheme}")
            model = {**MODEL, "dropout": 0.1}
            _run(_two_ranks() + _flags(corpus, out, model, steps=40, parallel=scheme))
            runs[scheme] = out
        return runs[scheme]

    return run


def _equal(ours: object, ref: object) -> bool:
    """Equal bit for bit, through nested dicts and lists of tensors and numbers."""
    if isinstance(ref, dict):
        return (
            isinstance(ours, dict)
            and ours.keys() == ref.keys()
            and all(_equal(ours[k], ref[k]) for k in ref)
        )
    if isinstance(ref, list | tuple):
        return len(ours) == len(ref) and all(_equal(a, b) for a, b in zip(ours, ref, strict=True))
    if torch.is_tensor(ref):
        return torch.is_tensor(ours) and ours.dtype == ref.dtype and torch.equal(ours, ref)
    return ours == ref


def _same_run(out: Path, reference: Path) -> None:
    assert (out / "log.csv").read_bytes() == (reference / "log.csv").read_bytes()
    ours, ref = load_checkpoint(out / "checkpoint.pt"), load_checkpoint(reference / "checkpoint.pt")
    assert ours["model"].keys() == ref["model"].keys()
    assert all(torch.equal(ours["model"][name], ref["model"][name]) for name in ref["model"])
    assert _equal(ours["optimizer"], ref["optimizer"])
    assert (out / "samples.txt").read_text() == (reference / "samples.txt").read_text()


def test_two_ranks_resume_bit_identical(corpus, uninterrupted, tmp_path):
    out, model = tmp_path / "part", {**MODEL, "dropout": 0.1}
    printed = _run(_two_ranks() + _flags(corpus, out, model, steps=40, stop_after=10))
    assert "stopped after step 10" in printed
    _run(_two_ranks() + _flags(corpus, out, model, steps=40) + ["--resume"])
    _same_run(out, uninterrupted("ddp"))


def _start_and_kill_rank_1(cmd: list[str]) -> tuple[subprocess.Popen, str]:
    """Start ``cmd``; once rank 0 has written its first checkpoint, SIGKILL rank 1."""
    # Read line by line as they come (a poll could miss step 4 of a fast run); its own session,
    # so that a job the test gives up on ends with all its ranks.
    job = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        start_new_session=True,
    )
    try:
        seen, pid = [], None
        for line in job.stdout:
            seen.append(line)
            found = re.search(r"rank 1 of 2 \(pid (\d+)\)", line)
            pid = int(found.group(1)) if found else pid
            if "checkpoint at step 4" in line and pid is not None:
                os.kill(pid, signal.SIGKILL)
                break
        rest = job.communicate(timeout=budget(600))[0]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return job, "".join(seen) + rest


@pytest.mark.parametrize("scheme", KILLED)
def test_killed_rank_ends_the_job_clearly_and_leaves_the_checkpoint_whole(corpus, tmp_path, scheme):
    out = tmp_path / "killed"
    flags = _flags(corpus, out, {**MODEL, "dropout": 0.1}, steps=40, parallel=scheme)
    job, printed = _start_and_kill_rank_1(_two_ranks() + flags)
    assert job.returncode != 0
    assert "is intact: run again with --resume" in printed, printed
    saved = load_checkpoint(out / "checkpoint.pt")  # verified: not damaged
    assert saved["step"] >= 4 and len(saved["rows"]) == saved["step"]
    assert not list(out.glob(".*.tmp"))


@pytest.mark.parametrize("scheme", KILLED_AND_RESTARTED)
def test_killed_rank_restarted_by_torchrun_resumes_exactly(corpus, uninterrupted, tmp_path, scheme):
    out = tmp_path / "restarted"
    model = {**MODEL, "dropout": 0.1}
    flags = _flags(corpus, out, model, steps=40, parallel=scheme) + ["--resume"]
    job, printed = _start_and_kill_rank_1(_two_ranks(max_restarts=1) + flags)
    assert job.returncode == 0, printed
    assert re.search(r"resumed from .* at step \d+", printed), printed
    _same_run(out, uninterrupted(scheme))
