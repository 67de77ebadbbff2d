"""The correct blocks of today's decoder that ex11's catalogue builds its attention and block
mistakes on, and the reference called as the student's blocks are: the rotary helpers,
:class:`RotaryGQABlock` (grouped-query self-attention with RoPE and a dict KV cache) and
:class:`PreNormBlock` (the reference's RMSNorm and gated feed-forward around it), each written
in steps a catalogued mistake overrides one at a time; :class:`ReferenceGQA` and
:class:`ReferenceBlock` are the reference's :class:`~coursepkg.attention.MultiHeadAttention`
(``n_kv_heads``, RoPE, no biases) and pre-norm :class:`~coursepkg.layers.EncoderLayer`, called
as ``f(x, mask)``, for the checks to compare with, and :class:`ReferenceSwiGLU`, the
reference's gated feed-forward as the exercise builds it, which the SwiGLU mistakes subclass.

Dimension legend: B batch, L length, D d_model, H query heads, Hkv key/value heads, Dh per-head
width, F hidden width of the feed-forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...attention import MultiHeadAttention as _ReferenceMHA
from ...config import BlockConfig
from ...layers import EncoderLayer as _ReferenceLayer
from ...layers import PositionwiseFeedForward, RMSNorm
from ...positional import RopeAngles, apply_rope, rope_frequencies
from .variants import masked_attention

__all__ = [
    "PreNormBlock",
    "ReferenceBlock",
    "ReferenceGQA",
    "ReferenceSwiGLU",
    "RotaryGQABlock",
    "pair_index",
    "rope_angles",
    "inv_freq",
    "rotate_halves",
    "rotate_interleaved",
    "rotate_pairs",
]


def rope_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """pos * w_i for every position and pair, in float64."""
    return positions.to(torch.float64)[:, None] * inv_freq  # (L, Dh/2)


def pair_index(x: Tensor) -> Tensor:
    return torch.arange(x.size(-1) // 2, dtype=torch.float64)  # (Dh/2,): pair i


def inv_freq(x: Tensor, theta: float) -> Tensor:
    """w_i = theta^(-2i/Dh) for the Dh/2 pairs of ``x`` (..., Dh), in float64."""
    return theta ** (-2 * pair_index(x) / x.size(-1))  # (Dh/2,)


def rotate_halves(x: Tensor, angles: Tensor) -> Tensor:
    """Pair column i with column i + Dh/2 and turn each pair by its angle."""
    half = x.size(-1) // 2
    a, b = x[..., :half].double(), x[..., half:].double()  # (B, H, L, Dh/2) each
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).to(x.dtype)


def rotate_interleaved(x: Tensor, angles: Tensor) -> Tensor:
    """Pair columns 2i and 2i+1 and turn each pair by its angle."""
    a, b = x[..., 0::2].double(), x[..., 1::2].double()  # (B, H, L, Dh/2) each
    cos, sin = angles.cos(), angles.sin()
    pairs = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)  # (B, H, L, Dh/2, 2)
    return pairs.flatten(-2).to(x.dtype)  # (B, H, L, Dh)


def rotate_pairs(x: Tensor, angles: Tensor, pairs: str) -> Tensor:
    return rotate_halves(x, angles) if pairs == "halves" else rotate_interleaved(x, angles)


class ReferenceSwiGLU(PositionwiseFeedForward):
    """The reference feed-forward as the exercise's ``SwiGLU(d_model, d_ff)``: gated by SiLU,
    no biases (``linear1`` the gate, ``linear3`` the linear branch)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__(d_model, d_ff, activation="swiglu", bias=False)


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
        q, k, v = self.project(x, self.positions(x.size(1), cache))
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)  # (B, Hkv, S, Dh)
                v = torch.cat([cache["v"], v], dim=2)  # (B, Hkv, S, Dh)
            cache["k"], cache["v"] = k, v
        out = self.attend(q, self.repeat_kv(k), self.repeat_kv(v), mask)  # (B, H, L, Dh)
        return self.out_proj(self.merge(out))  # (B, L, D)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """softmax(q k^T / sqrt(Dh)) v with the course's mask, every query head at once."""
        return masked_attention(q, k, v, mask)  # (B, H, L, Dh)

    def merge(self, out: Tensor) -> Tensor:
        """(B, H, L, Dh) -> (B, L, H * Dh): the heads side by side at each position."""
        b, _, n, _ = out.shape
        return out.transpose(1, 2).reshape(b, n, -1)  # (B, L, H*Dh)


class PreNormBlock(nn.Module):
    """The correct pre-norm block: x + attention(norm1(x)), then + ffn(norm2(x)), with the
    reference's RMSNorm and gated feed-forward around the attention below."""

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
        self.norm1 = RMSNorm(d_model, eps)
        self.self_attn = RotaryGQABlock(d_model, n_heads, n_kv_heads, rope_theta, rope_pairs)
        self.norm2 = RMSNorm(d_model, eps)
        self.ffn = ReferenceSwiGLU(d_model, d_ff)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, cache: dict[str, Tensor] | None = None
    ) -> Tensor:
        x = x + self.self_attn(self.norm1(x), mask, cache)  # (B, L, D)
        return x + self.ffn(self.norm2(x))  # (B, L, D)


def _rope_of(x: Tensor, head_dim: int, theta: float, pairs: str) -> RopeAngles:
    """The reference's rotary angles of positions 0 .. L-1 of ``x`` (B, L, D)."""
    return RopeAngles(torch.arange(x.size(1)), rope_frequencies(head_dim, theta), pairs)


class ReferenceGQA(_ReferenceMHA):
    """The reference's grouped-query attention without biases, called as the student's
    ``f(x, mask)`` with RoPE at positions 0 .. L-1 (the checks never give it a cache)."""

    def __init__(self, d: int, h: int, hkv: int, theta: float, pairs: str) -> None:
        super().__init__(d, h, bias=False, n_kv_heads=hkv)
        self.rope_args = (theta, pairs)

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: None = None) -> Tensor:
        return super().forward(x, x, x, mask, None, _rope_of(x, self.d_k, *self.rope_args))


class ReferenceBlock(_ReferenceLayer):
    """The reference's pre-norm layer of a Llama-style model (RMSNorm, grouped-query
    attention, SwiGLU, no biases), called as the student's ``f(x, mask)``."""

    def __init__(self, d: int, h: int, hkv: int, f: int, eps: float, theta: float, pairs: str):
        kw = {"activation": "swiglu", "bias": False, "layer_norm_eps": eps, "norm": "rmsnorm"}
        super().__init__(BlockConfig.of(d, h, f, norm_first=True, n_kv_heads=hkv, **kw))
        self.rope_args = (theta, pairs)

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: None = None) -> Tensor:
        return super().forward(x, mask, None, _rope_of(x, self.self_attn.d_k, *self.rope_args))
