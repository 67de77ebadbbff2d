"""Multi-head latent attention (DeepSeek-V2, 2024, Sec. 2.1): keys and values rebuilt from one
small latent vector per token, which is all the cache keeps.

Grouped-query attention shrinks the cache by sharing key/value heads; MLA instead compresses
each token to a latent c (``kv_rank`` numbers, far fewer than the H * (Dk + Dv) of full keys
and values) and rebuilds every head's key and value from it with an up-projection. Rotary
positions do not survive that (a rotation depending on the position cannot be folded into the
up-projection), so each head's query and key get a small extra part, ``d_rope`` wide, that is
rotated: the query's per head, the key's one for all heads, computed from the token directly
("decoupled RoPE"). The cache stores c and that rotated key part, ``kv_rank + d_rope`` numbers
per token and layer (:func:`mla_cache_numbers_per_token`). At decoding time the
up-projections can be folded into the query and the output instead of rebuilding the keys and
values (:meth:`MultiHeadLatentAttention.forward_absorbed`, the "absorbed" form).

Dimension legend: B batch, L new positions, S cached + new positions, D d_model, H heads,
R ``kv_rank``, Rq ``q_rank``, Dn ``d_nope`` (a head's unrotated query/key part), Dr ``d_rope``,
Dv a head's value width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .config import BlockConfig
from .kv_cache import LayerCache
from .layers import RMSNorm
from .positional import RopeAngles

__all__ = [
    "LatentCache",
    "MultiHeadLatentAttention",
    "mla_cache_numbers_per_token",
    "mla_parameters",
]


class LatentCache(LayerCache):
    """What one MLA block keeps per past token: the normalised latent and the rotated key part
    (the :class:`~coursepkg.kv_cache.LayerCache` protocol, with the latent and the rotated key
    part in place of keys and values).

    Attributes:
        latent: (B, S, R) or None before the first call.
        k_rope: (B, S, Dr) or None, already rotated to each token's position.
    """

    def __init__(self) -> None:
        self.latent: Tensor | None = None
        self.k_rope: Tensor | None = None

    @property
    def length(self) -> int:
        """The number of cached positions."""
        return 0 if self.latent is None else self.latent.size(1)

    def update(self, latent: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Append this call's positions and return all of them.

        Shape:
            latent (B, L, R), k_rope (B, L, Dr) -> (B, S, R), (B, S, Dr).
        """
        if self.latent is None:
            self.latent, self.k_rope = latent, k_rope
        else:
            self.latent = torch.cat([self.latent, latent], dim=1)  # (B, S, R)
            self.k_rope = torch.cat([self.k_rope, k_rope], dim=1)  # (B, S, Dr)
        return self.latent, self.k_rope

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search)."""
        if self.latent is not None:
            self.latent = self.latent.index_select(0, index)
            self.k_rope = self.k_rope.index_select(0, index)

    def numbers_per_token(self) -> int:
        """Numbers held per cached position and batch row (measured from the tensors)."""
        return self.latent.size(-1) + self.k_rope.size(-1)


def mla_cache_numbers_per_token(kv_rank: int, d_rope: int) -> int:
    """Numbers one MLA layer caches per token: the latent (R) and the shared rotated key (Dr),
    against H * (Dk + Dv) for multi-head attention and Hkv * (Dk + Dv) for grouped queries."""
    return kv_rank + d_rope


def mla_parameters(
    d_model: int,
    n_heads: int,
    kv_rank: int,
    d_nope: int,
    d_rope: int,
    d_v: int,
    q_rank: int | None = None,
) -> int:
    """The weights of one :class:`MultiHeadLatentAttention`, in closed form (arguments as its).

    Queries D x H(Dn + Dr), or D x Rq, Rq norm gains and Rq x H(Dn + Dr); keys and values
    D x (R + Dr), R norm gains, R x H(Dn + Dv); output H Dv x D.
    """
    q_width = n_heads * (d_nope + d_rope)
    queries = d_model * q_width if q_rank is None else d_model * q_rank + q_rank + q_rank * q_width
    keys_values = d_model * (kv_rank + d_rope) + kv_rank + kv_rank * n_heads * (d_nope + d_v)
    return queries + keys_values + n_heads * d_v * d_model


class MultiHeadLatentAttention(nn.Module):
    """Self-attention whose keys and values come from a cached low-rank latent (DeepSeek-V2).

    Per token x: c = norm(W_dkv x) (R numbers) and k_r = RoPE(W_kr x) (Dr numbers, shared by the
    heads); every head h has key [W_uk,h c ; k_r] and value W_uv,h c. The queries take the same
    route through their own latent when ``q_rank`` is set (norm(W_dq x), then W_uq), else one
    projection; each head's query is [q_n,h ; RoPE(q_r,h)]. Scores are scaled by
    1 / sqrt(Dn + Dr).

    Args:
        d_model: D.
        n_heads: H.
        kv_rank: R, the width of the keys' and values' latent (what the cache keeps).
        d_nope: Dn, the unrotated part of each head's query and key.
        d_rope: Dr, the rotated part (even).
        d_v: Dv, each head's value width.
        q_rank: Rq, the queries' latent width, or None for a plain query projection.
        eps: the latents' RMSNorm epsilon.

    Submodules ``q_proj`` (D -> H (Dn + Dr); None with ``q_rank``) or ``q_down``, ``q_norm``,
    ``q_up``; ``kv_down`` (D -> R + Dr: the latent and the rotated key part together, as
    DeepSeek's ``kv_a_proj_with_mqa``), ``kv_norm``, ``kv_up`` (R -> H (Dn + Dv)),
    ``out_proj`` (H Dv -> D). No biases.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        kv_rank: int,
        d_nope: int,
        d_rope: int,
        d_v: int,
        q_rank: int | None = None,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if kv_rank > d_model:
            raise ValueError(
                f"kv_rank must be at most d_model={d_model} (a compression), got {kv_rank}"
            )
        if q_rank is not None and q_rank > d_model:
            raise ValueError(
                f"q_rank must be at most d_model={d_model} (a compression), got {q_rank}"
            )
        if d_rope % 2:
            raise ValueError(f"d_rope must be even (RoPE turns pairs of columns), got {d_rope}")
        self.n_heads, self.kv_rank, self.d_v = n_heads, kv_rank, d_v
        self.d_nope, self.d_rope = d_nope, d_rope
        d_qk = d_nope + d_rope
        if q_rank is None:
            self.q_proj = nn.Linear(d_model, n_heads * d_qk, bias=False)
            self.q_down = self.q_norm = self.q_up = None
        else:
            self.q_proj = None
            self.q_down = nn.Linear(d_model, q_rank, bias=False)
            self.q_norm = RMSNorm(q_rank, eps)
            self.q_up = nn.Linear(q_rank, n_heads * d_qk, bias=False)
        self.kv_down = nn.Linear(d_model, kv_rank + d_rope, bias=False)
        self.kv_norm = RMSNorm(kv_rank, eps)
        self.kv_up = nn.Linear(kv_rank, n_heads * (d_nope + d_v), bias=False)
        self.out_proj = nn.Linear(n_heads * d_v, d_model, bias=False)

    @classmethod
    def from_block(cls, config: BlockConfig) -> MultiHeadLatentAttention:
        """The attention a block's ``latent`` group describes (its ``d_k`` is Dn)."""
        if config.latent is None:
            raise ValueError(
                "MultiHeadLatentAttention.from_block needs a block with a latent group, got None"
            )
        latent = config.latent
        return cls(
            config.d_model,
            config.n_heads,
            latent.kv_rank,
            config.d_k,
            latent.d_rope,
            config.d_v,
            latent.q_rank,
            config.layer_norm_eps,
        )

    def queries(self, x: Tensor, rope: RopeAngles) -> tuple[Tensor, Tensor]:
        """Each head's unrotated and rotated query parts.

        Shape:
            x (B, L, D) -> (B, H, L, Dn), (B, H, L, Dr).
        """
        b, n, _ = x.shape
        q = self.q_proj(x) if self.q_proj is not None else self.q_up(self.q_norm(self.q_down(x)))
        q = q.view(b, n, self.n_heads, -1).transpose(1, 2)  # (B, H, L, Dn + Dr)
        q_nope, q_rope = q.split([self.d_nope, self.d_rope], dim=-1)  # (B, H, L, Dn), (.., Dr)
        return q_nope, rope.rotate(q_rope)

    def compress(self, x: Tensor, rope: RopeAngles) -> tuple[Tensor, Tensor]:
        """The cached part of each token: its normalised latent and its rotated key part.

        Shape:
            x (B, L, D) -> latent (B, L, R), k_rope (B, L, Dr).
        """
        latent, k_rope = self.kv_down(x).split([self.kv_rank, self.d_rope], dim=-1)
        k_rope = rope.rotate(k_rope[:, None])[:, 0]  # (B, L, Dr): one head's worth, rotated
        return self.kv_norm(latent), k_rope  # (B, L, R), (B, L, Dr)

    def expand(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        """Every head's unrotated key part and value, rebuilt from the latent.

        Shape:
            latent (B, S, R) -> (B, H, S, Dn), (B, H, S, Dv).
        """
        b, s, _ = latent.shape
        kv = self.kv_up(latent).view(b, s, self.n_heads, -1).transpose(1, 2)  # (B, H, S, Dn+Dv)
        k_nope, v = kv.split([self.d_nope, self.d_v], dim=-1)  # (B, H, S, Dn), (B, H, S, Dv)
        return k_nope, v

    def forward(
        self,
        x: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        cache: LatentCache | None = None,
        rope: RopeAngles | None = None,
    ) -> Tensor:
        """Attend from the new positions to every cached and new one.

        Called as :class:`~coursepkg.attention.MultiHeadAttention` is in a layer,
        ``attn(x, x, x, mask, cache, rope)``, so that a layer takes either; it is
        self-attention only.

        Args:
            x: the new positions' inputs.
            key, value: ``x`` itself (or None).
            mask: bool, True = may attend, broadcastable to (B, H, L, S) (causal for training).
            cache: a :class:`LatentCache`, extended with the new positions.
            rope: the angles of the new positions (:class:`~coursepkg.positional.RopeAngles`).

        Shape:
            x (B, L, D) -> (B, L, D).
        """
        for name, other in (("key", key), ("value", value)):
            if other is not None and other is not x:
                raise ValueError(f"{name} must be the query itself (self-attention only) or None")
        if rope is None:
            raise ValueError("rope must be given: latent attention rotates its Dr part")
        b, n, _ = x.shape
        q_nope, q_rope = self.queries(x, rope)  # (B, H, L, Dn), (B, H, L, Dr)
        latent, k_rope = self.compress(x, rope)  # (B, L, R), (B, L, Dr)
        if cache is not None:
            latent, k_rope = cache.update(latent, k_rope)  # (B, S, R), (B, S, Dr)
        k_nope, v = self.expand(latent)  # (B, H, S, Dn), (B, H, S, Dv)
        # The two parts' dot products add up: q.k = q_n.k_n + q_r.k_r (k_r shared by the heads).
        scores = q_nope @ k_nope.transpose(-2, -1)  # (B, H, L, S)
        scores = scores + q_rope @ k_rope[:, None].transpose(-2, -1)  # (B, H, L, S)
        scores = scores / math.sqrt(self.d_nope + self.d_rope)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, H, L, S)
        if mask is not None:  # a row that may see nothing gets zeros, not NaN
            weights = weights.masked_fill(~mask, 0.0)
        out = weights @ v  # (B, H, L, Dv)
        out = out.transpose(1, 2).reshape(b, n, self.n_heads * self.d_v)  # (B, L, H Dv)
        return self.out_proj(out)  # (B, L, D)

    def forward_absorbed(self, x: Tensor, rope: RopeAngles, cache: LatentCache) -> Tensor:
        """The same attention without rebuilding any key or value: the "absorbed" form.

        A head's unrotated score is q_n . (W_uk c) = (W_uk^T q_n) . c, so the query is taken
        into the latent's space once and meets the cached latents directly; likewise the
        weighted sum of values W_uv c is W_uv (weighted sum of c). Decoding then reads R + Dr
        numbers per past token and head instead of Dn + Dr + Dv. Equal to :meth:`forward`
        with the same cache and no mask (a test checks it).

        Shape:
            x (B, L, D) -> (B, L, D); the cache grows by L positions.
        """
        b, n, _ = x.shape
        q_nope, q_rope = self.queries(x, rope)  # (B, H, L, Dn), (B, H, L, Dr)
        latent, k_rope = cache.update(*self.compress(x, rope))  # (B, S, R), (B, S, Dr)
        w = self.kv_up.weight.view(self.n_heads, self.d_nope + self.d_v, self.kv_rank)
        w_uk, w_uv = w.split([self.d_nope, self.d_v], dim=1)  # (H, Dn, R), (H, Dv, R)
        q_latent = q_nope @ w_uk  # (B, H, L, R): the query in the latent's space
        scores = q_latent @ latent[:, None].transpose(-2, -1)  # (B, H, L, S)
        scores = scores + q_rope @ k_rope[:, None].transpose(-2, -1)  # (B, H, L, S)
        weights = torch.softmax(scores / math.sqrt(self.d_nope + self.d_rope), dim=-1)
        mixed = weights @ latent[:, None]  # (B, H, L, R): the weighted sum of latents
        out = mixed @ w_uv.transpose(-2, -1)  # (B, H, L, Dv)
        out = out.transpose(1, 2).reshape(b, n, self.n_heads * self.d_v)  # (B, L, H Dv)
        return self.out_proj(out)  # (B, L, D)
