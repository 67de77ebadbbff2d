"""The variants the catalogues build their known mistakes from, shared by several
assignments: attention with switches (ex01's mistakes, and the kernel of the multi-head block)
and the multi-head block with switches (ex02's mistakes, and the attention of the encoder's
wiring mistakes). With the default switches each computes what the reference computes.

Dimension legend: B batch, H heads, L queries, S keys, D d_model, Dk/Dv per-head sizes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["HeadsVariant", "attention_variant"]


def attention_variant(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    scale: str = "sqrt_dk",
    softmax_dim: int = -1,
    mask_mode: str = "fill",
    empty_rows: str = "zero",
    return_scores: bool = False,
) -> tuple[Tensor, Tensor]:
    """Attention with switches for the catalogued mistakes; the defaults are the correct
    computation. ``scale``: "sqrt_dk", "none", "dk" or "sqrt_dv"; ``mask_mode``: "fill"
    (-inf before softmax), "after" (zero the weights after softmax, no renormalising) or
    "inverted" (hide the True positions); ``empty_rows``: "zero", "nan" (leave softmax's NaN)
    or "uniform" (a large finite fill, so a fully hidden row averages every value)."""
    d_k, d_v = query.size(-1), value.size(-1)
    divisor = {"sqrt_dk": math.sqrt(d_k), "none": 1.0, "dk": float(d_k), "sqrt_dv": math.sqrt(d_v)}
    scores = query @ key.transpose(-2, -1) / divisor[scale]  # (..., L, S)
    allowed = None if mask is None else (~mask if mask_mode == "inverted" else mask)
    if allowed is not None and mask_mode != "after":
        fill = float("-inf") if empty_rows != "uniform" else -1e9
        scores = scores.masked_fill(~allowed, fill)
    weights = torch.softmax(scores, dim=softmax_dim)  # (..., L, S)
    if allowed is not None and (mask_mode == "after" or empty_rows == "zero"):
        weights = weights.masked_fill(~allowed, 0.0)
    return weights @ value, scores if return_scores else weights  # (..., L, Dv), (..., L, S)


class HeadsVariant(nn.Module):
    """Multi-head attention with switches for the catalogued mistakes (class attributes); the
    defaults are the correct computation. ex02's catalogue switches one each; the encoder's
    wiring mistakes use the correct one as their attention block."""

    split = "transpose"  # or "reshape": (B, n, D) viewed as (B, H, n, Dk) directly
    merge = "transpose"  # or "reshape": (B, H, L, Dk) viewed as (B, L, D) directly
    scale = "sqrt_dk"  # or "sqrt_d_model"
    inverted = False
    has_out_proj = True
    self_only = False  # keys and values projected from the query (self-attention only)
    empty_rows = "zero"  # or "uniform": a finite fill, so a fully masked query averages values

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        if self.has_out_proj:
            self.out_proj = nn.Linear(d_model, d_model)

    def _heads(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        if self.split == "reshape":
            return x.reshape(b, self.n_heads, n, d // self.n_heads)  # (B, H, n, Dk)
        return x.reshape(b, n, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B, H, n, Dk)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        b, n_q, d = query.shape
        if self.self_only:
            key = value = query
        q = self._heads(self.q_proj(query))  # (B, H, L, Dk)
        k = self._heads(self.k_proj(key))  # (B, H, S, Dk)
        v = self._heads(self.v_proj(value))  # (B, H, S, Dk)
        if self.scale == "sqrt_d_model":
            # The kernel divides by sqrt(Dk); this makes the net divisor sqrt(D).
            q = q * math.sqrt(q.size(-1) / d)
        out, _ = attention_variant(
            q,
            k,
            v,
            mask,
            mask_mode="inverted" if self.inverted else "fill",
            empty_rows=self.empty_rows,
        )  # (B, H, L, Dk)
        if self.merge == "reshape":
            out = out.reshape(b, n_q, d)  # (B, L, D)
        else:
            out = out.transpose(1, 2).reshape(b, n_q, d)  # (B, L, D)
        return self.out_proj(out) if self.has_out_proj else out
