"""The catalogue of ex02_multihead: the known mistakes of ``MultiHeadAttention``. Each is a
wrong forward: a subclass of the reference :class:`~coursepkg.attention.MultiHeadAttention`
that overrides the one step it gets wrong (split, attend, merge, the projections; the
evidence: the check builds it with the student's arguments, gives it the reference's weights,
reruns it on the student's inputs and compares outputs; a missing projection also shows in the
parameter table), with its id and the story and advice a student reads when their output
matches it. The mistakes named by a built-in call are not built on the reference: the tests run
them as a student's code, and a student's class may not contain the reference.

Dimension legend: B batch, H heads, L queries, S keys, D d_model, Dk per-head size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...attention import MultiHeadAttention
from ...kv_cache import AttentionCache
from ...positional import RopeAngles
from ..framework import BugVariant, HeadsBlock, call_student

__all__ = ["BUGS", "MHA_BUGS", "MHA_ITEM"]

MHA_ITEM = "MultiHeadAttention"

# The class names (MultiHeadAttention_<mistake>) are what a parameter table shows for a variant.
# The reference's attention step runs the fused kernel; the catalogue's verdicts compare
# outputs at DIAGNOSE_TOLERANCE (1e-3, 1e-4), far above its float difference to the textbook
# kernel (~1e-7), so the mistakes that keep the reference's step need no textbook copy.


class MultiHeadAttention_split_without_transpose(MultiHeadAttention):
    def _split(self, x: Tensor, size: int, heads: int | None = None) -> Tensor:
        """(B, n, heads*size) viewed as (B, heads, n, size) directly: positions and features
        mixed."""
        b, n, _ = x.shape
        heads = self.n_heads if heads is None else heads
        return x.reshape(b, heads, n, size)  # (B, heads, n, size)


class MultiHeadAttention_merge_wrong_order(MultiHeadAttention):
    def _merge_heads(self, out: Tensor) -> Tensor:
        """(B, H, L, Dv) viewed as (B, L, H*Dv) without moving the head axis back."""
        b, h, n, d_v = out.shape
        return out.reshape(b, n, h * d_v)  # (B, L, H*Dv)


class MultiHeadAttention_no_output_projection(MultiHeadAttention):
    def __init__(self, d_model: int, n_heads: int) -> None:
        """The three input projections only: W^O is never built, the merged heads are the
        output."""
        super().__init__(d_model, n_heads)
        self.out_proj = nn.Identity()  # no weight, no bias: (B, L, D) as it is


class MultiHeadAttention_scale_by_d_model(MultiHeadAttention):
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Scores divided by sqrt(D): the kernel divides by sqrt(Dk), this makes it sqrt(D)."""
        scale = math.sqrt(q.size(-1) / self.d_model)
        return super()._attend(q * scale, k, v, mask)  # (B, H, L, Dk)


class MultiHeadAttention_inverted_mask(MultiHeadAttention):
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """True read as blocked."""
        return super()._attend(q, k, v, None if mask is None else ~mask)  # (B, H, L, Dk)


class MultiHeadAttention_ignores_key_value(MultiHeadAttention):
    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        cache: AttentionCache | None = None,
        rope: RopeAngles | None = None,
    ) -> Tensor:
        """Keys and values projected from the query: self-attention only."""
        return super().forward(query, query, query, mask, cache, rope)  # (B, L, D)


class MultiHeadAttention_masked_row_uniform(MultiHeadAttention):
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """A finite fill (-1e9) and no zeroing: a fully masked query averages the values."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, L, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e9)
        return torch.softmax(scores, dim=-1) @ v  # (B, H, L, Dk)


class MultiHeadAttention_no_bias(MultiHeadAttention):
    def __init__(self, d_model: int, n_heads: int) -> None:
        """The four projections without biases (D2L's default, nanoGPT's bias=False)."""
        super().__init__(d_model, n_heads, bias=False)


class MultiHeadAttention_no_qkv_bias(MultiHeadAttention_no_bias):
    def __init__(self, d_model: int, n_heads: int) -> None:
        """Q, K and V without biases, the output projection with one (qkv_bias=False)."""
        super().__init__(d_model, n_heads)
        self.out_proj = nn.Linear(d_model, d_model)


class MultiHeadAttention_builtin_sdpa(HeadsBlock):
    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """PyTorch's fused kernel where the exercise asks for the steps."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, L, Dk)


class MultiHeadAttention_builtin_multihead_attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        """PyTorch's whole block, wrapped."""
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        blocked = None if mask is None else ~mask  # nn.MultiheadAttention: True = blocked
        return self.attn(query, key, value, attn_mask=blocked, need_weights=False)[0]


def queries_carry_no_bias(module: nn.Module, args: tuple[int, ...]) -> bool:
    """Evidence that Q has no bias, whatever the projections are called: with a zero query
    the scores are all zero (softmax uniform), so the keys cannot change the output; a
    query bias b_q makes the scores b_q . k depend on them."""
    d = args[0]
    gen = torch.Generator().manual_seed(0)
    zero = torch.zeros(2, 3, d)  # (B, L, D)
    keys = [torch.randn(2, 4, d, generator=gen) for _ in range(2)]  # (B, S, D) each
    value = torch.randn(2, 4, d, generator=gen)  # (B, S, D)
    first, second = (call_student(module, zero, k, value, None, item=MHA_ITEM) for k in keys)
    return bool(torch.allclose(first, second, atol=1e-5))


def attention_without_bias(module: nn.Module, args: tuple[int, ...]) -> bool:
    """Evidence that none of the four projections has a bias: the queries carry none
    (:func:`queries_carry_no_bias`), and zero values give a zero output, where the value and
    output biases would add W^O b_V + b_O. (A bias of K only shifts every score of a query by
    the same amount: the parameter count is its evidence.)"""
    d = args[0]
    gen = torch.Generator().manual_seed(1)
    query, key = torch.randn(2, 3, d, generator=gen), torch.randn(2, 4, d, generator=gen)
    out = call_student(module, query, key, torch.zeros(2, 4, d), None, item=MHA_ITEM)
    return queries_carry_no_bias(module, args) and bool(out.abs().max() <= 1e-6)


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

MHA_BUGS += [
    BugVariant(
        "mha.no_bias",
        MHA_ITEM,
        "your projections have no biases (nn.Linear(..., bias=False), D2L's and nanoGPT's "
        "habit): zero queries leave the output blind to the keys and zero values give a zero "
        "output, and your module has 4·D fewer parameters; this exercise's q_proj, k_proj, "
        "v_proj and out_proj are nn.Linear(d_model, d_model) with biases",
        "Build the four projections as nn.Linear(d_model, d_model), whose bias is on by "
        "default (drop bias=False).",
        MultiHeadAttention_no_bias,
        shows=attention_without_bias,
    ),
    BugVariant(
        "mha.no_qkv_bias",
        MHA_ITEM,
        "your query, key and value projections have no biases (qkv_bias=False, the habit of "
        "Raschka's book): zero queries leave the output blind to the keys, and your module has "
        "3·D fewer parameters; this exercise's q_proj, k_proj and v_proj have biases",
        "Build q_proj, k_proj and v_proj as nn.Linear(d_model, d_model), with their default "
        "bias (drop bias=False / qkv_bias=False).",
        MultiHeadAttention_no_qkv_bias,
        shows=queries_carry_no_bias,
    ),
    BugVariant(
        "mha.builtin_sdpa",
        MHA_ITEM,
        "your MultiHeadAttention calls PyTorch's fused "
        "torch.nn.functional.scaled_dot_product_attention, where the exercise asks you to "
        "write the attention step yourself",
        "Compute softmax(Q K^T / sqrt(Dk)) V per head with matmul, masking and softmax.",
        MultiHeadAttention_builtin_sdpa,
        calls=(F.scaled_dot_product_attention,),
    ),
    BugVariant(
        "mha.builtin_multihead_attention",
        MHA_ITEM,
        "your MultiHeadAttention uses PyTorch's nn.MultiheadAttention, where the exercise asks "
        "you to write the block yourself",
        "Build q_proj, k_proj, v_proj and out_proj (nn.Linear) and write the heads' split, "
        "attention and merge yourself.",
        MultiHeadAttention_builtin_multihead_attention,
        calls=(nn.MultiheadAttention,),
    ),
]

BUGS: list[BugVariant] = [*MHA_BUGS]
