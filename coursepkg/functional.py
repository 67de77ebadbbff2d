"""Softmax and cross-entropy written out, the way the course derives them.

Both subtract the row maximum before exponentiating (the log-sum-exp trick), so large logits
never overflow; each equals its PyTorch counterpart (``torch.softmax``,
``torch.nn.functional.cross_entropy``) to float rounding, which ``tests/test_optim.py`` checks
on random problems. :mod:`coursepkg.training` computes its loss with :func:`cross_entropy`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["cross_entropy", "log_softmax", "softmax"]


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """log softmax(x) = (x - m) - log(sum(exp(x - m))), with m the maximum along ``dim``.

    Subtracting m first is the log-sum-exp trick: every exponent is <= 0, so nothing overflows,
    and the largest term is exp(0) = 1, so the logarithm never sees 0.

    Args:
        x: scores.
        dim: the dimension the distribution runs over.

    Shape:
        x (..., V) -> (..., V).

    Returns:
        Log-probabilities (each slice along ``dim`` exponentiates to a distribution).
    """
    m = x.amax(dim=dim, keepdim=True).detach()  # (..., 1) a constant: the result does not move
    shifted = x - m  # (..., V), every entry <= 0
    return shifted - shifted.exp().sum(dim=dim, keepdim=True).log()  # (..., V)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """exp(x - m) / sum(exp(x - m)) with m the maximum along ``dim``: probabilities summing to 1.

    Args:
        x: scores.
        dim: the dimension the probabilities run over.

    Shape:
        x (..., V) -> (..., V).

    Returns:
        Non-negative values summing to 1 along ``dim``.
    """
    e = (x - x.amax(dim=dim, keepdim=True).detach()).exp()  # (..., V), every value <= 1
    return e / e.sum(dim=dim, keepdim=True)  # (..., V)


def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int | None = None) -> Tensor:
    """Mean of -log softmax(logits)[target] over the positions, in nats.

    Args:
        logits: unnormalised scores.
        target: the true ids, in [0, V).
        ignore_index: a target id (e.g. padding) whose positions are left out of the mean.

    Shape:
        logits (..., V), target (...) -> scalar.

    Returns:
        The mean loss over the positions not ignored (NaN when every position is ignored, as
        PyTorch's).

    Raises:
        ValueError: when the leading dimensions of ``logits`` and ``target`` differ.
    """
    if logits.shape[:-1] != target.shape:
        raise ValueError(
            f"logits (..., V) and target (...) must agree on the leading dimensions, got "
            f"logits {tuple(logits.shape)} and target {tuple(target.shape)}"
        )
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # half-precision logits (autocast): the sum in float32
    flat = logits.reshape(-1, logits.size(-1))  # (N, V)
    ids = target.reshape(-1)  # (N,)
    keep = torch.ones_like(ids, dtype=torch.bool) if ignore_index is None else ids != ignore_index
    logp = log_softmax(flat)  # (N, V)
    nll = -logp.gather(1, ids.masked_fill(~keep, 0)[:, None]).squeeze(1)  # (N,)
    return nll[keep].sum() / keep.sum()
