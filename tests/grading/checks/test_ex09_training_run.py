"""ex09_training_run: the classic training mistakes are named, the correct solution is not
accused of any, and the checks' own rules (bands, stand-ins) hold.

Each mistake is planted in the solution notebook's own code and trained briefly (a small model,
60 steps) in a separate process (:mod:`ex09_runner`); the check must fail and name it. The
scenarios run side by side.
"""

from __future__ import annotations

import pytest
from ex09_runner import start_scenario, verdict
from torch import nn

from coursepkg.grading import CheckFailure
from coursepkg.grading.checks.ex09_training_run import (
    TrainingRun,
    check_accuracy_band,
    check_own_pieces,
)
from coursepkg.grading.checks.ex09_training_run_mistakes import BUGS

# Each scenario is a fresh Python process that imports torch and trains a little; they run side
# by side, and on a busy machine the lot takes minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TF = "answer_train_model"
# mistake id -> the edits that plant it in the solution
PLANTED = {
    "ex09.target_not_shifted": [
        (
            "answer_sequence_loss",
            "model(batch.src, batch.tgt_in,",
            "model(batch.src, batch.tgt_out,",
        )
    ],
    "ex09.no_causal_mask": [
        (
            "answer_DateTransformer",
            "causal_mask(t).to(tgt_in.device)[None, None]",
            "torch.ones(t, t, dtype=torch.bool)[None, None]",
        )
    ],
    "ex09.schedule_not_stepped": [(TF, "scheduler.step()", "pass")],
    "ex09.padding_in_loss": [
        ("answer_sequence_loss", "smoothing, ignore_index=PAD_ID)", "smoothing)")
    ],
    "ex09.dropout_at_evaluation": [
        (TF, "model.eval()\n    return losses", "return losses"),
        ("answer_greedy_decode", "model.eval()\n    with", "with"),
    ],
}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict]:
    procs = {name: start_scenario(edits) for name, edits in PLANTED.items()}
    procs["correct"] = start_scenario()
    return {name: verdict(proc) for name, proc in procs.items()}


def test_every_catalogued_mistake_is_planted():
    assert sorted(PLANTED) == sorted(m.id for m in BUGS)


@pytest.mark.parametrize("mistake", sorted(PLANTED))
def test_a_planted_mistake_is_named(mistake, verdicts):
    result = verdicts[mistake]
    assert not result["passed"]
    assert not result["checker_error"], result["message"]
    assert f"Known mistake ({mistake})" in result["message"], result["message"]
    # ... and only the planted one
    others = [m.id for m in BUGS if m.id != mistake and f"({m.id})" in result["message"]]
    assert others == [], result["message"]


def test_the_correct_solution_is_accused_of_nothing(verdicts):
    result = verdicts["correct"]
    assert not result["checker_error"], result["message"]
    assert "Known mistake" not in result["message"], result["message"]
    assert "No known mistake recognised" in result["message"]  # 60 steps are not enough


def test_a_band_needs_a_run_the_check_graded():
    look_alike = TrainingRun(accuracy=1.0, n=1000, cpu_seconds=1.0, steps=5000)
    with pytest.raises(CheckFailure, match="was not graded"):
        check_accuracy_band(look_alike, 0.99)
    with pytest.raises(CheckFailure, match="was not graded"):
        check_accuracy_band(None, 0.97)


class _Own(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)


def test_own_pieces_pass_and_stand_ins_are_named():
    from coursepkg.layers import EncoderLayer
    from coursepkg.schedule import noam_lr

    assert check_own_pieces(_Own(), {"model": _Own()}).passed
    model = _Own()
    model.layer = EncoderLayer(8, 2, 16)
    with pytest.raises(CheckFailure, match=r"coursepkg\.layers\.EncoderLayer"):
        check_own_pieces(model, {})
    with pytest.raises(CheckFailure, match=r"coursepkg\.schedule\.noam_lr"):
        check_own_pieces(_Own(), {"noam_lr": noam_lr})
    model = _Own()
    model.norm = nn.LayerNorm(4)
    with pytest.raises(CheckFailure, match=r"torch\.nn\.LayerNorm"):
        check_own_pieces(model, {})


def test_own_pieces_names_torch_functional_attention():
    import torch.nn.functional as F

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    attend.__module__ = "__main__"
    with pytest.raises(CheckFailure, match="scaled_dot_product_attention"):
        check_own_pieces(_Own(), {"attend": attend})
