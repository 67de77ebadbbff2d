"""ALiBi, attention with linear biases (Press, Smith and Lewis, 2022, "Train Short, Test Long").

No position is added to the embeddings and nothing is rotated: each head h adds a penalty
proportional to the distance to every score, score(i, j) - m_h * (i - j) for query position i
and key position j <= i. The slopes m_h are fixed, a geometric sequence over the heads
(:func:`alibi_slopes`), so some heads look far back and others mostly at their neighbours.
As the bias depends only on i - j, a model trained on short sequences runs on longer ones.

``TransformerConfig(..., positional="alibi")`` builds it in every self-attention of a
:class:`~coursepkg.DecoderOnlyLM` (:class:`ALiBiAttention`).

Dimension legend: B batch, H heads, Hkv key/value heads, L new positions, S keys (cached and
new), Dk/Dv per-head sizes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .fast_attention import FastMultiHeadAttention
from .masks import PackedMask, as_mask

__all__ = ["ALiBiAttention", "alibi_bias", "alibi_slopes"]


def alibi_slopes(n_heads: int) -> Tensor:
    """The heads' slopes m_1..m_H (Press et al., 2022, Sec. 3).

    For H a power of two, m_h = 2^(-8h/H): 8 heads have 1/2, 1/4, ..., 1/256. Otherwise the
    paper's code takes the slopes of the largest power of two below H, then every other slope
    of twice that power, until there are H.

    Args:
        n_heads: H, at least 1.

    Returns:
        float32 (H,), decreasing.
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}")
    below = 2 ** math.floor(math.log2(n_heads))  # the largest power of two <= H

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    extra = geometric(2 * below)[0::2][: n_heads - below]  # every other slope of 2 * below
    return torch.tensor(geometric(below) + extra)  # (H,)


def alibi_bias(slopes: Tensor, query_positions: Tensor, key_positions: Tensor) -> Tensor:
    """What ALiBi adds to the scores: -m_h * (i - j) for query position i and key position j.

    Args:
        slopes: (H,) from :func:`alibi_slopes`.
        query_positions: (L,) the queries' positions i.
        key_positions: (S,) the keys' positions j.

    Returns:
        (H, L, S), zero on the diagonal and more negative the further back the key.
    """
    distance = query_positions[:, None] - key_positions[None, :]  # (L, S): i - j
    return -slopes[:, None, None] * distance.to(slopes.dtype)  # (H, L, S)


class ALiBiAttention(FastMultiHeadAttention):
    """Multi-head attention with ALiBi's biases on the scores: softmax(QK^T / sqrt(Dk) + bias)
    V with the bias of :func:`alibi_bias`. The projections (and their names) are the models'
    attention's; only the attention step differs, written out as the textbook formula.

    The positions come from where the keys sit, aligned bottom-right as ``causal_mask`` is: the
    L queries are the last L of the S keys (a cache's keys come first, a sliding window's ring
    returns its keys oldest first); a :class:`~coursepkg.masks.PackedMask` says each query's
    and key's position within its request. Left padding is masked out, so the distances
    between real tokens are their true distances.

    Args:
        As :class:`~coursepkg.attention.MultiHeadAttention`.

    Buffers:
        ``slopes`` (H,), not saved (they are fixed by H).
    """

    def __init__(self, d_model: int, n_heads: int, **options) -> None:
        super().__init__(d_model, n_heads, **options)
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | PackedMask | None) -> Tensor:
        """Scores plus ALiBi's bias, masked, softmax, weighted values.

        Shape:
            q (B, H, L, Dk), k (B, Hkv, S, Dk), v (B, Hkv, S, Dv) -> (B, H, L, Dv).
        """
        group = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(group, dim=1)  # (B, H, S, Dk)
        v = v.repeat_interleave(group, dim=1)  # (B, H, S, Dv)
        n_q, n_k = q.size(-2), k.size(-2)
        if isinstance(mask, PackedMask):  # each request's tokens at their own positions
            at_q, at_k = mask.query_position, mask.key_position  # (L,), (S,)
        else:  # the queries are the last L of the S keys
            at_k = torch.arange(n_k, device=q.device)  # (S,)
            at_q = at_k[n_k - n_q :]  # (L,)
        bias = alibi_bias(self.slopes, at_q, at_k).to(q.dtype)  # (H, L, S)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k) + bias  # (B, H, L, S)
        allowed = as_mask(mask)  # bool, True = may attend
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, H, L, S)
        if allowed is not None:  # a fully masked row gives zeros, not NaN
            weights = weights.masked_fill(~allowed, 0.0)
        if self.record_weights:
            self.last_weights = weights.detach()  # (B, H, L, S)
        weights = F.dropout(weights, self.dropout, self.training)
        return weights @ v  # (B, H, L, Dv)
