"""Blocks written without the reference, for the mistakes that call a built-in (ex02's, ex04's
and ex05's ``builtin_sdpa``, ex04's ``builtin_multihead_attention``): the tests run those as a
student's code, and a student's class may not contain the reference, so they cannot be built on
it as the other known mistakes are. Their numbers are never compared (a built-in call is named
by the call). Also the textbook masked attention kernel, which ex11's blocks use.

Dimension legend: B batch, H heads, L queries, S keys, D d_model, Dk per-head size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["FeedForwardBlock", "HeadsBlock", "masked_attention"]


def masked_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> Tensor:
    """softmax(Q K^T / sqrt(Dk)) V with the course's mask (True = may attend): -inf before the
    softmax, zero weights for hidden keys after it, so a fully masked query gives zeros."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., L, S)
    if mask is None:
        return torch.softmax(scores, dim=-1) @ value  # (..., L, Dv)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # (..., L, S)
    return weights.masked_fill(~mask, 0.0) @ value  # (..., L, Dv)


class HeadsBlock(nn.Module):
    """Multi-head attention ``(d_model, n_heads)`` with the reference's parameter names, not
    built on the reference; a built-in mistake overrides :meth:`attend` in its own module, so
    that the built-in is called from the code the tests run as a student's."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Every head's attention: (B, H, L, Dk) from queries, keys and values per head."""
        return masked_attention(q, k, v, mask)  # (B, H, L, Dk)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        b, n, d = query.shape
        q, k, v = (
            x.reshape(b, x.size(1), self.n_heads, d // self.n_heads).transpose(1, 2)
            for x in (self.q_proj(query), self.k_proj(key), self.v_proj(value))
        )  # (B, H, L, Dk), (B, H, S, Dk), (B, H, S, Dk)
        out = self.attend(q, k, v, mask).transpose(1, 2).reshape(b, n, d)  # (B, L, D)
        return self.out_proj(out)  # (B, L, D)


class FeedForwardBlock(nn.Module):
    """The position-wise feed-forward network ``(d_model, d_ff)`` with the reference's
    parameter names (``linear1``, ReLU, ``linear2``), not built on the reference: the
    feed-forward of ex04's and ex05's built-in layer mistakes."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(torch.relu(self.linear1(x)))  # (B, L, D)
