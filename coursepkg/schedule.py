"""Training helpers: the warm-up learning-rate schedule (Sec. 5.3) and the label-smoothed
loss (Sec. 5.4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """lrate = factor * D^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani et al., Eq. 3).

    Linear growth for the first ``warmup_steps`` steps, then decay with the inverse square
    root of the step; the peak is at ``step == warmup_steps``. Steps count from 1 (the first
    optimiser update); step 0 gives 0.

    Args:
        step: the optimiser step, >= 0.
        d_model: model width D.
        warmup_steps: length of the warm-up, >= 1.
        factor: a constant multiplier.

    Returns:
        The learning rate at ``step``.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if d_model < 1:
        raise ValueError(f"d_model must be >= 1, got {d_model}")
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
    if step == 0:
        return 0.0
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def noam_scheduler(
    optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int, factor: float = 1.0
) -> LambdaLR:
    """A ``LambdaLR`` following :func:`noam_lr`; give the optimiser ``lr=1.0``.

    ``LambdaLR`` evaluates its function at 0 before the first update, so update ``n``
    (counting from 1) uses ``noam_lr(n)``.
    """
    return LambdaLR(optimizer, lambda i: noam_lr(i + 1, d_model, warmup_steps, factor))


def label_smoothed_cross_entropy(
    logits: Tensor,
    target: Tensor,
    smoothing: float = 0.1,
    ignore_index: int | None = None,
) -> Tensor:
    """Cross-entropy against a smoothed target: (1 - eps) on the true token plus eps / V on
    every token (Szegedy et al., 2016; the paper uses eps = 0.1).

    This is the convention of ``F.cross_entropy(..., label_smoothing=eps)``.

    Args:
        logits: unnormalised scores.
        target: true ids.
        smoothing: eps in [0, 1).
        ignore_index: target id (e.g. padding) whose positions are left out of the mean.

    Shape:
        logits (..., V), target (...) -> scalar.

    Returns:
        The mean loss over the positions not ignored (0 if all are ignored).
    """
    if not (0.0 <= smoothing < 1.0):
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    if logits.shape[:-1] != target.shape:
        raise ValueError(
            f"logits (..., V) and target (...) must agree on the leading dimensions, got "
            f"logits {tuple(logits.shape)} and target {tuple(target.shape)}"
        )
    vocab = logits.size(-1)
    # Half-precision logits are upcast for a stable log-softmax; float64 stays float64.
    work = logits if logits.dtype == torch.float64 else logits.float()
    logp = F.log_softmax(work, dim=-1).reshape(-1, vocab)  # (N, V)
    flat = target.reshape(-1)  # (N,)
    keep = torch.ones_like(flat, dtype=torch.bool) if ignore_index is None else flat != ignore_index
    safe = flat.masked_fill(~keep, 0)
    nll = -logp.gather(1, safe[:, None]).squeeze(1)  # (N,)
    uniform = -logp.mean(dim=-1)  # (N,) cross-entropy against the uniform distribution
    loss = (1.0 - smoothing) * nll + smoothing * uniform  # (N,)
    n = keep.sum()
    return (loss * keep).sum() / n.clamp(min=1)


class LabelSmoothingLoss(nn.Module):
    """Module form of :func:`label_smoothed_cross_entropy`."""

    def __init__(self, smoothing: float = 0.1, ignore_index: int | None = None) -> None:
        super().__init__()
        if not (0.0 <= smoothing < 1.0):
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.smoothing = smoothing
        self.ignore_index = ignore_index

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """Shape: logits (..., V), target (...) -> scalar."""
        return label_smoothed_cross_entropy(logits, target, self.smoothing, self.ignore_index)
