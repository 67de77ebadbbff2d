"""Tests of the ex06 checks (warm-up schedule, label-smoothed loss): independent solutions pass,
its catalogue (each mistake rerun: test_check_protocol.py), forbidden shortcuts are named."""

from __future__ import annotations

import grading_impls_decoder as impls
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursepkg.grading import (
    CheckFailure,
    catalogue,
    check_label_smoothing,
    check_noam_lr,
)
from coursepkg.grading.checks import ex06_training as grading
from coursepkg.grading.checks import ex06_training_mistakes as mistakes
from coursepkg.grading.framework import configs
from coursepkg.schedule import label_smoothed_cross_entropy, noam_lr

# ---------------------------------------------------------------------------------------------
# check_noam_lr
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "impl", [noam_lr, impls.noam_lr_min, impls.noam_lr_piecewise], ids=lambda f: f.__name__
)
def test_noam_accepts_correct_schedules(impl) -> None:
    assert check_noam_lr(impl).passed
    assert check_noam_lr(impl, thorough=True, seed=7).passed


def test_noam_accepts_a_tensor_scalar() -> None:
    def as_tensor(step, d_model, warmup_steps):
        return torch.tensor(impls.noam_lr_min(step, d_model, warmup_steps), dtype=torch.float64)

    assert check_noam_lr(as_tensor).passed


def test_noam_wrong_peak_is_reported() -> None:
    with pytest.raises(CheckFailure, match="yours peaks at step 4001, the reference at 4000"):
        check_noam_lr(grading.NOAM_LR_BUGS[1].impl)


def test_noam_division_by_zero_at_step_zero_gets_advice() -> None:
    def raw(step, d_model, warmup_steps):
        return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)

    with pytest.raises(CheckFailure) as info:
        check_noam_lr(raw)
    assert "ZeroDivisionError" in str(info.value)
    assert "return 0.0 for step == 0" in str(info.value)


def test_noam_calling_the_reference_is_named() -> None:
    with pytest.raises(CheckFailure, match="calls coursepkg.schedule.noam_lr"):
        check_noam_lr(lambda s, d, w: noam_lr(s, d, w))


def test_noam_non_number_is_reported() -> None:
    with pytest.raises(CheckFailure, match="should be a Python float"):
        check_noam_lr(lambda s, d, w: "0.001")


def test_noam_thorough_configs_depend_on_the_seed() -> None:
    a, b = configs("noam_lr", True, 0), configs("noam_lr", True, 1)
    assert a != b and a[:3] == b[:3] == configs("noam_lr")


# ---------------------------------------------------------------------------------------------
# check_label_smoothing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "impl",
    [label_smoothed_cross_entropy, impls.smoothed_ce_gather, impls.smoothed_ce_distribution],
    ids=lambda f: f.__name__,
)
def test_label_smoothing_accepts_correct_losses(impl) -> None:
    assert check_label_smoothing(impl).passed
    assert check_label_smoothing(impl, thorough=True, seed=3).passed


def test_label_smoothing_convention_is_the_references() -> None:
    # The catalogue's "other" convention must really be the other one: the reference agrees
    # with F.cross_entropy(label_smoothing=eps), which spreads eps over all V tokens.
    logits, targets = torch.randn(4, 7, dtype=torch.float64), torch.randint(0, 7, (4,))
    ours = label_smoothed_cross_entropy(logits, targets, 0.2)
    torch.testing.assert_close(ours, F.cross_entropy(logits, targets, label_smoothing=0.2))
    other = grading.LABEL_SMOOTHING_BUGS[0].impl(logits, targets, 0.2)
    assert not torch.allclose(ours, other)


def test_label_smoothing_cross_entropy_call_is_named() -> None:
    def through_torch(logits, targets, smoothing=0.1, ignore_index=-100):
        flat = logits.reshape(-1, logits.size(-1))
        return F.cross_entropy(
            flat, targets.reshape(-1), ignore_index=ignore_index, label_smoothing=smoothing
        )

    def through_module(logits, targets, smoothing=0.1, ignore_index=-100):
        loss = nn.CrossEntropyLoss(ignore_index=ignore_index, label_smoothing=smoothing)
        return loss(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    for impl in (through_torch, through_module):
        with pytest.raises(CheckFailure, match="calls torch.nn.functional.cross_entropy"):
            check_label_smoothing(impl)


def test_label_smoothing_calling_the_reference_is_named() -> None:
    with pytest.raises(CheckFailure, match="calls coursepkg.schedule.label_smoothed_cross"):
        check_label_smoothing(lambda *a: label_smoothed_cross_entropy(*a))


def test_label_smoothing_detached_loss_is_reported() -> None:
    def detached(logits, targets, smoothing=0.1, ignore_index=-100):
        return impls.smoothed_ce_gather(logits, targets, smoothing, ignore_index).detach()

    with pytest.raises(CheckFailure, match="does not require grad"):
        check_label_smoothing(detached)


def test_label_smoothing_python_float_is_reported() -> None:
    def as_float(logits, targets, smoothing=0.1, ignore_index=-100):
        return impls.smoothed_ce_gather(logits, targets, smoothing, ignore_index).item()

    with pytest.raises(CheckFailure, match="should be a torch.Tensor"):
        check_label_smoothing(as_float)


def test_label_smoothing_negative_ignore_index_crash_gets_advice() -> None:
    def gathers_padding(logits, targets, smoothing=0.1, ignore_index=-100):
        # Right for a pad id inside the vocabulary, but gathers at -100 before masking.
        keep = targets != ignore_index
        logp = logits.log_softmax(-1)
        nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        loss = ((1 - smoothing) * nll - smoothing * logp.mean(-1))[keep]
        return loss.mean() if loss.numel() else logits.sum() * 0.0

    with pytest.raises(CheckFailure, match="ignore_index=-100"):
        # The extra configuration with ignore_index -100 is in thorough mode.
        check_label_smoothing(gathers_padding, thorough=True, seed=0)


def test_label_smoothing_thorough_configs_depend_on_the_seed() -> None:
    a, b = (
        configs(grading.LABEL_SMOOTHING_ITEM, True, 0),
        configs(grading.LABEL_SMOOTHING_ITEM, True, 1),
    )
    assert a != b and a[:3] == configs(grading.LABEL_SMOOTHING_ITEM)


def test_catalogue_lists_the_training_bugs() -> None:
    assert {bug.id for bug in mistakes.BUGS} <= {bug.id for bug in catalogue()}
