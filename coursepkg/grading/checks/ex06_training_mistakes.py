"""The catalogue of ex06_training: the known mistakes of the Noam schedule and of the
label-smoothed loss, each a runnable variant with the advice a student gets when their output
matches it. The loss variants are written on top of the reference, so no second solution lives
here.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from ...schedule import label_smoothed_cross_entropy as _reference_loss
from ..framework import BugVariant

__all__ = ["BUGS", "LABEL_SMOOTHING_BUGS", "LABEL_SMOOTHING_ITEM", "NOAM_LR_BUGS", "NOAM_LR_ITEM"]

NOAM_LR_ITEM = "noam_lr"
LABEL_SMOOTHING_ITEM = "label_smoothed_cross_entropy"

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

NOAM_LR_BUGS: list[BugVariant] = [
    BugVariant(
        id="noam_lr.counts_from_zero",
        item=NOAM_LR_ITEM,
        description="the schedule is shifted by one step (it uses step + 1): the peak comes at "
        "warmup_steps - 1 and step 0 gets a non-zero rate",
        advice="Steps count from 1: use step itself in the formula, and return 0.0 at step 0.",
        impl=_noam_counts_from_zero,
    ),
    BugVariant(
        id="noam_lr.peak_late",
        item=NOAM_LR_ITEM,
        description="the schedule is shifted by one step (it uses step - 1): the peak comes at "
        "warmup_steps + 1",
        advice=f"Use step itself: {_NOAM_FORMULA}; the peak must be at step == warmup_steps.",
        impl=_noam_peak_late,
    ),
    BugVariant(
        id="noam_lr.step_zero_not_zero",
        item=NOAM_LR_ITEM,
        description="step 0 is treated like step 1 and gets a non-zero rate",
        advice="At step 0 nothing has been trained yet: return 0.0 there (the formula's "
        "0 ** -0.5 would divide by zero).",
        impl=_noam_step_zero_not_zero,
    ),
    BugVariant(
        id="noam_lr.no_d_model_factor",
        item=NOAM_LR_ITEM,
        description="the d_model ** -0.5 factor is missing",
        advice=f"Multiply by d_model ** -0.5: {_NOAM_FORMULA}.",
        impl=_noam_no_d_model,
    ),
    BugVariant(
        id="noam_lr.times_sqrt_d_model",
        item=NOAM_LR_ITEM,
        description="the rate is multiplied by sqrt(d_model) instead of divided by it",
        advice="The factor is d_model ** -0.5 (a smaller rate for wider models).",
        impl=_noam_times_sqrt_d_model,
    ),
    BugVariant(
        id="noam_lr.warmup_exponent",
        item=NOAM_LR_ITEM,
        description="the warm-up term uses warmup_steps ** -0.5 instead of warmup_steps ** -1.5",
        advice="With warmup_steps ** -1.5 the two terms of min() meet exactly at "
        f"step == warmup_steps: {_NOAM_FORMULA}.",
        impl=_noam_warmup_exponent,
    ),
    BugVariant(
        id="noam_lr.max_instead_of_min",
        item=NOAM_LR_ITEM,
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


def _ls_builtin(logits, targets, smoothing=0.1, ignore_index=-100):  # noqa: ANN001, ANN202
    """PyTorch's loss with its label_smoothing option."""
    flat = logits.reshape(-1, logits.size(-1))  # (N, V)
    return F.cross_entropy(
        flat, targets.reshape(-1), ignore_index=ignore_index, label_smoothing=smoothing
    )


LABEL_SMOOTHING_BUGS: list[BugVariant] = [
    BugVariant(
        id="label_smoothing.kl_divergence",
        item=LABEL_SMOOTHING_ITEM,
        description="the loss is the KL divergence KL(q || p) (nn.KLDivLoss against the "
        "smoothed targets), which is the cross-entropy minus the entropy of q: the gradient "
        "is right but the value is lower by a constant",
        advice="Return the cross-entropy -sum(q * log_softmax(logits)) averaged over the kept "
        "positions, without the sum(q * log q) term.",
        impl=_ls_kl_divergence,
    ),
    BugVariant(
        id="label_smoothing.kl_eps_over_v_minus_1",
        item=LABEL_SMOOTHING_ITEM,
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
        item=LABEL_SMOOTHING_ITEM,
        description="eps is spread over the V - 1 wrong tokens (the true token gets exactly "
        "1 - eps), but this course spreads it over all V tokens",
        advice="Use q = (1 - eps) * one_hot + eps / V on every token, the true one included "
        "(what F.cross_entropy(label_smoothing=eps) does): the true token gets 1 - eps + eps / V.",
        impl=_ls_eps_over_v_minus_1,
    ),
    BugVariant(
        id="label_smoothing.no_smoothing",
        item=LABEL_SMOOTHING_ITEM,
        description="the smoothing is not applied (this is the plain cross-entropy)",
        advice="Mix in the uniform part: loss = (1 - eps) * nll + eps * mean over V of "
        "(-log_softmax).",
        impl=_ls_no_smoothing,
    ),
    BugVariant(
        id="label_smoothing.true_token_misses_share",
        item=LABEL_SMOOTHING_ITEM,
        description="the true token gets 1 - eps and the others eps / V, so the target "
        "distribution does not sum to 1",
        advice="Give every token eps / V, the true one included: it gets 1 - eps + eps / V.",
        impl=_ls_true_token_misses_share,
    ),
    BugVariant(
        id="label_smoothing.padding_not_ignored",
        item=LABEL_SMOOTHING_ITEM,
        description="positions whose target equals ignore_index (padding) are counted as "
        "ordinary tokens",
        advice="Build keep = targets != ignore_index and average the per-position losses over "
        "the kept positions only.",
        impl=_ls_padding_not_ignored,
    ),
    BugVariant(
        id="label_smoothing.mean_over_all_positions",
        item=LABEL_SMOOTHING_ITEM,
        description="padded positions contribute 0 but the mean still divides by every "
        "position, padding included",
        advice="Divide by the number of kept positions, keep.sum(), not by targets.numel().",
        impl=_ls_mean_over_all_positions,
    ),
    BugVariant(
        id="label_smoothing.sum_not_mean",
        item=LABEL_SMOOTHING_ITEM,
        description="the loss is summed over positions instead of averaged",
        advice="Return the mean over the kept positions: sum / keep.sum().",
        impl=_ls_sum_not_mean,
    ),
    BugVariant(
        id="label_smoothing.all_ignored_nan",
        item=LABEL_SMOOTHING_ITEM,
        description="when every position is padding the loss is 0 / 0 = NaN",
        advice="Divide by keep.sum().clamp(min=1) (or return a zero that keeps the graph, such "
        "as logits.sum() * 0) when nothing is kept.",
        impl=_ls_all_ignored_nan,
    ),
]

LABEL_SMOOTHING_BUGS.append(
    BugVariant(
        id="label_smoothing.builtin_cross_entropy",
        item=LABEL_SMOOTHING_ITEM,
        description="your loss calls torch.nn.functional.cross_entropy (its label_smoothing= "
        "option), where the exercise asks you to write the smoothed loss",
        advice="Write it from log_softmax: -sum(q * log_softmax(logits)) with q = (1 - eps) * "
        "one_hot + eps / V, averaged over the positions that are not ignore_index.",
        impl=_ls_builtin,
        calls=(F.cross_entropy,),
    )
)

BUGS: list[BugVariant] = [*NOAM_LR_BUGS, *LABEL_SMOOTHING_BUGS]
