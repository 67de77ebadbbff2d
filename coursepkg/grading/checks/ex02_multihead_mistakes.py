"""The catalogue of ex02_multihead: the known mistakes of ``MultiHeadAttention``. Each is a
wrong forward: a subclass of the framework's correct :class:`HeadsBlock` that overrides the one
step it gets wrong (the evidence: the check builds it with the student's arguments, gives it the
reference's weights, reruns it on the student's inputs and compares outputs; a missing
projection also shows in the parameter table), with its id and the story and advice a student
reads when their output matches it.

Dimension legend: B batch, H heads, L queries, S keys, D d_model, Dk per-head size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..framework import BugVariant, HeadsBlock, masked_attention

__all__ = ["BUGS", "MHA_BUGS", "MHA_ITEM"]

MHA_ITEM = "MultiHeadAttention"

# The class names (MultiHeadAttention_<mistake>) are what a parameter table shows for a variant.


class MultiHeadAttention_split_without_transpose(HeadsBlock):
    def split(self, x: Tensor) -> Tensor:
        """(B, n, D) viewed as (B, H, n, Dk) directly: positions and features mixed."""
        b, n, d = x.shape
        return x.reshape(b, self.n_heads, n, d // self.n_heads)  # (B, H, n, Dk)


class MultiHeadAttention_merge_wrong_order(HeadsBlock):
    def merge(self, out: Tensor) -> Tensor:
        """(B, H, L, Dk) viewed as (B, L, D) without moving the head axis back."""
        b, h, n, d_k = out.shape
        return out.reshape(b, n, h * d_k)  # (B, L, D)


class MultiHeadAttention_no_output_projection(HeadsBlock):
    def __init__(self, d_model: int, n_heads: int) -> None:
        """The three input projections only: W^O is never built."""
        nn.Module.__init__(self)
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)

    def project_out(self, out: Tensor) -> Tensor:
        return out  # (B, L, D)


class MultiHeadAttention_scale_by_d_model(HeadsBlock):
    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Scores divided by sqrt(D): the kernel divides by sqrt(Dk), this makes it sqrt(D)."""
        d_model = q.size(-1) * self.n_heads
        return masked_attention(q * math.sqrt(q.size(-1) / d_model), k, v, mask)


class MultiHeadAttention_inverted_mask(HeadsBlock):
    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """True read as blocked."""
        return masked_attention(q, k, v, None if mask is None else ~mask)  # (B, H, L, Dk)


class MultiHeadAttention_ignores_key_value(HeadsBlock):
    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """Keys and values projected from the query: self-attention only."""
        return super().forward(query, query, query, mask)  # (B, L, D)


class MultiHeadAttention_masked_row_uniform(HeadsBlock):
    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """A finite fill (-1e9) and no zeroing: a fully masked query averages the values."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, L, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e9)
        return torch.softmax(scores, dim=-1) @ v  # (B, H, L, Dk)


MHA_BUGS: list[BugVariant] = [
    BugVariant(
        "mha.split_without_transpose",
        MHA_ITEM,
        "the heads are split with a plain reshape (B, L, D) -> (B, H, L, Dk), which mixes "
        "positions and features",
        "Reshape to (B, L, H, Dk) first, then transpose(1, 2) to get (B, H, L, Dk).",
        MultiHeadAttention_split_without_transpose,
    ),
    BugVariant(
        "mha.merge_wrong_order",
        MHA_ITEM,
        "the heads are merged in the wrong order: (B, H, L, Dk) is reshaped to (B, L, D) "
        "without moving the head axis back first",
        "Transpose (B, H, L, Dk) to (B, L, H, Dk), then reshape to (B, L, H*Dk) "
        "(call .contiguous() or use .reshape).",
        MultiHeadAttention_merge_wrong_order,
    ),
    BugVariant(
        "mha.no_output_projection",
        MHA_ITEM,
        "the output projection W^O (out_proj) is missing",
        "Add self.out_proj = nn.Linear(d_model, d_model) and apply it to the concatenated heads.",
        MultiHeadAttention_no_output_projection,
    ),
    BugVariant(
        "mha.scale_by_d_model",
        MHA_ITEM,
        "the scores are divided by sqrt(d_model) instead of sqrt(d_k) of one head",
        "Each head's dot products have Dk = d_model // n_heads terms: divide by math.sqrt(Dk).",
        MultiHeadAttention_scale_by_d_model,
    ),
    BugVariant(
        "mha.inverted_mask",
        MHA_ITEM,
        "the mask is read the wrong way round (True treated as blocked)",
        "True means may attend: fill the scores with -inf where the mask is False (~mask).",
        MultiHeadAttention_inverted_mask,
    ),
    BugVariant(
        "mha.ignores_key_value",
        MHA_ITEM,
        "your MultiHeadAttention ignores its key and value inputs: keys and values are "
        "projected from the query, so it can only attend to itself (the GPT-style "
        "self-attention habit), and cross-attention to the encoder's memory cannot work",
        "Project the arguments you are given: q = q_proj(query), k = k_proj(key), "
        "v = v_proj(value); with a fused projection, apply it to each input separately.",
        MultiHeadAttention_ignores_key_value,
    ),
    BugVariant(
        "mha.masked_row_uniform",
        MHA_ITEM,
        "a query whose keys are all masked averages all values instead of giving zero "
        "attention: a finite fill such as -1e9 or -1e4 (or torch.finfo().min) makes that "
        "row's softmax uniform",
        "After the softmax, set the weights of masked positions to 0 (weights.masked_fill("
        "~mask, 0.0)), or fill with float('-inf') and turn the NaN rows into zeros; a fully "
        "masked query must give a zero attention output.",
        MultiHeadAttention_masked_row_uniform,
    ),
]

BUGS: list[BugVariant] = [*MHA_BUGS]
