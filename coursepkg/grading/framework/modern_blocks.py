"""What ex11's catalogue builds its attention and block mistakes on, and the reference called as
the student's blocks are: the rotary helpers; :class:`RotaryGQABlock`, the reference's
grouped-query attention called with the exercise's dict KV cache; :class:`PreNormBlock`, the
pre-norm wiring of reference parts (RMSNorm, that attention, :class:`ReferenceSwiGLU`) whose
forward the block's mistakes override; :class:`ReferenceGQA` and :class:`ReferenceBlock`, the
reference's :class:`~coursepkg.attention.MultiHeadAttention` (``n_kv_heads``, RoPE, no
biases) and pre-norm :class:`~coursepkg.layers.EncoderLayer`, called as ``f(x, mask)``, for the
checks to compare with; and :class:`ReferenceSwiGLU`, the reference's gated feed-forward as
the exercise builds it, which the SwiGLU mistakes subclass.

Dimension legend: B batch, L length, D d_model, H query heads, Hkv key/value heads, Dh per-head
width, F hidden width of the feed-forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...attention import MultiHeadAttention as _ReferenceMHA
from ...config import BlockConfig
from ...kv_cache import LayerCache
from ...layers import EncoderLayer as _ReferenceLayer
from ...layers import PositionwiseFeedForward, RMSNorm
from ...positional import RopeAngles, rope_frequencies

__all__ = [
    "DictCache",
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


class DictCache(LayerCache):
    """The checks' dict cache (``{"k": (B, Hkv, S, Dh), "v": ...}``, filled in place) as the
    reference's growing key/value cache: what the exercise's blocks take, given to the
    reference's attention."""

    def __init__(self, store: dict[str, Tensor]) -> None:
        self.store = store

    @property
    def length(self) -> int:
        """How many keys are cached."""
        return self.store["k"].size(2) if "k" in self.store else 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this call's keys and values; all of them, cached first, come back.

        Shape:
            k (B, Hkv, L, Dh), v (B, Hkv, L, Dh) -> (B, Hkv, S, Dh) each.
        """
        if "k" in self.store:
            k = torch.cat([self.store["k"], k], dim=2)  # (B, Hkv, S, Dh)
            v = torch.cat([self.store["v"], v], dim=2)  # (B, Hkv, S, Dh)
        self.store["k"], self.store["v"] = k, v
        return k, v


class RotaryGQABlock(_ReferenceMHA):
    """The reference's grouped-query self-attention without biases, called as the exercise's
    ``GroupedQueryAttention(d_model, n_heads, n_kv_heads, rope_theta, rope_pairs)``:
    ``f(x, mask, cache)`` with a dict cache and RoPE at the positions after the cached ones. A
    catalogued mistake overrides one step of the reference (``_project``, ``_attend``,
    ``_merge_heads``) or of this call (:meth:`positions`, :meth:`rope`)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        rope_theta: float = 10000.0,
        rope_pairs: str = "halves",
    ) -> None:
        super().__init__(d_model, n_heads, bias=False, n_kv_heads=n_kv_heads)
        self.theta, self.pairs = rope_theta, rope_pairs

    def positions(self, length: int, cache: dict[str, Tensor] | None) -> Tensor:
        """The absolute positions of this call: after the cached ones."""
        start = 0 if cache is None or "k" not in cache else cache["k"].size(2)
        return torch.arange(start, start + length)  # (L,)

    def rope(self, positions: Tensor) -> RopeAngles | None:
        """The rotary angles of ``positions`` for each head's Dh columns."""
        return RopeAngles(positions, rope_frequencies(self.d_k, self.theta), self.pairs)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, cache: dict[str, Tensor] | None = None
    ) -> Tensor:
        """Shape: x (B, L, D) -> (B, L, D)."""
        rope = self.rope(self.positions(x.size(1), cache))
        store = None if cache is None else DictCache(cache)
        return super().forward(x, x, x, mask, store, rope)  # (B, L, D)


class PreNormBlock(nn.Module):
    """The pre-norm block wired from reference parts: x + attention(norm1(x)), then
    + ffn(norm2(x)); each of the block's mistakes overrides this forward."""

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
