"""Assignment ex06_training: the warm-up learning-rate schedule and the label-smoothed loss
(chapter 8)."""

from __future__ import annotations

import torch  # noqa: F401  (you will need it)
import torch.nn.functional as F  # noqa: F401
from torch import Tensor


def noam_lr(step: int, d_model: int, warmup_steps: int) -> float:
    """The learning rate of the paper's schedule (Vaswani et al., Sec. 5.3, Eq. 3):

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

    It grows linearly for the first ``warmup_steps`` steps, peaks at ``step == warmup_steps``,
    then decays like 1 / sqrt(step). Steps count from 1 (step 1 is the first optimiser
    update); at ``step == 0`` nothing has been trained yet and the rate is ``0.0``.

    Args:
        step: the optimiser step, an integer >= 0.
        d_model: model width D.
        warmup_steps: length of the warm-up, >= 1.

    Returns:
        The learning rate, a Python float.
    """
    raise NotImplementedError


def label_smoothed_cross_entropy(
    logits: Tensor, targets: Tensor, smoothing: float = 0.1, ignore_index: int = -100
) -> Tensor:
    """Cross-entropy against a smoothed target distribution (Sec. 5.4, eps = smoothing).

    The target distribution puts ``1 - eps`` on the true token and spreads ``eps`` uniformly
    over ALL V tokens (the true one included), so the true token gets ``1 - eps + eps / V``
    and every other token ``eps / V``. This is what
    ``F.cross_entropy(..., label_smoothing=eps)`` computes, but write it yourself from
    ``log_softmax``: the check rejects a call to ``F.cross_entropy``.

    Padding is ignored: a position whose target equals ``ignore_index`` contributes nothing,
    and the mean is over the other positions only (0 if every position is ignored).

    Args:
        logits: unnormalised scores.
        targets: true token ids (integers); ``ignore_index`` marks padding.
        smoothing: eps in [0, 1).
        ignore_index: the target id to leave out (e.g. the pad id).

    Shape:
        logits (..., V), targets (...) -> scalar (a 0-dimensional tensor). Typically logits
        (B, T, V) and targets (B, T).

    Returns:
        The mean smoothed cross-entropy over the positions not ignored, with the dtype of
        ``logits`` and differentiable with respect to them.
    """
    raise NotImplementedError
