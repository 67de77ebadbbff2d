"""Checks of assignment ex06_training: the warm-up learning-rate schedule and the
label-smoothed loss.

``check_noam_lr`` compares the student's schedule with :func:`coursepkg.schedule.noam_lr` at the
steps that matter (0, 1, around the peak, late decay) and checks that the peak sits exactly at
``warmup_steps``. ``check_label_smoothing`` compares the loss and its gradient with
:func:`coursepkg.schedule.label_smoothed_cross_entropy`, in float32 and float64, with padding
that must contribute nothing (not to the sum, not to the count), and with a batch where every
position is padding (0, never NaN).

Dimension legend: B batch, T target length, V vocabulary.
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
    assert_close,
    call_student,
    configs,
    describe,
    diagnose,
    expect_tensor,
    forbidden_calls,
    public_check,
    register_configs,
)

__all__ = ["BUGS", "check_label_smoothing", "check_noam_lr"]

NOAM_ITEM = "noam_lr"
LOSS_ITEM = "label_smoothed_cross_entropy"

# ---------------------------------------------------------------------------------------------
# Known mistakes: the schedule
# ---------------------------------------------------------------------------------------------


def _noam_counts_from_zero(step: int, d_model: int, warmup_steps: int) -> float:
    s = step + 1
    return d_model**-0.5 * min(s**-0.5, s * warmup_steps**-1.5)


def _noam_peak_late(step: int, d_model: int, warmup_steps: int) -> float:
    s = step - 1
    if s <= 0:
        return 0.0
    return d_model**-0.5 * min(s**-0.5, s * warmup_steps**-1.5)


def _noam_step_zero_not_zero(step: int, d_model: int, warmup_steps: int) -> float:
    s = max(step, 1)
    return d_model**-0.5 * min(s**-0.5, s * warmup_steps**-1.5)


def _noam_no_d_model(step: int, d_model: int, warmup_steps: int) -> float:
    if step == 0:
        return 0.0
    return min(step**-0.5, step * warmup_steps**-1.5)


def _noam_times_sqrt_d_model(step: int, d_model: int, warmup_steps: int) -> float:
    if step == 0:
        return 0.0
    return d_model**0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def _noam_warmup_exponent(step: int, d_model: int, warmup_steps: int) -> float:
    if step == 0:
        return 0.0
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-0.5)


def _noam_max(step: int, d_model: int, warmup_steps: int) -> float:
    if step == 0:
        return 0.0
    return d_model**-0.5 * max(step**-0.5, step * warmup_steps**-1.5)


_NOAM_FORMULA = "d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)"

NOAM_BUGS: list[BugVariant] = [
    BugVariant(
        id="noam_lr.counts_from_zero",
        item=NOAM_ITEM,
        description="the schedule is shifted by one step (it uses step + 1): the peak comes at "
        "warmup_steps - 1 and step 0 gets a non-zero rate",
        advice="Steps count from 1: use step itself in the formula, and return 0.0 at step 0.",
        impl=_noam_counts_from_zero,
    ),
    BugVariant(
        id="noam_lr.peak_late",
        item=NOAM_ITEM,
        description="the schedule is shifted by one step (it uses step - 1): the peak comes at "
        "warmup_steps + 1",
        advice=f"Use step itself: {_NOAM_FORMULA}; the peak must be at step == warmup_steps.",
        impl=_noam_peak_late,
    ),
    BugVariant(
        id="noam_lr.step_zero_not_zero",
        item=NOAM_ITEM,
        description="step 0 is treated like step 1 and gets a non-zero rate",
        advice="At step 0 nothing has been trained yet: return 0.0 there (the formula's "
        "0 ** -0.5 would divide by zero).",
        impl=_noam_step_zero_not_zero,
    ),
    BugVariant(
        id="noam_lr.no_d_model_factor",
        item=NOAM_ITEM,
        description="the d_model ** -0.5 factor is missing",
        advice=f"Multiply by d_model ** -0.5: {_NOAM_FORMULA}.",
        impl=_noam_no_d_model,
    ),
    BugVariant(
        id="noam_lr.times_sqrt_d_model",
        item=NOAM_ITEM,
        description="the rate is multiplied by sqrt(d_model) instead of divided by it",
        advice="The factor is d_model ** -0.5 (a smaller rate for wider models).",
        impl=_noam_times_sqrt_d_model,
    ),
    BugVariant(
        id="noam_lr.warmup_exponent",
        item=NOAM_ITEM,
        description="the warm-up term uses warmup_steps ** -0.5 instead of warmup_steps ** -1.5",
        advice="With warmup_steps ** -1.5 the two terms of min() meet exactly at "
        f"step == warmup_steps: {_NOAM_FORMULA}.",
        impl=_noam_warmup_exponent,
    ),
    BugVariant(
        id="noam_lr.max_instead_of_min",
        item=NOAM_ITEM,
        description="max() is used instead of min(), so the rate never warms up",
        advice=f"Take the smaller of the two terms: {_NOAM_FORMULA}.",
        impl=_noam_max,
    ),
]

# ---------------------------------------------------------------------------------------------
# Known mistakes: the loss (written on top of the reference, so no second solution lives here)
# ---------------------------------------------------------------------------------------------


def _kept(targets: Tensor, ignore_index: int) -> int:
    return int((targets != ignore_index).sum())


def _ls_eps_over_v_minus_1(logits, targets, smoothing=0.1, ignore_index=-100):
    # Spreading eps over the V - 1 wrong tokens is the reference's rule with eps * V / (V - 1).
    v = logits.size(-1)
    return _reference_loss(logits, targets, smoothing * v / (v - 1), ignore_index)


def _ls_no_smoothing(logits, targets, smoothing=0.1, ignore_index=-100):
    return _reference_loss(logits, targets, 0.0, ignore_index)


def _ls_true_token_misses_share(logits, targets, smoothing=0.1, ignore_index=-100):
    # q = (1 - eps) on the true token and eps / V on the others only: the loss loses
    # eps / V of the true token's negative log-likelihood.
    v = logits.size(-1)
    nll = _reference_loss(logits, targets, 0.0, ignore_index)
    return _reference_loss(logits, targets, smoothing, ignore_index) - smoothing / v * nll


def _ls_padding_not_ignored(logits, targets, smoothing=0.1, ignore_index=-100):
    return _reference_loss(logits, targets, smoothing, None)


def _ls_mean_over_all_positions(logits, targets, smoothing=0.1, ignore_index=-100):
    loss = _reference_loss(logits, targets, smoothing, ignore_index)
    return loss * _kept(targets, ignore_index) / targets.numel()


def _ls_sum_not_mean(logits, targets, smoothing=0.1, ignore_index=-100):
    loss = _reference_loss(logits, targets, smoothing, ignore_index)
    return loss * _kept(targets, ignore_index)


def _ls_all_ignored_nan(logits, targets, smoothing=0.1, ignore_index=-100):
    loss = _reference_loss(logits, targets, smoothing, ignore_index)
    if _kept(targets, ignore_index) == 0:
        return loss * float("nan")
    return loss


def _ls_kl_divergence(logits, targets, smoothing=0.1, ignore_index=-100):
    # KL(q || p) = cross-entropy(q, p) - H(q); H(q) is the same at every kept position.
    v = logits.size(-1)
    loss = _reference_loss(logits, targets, smoothing, ignore_index)
    return loss - _target_entropy(smoothing, v) if _kept(targets, ignore_index) else loss


def _ls_kl_eps_over_v_minus_1(logits, targets, smoothing=0.1, ignore_index=-100):
    # Both habits at once (KLDivLoss against 1 - eps on the target, eps / (V - 1) elsewhere).
    v = logits.size(-1)
    loss = _ls_eps_over_v_minus_1(logits, targets, smoothing, ignore_index)
    if not _kept(targets, ignore_index):
        return loss
    return loss - _target_entropy(smoothing, v, over_others=True)


def _target_entropy(eps: float, v: int, over_others: bool = False) -> float:
    """Entropy of the smoothed target distribution: 1 - eps + eps/V on one token and eps/V on
    the V - 1 others, or (``over_others``) 1 - eps and eps/(V - 1)."""
    top, rest = (1 - eps, eps / (v - 1)) if over_others else (1 - eps + eps / v, eps / v)
    return -(top * math.log(top) if top > 0 else 0.0) - (
        (v - 1) * rest * math.log(rest) if rest > 0 else 0.0
    )


LOSS_BUGS: list[BugVariant] = [
    BugVariant(
        id="label_smoothing.kl_divergence",
        item=LOSS_ITEM,
        description="the loss is the KL divergence KL(q || p) (nn.KLDivLoss against the "
        "smoothed targets), which is the cross-entropy minus the entropy of q: the gradient "
        "is right but the value is lower by a constant",
        advice="Return the cross-entropy -sum(q * log_softmax(logits)) averaged over the kept "
        "positions, without the sum(q * log q) term.",
        impl=_ls_kl_divergence,
    ),
    BugVariant(
        id="label_smoothing.kl_eps_over_v_minus_1",
        item=LOSS_ITEM,
        description="two conventions at once: the loss is the KL divergence (cross-entropy "
        "minus the entropy of q, lower by a constant), and eps is spread over the V - 1 wrong "
        "tokens (the true token gets 1 - eps) instead of over all V",
        advice="Return the cross-entropy -sum(q * log_softmax(logits)) with q = (1 - eps) * "
        "one_hot + eps / V on every token (the true one gets 1 - eps + eps / V), averaged over "
        "the kept positions.",
        impl=_ls_kl_eps_over_v_minus_1,
    ),
    BugVariant(
        id="label_smoothing.eps_over_v_minus_1",
        item=LOSS_ITEM,
        description="eps is spread over the V - 1 wrong tokens (the true token gets exactly "
        "1 - eps), but this course spreads it over all V tokens",
        advice="Use q = (1 - eps) * one_hot + eps / V on every token, the true one included "
        "(what F.cross_entropy(label_smoothing=eps) does): the true token gets 1 - eps + eps / V.",
        impl=_ls_eps_over_v_minus_1,
    ),
    BugVariant(
        id="label_smoothing.no_smoothing",
        item=LOSS_ITEM,
        description="the smoothing is not applied (this is the plain cross-entropy)",
        advice="Mix in the uniform part: loss = (1 - eps) * nll + eps * mean over V of "
        "(-log_softmax).",
        impl=_ls_no_smoothing,
    ),
    BugVariant(
        id="label_smoothing.true_token_misses_share",
        item=LOSS_ITEM,
        description="the true token gets 1 - eps and the others eps / V, so the target "
        "distribution does not sum to 1",
        advice="Give every token eps / V, the true one included: it gets 1 - eps + eps / V.",
        impl=_ls_true_token_misses_share,
    ),
    BugVariant(
        id="label_smoothing.padding_not_ignored",
        item=LOSS_ITEM,
        description="positions whose target equals ignore_index (padding) are counted as "
        "ordinary tokens",
        advice="Build keep = targets != ignore_index and average the per-position losses over "
        "the kept positions only.",
        impl=_ls_padding_not_ignored,
    ),
    BugVariant(
        id="label_smoothing.mean_over_all_positions",
        item=LOSS_ITEM,
        description="padded positions contribute 0 but the mean still divides by every "
        "position, padding included",
        advice="Divide by the number of kept positions, keep.sum(), not by targets.numel().",
        impl=_ls_mean_over_all_positions,
    ),
    BugVariant(
        id="label_smoothing.sum_not_mean",
        item=LOSS_ITEM,
        description="the loss is summed over positions instead of averaged",
        advice="Return the mean over the kept positions: sum / keep.sum().",
        impl=_ls_sum_not_mean,
    ),
    BugVariant(
        id="label_smoothing.all_ignored_nan",
        item=LOSS_ITEM,
        description="when every position is padding the loss is 0 / 0 = NaN",
        advice="Divide by keep.sum().clamp(min=1) (or return a zero that keeps the graph, such "
        "as logits.sum() * 0) when nothing is kept.",
        impl=_ls_all_ignored_nan,
    ),
]

BUGS: list[BugVariant] = NOAM_BUGS + LOSS_BUGS

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
    NOAM_ITEM,
    visible=[{"D": 512, "W": 4000}, {"D": 16, "W": 10}, {"D": 64, "W": 1}],
    extra=[{"D": 1024, "W": 8000}, {"D": 8, "W": 3}],
    sample=_sample_noam,
)
# T = 0 means 2-D logits (B, V); pad is the ignore_index (0 plays a pad id inside the vocabulary).
register_configs(
    LOSS_ITEM,
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


@public_check(assignment="ex06_training", implements="noam_lr", bugs=NOAM_BUGS, kind="function")
def check_noam_lr(report: CheckReport, impl: Callable, thorough: bool, seed: int | None) -> None:
    """Check the student's ``noam_lr(step, d_model, warmup_steps)`` against the reference."""
    rng = random.Random(0 if seed is None else seed)
    for config in configs(NOAM_ITEM, thorough, seed):
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
        with forbidden_calls(NOAM_ITEM):
            got = []
            for step in steps:
                try:
                    value = call_student(impl, step, d, w, item=NOAM_ITEM)
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
                NOAM_BUGS,
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
        + ", ".join(f"({c['D']}, {c['W']})" for c in configs(NOAM_ITEM, thorough, seed))
    )


# ---------------------------------------------------------------------------------------------
# check_label_smoothing
# ---------------------------------------------------------------------------------------------


# Tolerances are _core.TOLERANCES. Measured over the visible and thorough configurations
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
        LOSS_ITEM,
        extra=[(F.cross_entropy, "torch.nn.functional.cross_entropy")],
        advice="write the loss yourself from log_softmax",
    ):
        try:
            out = call_student(impl, logits, targets, eps, pad, item=LOSS_ITEM)
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
    bugs=LOSS_BUGS,
    kind="function",
)
def check_label_smoothing(
    report: CheckReport, impl: Callable, thorough: bool, seed: int | None
) -> None:
    """Check the student's ``label_smoothed_cross_entropy(logits, targets, smoothing,
    ignore_index)`` against the reference.
    """
    for index, config in enumerate(configs(LOSS_ITEM, thorough, seed)):
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
        LOSS_BUGS,
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
        f"\nOn one position (V={v}, eps={eps}, target {target}, equal logits), the target "
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
        if out.dim() != 0:
            report.fail(
                f"the loss should be a scalar (a 0-dimensional tensor), but yours has shape "
                f"{tuple(out.shape)} {where}: average over the kept positions."
            )
        try:
            assert_close(out, expected, f"your loss {where}")
        except CheckFailure as failure:
            report.fail(
                failure.message + _target_distributions(impl, config),
                _diagnose_loss(impl, logits, targets, eps, pad, True),
            )
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
        try:
            assert_close(logits.grad, expected_logits.grad, f"the gradient of your loss {where}")
        except CheckFailure as failure:
            report.fail(
                failure.message + _target_distributions(impl, config),
                _diagnose_loss(impl, logits, targets, eps, pad, True),
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
