"""The catalogue of ex11_modern_block: the known mistakes of today's decoder block (RMSNorm,
rotary positions, the SwiGLU feed-forward, grouped-query attention and the pre-norm block that
assembles them). Each is either a wrong function with the stub's signature (``apply_rope``) or a
wrong forward: a subclass of a correct module written here (:class:`_RMSNorm`,
:class:`_SwiGLU`, :class:`RotaryGQABlock`, :class:`PreNormBlock`, with the reference's
parameter names) that overrides the one step it gets wrong. The evidence: the check reruns
the variant on the student's inputs (a module built with the student's arguments and the
reference's weights) and names the mistake only when the outputs match.

The class names (``GroupedQueryAttention_<mistake>``) are what a parameter table shows for a
variant. :class:`ReferenceGQA` and :class:`ReferenceBlock` are the reference's
:class:`~coursepkg.attention.MultiHeadAttention` (``n_kv_heads``, RoPE, no biases) and pre-norm
:class:`~coursepkg.layers.EncoderLayer`, called as the student's blocks are, for the checks
to compare with.

Dimension legend: B batch, L length, D d_model, H query heads, Hkv key/value heads, Dh per-head
width, F hidden width of the feed-forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...attention import MultiHeadAttention as _ReferenceMHA
from ...layers import EncoderLayer as _ReferenceLayer
from ...positional import RopeAngles, apply_rope, rope_frequencies
from ..framework import BugVariant, masked_attention

__all__ = [
    "BUGS",
    "GQA_BUGS",
    "GQA_ITEM",
    "MODERN_BLOCK_BUGS",
    "MODERN_BLOCK_ITEM",
    "PreNormBlock",
    "ReferenceBlock",
    "ReferenceGQA",
    "RMS_NORM_BUGS",
    "RMS_NORM_ITEM",
    "ROPE_BUGS",
    "ROPE_ITEM",
    "RotaryGQABlock",
    "SWIGLU_BUGS",
    "SWIGLU_ITEM",
]

RMS_NORM_ITEM = "RMSNorm"
ROPE_ITEM = "apply_rope"
SWIGLU_ITEM = "SwiGLU"
GQA_ITEM = "GroupedQueryAttention"
MODERN_BLOCK_ITEM = "ModernDecoderBlock"

# ---------------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------------


class _RMSNorm(nn.Module):
    """The correct RMSNorm, ``weight`` only; each catalogued mistake overrides its forward."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        mean_square = x.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
        return x / torch.sqrt(mean_square + self.eps) * self.weight  # (..., D)


class RMSNorm_subtracts_mean(_RMSNorm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D): LayerNorm's centring
        mean_square = centred.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
        return centred / torch.sqrt(mean_square + self.eps) * self.weight


class RMSNorm_eps_outside_root(_RMSNorm):
    def forward(self, x: Tensor) -> Tensor:
        rms = x.pow(2).mean(dim=-1, keepdim=True).sqrt()  # (..., 1)
        return x / (rms + self.eps) * self.weight  # (..., D)


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
]

# ---------------------------------------------------------------------------------------------
# apply_rope
# ---------------------------------------------------------------------------------------------


def _angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """pos * w_i for every position and pair, in float64."""
    return positions.to(torch.float64)[:, None] * inv_freq  # (L, Dh/2)


def _pair_index(x: Tensor) -> Tensor:
    return torch.arange(x.size(-1) // 2, dtype=torch.float64)  # (Dh/2,): pair i


def _rotate_halves(x: Tensor, angles: Tensor) -> Tensor:
    """Pair column i with column i + Dh/2 and turn each pair by its angle."""
    half = x.size(-1) // 2
    a, b = x[..., :half].double(), x[..., half:].double()  # (B, H, L, Dh/2) each
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).to(x.dtype)


def _rotate_interleaved(x: Tensor, angles: Tensor) -> Tensor:
    """Pair columns 2i and 2i+1 and turn each pair by its angle."""
    a, b = x[..., 0::2].double(), x[..., 1::2].double()  # (B, H, L, Dh/2) each
    cos, sin = angles.cos(), angles.sin()
    pairs = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)  # (B, H, L, Dh/2, 2)
    return pairs.flatten(-2).to(x.dtype)  # (B, H, L, Dh)


def rope_interleaved_pairs(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """Adjacent columns (2i, 2i+1) paired whatever ``pairs`` asks."""
    inv_freq = theta ** (-2 * _pair_index(x) / x.size(-1))  # (Dh/2,)
    return _rotate_interleaved(x, _angles(positions, inv_freq))


def rope_halves_pairs(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """Column i paired with column i + Dh/2 whatever ``pairs`` asks."""
    inv_freq = theta ** (-2 * _pair_index(x) / x.size(-1))  # (Dh/2,)
    return _rotate_halves(x, _angles(positions, inv_freq))


def _rotate(x: Tensor, angles: Tensor, pairs: str) -> Tensor:
    return _rotate_halves(x, angles) if pairs == "halves" else _rotate_interleaved(x, angles)


def rope_exponent_missing_two(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """w_i = theta^(-i/Dh): the factor 2 of the exponent left out."""
    inv_freq = theta ** (-_pair_index(x) / x.size(-1))  # (Dh/2,)
    return _rotate(x, _angles(positions, inv_freq), pairs)


def rope_exponent_doubled(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """w_i = theta^(-4i/Dh): arange(0, Dh, 2) already counts 2i, and it is doubled again."""
    two_i = torch.arange(0, x.size(-1), 2, dtype=torch.float64)  # (Dh/2,): 2i
    inv_freq = theta ** (-2 * two_i / x.size(-1))  # (Dh/2,)
    return _rotate(x, _angles(positions, inv_freq), pairs)


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
]

# ---------------------------------------------------------------------------------------------
# SwiGLU
# ---------------------------------------------------------------------------------------------


class _SwiGLU(nn.Module):
    """The correct gated feed-forward without biases: ``linear1`` (the gate, through SiLU),
    ``linear3`` (the linear branch), ``linear2`` (back to D)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=False)
        self.linear2 = nn.Linear(d_ff, d_model, bias=False)
        self.linear3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.silu(self.linear1(x)) * self.linear3(x))  # (B, L, D)


class SwiGLU_gate_on_wrong_branch(_SwiGLU):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.linear1(x) * F.silu(self.linear3(x)))  # SiLU on W3 x


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
]

# ---------------------------------------------------------------------------------------------
# GroupedQueryAttention
# ---------------------------------------------------------------------------------------------


class RotaryGQABlock(nn.Module):
    """The correct grouped-query self-attention with rotary positions and a dict KV cache,
    written in steps a catalogued mistake overrides one at a time."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        rope_theta: float = 10000.0,
        rope_pairs: str = "halves",
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.theta, self.pairs = rope_theta, rope_pairs
        self.q_proj = nn.Linear(d_model, n_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.out_proj = nn.Linear(n_heads * self.d_head, d_model, bias=False)

    def split(self, x: Tensor) -> Tensor:
        """(B, L, heads * Dh) -> (B, heads, L, Dh)."""
        b, n, width = x.shape
        return x.view(b, n, width // self.d_head, self.d_head).transpose(1, 2)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """RoPE on one head's queries or keys."""
        return apply_rope(x, positions, self.theta, self.pairs)  # (B, heads, L, Dh)

    def positions(self, length: int, cache: dict[str, Tensor] | None) -> Tensor:
        """The absolute positions of this call: after the cached ones."""
        start = 0 if cache is None or "k" not in cache else cache["k"].size(2)
        return torch.arange(start, start + length)  # (L,)

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries and keys rotated, values as they are."""
        q = self.rotate(self.split(self.q_proj(x)), positions)  # (B, H, L, Dh)
        k = self.rotate(self.split(self.k_proj(x)), positions)  # (B, Hkv, L, Dh)
        return q, k, self.split(self.v_proj(x))  # ..., (B, Hkv, L, Dh)

    def repeat_kv(self, x: Tensor) -> Tensor:
        """Key/value head g serves query heads g*r .. g*r + r - 1 (r = H / Hkv)."""
        return x.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)  # (B, H, S, Dh)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, cache: dict[str, Tensor] | None = None
    ) -> Tensor:
        b, n, _ = x.shape
        q, k, v = self.project(x, self.positions(n, cache))
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)  # (B, Hkv, S, Dh)
                v = torch.cat([cache["v"], v], dim=2)  # (B, Hkv, S, Dh)
            cache["k"], cache["v"] = k, v
        out = masked_attention(q, self.repeat_kv(k), self.repeat_kv(v), mask)  # (B, H, L, Dh)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, -1))  # (B, L, D)


class GroupedQueryAttention_rope_on_values(RotaryGQABlock):
    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().project(x, positions)
        return q, k, self.rotate(v, positions)  # the values turned as well


class GroupedQueryAttention_positions_not_offset(RotaryGQABlock):
    def positions(self, length: int, cache: dict[str, Tensor] | None) -> Tensor:
        return torch.arange(length)  # (L,): from 0 at every call, cache or not


class GroupedQueryAttention_kv_repeat_not_interleave(RotaryGQABlock):
    def repeat_kv(self, x: Tensor) -> Tensor:
        return x.repeat(1, self.n_heads // self.n_kv_heads, 1, 1)  # heads 0, 1, 0, 1, ...


class GroupedQueryAttention_rope_frequencies_over_model_width(RotaryGQABlock):
    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        d_model = self.n_heads * self.d_head
        inv_freq = self.theta ** (-2 * _pair_index(x) / d_model)  # (Dh/2,): 2i / D, not / Dh
        return _rotate(x, _angles(positions, inv_freq), self.pairs)


class GroupedQueryAttention_rope_before_head_split(RotaryGQABlock):
    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q = self.rotate(self.q_proj(x)[:, None], positions)[:, 0]  # (B, L, H*Dh) turned whole
        k = self.rotate(self.k_proj(x)[:, None], positions)[:, 0]  # (B, L, Hkv*Dh)
        return self.split(q), self.split(k), self.split(self.v_proj(x))


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
]

# ---------------------------------------------------------------------------------------------
# The pre-norm block
# ---------------------------------------------------------------------------------------------


class PreNormBlock(nn.Module):
    """The correct pre-norm block: x + attention(norm1(x)), then + ffn(norm2(x))."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        d_ff: int,
        eps: float = 1e-5,
        rope_theta: float = 10000.0,
        rope_pairs: str = "halves",
    ) -> None:
        super().__init__()
        self.norm1 = _RMSNorm(d_model, eps)
        self.self_attn = RotaryGQABlock(d_model, n_heads, n_kv_heads, rope_theta, rope_pairs)
        self.norm2 = _RMSNorm(d_model, eps)
        self.ffn = _SwiGLU(d_model, d_ff)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, cache: dict[str, Tensor] | None = None
    ) -> Tensor:
        x = x + self.self_attn(self.norm1(x), mask, cache)  # (B, L, D)
        return x + self.ffn(self.norm2(x))  # (B, L, D)


class ModernDecoderBlock_residual_after_norm(PreNormBlock):
    def forward(
        self, x: Tensor, mask: Tensor | None = None, cache: dict[str, Tensor] | None = None
    ) -> Tensor:
        h = self.norm1(x)  # (B, L, D)
        x = h + self.self_attn(h, mask, cache)  # the residual starts from the normed x
        h = self.norm2(x)
        return h + self.ffn(h)  # (B, L, D)


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
]

# ---------------------------------------------------------------------------------------------
# The reference, called as the student's blocks are: what the checks compare with
# ---------------------------------------------------------------------------------------------


def _rope(x: Tensor, head_dim: int, theta: float, pairs: str) -> RopeAngles:
    """The reference's rotary angles of positions 0 .. L-1 of ``x`` (B, L, D)."""
    return RopeAngles(torch.arange(x.size(1)), rope_frequencies(head_dim, theta), pairs)


class ReferenceGQA(_ReferenceMHA):
    """The reference's grouped-query attention without biases, called as the student's
    ``f(x, mask)`` with RoPE at positions 0 .. L-1 (the checks never give it a cache)."""

    def __init__(self, d: int, h: int, hkv: int, theta: float, pairs: str) -> None:
        super().__init__(d, h, bias=False, n_kv_heads=hkv)
        self.rope_args = (theta, pairs)

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: None = None) -> Tensor:
        return super().forward(x, x, x, mask, None, _rope(x, self.d_k, *self.rope_args))


class ReferenceBlock(_ReferenceLayer):
    """The reference's pre-norm layer of a Llama-style model (RMSNorm, grouped-query
    attention, SwiGLU, no biases), called as the student's ``f(x, mask)``."""

    def __init__(self, d: int, h: int, hkv: int, f: int, eps: float, theta: float, pairs: str):
        kw = {"activation": "swiglu", "bias": False, "layer_norm_eps": eps, "norm": "rmsnorm"}
        super().__init__(d, h, f, norm_first=True, n_kv_heads=hkv, **kw)
        self.rope_args = (theta, pairs)

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: None = None) -> Tensor:
        return super().forward(x, mask, None, _rope(x, self.self_attn.d_k, *self.rope_args))


BUGS: list[BugVariant] = [
    *RMS_NORM_BUGS,
    *ROPE_BUGS,
    *SWIGLU_BUGS,
    *GQA_BUGS,
    *MODERN_BLOCK_BUGS,
]
