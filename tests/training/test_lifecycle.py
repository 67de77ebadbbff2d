"""The one run lifecycle (``coursepkg/training/lifecycle.py``) both trainers use: checkpoints
written before it resume (to rounding: another machine wrote them), SIGTERM checkpoints and
exits so that a fine-tune resumes to the weights of an uninterrupted run, the random states
come back, a lost rank is named.

``tests/fixtures/old_run`` was written by the trainers before they shared the lifecycle (commit
6689674): ``train/`` a mixture-of-experts character model stopped at step 2 of 4, ``finetune/``
an SFT LoRA run of ``base.pt`` (GPT-2's vocabulary, d_model 4, weights in half precision) on
``chat.jsonl`` stopped at step 2 of 4.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from coursepkg import DecoderOnlyLM, MoEConfig, TransformerConfig
from coursepkg.posttrain.trainer import FinetuneSettings, finetune
from coursepkg.training import TrainSettings, lifecycle, train
from coursepkg.training.checkpoint import load_checkpoint, save_checkpoint
from coursepkg.training.distributed import setup
from coursepkg.training.lifecycle import CHECKPOINT, Run, checkpoint, restore
from coursepkg.training.schemes import Scheme

OLD = Path(__file__).parents[1] / "fixtures" / "old_run"
MOE = {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "moe.n_experts": 2, "moe.top_k": 1}
TRAIN = dict(steps=4, batch_size=2, block_size=8, warmup_steps=1, eval_every=2, eval_batches=1)
TRAIN.update(checkpoint_every=2, sample_tokens=0, device="cpu", aux_loss_coef=0.01, model=MOE)
TUNE = dict(lora_rank=1, steps=4, batch_size=2, warmup_steps=1, checkpoint_every=2, device="cpu")


def _tune(out: Path, **options) -> FinetuneSettings:
    common = dict(base=str(OLD / "base.pt"), data=str(OLD / "chat.jsonl"), out=str(out))
    return FinetuneSettings(**(common | TUNE | options))


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# The old runs were written on another machine: their first two steps' float bits are that CPU's
# kernels' (a machine with other vector units, or BLAS's other path, rounds differently), and the
# trainers now update with the fused AdamW, which agrees with the plain update that wrote them
# to float32 rounding only. So a resumed old run is checked to agree with an uninterrupted one to
# rounding; exact resume on one machine is test_loop's test_resume_is_bit_identical and the
# SIGTERM test below.


def _same_to_rounding(part, whole) -> None:
    # The steps and rates exactly; the losses, and the two models' outputs, to rounding: not
    # their weights, since a key bias has a gradient of rounding noise (softmax ignores it),
    # which Adam's normalisation makes a step as large as any other's.
    assert len(part.rows) == len(whole.rows) == 4
    assert [(r["step"], r["lr"]) for r in part.rows] == [(r["step"], r["lr"]) for r in whole.rows]
    losses = [[r["loss"] for r in result.rows] for result in (part, whole)]
    torch.testing.assert_close(*(torch.tensor(x) for x in losses), rtol=1e-5, atol=1e-6)
    vocab = whole.model.config.vocab_size
    tokens = torch.randint(vocab, (2, 8), generator=torch.Generator().manual_seed(0))  # (B, L)
    with torch.no_grad():
        outputs = [result.model.float()(tokens) for result in (part, whole)]  # (B, L, V)
    torch.testing.assert_close(*outputs, rtol=1e-4, atol=1e-4)


def test_a_pretraining_checkpoint_written_before_resumes(tmp_path):
    shutil.copytree(OLD / "train", tmp_path / "part")
    text = str(OLD / "text.txt")
    part = train(TrainSettings(data=text, out=str(tmp_path / "part"), **TRAIN), True, False)
    whole = train(TrainSettings(data=text, out=str(tmp_path / "whole"), **TRAIN), False, False)
    _same_to_rounding(part, whole)


def test_a_fine_tuning_checkpoint_written_before_resumes(tmp_path):
    shutil.copytree(OLD / "finetune", tmp_path / "part")
    part = finetune(_tune(tmp_path / "part"), resume=True, progress=False)
    whole = finetune(_tune(tmp_path / "whole"), progress=False)
    _same_to_rounding(part, whole)


def _terminate_after_first_checkpoint(out: Path) -> threading.Thread:
    """A thread that sends this process SIGTERM once ``out`` holds its first checkpoint."""

    def watch() -> None:
        while not (out / "checkpoint.pt").exists():
            threading.Event().wait(0.001)  # polling a file the run writes, not a fixed sleep
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_fine_tune_stopped_by_sigterm_checkpoints_and_resumes_to_the_same_weights(tmp_path):
    """SIGTERM (a batch system's notice) lets the step finish, writes a checkpoint and exits
    with 143; the resumed run ends bit for bit where an uninterrupted one does (CPU, one
    thread: the conftest's)."""
    long = dict(steps=20, checkpoint_every=5, seed=3)
    whole = finetune(_tune(tmp_path / "whole", **long), progress=False)
    parts, before = tmp_path / "parts", signal.getsignal(signal.SIGTERM)
    watcher = _terminate_after_first_checkpoint(parts)
    with pytest.raises(SystemExit) as stopped:
        finetune(_tune(parts, **long), progress=False)
    watcher.join()
    assert stopped.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    saved = load_checkpoint(parts / "checkpoint.pt")
    assert 5 <= saved["step"] < 20, "the run ended before SIGTERM came: the test proves nothing"
    assert len(saved["rows"]) == saved["step"] and not (parts / "model.pt").exists()
    resumed = finetune(_tune(parts, **long), resume=True, progress=False)
    assert resumed.rows == whole.rows
    _same_weights(resumed.model.state_dict(), whole.model.state_dict())


def _tiny_run(out: Path) -> Run:
    """A :class:`Run` of a linear layer on this process, its data generator seeded."""
    net = nn.Linear(3, 2)
    settings = FinetuneSettings(base="unused", data="unused", out=str(out))
    dist = setup("cpu")
    scheme = Scheme(net, settings, dist)
    return Run(out, dist, net, scheme, torch.Generator().manual_seed(7), {}, ("step", "loss"))


@given(st.integers(0, 2**31), st.integers(1, 5))
@settings(max_examples=5, deadline=None)
def test_a_checkpoint_brings_back_the_random_states_step_and_rows(tmp_path_factory, seed, step):
    """What a run draws after a checkpoint (CPU random numbers, the data generator's windows)
    it draws again after restoring it, whatever the process did in between."""
    out = tmp_path_factory.mktemp("run")
    run = _tiny_run(out)
    run.step, run.rows = step, [{"step": i + 1, "loss": float(i)} for i in range(step)]
    torch.manual_seed(seed)
    torch.randint(10, (seed % 7,), generator=run.batches)
    checkpoint(run)
    want = torch.rand(4), torch.rand(4, generator=run.batches)
    torch.manual_seed(seed + 1)  # the process moves on (or a new one starts)
    again = _tiny_run(out)
    restore(again, load_checkpoint(out / CHECKPOINT))
    assert torch.equal(torch.rand(4), want[0])
    assert torch.equal(torch.rand(4, generator=again.batches), want[1])
    assert (again.step, again.last_checkpoint, again.rows) == (step, step, run.rows)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(parallel="ddp2"), "parallel must be one of"),
        (dict(parallel="fsdp", lora_rank=2), "LoRA .* need it whole"),
        (dict(parallel="course-fsdp", grpo=True), "GRPO .* need it whole"),
        (dict(aux_loss_coef=-1.0), "aux_loss_coef must be >= 0"),
    ],
)
def test_a_fine_tuning_scheme_it_cannot_run_is_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        FinetuneSettings(base="base", data="data.jsonl", **options)


def test_fine_tuning_a_mixture_adds_the_aux_loss_its_forward_returns(tmp_path):
    """SFT of a mixture of experts logs the load-balancing loss and adds it times
    ``aux_loss_coef`` (in the lifecycle's one place, as pretraining does): the first step's
    numbers are the same with either coefficient, the trained weights are not."""
    shape = dict(vocab_size=50261, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=32)
    config = TransformerConfig(**shape, moe=MoEConfig(n_experts=2, top_k=1))
    base = tmp_path / "moe.pt"
    identity = {"tokenizer": "bpe", "config": dataclasses.asdict(config)}
    save_checkpoint(base, {"identity": identity, "model": DecoderOnlyLM(config).state_dict()})
    options = dict(base=str(base), lora_rank=0, steps=2)
    runs = [
        finetune(_tune(tmp_path / f"c{coef}", aux_loss_coef=coef, **options), progress=False)
        for coef in (0.0, 0.5)
    ]
    assert runs[0].rows[0] == runs[1].rows[0] and runs[0].rows[0]["aux_loss"] > 0
    assert "aux_loss" in (tmp_path / "c0.5" / "log.csv").read_text().splitlines()[0]
    trained = [run.model.state_dict() for run in runs]
    assert any(not torch.equal(trained[0][k], trained[1][k]) for k in trained[0])


def test_a_lost_rank_says_where_the_run_stands_before_the_error_leaves_the_loop(caplog, tmp_path):
    """torchrun SIGTERMs the surviving ranks within milliseconds of one dying; once the error
    has unwound the loop, the default handler is back and the process may end before its
    traceback is printed. So the message naming the intact checkpoint is logged at once."""

    def lost(lr):
        raise RuntimeError("Connection closed by peer")

    run = SimpleNamespace(
        dist=SimpleNamespace(distributed=True, rank=0), step=6, last_checkpoint=4, out=tmp_path
    )
    with caplog.at_level("ERROR", logger=lifecycle.__name__), pytest.raises(RuntimeError) as err:
        lifecycle._guarded_step(run, lost, 1e-3)
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and logged[0] == str(err.value)
    assert "rank 0 lost the other ranks at step 7 (Connection closed by peer)" in logged[0]
    assert f"checkpoint of step 4 in {tmp_path} is intact: run again with --resume" in logged[0]
