"""``coursepkg finetune`` under ``torchrun`` with 2 gloo ranks on 127.0.0.1, as
``docs/training.md`` writes it: the weights and losses of one process on the whole batch."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
from pathlib import Path

import processes
import pytest
import torch
from test_finetune_command import EXAMPLES, _doc_commands, _rows, _train_base

from coursepkg.cli import main
from coursepkg.training.checkpoint import load_checkpoint

BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_fine_tune_the_model_one_process_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(EXAMPLES, tmp_path / "docs" / "examples")
    base = _train_base(tmp_path, "bpe")
    shutil.copytree(base, tmp_path / "runs" / "base")
    [command] = [c for c in _doc_commands() if c.startswith("torchrun")]
    words = shlex.split(command)
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}"]
    words = [str(BIN / "torchrun"), *rdzv, *words[1:]]
    words[words.index("coursepkg")] = str(BIN / "coursepkg")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    done = processes.run(words, env=env, idle=600)
    assert done.returncode == 0, done.stdout + done.stderr
    one = words[words.index("--out") + 1].replace("sft-2", "sft-1")
    single = shlex.split(command.replace("sft-2", "sft-1"))
    assert main(single[single.index("coursepkg") + 1 :]) == 0
    two_rows, one_rows = _rows(tmp_path / "runs" / "sft-2"), _rows(tmp_path / one)
    assert len(two_rows) == len(one_rows) == 20
    for a, b in zip(two_rows, one_rows, strict=True):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-4)
    two = load_checkpoint(tmp_path / "runs" / "sft-2" / "model.pt")["model"]
    ref = load_checkpoint(tmp_path / one / "model.pt")["model"]
    for name in ref:
        torch.testing.assert_close(two[name], ref[name], rtol=1e-4, atol=1e-5, msg=name)
