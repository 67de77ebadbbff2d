"""The catalogue of ex01_attention: the known mistakes of scaled dot-product attention and of
the additive (Bahdanau) score. Each is a wrong function with the stub's signature (the
evidence: the check reruns it on the student's inputs and compares outputs), its id, and the
story and advice a student reads when their output matches it.

Dimension legend: B batch, L queries, S keys, Dk/Dv per-head sizes, A additive-attention width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..framework import BugVariant

__all__ = ["ADDITIVE_BUGS", "ADDITIVE_ITEM", "BUGS", "SDPA_BUGS", "SDPA_ITEM"]

SDPA_ITEM = "scaled_dot_product_attention"
ADDITIVE_ITEM = "additive_score"

# ---------------------------------------------------------------------------------------------
# Scaled dot-product attention: the wrong functions
# ---------------------------------------------------------------------------------------------


def _scores(query: Tensor, key: Tensor, divisor: float) -> Tensor:
    return query @ key.transpose(-2, -1) / divisor  # (..., L, S)


def _masked_softmax(scores: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
    """The correct masking: -inf before the softmax, zeros for the hidden keys after it."""
    if mask is None:
        return torch.softmax(scores, dim=dim)  # (..., L, S)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)  # (..., L, S)
    return weights.masked_fill(~mask, 0.0)


def sdpa_no_scaling(query, key, value, mask=None):  # noqa: ANN001, ANN201 - the stub's signature
    """Q K^T is never divided by sqrt(d_k)."""
    weights = _masked_softmax(_scores(query, key, 1.0), mask)  # (..., L, S)
    return weights @ value, weights  # (..., L, Dv)


def sdpa_scale_by_dk(query, key, value, mask=None):  # noqa: ANN001, ANN201
    """Q K^T divided by d_k."""
    weights = _masked_softmax(_scores(query, key, float(query.size(-1))), mask)
    return weights @ value, weights


def sdpa_scale_by_dv(query, key, value, mask=None):  # noqa: ANN001, ANN201
    """Q K^T divided by sqrt(d_v)."""
    weights = _masked_softmax(_scores(query, key, math.sqrt(value.size(-1))), mask)
    return weights @ value, weights


def sdpa_softmax_query_axis(query, key, value, mask=None):  # noqa: ANN001, ANN201
    """The softmax runs over the queries (dim=-2)."""
    weights = _masked_softmax(_scores(query, key, math.sqrt(query.size(-1))), mask, dim=-2)
    return weights @ value, weights


def sdpa_mask_after_softmax(query, key, value, mask=None):  # noqa: ANN001, ANN201
    """The mask zeroes weights after the softmax, with no renormalising."""
    weights = torch.softmax(_scores(query, key, math.sqrt(query.size(-1))), dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ value, weights


def sdpa_inverted_mask(query, key, value, mask=None):  # noqa: ANN001, ANN201
    """True read as blocked: the positions the mask allows are hidden."""
    hidden = None if mask is None else ~mask
    weights = _masked_softmax(_scores(query, key, math.sqrt(query.size(-1))), hidden)
    return weights @ value, weights


def sdpa_masked_row_nan(query, key, value, mask=None):  # noqa: ANN001, ANN201
    """-inf before the softmax and nothing after it: a fully masked row is NaN."""
    scores = _scores(query, key, math.sqrt(query.size(-1)))  # (..., L, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., L, S)
    return weights @ value, weights


def sdpa_masked_row_uniform(query, key, value, mask=None):  # noqa: ANN001, ANN201
    """A finite fill (-1e9) and nothing after the softmax: a fully masked row is uniform."""
    scores = _scores(query, key, math.sqrt(query.size(-1)))  # (..., L, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = torch.softmax(scores, dim=-1)  # (..., L, S)
    return weights @ value, weights


def sdpa_returns_scores(query, key, value, mask=None):  # noqa: ANN001, ANN201
    """The second value returned is the (masked) scores, not the weights."""
    scores = _scores(query, key, math.sqrt(query.size(-1)))  # (..., L, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., L, S)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ value, scores


def sdpa_builtin(query, key, value, mask=None):  # noqa: ANN001, ANN201
    """PyTorch's fused kernel for the output, the weights computed beside it."""
    weights = _masked_softmax(_scores(query, key, math.sqrt(query.size(-1))), mask)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask), weights


SDPA_BUGS: list[BugVariant] = [
    BugVariant(
        "sdpa.no_scaling",
        SDPA_ITEM,
        "the scores Q K^T are not divided by sqrt(d_k)",
        "Divide the scores by math.sqrt(d_k), where d_k = query.size(-1), before the softmax.",
        sdpa_no_scaling,
    ),
    BugVariant(
        "sdpa.scale_by_dk",
        SDPA_ITEM,
        "the scores are divided by d_k instead of sqrt(d_k)",
        "Divide by math.sqrt(d_k), not by d_k.",
        sdpa_scale_by_dk,
    ),
    BugVariant(
        "sdpa.scale_by_dv",
        SDPA_ITEM,
        "the scores are scaled with the value size Dv instead of the key size Dk",
        "Use d_k = query.size(-1) (the size of the dot products), not value.size(-1).",
        sdpa_scale_by_dv,
    ),
    BugVariant(
        "sdpa.softmax_query_axis",
        SDPA_ITEM,
        "the softmax runs over the queries (dim=-2) instead of over the keys",
        "Use torch.softmax(scores, dim=-1): each query's weights over the keys must sum to 1.",
        sdpa_softmax_query_axis,
    ),
    BugVariant(
        "sdpa.mask_after_softmax",
        SDPA_ITEM,
        "the mask zeroes the weights after the softmax, so the remaining weights no longer "
        "sum to 1",
        "Mask the scores before the softmax: scores.masked_fill(~mask, float('-inf')).",
        sdpa_mask_after_softmax,
    ),
    BugVariant(
        "sdpa.inverted_mask",
        SDPA_ITEM,
        "the mask is read the wrong way round (True treated as blocked)",
        "True means may attend: hide the positions where the mask is False, "
        "scores.masked_fill(~mask, float('-inf')).",
        sdpa_inverted_mask,
    ),
    BugVariant(
        "sdpa.masked_row_nan",
        SDPA_ITEM,
        "a query whose keys are all masked gets NaN (softmax of a row of -inf)",
        "After the softmax, set the weights of masked positions to 0, e.g. "
        "weights.masked_fill(~mask, 0.0); a fully masked row then gives zeros.",
        sdpa_masked_row_nan,
    ),
    BugVariant(
        "sdpa.masked_row_uniform",
        SDPA_ITEM,
        "a query whose keys are all masked averages all values (a finite fill such as -1e9 "
        "makes that row's softmax uniform)",
        "After the softmax, set the weights of masked positions to 0, e.g. "
        "weights.masked_fill(~mask, 0.0), so a fully masked row gives zeros.",
        sdpa_masked_row_uniform,
    ),
    BugVariant(
        "sdpa.returns_scores",
        SDPA_ITEM,
        "the second value returned is the scores before the softmax, not the weights",
        "Return (output, weights) where weights = softmax(scores) after masking.",
        sdpa_returns_scores,
    ),
]


# ---------------------------------------------------------------------------------------------
# The additive score: the wrong functions
# ---------------------------------------------------------------------------------------------


def additive_no_tanh(query, keys, W_q, W_k, v):  # noqa: ANN001, ANN201, N803 - the stub's
    """v^T (W_q s + W_k h): the tanh is missing."""
    return ((query @ W_q.T).unsqueeze(1) + keys @ W_k.T) @ v  # (B, S)


def additive_tanh_separately(query, keys, W_q, W_k, v):  # noqa: ANN001, ANN201, N803
    """v^T (tanh(W_q s) + tanh(W_k h)): one tanh per projection."""
    return (torch.tanh(query @ W_q.T).unsqueeze(1) + torch.tanh(keys @ W_k.T)) @ v  # (B, S)


def additive_softmax(query, keys, W_q, W_k, v):  # noqa: ANN001, ANN201, N803
    """The softmax of the scores instead of the scores."""
    scores = torch.tanh((query @ W_q.T).unsqueeze(1) + keys @ W_k.T) @ v  # (B, S)
    return torch.softmax(scores, dim=-1)


ADDITIVE_BUGS: list[BugVariant] = [
    BugVariant(
        "additive.no_tanh",
        ADDITIVE_ITEM,
        "the tanh between the projections and v is missing (the score is then linear)",
        "Compute v^T tanh(W_q s + W_k h): apply torch.tanh to the sum before the product with v.",
        additive_no_tanh,
    ),
    BugVariant(
        "additive.tanh_separately",
        ADDITIVE_ITEM,
        "tanh is applied to W_q s and to W_k h separately instead of to their sum",
        "Add the two projections first, then apply one tanh: tanh(W_q s + W_k h).",
        additive_tanh_separately,
    ),
    BugVariant(
        "additive.softmax_applied",
        ADDITIVE_ITEM,
        "the function returns softmax weights instead of the raw scores",
        "Return the scores; the softmax (and the mask) belong to the caller.",
        additive_softmax,
    ),
]

SDPA_BUGS.append(
    BugVariant(
        "sdpa.builtin",
        SDPA_ITEM,
        "your function calls PyTorch's fused torch.nn.functional.scaled_dot_product_attention, "
        "where the exercise asks you to write attention",
        "Compute softmax(Q K^T / sqrt(d_k)) V yourself, with matmul, masking and softmax.",
        sdpa_builtin,
        calls=(F.scaled_dot_product_attention,),
    )
)

BUGS: list[BugVariant] = [*SDPA_BUGS, *ADDITIVE_BUGS]
