"""The catalogue of ex11_modern_block: the known mistakes of today's decoder block (RMSNorm,
rotary positions, SwiGLU, grouped-query attention and the pre-norm block). Each is a wrong
function with the stub's signature (``apply_rope``) or a wrong forward: a subclass of the
reference (or of it as :mod:`..framework.modern_blocks` calls it) overriding the one step it
gets wrong, named ``<Class>_<mistake>`` for the parameter table, rerun on the student's inputs.

Dimension legend: B batch, L length, D d_model, H query heads, Hkv key/value heads, Dh per-head
width, F hidden width of the feed-forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ...attention import fused_attention
from ...layers import RMSNorm
from ...positional import RopeAngles, apply_rope
from ..framework import BugVariant
from ..framework.modern_blocks import (
    DictCache,
    PreNormBlock,
    ReferenceSwiGLU,
    RotaryGQABlock,
    inv_freq,
    pair_index,
    rope_angles,
    rotate_halves,
    rotate_interleaved,
    rotate_pairs,
)

__all__ = [
    "BUGS",
    "GQA_BUGS",
    "GQA_ITEM",
    "MODERN_BLOCK_BUGS",
    "MODERN_BLOCK_ITEM",
    "RMS_NORM_BUGS",
    "RMS_NORM_ITEM",
    "ROPE_BUGS",
    "ROPE_ITEM",
    "SWIGLU_BUGS",
    "SWIGLU_ITEM",
]

RMS_NORM_ITEM = "RMSNorm"
ROPE_ITEM = "apply_rope"
SWIGLU_ITEM = "SwiGLU"
GQA_ITEM = "GroupedQueryAttention"
MODERN_BLOCK_ITEM = "ModernDecoderBlock"

Mask = Tensor | None
Cache = dict[str, Tensor] | None
Projected = tuple[Tensor, Tensor, Tensor]
Cached = DictCache | None

# --- RMSNorm ---------------------------------------------------------------------------------


class RMSNorm_subtracts_mean(RMSNorm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D): LayerNorm's centring
        mean_square = centred.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
        return centred / torch.sqrt(mean_square + self.eps) * self.weight


class RMSNorm_eps_outside_root(RMSNorm):
    def forward(self, x: Tensor) -> Tensor:
        rms = x.pow(2).mean(dim=-1, keepdim=True).sqrt()  # (..., 1)
        return x / (rms + self.eps) * self.weight  # (..., D)


class RMSNorm_mean_over_wrong_axis(RMSNorm):
    def forward(self, x: Tensor) -> Tensor:
        mean_square = x.pow(2).mean(dim=1, keepdim=True)  # (B, 1, D): over the positions
        return x / torch.sqrt(mean_square + self.eps) * self.weight  # (B, L, D)


class RMSNorm_l2_norm_not_rms(RMSNorm):
    def forward(self, x: Tensor) -> Tensor:
        norm = x.norm(dim=-1, keepdim=True)  # (..., 1): sqrt of the sum, not of the mean
        return x / (norm + self.eps) * self.weight  # (..., D)


class RMSNorm_gain_before_norm(RMSNorm):
    def forward(self, x: Tensor) -> Tensor:
        x = x * self.weight  # (..., D): scaled first, then normalised
        return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)


RMS_NORM_BUGS: list[BugVariant] = [
    BugVariant(
        "rms_norm.subtracts_mean",
        RMS_NORM_ITEM,
        "your RMSNorm subtracts the mean first, as LayerNorm does: RMSNorm only rescales each "
        "row by its root mean square, it never centres it",
        "Divide x itself by sqrt(mean(x**2) + eps) over the last axis; do not subtract x.mean().",
        RMSNorm_subtracts_mean,
    ),
    BugVariant(
        "rms_norm.eps_outside_root",
        RMS_NORM_ITEM,
        "eps is added after the square root, sqrt(mean(x**2)) + eps, instead of inside it; "
        "rows of small values come out different",
        "Compute torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) (or torch.rsqrt of it): "
        "eps goes inside the root.",
        RMSNorm_eps_outside_root,
    ),
    BugVariant(
        "rms_norm.mean_over_wrong_axis",
        RMS_NORM_ITEM,
        "the mean of the squares is taken over the positions (dim=1), not over the features "
        "of each position (the last axis)",
        "Average over the last axis: x.pow(2).mean(dim=-1, keepdim=True), one number per row.",
        RMSNorm_mean_over_wrong_axis,
    ),
    BugVariant(
        "rms_norm.l2_norm_not_rms",
        RMS_NORM_ITEM,
        "each row is divided by its Euclidean norm (x.norm(dim=-1) or F.normalize), the root "
        "of the sum of the squares, not of their mean: the output is sqrt(D) times too small",
        "Divide by sqrt(mean(x**2) + eps): the mean over the D features, not their sum.",
        RMSNorm_l2_norm_not_rms,
    ),
    BugVariant(
        "rms_norm.gain_before_norm",
        RMS_NORM_ITEM,
        "the gain `weight` multiplies x before the normalisation, which divides most of it out",
        "Normalise first, then scale: x / sqrt(mean(x**2) + eps) * weight.",
        RMSNorm_gain_before_norm,
    ),
]

# --- apply_rope ------------------------------------------------------------------------------


def rope_interleaved_pairs(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """Adjacent columns (2i, 2i+1) paired whatever ``pairs`` asks."""
    inv_freq = theta ** (-2 * pair_index(x) / x.size(-1))  # (Dh/2,)
    return rotate_interleaved(x, rope_angles(positions, inv_freq))


def rope_halves_pairs(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """Column i paired with column i + Dh/2 whatever ``pairs`` asks."""
    inv_freq = theta ** (-2 * pair_index(x) / x.size(-1))  # (Dh/2,)
    return rotate_halves(x, rope_angles(positions, inv_freq))


def rope_exponent_missing_two(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """w_i = theta^(-i/Dh): the factor 2 of the exponent left out."""
    inv_freq = theta ** (-pair_index(x) / x.size(-1))  # (Dh/2,)
    return rotate_pairs(x, rope_angles(positions, inv_freq), pairs)


def rope_exponent_doubled(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """w_i = theta^(-4i/Dh): arange(0, Dh, 2) already counts 2i, and it is doubled again."""
    two_i = torch.arange(0, x.size(-1), 2, dtype=torch.float64)  # (Dh/2,): 2i
    inv_freq = theta ** (-2 * two_i / x.size(-1))  # (Dh/2,)
    return rotate_pairs(x, rope_angles(positions, inv_freq), pairs)


def rope_wrong_direction(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """Every pair turned by -pos * w_i: (a cos + b sin, -a sin + b cos)."""
    return rotate_pairs(x, -rope_angles(positions, inv_freq(x, theta)), pairs)


def rope_theta_ignored(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """The base fixed at 10000, whatever theta is given."""
    return rotate_pairs(x, rope_angles(positions, inv_freq(x, 10000.0)), pairs)


def rope_positions_ignored(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """The rows turned as positions 0 .. L-1, whatever positions are given."""
    return rotate_pairs(x, rope_angles(torch.arange(x.size(-2)), inv_freq(x, theta)), pairs)


def rope_frequencies_inverted(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """w_i = theta^(+2i/Dh): the minus sign (or the 1 /) of the exponent left out."""
    return rotate_pairs(x, rope_angles(positions, 1 / inv_freq(x, theta)), pairs)


def rope_angles_in_other_layout(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """The columns paired as ``pairs`` asks, the table of angles per column the other's."""
    d = x.size(-1)
    angles = rope_angles(positions, inv_freq(x, theta))  # (L, Dh/2)
    if pairs == "halves":
        per_column = angles.repeat_interleave(2, dim=-1)  # (L, Dh): the interleaved table
        turned = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)  # (B, H, L, Dh)
    else:
        per_column = torch.cat([angles, angles], dim=-1)  # (L, Dh): the halves' table
        turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)  # (B, H, L, Dh)
    out = x.double() * per_column.cos() + turned.double() * per_column.sin()
    return out.to(x.dtype)  # (B, H, L, Dh)


ROPE_BUGS: list[BugVariant] = [
    BugVariant(
        "rope.interleaved_pairs",
        ROPE_ITEM,
        "you paired adjacent columns (2i, 2i+1), the RoFormer paper's interleaved layout, "
        "where pairs='halves' asks for column i with column i + Dh/2 (Hugging Face's "
        "rotate-half layout, Llama's and Qwen's)",
        "For pairs='halves' split x into x[..., :Dh//2] and x[..., Dh//2:] and rotate those "
        "two halves; keep x[..., 0::2] and x[..., 1::2] for pairs='interleaved'.",
        rope_interleaved_pairs,
    ),
    BugVariant(
        "rope.halves_pairs",
        ROPE_ITEM,
        "you paired column i with column i + Dh/2 (the rotate-half layout), where "
        "pairs='interleaved' asks for adjacent columns (2i, 2i+1), the RoFormer paper's layout",
        "For pairs='interleaved' rotate x[..., 0::2] with x[..., 1::2] and put the results "
        "back in alternate columns (torch.stack([...], dim=-1).flatten(-2)).",
        rope_halves_pairs,
    ),
    BugVariant(
        "rope.exponent_missing_two",
        ROPE_ITEM,
        "the frequencies are theta^(-i/Dh) for pair i: the factor 2 of theta^(-2i/Dh) is "
        "missing, so every pair turns too fast",
        "Use w_i = theta ** (-2 * i / Dh) with i = 0 .. Dh/2 - 1 (or theta ** (-torch.arange"
        "(0, Dh, 2) / Dh)).",
        rope_exponent_missing_two,
    ),
    BugVariant(
        "rope.exponent_doubled",
        ROPE_ITEM,
        "the frequencies are theta^(-4i/Dh): torch.arange(0, Dh, 2) already counts 2i, and the "
        "exponent doubles it again, so the slow pairs turn far too slowly",
        "With two_i = torch.arange(0, Dh, 2) the frequency is theta ** (-two_i / Dh); with "
        "i = torch.arange(Dh // 2) it is theta ** (-2 * i / Dh). Not both.",
        rope_exponent_doubled,
    ),
    BugVariant(
        "rope.wrong_direction",
        ROPE_ITEM,
        "every pair turns the other way (by -pos * w_i): the sign of the sine is swapped, "
        "as with rotate_half written cat([x2, -x1]) instead of cat([-x2, x1])",
        "A pair (a, b) turned by t becomes (a cos t - b sin t, a sin t + b cos t): the first "
        "part loses b sin t, the second gains a sin t.",
        rope_wrong_direction,
    ),
    BugVariant(
        "rope.theta_ignored",
        ROPE_ITEM,
        "the base of the frequencies is fixed at 10000: the theta given (500000 in Llama 3) is "
        "never used",
        "Compute w_i = theta ** (-2 * i / Dh) from the theta argument.",
        rope_theta_ignored,
    ),
    BugVariant(
        "rope.positions_ignored",
        ROPE_ITEM,
        "the rows are turned as positions 0 .. L-1 (torch.arange(L)) instead of the positions "
        "given, which start after the cached ones with a KV cache",
        "Use the positions argument for the angles: angle = positions[:, None] * w[None, :].",
        rope_positions_ignored,
    ),
    BugVariant(
        "rope.frequencies_inverted",
        ROPE_ITEM,
        "the frequencies are theta^(+2i/Dh), growing with i: the minus sign of the exponent "
        "(or the 1 / of inv_freq) is missing",
        "w_i = 1 / theta ** (2 * i / Dh): pair 0 turns fastest (w_0 = 1), the last slowest.",
        rope_frequencies_inverted,
    ),
    BugVariant(
        "rope.angles_in_other_layout",
        ROPE_ITEM,
        "the columns are paired as asked, but the cos/sin table per column is the other "
        "layout's, so the two columns of a pair turn by different angles",
        "Give both columns of a pair the same angle: cat([angles, angles], -1) for the halves "
        "(column i with i + Dh/2), angles.repeat_interleave(2, -1) for adjacent pairs.",
        rope_angles_in_other_layout,
    ),
]

# --- SwiGLU ----------------------------------------------------------------------------------


class SwiGLU_gate_on_wrong_branch(ReferenceSwiGLU):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.linear1(x) * F.silu(self.linear3(x)))  # SiLU on W3 x


class SwiGLU_sigmoid_gate(ReferenceSwiGLU):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(torch.sigmoid(self.linear1(x)) * self.linear3(x))  # GLU's gate


SWIGLU_BUGS: list[BugVariant] = [
    BugVariant(
        "swiglu.gate_on_wrong_branch",
        SWIGLU_ITEM,
        "SiLU is applied to the linear branch linear3(x) instead of the gate linear1(x): "
        "with Llama's weights (gate_proj = linear1, up_proj = linear3) the outputs differ",
        "Compute linear2(F.silu(linear1(x)) * linear3(x)): linear1 is the gate that goes "
        "through SiLU, linear3 stays linear.",
        SwiGLU_gate_on_wrong_branch,
    ),
    BugVariant(
        "swiglu.sigmoid_gate",
        SWIGLU_ITEM,
        "the gate goes through a sigmoid (GLU), not through SiLU(z) = z * sigmoid(z)",
        "Use F.silu(linear1(x)) (z * torch.sigmoid(z)), not torch.sigmoid(linear1(x)).",
        SwiGLU_sigmoid_gate,
    ),
]

# --- GroupedQueryAttention -------------------------------------------------------------------


class GroupedQueryAttention_rope_on_values(RotaryGQABlock):
    def _project(self, query: Tensor, key: Tensor, value: Tensor, cache: Cached) -> Projected:
        q, k, v = super()._project(query, key, value, cache)
        at = self.positions(v.size(2), None if cache is None else cache.store)  # (S,)
        return q, k, self.rope(at).rotate(v)  # the values turned as well (q and k later)


class GroupedQueryAttention_positions_not_offset(RotaryGQABlock):
    def positions(self, length: int, cache: dict[str, Tensor] | None) -> Tensor:
        return torch.arange(length)  # (L,): from 0 at every call, cache or not


class GroupedQueryAttention_kv_repeat_not_interleave(RotaryGQABlock):
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Mask) -> Tensor:
        k, v = (t.repeat(1, self.n_heads // self.n_kv_heads, 1, 1) for t in (k, v))  # 0, 1, 0, 1
        return fused_attention(q, k, v, mask, 0.0)  # (B, H, L, Dh)


class GroupedQueryAttention_rope_frequencies_over_model_width(RotaryGQABlock):
    def rope(self, positions: Tensor) -> RopeAngles:
        freqs = self.theta ** (-torch.arange(0, self.d_k, 2.0) / (self.n_heads * self.d_k))
        return RopeAngles(positions, freqs, self.pairs)  # w_i = theta^(-2i/D), not -2i/Dh


class GroupedQueryAttention_rope_before_head_split(RotaryGQABlock):
    def rope(self, positions: Tensor) -> None:
        return None  # nothing turned per head: _project turned the whole width

    def _project(self, query: Tensor, key: Tensor, value: Tensor, cache: Cached) -> Projected:
        at = self.positions(query.size(1), None if cache is None else cache.store)  # (L,)
        q = apply_rope(self.q_proj(query)[:, None], at, self.theta, self.pairs)[:, 0]
        k = apply_rope(self.k_proj(key)[:, None], at, self.theta, self.pairs)[:, 0]
        q = self._split(q, self.d_k)  # (B, H, L, Dh), turned as one (B, L, H*Dh) row
        k = self._split(k, self.d_k, self.n_kv_heads)  # (B, Hkv, L, Dh)
        return q, k, self._split(self.v_proj(value), self.d_v, self.n_kv_heads)


class GroupedQueryAttention_scale_by_model_width(RotaryGQABlock):
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Mask) -> Tensor:
        return super()._attend(q / self.n_heads**0.5, k, v, mask)  # scores / sqrt(D = H * Dh)


class GroupedQueryAttention_no_scaling(RotaryGQABlock):
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Mask) -> Tensor:
        return super()._attend(q * self.d_k**0.5, k, v, mask)  # scores q.k, never divided


class GroupedQueryAttention_inverted_mask(RotaryGQABlock):
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Mask) -> Tensor:
        return super()._attend(q, k, v, None if mask is None else ~mask)  # True read as hidden


class GroupedQueryAttention_masked_row_uniform(RotaryGQABlock):
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Mask) -> Tensor:
        k, v = (t.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1) for t in (k, v))
        scores = q @ k.transpose(-2, -1) / self.d_k**0.5  # (B, H, L, S)
        scores = scores if mask is None else scores.masked_fill(~mask, -1e9)  # finite fill
        return torch.softmax(scores, dim=-1) @ v  # (B, H, L, Dh)


class GroupedQueryAttention_heads_merged_without_transpose(RotaryGQABlock):
    def _merge_heads(self, out: Tensor) -> Tensor:
        b, _, n, _ = out.shape
        return out.reshape(b, n, -1)  # (B, H, L, Dh) read as (B, L, H*Dh): rows mixed up


class GroupedQueryAttention_empty_cache_not_filled(RotaryGQABlock):
    def forward(self, x: Tensor, mask: Mask = None, cache: Cache = None) -> Tensor:
        return super().forward(x, mask, cache if cache else None)  # `if cache:`: {} never filled


GQA_BUGS: list[BugVariant] = [
    BugVariant(
        "gqa.rope_on_values",
        GQA_ITEM,
        "the values are rotated too: RoPE turns queries and keys so that their dot product "
        "depends on the offset; the values carry content and must stay as projected",
        "Apply your apply_rope to q and k only; use v = v_proj(x) split into heads unchanged.",
        GroupedQueryAttention_rope_on_values,
    ),
    BugVariant(
        "gqa.positions_not_offset",
        GQA_ITEM,
        "with the KV cache the new tokens are rotated as positions 0, 1, ... again instead "
        "of continuing after the cached ones, so decoding step by step differs from running "
        "the whole sequence",
        "Start the positions at the number of cached keys: positions = torch.arange(start, "
        "start + L) with start = cache['k'].size(2) when the cache holds keys (else 0).",
        GroupedQueryAttention_positions_not_offset,
    ),
    BugVariant(
        "gqa.kv_repeat_not_interleave",
        GQA_ITEM,
        "the key/value heads are repeated with .repeat (heads 0, 1, 0, 1, ...) instead of "
        "repeat_interleave (0, 0, 1, 1, ...): query head h must read key/value head "
        "h // (H / Hkv), as Llama's repeat_kv does",
        "Use k.repeat_interleave(n_heads // n_kv_heads, dim=1) (and the same for v), or "
        "expand (B, Hkv, 1, S, Dh) to (B, Hkv, r, S, Dh) and reshape to (B, H, S, Dh).",
        GroupedQueryAttention_kv_repeat_not_interleave,
    ),
    BugVariant(
        "gqa.rope_frequencies_over_model_width",
        GQA_ITEM,
        "the rotary frequencies are computed over the model width D instead of the head "
        "width Dh (theta^(-2i/D)): each head has Dh/2 pairs, and pair i turns at "
        "theta^(-2i/Dh)",
        "Compute the frequencies from the head width: apply_rope on (B, H, L, Dh) uses "
        "x.shape[-1] = Dh, never d_model.",
        GroupedQueryAttention_rope_frequencies_over_model_width,
    ),
    BugVariant(
        "gqa.rope_before_head_split",
        GQA_ITEM,
        "RoPE is applied to the whole projection (B, L, H·Dh) before it is split into heads, "
        "so the pairs and frequencies run across the heads instead of starting again in "
        "each head",
        "Split q_proj(x) and k_proj(x) into heads first, (B, heads, L, Dh), then rotate each "
        "head's Dh columns.",
        GroupedQueryAttention_rope_before_head_split,
    ),
    BugVariant(
        "gqa.scale_by_model_width",
        GQA_ITEM,
        "the scores are divided by sqrt(D), the model width, instead of sqrt(Dh), the width "
        "of one head",
        "Divide q @ k^T by math.sqrt(Dh) with Dh = d_model // n_heads.",
        GroupedQueryAttention_scale_by_model_width,
    ),
    BugVariant(
        "gqa.no_scaling",
        GQA_ITEM,
        "the scores q @ k^T are not divided by sqrt(Dh)",
        "Divide the scores by math.sqrt(Dh) before the mask and the softmax.",
        GroupedQueryAttention_no_scaling,
    ),
    BugVariant(
        "gqa.inverted_mask",
        GQA_ITEM,
        "the mask is read the other way round (True = hidden, as nn.MultiheadAttention's); "
        "the course's masks say True = may attend",
        "Hide the keys where the mask is False: scores.masked_fill(~mask, float('-inf')).",
        GroupedQueryAttention_inverted_mask,
    ),
    BugVariant(
        "gqa.masked_row_uniform",
        GQA_ITEM,
        "hidden keys get a large finite score (-1e9) instead of -inf: a query that may attend "
        "no key then averages every value uniformly instead of giving zeros",
        "Fill with float('-inf') and set the weights of hidden keys to 0 after the softmax "
        "(weights.masked_fill(~mask, 0.0)), so a fully masked row gives zeros, never NaN.",
        GroupedQueryAttention_masked_row_uniform,
    ),
    BugVariant(
        "gqa.heads_merged_without_transpose",
        GQA_ITEM,
        "the heads' outputs (B, H, L, Dh) are reshaped to (B, L, H*Dh) without moving the "
        "head axis after the positions first, which mixes positions and heads",
        "Merge with out.transpose(1, 2).reshape(B, L, H * Dh) (or .contiguous().view(...)).",
        GroupedQueryAttention_heads_merged_without_transpose,
    ),
    BugVariant(
        "gqa.empty_cache_not_filled",
        GQA_ITEM,
        "an empty cache dict is never filled: `if cache:` is false for {}, so no call stores "
        "its keys and values and each new token attends to itself only",
        "Test `if cache is not None:` to store the keys and values, and `'k' in cache` to "
        "know whether earlier ones are there.",
        GroupedQueryAttention_empty_cache_not_filled,
    ),
]

# --- The pre-norm block ----------------------------------------------------------------------


class ModernDecoderBlock_residual_after_norm(PreNormBlock):
    def forward(self, x: Tensor, mask: Mask = None, cache: Cache = None) -> Tensor:
        h = self.norm1(x)  # (B, L, D)
        x = h + self.self_attn(h, mask, cache)  # the residual starts from the normed x
        h = self.norm2(x)
        return h + self.ffn(h)  # (B, L, D)


class ModernDecoderBlock_post_norm(PreNormBlock):
    def forward(self, x: Tensor, mask: Mask = None, cache: Cache = None) -> Tensor:
        x = self.norm1(x + self.self_attn(x, mask, cache))  # the original Transformer's order
        return self.norm2(x + self.ffn(x))  # (B, L, D)


class ModernDecoderBlock_parallel_branches(PreNormBlock):
    def forward(self, x: Tensor, mask: Mask = None, cache: Cache = None) -> Tensor:
        attended = self.self_attn(self.norm1(x), mask, cache)  # (B, L, D)
        return x + attended + self.ffn(self.norm2(x))  # both branches read the same x


class ModernDecoderBlock_cache_not_passed(PreNormBlock):
    def forward(self, x: Tensor, mask: Mask = None, cache: Cache = None) -> Tensor:
        x = x + self.self_attn(self.norm1(x), mask)  # the cache never reaches the attention
        return x + self.ffn(self.norm2(x))  # (B, L, D)


class ModernDecoderBlock_mask_not_passed(PreNormBlock):
    def forward(self, x: Tensor, mask: Mask = None, cache: Cache = None) -> Tensor:
        x = x + self.self_attn(self.norm1(x), None, cache)  # the mask never reaches it
        return x + self.ffn(self.norm2(x))  # (B, L, D)


class ModernDecoderBlock_norms_swapped(PreNormBlock):
    def forward(self, x: Tensor, mask: Mask = None, cache: Cache = None) -> Tensor:
        x = x + self.self_attn(self.norm2(x), mask, cache)  # norm2 before the attention
        return x + self.ffn(self.norm1(x))  # (B, L, D)


MODERN_BLOCK_BUGS: list[BugVariant] = [
    BugVariant(
        "modern_block.residual_after_norm",
        MODERN_BLOCK_ITEM,
        "the residual is taken after the norm (x = norm(x); x = x + attn(x)), so the "
        "un-normalised stream never reaches the output: in a pre-norm block only the branch "
        "sees the normed input",
        "Keep x as it is and add the branch to it: x = x + self_attn(norm1(x), mask, cache), "
        "then x = x + ffn(norm2(x)).",
        ModernDecoderBlock_residual_after_norm,
    ),
    BugVariant(
        "modern_block.post_norm",
        MODERN_BLOCK_ITEM,
        "the norms come after the residual additions (x = norm1(x + attn(x))), the original "
        "Transformer's post-norm order, where this block is pre-norm",
        "Normalise the branch's input and leave the stream alone: "
        "x = x + self_attn(norm1(x), mask, cache), then x = x + ffn(norm2(x)).",
        ModernDecoderBlock_post_norm,
    ),
    BugVariant(
        "modern_block.parallel_branches",
        MODERN_BLOCK_ITEM,
        "the attention and the feed-forward both read the block's input (GPT-J's parallel "
        "block), where the feed-forward reads the stream after the attention's output is added",
        "Run them one after the other: x = x + self_attn(norm1(x), ...), then "
        "x = x + ffn(norm2(x)) on that new x.",
        ModernDecoderBlock_parallel_branches,
    ),
    BugVariant(
        "modern_block.cache_not_passed",
        MODERN_BLOCK_ITEM,
        "the cache is not passed on to self_attn, so decoding one token at a time attends "
        "to nothing before it",
        "Call self.self_attn(self.norm1(x), mask, cache): the block only hands the cache on.",
        ModernDecoderBlock_cache_not_passed,
    ),
    BugVariant(
        "modern_block.mask_not_passed",
        MODERN_BLOCK_ITEM,
        "the mask is not passed on to self_attn, so every position attends to every other, "
        "later and padded ones included",
        "Call self.self_attn(self.norm1(x), mask, cache): the block hands the mask on.",
        ModernDecoderBlock_mask_not_passed,
    ),
    BugVariant(
        "modern_block.norms_swapped",
        MODERN_BLOCK_ITEM,
        "norm2 normalises the attention's input and norm1 the feed-forward's: with gains "
        "other than ones the two sub-layers see the wrong scales",
        "norm1 goes before self_attn and norm2 before ffn, as the parameter names say.",
        ModernDecoderBlock_norms_swapped,
    ),
]

BUGS: list[BugVariant] = [*RMS_NORM_BUGS, *ROPE_BUGS, *SWIGLU_BUGS, *GQA_BUGS, *MODERN_BLOCK_BUGS]
