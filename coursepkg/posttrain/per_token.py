"""Per-token pieces every post-training loss is built from: the entropy of the next-token
distribution, the log-probability of each token of a response, and the masked averages that
turn per-token numbers into one loss.

The losses of SFT, DPO and GRPO differ in what they do per token and in how they average;
written as these pieces, each choice is one visible argument (which mask, which dimension,
which constant to divide by).

Dimension legend: B batch, L length, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_float, check_tokens

__all__ = ["masked_mean", "masked_normalize", "token_entropy", "token_log_probs"]


def token_entropy(logits: Tensor) -> Tensor:
    """The entropy of the next-token distribution, H = -sum_v p_v log p_v, in nats.

    Computed as ``logsumexp(z) - sum_v p_v z_v`` (equal, since log p_v = z_v - logsumexp(z)),
    which never forms log 0: a token of probability 0 (a logit of -inf, a banned token) adds
    nothing instead of 0 * -inf = NaN.

    Args:
        logits: unnormalised scores over the vocabulary, on the last dimension.

    Shape:
        logits (..., V) -> (...).
    """
    check_float("logits", logits)
    if logits.dtype in (torch.float16, torch.bfloat16):  # a softmax over V needs float32
        logits = logits.float()
    probs = torch.softmax(logits, dim=-1)  # (..., V)
    finite = logits.masked_fill(probs == 0, 0.0)  # a -inf logit (p = 0) adds 0, not 0 * -inf
    return torch.logsumexp(logits, dim=-1) - (probs * finite).sum(dim=-1)  # (...)


def token_log_probs(
    logits: Tensor, tokens: Tensor, with_entropy: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    """log pi(token t + 1 | tokens <= t): each next token's log-probability under the model.

    Position t's logits predict token t + 1, so the result is one shorter than the tokens:
    entry t belongs to the *target* t + 1, and a mask over the tokens is shifted the same way
    (``mask[:, 1:]``) to select the response's targets.

    Args:
        logits: the model's next-token scores at every position.
        tokens: the ids the model read.
        with_entropy: also return the entropy of each predicted distribution.

    Shape:
        logits (B, L, V), tokens (B, L) -> (B, L - 1) (and the entropy, (B, L - 1)).

    Returns:
        The log-probabilities; with ``with_entropy`` the pair (log-probabilities, entropy).
    """
    check_float("logits", logits, 3)
    check_tokens("tokens", tokens, logits.size(-1))
    if logits.shape[:2] != tokens.shape:
        raise ValueError(
            f"logits (B, L, V) and tokens (B, L) must agree on (B, L), got "
            f"{tuple(logits.shape)} and {tuple(tokens.shape)}"
        )
    predicted = logits[:, :-1]  # (B, L-1, V)
    if predicted.dtype in (torch.float16, torch.bfloat16):  # a softmax over V needs float32
        predicted = predicted.float()
    targets = tokens[:, 1:, None]  # (B, L-1, 1)
    log_probs = torch.log_softmax(predicted, dim=-1).gather(-1, targets).squeeze(-1)  # (B, L-1)
    if with_entropy:
        return log_probs, token_entropy(predicted)  # (B, L-1) each
    return log_probs


def _check_masked(x: Tensor, mask: Tensor, dim: int | None) -> None:
    check_float("x", x)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != x.shape:
        got = f"{mask.dtype} of shape {tuple(mask.shape)}" if isinstance(mask, Tensor) else mask
        raise ValueError(f"mask must be a bool tensor of x's shape {tuple(x.shape)}, got {got}")
    if dim is not None and not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be None or in [-{x.dim()}, {x.dim()}), got {dim}")


def _masked_sum(x: Tensor, mask: Tensor, dim: int | None) -> Tensor:
    # where(), not a product: a masked entry may be inf or NaN (a padded position's loss)
    kept = torch.where(mask, x, torch.zeros_like(x))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """The mean of the entries of ``x`` that ``mask`` keeps: sum(x * mask) / sum(mask).

    Args:
        x: per-token numbers.
        mask: bool, True on the entries to average.
        dim: the dimension to average along; None averages over all kept entries.

    Shape:
        x, mask (...) -> a scalar (dim None) or x's shape without ``dim``.

    Returns:
        The mean; a slice with no kept entry gives NaN (0 / 0): there is nothing to average.
    """
    _check_masked(x, mask, dim)
    counts = mask.sum() if dim is None else mask.sum(dim=dim)
    return _masked_sum(x, mask, dim) / counts


def masked_normalize(x: Tensor, mask: Tensor, constant: float, dim: int | None = None) -> Tensor:
    """The sum of the entries of ``x`` that ``mask`` keeps, divided by a given constant.

    Unlike :func:`masked_mean` the divisor does not depend on how many entries are kept: with
    the constant the longest response length (Dr. GRPO) or the number of response tokens of the
    whole batch (gradient accumulation, several ranks), every token weighs the same however the
    batch is split.

    Args:
        x: per-token numbers.
        mask: bool, True on the entries to sum.
        constant: the divisor, > 0.
        dim: the dimension to sum along; None sums over all kept entries.

    Shape:
        x, mask (...) -> a scalar (dim None) or x's shape without ``dim``.
    """
    _check_masked(x, mask, dim)
    if not constant > 0:
        raise ValueError(f"constant must be > 0, got {constant!r}")
    return _masked_sum(x, mask, dim) / constant
