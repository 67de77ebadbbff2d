"""The correct blocks that catalogues build their known mistakes from, shared by several
assignments: the masked attention kernel, a multi-head attention block written in steps
(project, split the heads, attend, merge the heads, project out) and the feed-forward network.
A catalogued mistake is a subclass that overrides the one step it gets wrong (ex02's and
ex04's catalogues); the layers' wiring mistakes use the blocks as they are.

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
    """Multi-head attention ``(d_model, n_heads)`` with the reference's parameter names, in
    steps a catalogued mistake can override one at a time."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split(self, x: Tensor) -> Tensor:
        """(B, n, D) -> (B, H, n, Dk)."""
        b, n, d = x.shape
        return x.reshape(b, n, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B, H, n, Dk)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Every head's attention: (B, H, L, Dk) from queries, keys and values per head."""
        return masked_attention(q, k, v, mask)  # (B, H, L, Dk)

    def merge(self, out: Tensor) -> Tensor:
        """(B, H, L, Dk) -> (B, L, D)."""
        b, h, n, d_k = out.shape
        return out.transpose(1, 2).reshape(b, n, h * d_k)  # (B, L, D)

    def project_out(self, out: Tensor) -> Tensor:
        """W^O applied to the merged heads."""
        return self.out_proj(out)  # (B, L, D)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        q = self.split(self.q_proj(query))  # (B, H, L, Dk)
        k = self.split(self.k_proj(key))  # (B, H, S, Dk)
        v = self.split(self.v_proj(value))  # (B, H, S, Dk)
        return self.project_out(self.merge(self.attend(q, k, v, mask)))  # (B, L, D)


class FeedForwardBlock(nn.Module):
    """The position-wise feed-forward network ``(d_model, d_ff)`` with the reference's
    parameter names (``linear1``, ReLU, ``linear2``); ex04's catalogued mistakes override its
    forward or its widths, and ex05's layer variants are built on it."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(torch.relu(self.linear1(x)))  # (B, L, D)
