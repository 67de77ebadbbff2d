"""Checks of assignment ex06_training: the warm-up learning-rate schedule and the
label-smoothed loss.

``check_noam_lr`` compares the student's schedule with :func:`coursepkg.schedule.noam_lr` at the
steps that matter (0, 1, around the peak, late decay) and checks that the peak sits exactly at
``warmup_steps``. ``check_label_smoothing`` compares the loss and its gradient with
:func:`coursepkg.schedule.label_smoothed_cross_entropy`, in float32 and float64, with padding
that must contribute nothing (not to the sum, not to the count), and with a batch where every
position is padding (0, never NaN).

Dimension legend: B batch, T target length, V vocabulary.

The catalogue of known mistakes these checks name is in :mod:`.ex06_training_mistakes`.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...schedule import label_smoothed_cross_entropy as _reference_loss
from ...schedule import noam_lr as _reference_noam
from ..framework import (
    BugVariant,
    CheckFailure,
    CheckReport,
    NotImplementedYet,
    call_student,
    configs,
    describe,
    diagnose,
    expect_close,
    expect_tensor,
    forbidden_calls,
    public_check,
    register_configs,
)
from .ex06_training_mistakes import (
    LABEL_SMOOTHING_BUGS,
    LABEL_SMOOTHING_ITEM,
    NOAM_LR_BUGS,
    NOAM_LR_ITEM,
)

__all__ = ["check_label_smoothing", "check_noam_lr"]


# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------


def _sample_noam(rng: random.Random) -> dict[str, int]:
    return {"D": rng.choice([8, 32, 96, 256, 768, 2048]), "W": rng.randint(2, 6000)}


def _sample_loss(rng: random.Random) -> dict[str, Any]:
    return {
        "B": rng.randint(1, 5),
        "T": rng.randint(0, 7),
        "V": rng.randint(3, 40),
        "eps": rng.choice([0.05, 0.1, 0.2, 0.4]),
        "pad": rng.choice([0, -100]),
    }


register_configs(
    NOAM_LR_ITEM,
    visible=[{"D": 512, "W": 4000}, {"D": 16, "W": 10}, {"D": 64, "W": 1}],
    extra=[{"D": 1024, "W": 8000}, {"D": 8, "W": 3}],
    sample=_sample_noam,
)
# T = 0 means 2-D logits (B, V); pad is the ignore_index (0 plays a pad id inside the vocabulary).
register_configs(
    LABEL_SMOOTHING_ITEM,
    visible=[
        {"B": 1, "T": 1, "V": 5, "eps": 0.1, "pad": 0},
        {"B": 2, "T": 3, "V": 7, "eps": 0.1, "pad": -100},
        {"B": 3, "T": 5, "V": 11, "eps": 0.3, "pad": 0},
    ],
    extra=[
        {"B": 4, "T": 0, "V": 6, "eps": 0.2, "pad": 0},
        {"B": 2, "T": 4, "V": 9, "eps": 0.1, "pad": 0},
    ],
    sample=_sample_loss,
)

# ---------------------------------------------------------------------------------------------
# check_noam_lr
# ---------------------------------------------------------------------------------------------


def _noam_steps(warmup: int, thorough: bool, rng: random.Random) -> list[int]:
    steps = {0, 1, 2, 3, warmup // 2, warmup - 1, warmup, warmup + 1, 2 * warmup, 10 * warmup}
    if thorough:
        steps |= {rng.randint(1, 20 * warmup) for _ in range(5)}
    return sorted(s for s in steps if s >= 0)


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise CheckFailure(f"{what} should be a float, but your code returned a bool.")
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise CheckFailure(
                f"{what} should be one number (a Python float), but your code returned a tensor "
                f"of shape {tuple(value.shape)}."
            )
        return float(value.item())
    if not isinstance(value, numbers.Real):
        raise CheckFailure(
            f"{what} should be a Python float, but your code returned {type(value).__name__}."
        )
    return float(value)


@public_check(assignment="ex06_training", implements="noam_lr", bugs=NOAM_LR_BUGS, kind="function")
def check_noam_lr(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``noam_lr(step, d_model, warmup_steps)`` against the reference."""
    rng = random.Random(0 if seed is None else seed)
    for config in configs(NOAM_LR_ITEM, thorough, seed):
        d, w = config["D"], config["W"]
        steps = _noam_steps(w, thorough, rng)

        # Rates are ~1e-4 or less; the diagnosis compares curves in units of the reference's
        # peak rate so that its tolerance means the same for every configuration.
        peak_rate = _reference_noam(w, d, w)

        def curve(
            fn: Callable, d: int = d, w: int = w, steps: list[int] = steps, scale: float = peak_rate
        ) -> Tensor:
            values = [_as_float(fn(s, d, w), f"noam_lr({s}, {d}, {w})") for s in steps]
            return torch.tensor(values, dtype=torch.float64) / scale  # (n_steps,)

        expected = curve(_reference_noam)
        with forbidden_calls(NOAM_LR_ITEM):
            got = []
            for step in steps:
                try:
                    value = call_student(impl, step, d, w, item=NOAM_LR_ITEM)
                except NotImplementedYet:
                    raise
                except CheckFailure as failure:
                    if step == 0 and "ZeroDivisionError" in failure.message:
                        report.fail(
                            f"{failure.message}\nAt step 0 the formula's step ** -0.5 divides by "
                            "zero: return 0.0 for step == 0 (nothing has been trained yet)."
                        )
                    raise
                got.append(_as_float(value, f"noam_lr({step}, {d}, {w})"))
        actual = torch.tensor(got, dtype=torch.float64) / peak_rate  # (n_steps,)
        bad = ~torch.isclose(actual, expected, rtol=1e-6, atol=1e-9)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            bug = diagnose(
                lambda: curve(impl),
                NOAM_LR_BUGS,
                [],
                run=lambda fn, _: curve(fn),
                reference_output=expected,
            )
            peak = steps[int(actual[1:].argmax()) + 1] if len(steps) > 1 else 0
            report.fail(
                f"noam_lr({steps[i]}, d_model={d}, warmup_steps={w}) returned "
                f"{got[i]:.6g}, expected {expected[i].item() * peak_rate:.6g} ({int(bad.sum())} of "
                f"{len(steps)} steps tried are wrong; steps tried: {steps}; among them yours "
                f"peaks at step {peak}, the reference at {w}).",
                bug,
            )
    report.ok("0 at step 0, linear warm-up, peak at step == warmup_steps, 1/sqrt(step) decay")
    report.ok(
        "matches the reference for (d_model, warmup_steps) = "
        + ", ".join(f"({c['D']}, {c['W']})" for c in configs(NOAM_LR_ITEM, thorough, seed))
    )


# ---------------------------------------------------------------------------------------------
# check_label_smoothing
# ---------------------------------------------------------------------------------------------


# Tolerances are framework.compare.TOLERANCES. Measured over the visible and thorough configurations
# (seeds 0-4): the float32 reference loss (values 1-5) differs from itself in float64 by at
# most 7e-7, and the two independent test losses (gather; explicit target distribution) from
# the reference by at most 1.5e-6: the float32 default (rtol 1e-4, atol 5e-5) leaves a wide
# margin, while on the visible configurations the smallest catalogued mistake (eps over
# V - 1) moves the loss or its gradient by more than 5e-3.


def _loss_inputs(
    config: dict[str, Any], seed: int, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """Logits and targets; row r > 0 ends with r padded positions (never a whole row).

    Returns:
        logits (B, T, V) or (B, V) when T == 0, targets (B, T) or (B,).
    """
    b, t, v, pad = config["B"], config["T"], config["V"], config["pad"]
    gen = torch.Generator().manual_seed(seed)
    shape = (b, t) if t > 0 else (b,)
    logits = 2.0 * torch.randn(*shape, v, generator=gen, dtype=torch.float64)  # (B, T, V)
    low = 1 if pad == 0 else 0  # real targets avoid the pad id
    targets = torch.randint(low, v, shape, generator=gen)  # (B, T)
    if t > 0:
        for row in range(1, b):
            targets[row, max(1, t - row) :] = pad
    elif b > 1:
        targets[-1] = pad
    return logits.to(dtype), targets


def _call_loss(impl: Callable, logits: Tensor, targets: Tensor, eps: float, pad: int) -> Tensor:
    with forbidden_calls(
        LABEL_SMOOTHING_ITEM,
        extra=[(F.cross_entropy, "torch.nn.functional.cross_entropy")],
        advice="write the loss yourself from log_softmax",
    ):
        try:
            out = call_student(impl, logits, targets, eps, pad, item=LABEL_SMOOTHING_ITEM)
        except NotImplementedYet:
            raise
        except CheckFailure as failure:
            if pad < 0 and bool((targets == pad).any()):
                raise CheckFailure(
                    f"{failure.message}\nThe targets contain ignore_index={pad} (padding); "
                    "leave those positions out before indexing with the targets, e.g. replace "
                    "them by 0 for the gather and drop them from the mean."
                ) from None
            raise
    return expect_tensor(out, "the loss")


@public_check(
    assignment="ex06_training",
    implements="label_smoothed_cross_entropy",
    bugs=LABEL_SMOOTHING_BUGS,
    kind="function",
)
def check_label_smoothing(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``label_smoothed_cross_entropy(logits, targets, smoothing,
    ignore_index)`` against the reference.
    """
    for index, config in enumerate(configs(LABEL_SMOOTHING_ITEM, thorough, seed)):
        case_seed = 100 * index + (0 if seed is None else seed)
        _check_one_loss(report, impl, config, case_seed)
    report.ok("value and gradient match the reference (float32 and float64)")
    report.ok("padding (ignore_index) contributes nothing; all-padding gives 0, not NaN")


def _value_and_grad(fn: Callable, logits: Tensor, targets: Tensor, eps: float, pad: int):
    """``(loss, d loss / d logits)`` of a loss function, for the diagnosis: two losses can agree
    in value by chance on one input but hardly ever in gradient as well."""
    with torch.enable_grad():
        leaf = logits.detach().clone().requires_grad_(True)
        loss = fn(leaf, targets, eps, pad)
        (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return loss.detach(), torch.zeros_like(leaf) if grad is None else grad


def _diagnose_loss(
    impl: Callable, logits: Tensor, targets: Tensor, eps: float, pad: int, skip_reference: bool
) -> BugVariant | None:
    reference = _value_and_grad(_reference_loss, logits, targets, eps, pad)
    return diagnose(
        lambda lg, tg: _value_and_grad(impl, lg, tg, eps, pad),
        LABEL_SMOOTHING_BUGS,
        [logits.detach(), targets],
        run=lambda fn, args: _value_and_grad(fn, *args, eps, pad),
        reference_output=reference if skip_reference else None,
    )


def _target_distributions(impl: Callable, config: dict[str, Any]) -> str:
    """Lines showing the target distribution the student's loss implies next to the expected
    one, on a single position with equal logits: there the gradient of a cross-entropy
    against q is 1/V - q, so q = 1/V - gradient (a KL divergence has the same gradient)."""
    v, eps, pad = min(config["V"], 6), config["eps"], config["pad"]
    target = 1 if pad == 0 else 0
    logits = torch.zeros(1, v, dtype=torch.float64)  # (1, V)
    targets = torch.tensor([target])  # (1,)
    try:
        _, grad = _value_and_grad(impl, logits, targets, eps, pad)
    except Exception:  # noqa: BLE001 - nothing to show when the student's loss cannot run here
        return ""
    implied = (1.0 / v - grad[0]).tolist()
    expected = [eps / v + (1 - eps if j == target else 0.0) for j in range(v)]

    def row(values: list[float]) -> str:
        return "[" + ", ".join(f"{q:.4f}" for q in values) + "]"

    return (
        f"On one position (V={v}, eps={eps}, target {target}, equal logits), the target "
        f"distribution your loss implies (from its gradient): {row(implied)}; expected: "
        f"{row(expected)} (1 - eps + eps/V on the target, eps/V on every other token)."
    )


def _check_one_loss(report: CheckReport, impl: Callable, config: dict[str, Any], seed: int) -> None:
    eps, pad = config["eps"], config["pad"]
    where = f"({describe(config)})"
    for dtype in (torch.float32, torch.float64):
        logits, targets = _loss_inputs(config, seed, dtype)
        logits.requires_grad_(True)
        out = _call_loss(impl, logits, targets, eps, pad)
        expected_logits = logits.detach().clone().requires_grad_(True)
        expected = _reference_loss(expected_logits, targets, eps, pad)

        def explain(
            logits: Tensor = logits, targets: Tensor = targets
        ) -> tuple[str, BugVariant | None]:
            return (
                _target_distributions(impl, config),
                _diagnose_loss(impl, logits, targets, eps, pad, True),
            )

        if out.dim() != 0:
            report.fail(
                f"the loss should be a scalar (a 0-dimensional tensor), but yours has shape "
                f"{tuple(out.shape)} {where}: average over the kept positions."
            )
        expect_close(report, out, expected, f"your loss {where}", explain=explain)
        if not out.requires_grad:
            report.fail(
                "your loss does not require grad, so it cannot train the model: do not use "
                ".detach(), .item(), torch.no_grad() or new tensors built from numbers."
            )
        out.backward()
        expected.backward()
        if logits.grad is None:
            report.fail("no gradient reaches the logits through your loss.")
        keep = targets != pad  # (B, T)
        leak = logits.grad[~keep].abs().max().item() if bool((~keep).any()) else 0.0
        if leak > 0:
            report.fail(
                f"the gradient of your loss reaches padded positions (targets == {pad}) "
                f"{where}: padding must contribute nothing. Leave those positions out.",
                _diagnose_loss(impl, logits, targets, eps, pad, True),
            )
        expect_close(
            report,
            logits.grad,
            expected_logits.grad,
            f"the gradient of your loss {where}",
            explain=explain,
        )

    # Every position padding: 0 (and no NaN), for each configuration's shape.
    logits, targets = _loss_inputs(config, seed + 1)
    targets = torch.full_like(targets, pad)
    out = _call_loss(impl, logits, targets, eps, pad)
    value = float(out.detach().reshape(-1)[0]) if out.numel() else math.nan
    if not math.isfinite(value) or value != 0.0:
        bug = _diagnose_loss(impl, logits, targets, eps, pad, False)
        report.fail(
            f"when every target is padding ({pad}) your loss is {value}, expected 0.0 "
            f"{where}: nothing is kept, so the mean over kept positions is defined as 0.",
            bug,
        )
