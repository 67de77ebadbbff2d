"""The hostile catalogue of ex09_training_run: notebooks that try to earn the training points
without training in the notebook, within the budget, on data they may see.

Each entry is a scenario for :func:`ex09_runner.start_scenario` (the solution's own code with
something hostile added) and the phrase the check's failure must contain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "solutions" / "ex09_training_run"


@dataclass(frozen=True)
class HostileRun:
    """A hostile scenario.

    Attributes:
        name: short id.
        what: what the notebook does.
        expect: a phrase the failure message must contain.
        scenario: keyword arguments of :func:`ex09_runner.start_scenario`.
    """

    name: str
    what: str
    expect: str
    scenario: dict = field(default_factory=dict)


def hostile_runs(tmp: Path) -> list[HostileRun]:
    """The catalogue; ``tmp`` is a scratch directory for the files the scenarios plant."""
    checkpoint = tmp / "pretrained.pt"
    save_checkpoint = (
        "import torch\n"
        "from torch import nn\n"
        "torch.save({'w': torch.zeros(3)}, " + repr(str(checkpoint)) + ")\n"
    )
    return [
        HostileRun(
            "loads_checkpoint",
            "trains briefly for show, then loads weights saved before the setup cell",
            "read the file",
            {
                "before": save_checkpoint,
                "after": "state = torch.load(" + repr(str(checkpoint)) + ")\n",
            },
        ),
        HostileRun(
            "weights_from_elsewhere",
            "overwrites the trained weights with others after training (no file involved)",
            "changed after the last optimiser step",
            {
                "after": (
                    "with torch.no_grad():\n"
                    "    for p in model.parameters():\n"
                    "        p.data.copy_(torch.randn_like(p))\n"
                )
            },
        ),
        HostileRun(
            "not_trained",
            "grades a freshly initialised model, never trained",
            "optimiser steps were taken",
            {"steps": 0},
        ),
        HostileRun(
            "trains_for_an_hour",
            "trains in an endless loop; the watch interrupts the kernel past its CPU limit",
            "was interrupted",
            {
                "interrupt_after": 20,
                "train": (
                    "torch.manual_seed(0)\n"
                    "src_vocab, tgt_vocab = date_vocabs()\n"
                    "model = DateTransformer(len(src_vocab), len(tgt_vocab), d_model=32, "
                    "n_heads=2, d_ff=64)\n"
                    "while True:\n"
                    "    train_model(model, steps=20, batch_size=32, warmup_steps=5)\n"
                ),
            },
        ),
        HostileRun(
            "over_budget",
            "uses more CPU than the budget (here a budget of 1 CPU second)",
            "the budget is 1",
            {"budget": 1},
        ),
        HostileRun(
            "reads_answers_from_disk",
            "its greedy_decode reads the instructors' notebook to find the held-out seed",
            "read the file " + str(SOURCE),
            {
                "after": (
                    "_decode = greedy_decode\n"
                    "def greedy_decode(*args):\n"
                    "    text = open("
                    + repr(str(SOURCE / "ex09_training_run.ipynb"))
                    + ").read()\n"
                    "    return _decode(*args)\n"
                )
            },
        ),
        HostileRun(
            "reads_grader_frames",
            "its greedy_decode looks up the held-out data in the grader's frames",
            "looked at the grader's call frames",
            {
                "after": (
                    "import sys\n"
                    "_decode = greedy_decode\n"
                    "def greedy_decode(*args):\n"
                    "    grader = sys._getframe(1).f_locals\n"
                    "    return _decode(*args)\n"
                )
            },
        ),
        HostileRun(
            "traceback_frames",
            "reaches the grader's frames through a traceback instead",
            "looked at the grader's call frames",
            {
                "after": (
                    "_decode = greedy_decode\n"
                    "def greedy_decode(*args):\n"
                    "    try:\n"
                    "        raise RuntimeError\n"
                    "    except RuntimeError as e:\n"
                    "        grader = e.__traceback__.tb_frame.f_back.f_locals\n"
                    "    return _decode(*args)\n"
                )
            },
        ),
        HostileRun(
            "starts_a_process",
            "trains (or fetches weights) in another process",
            "started another process",
            {"after": "import subprocess\nsubprocess.run(['true'])\n"},
        ),
    ]
