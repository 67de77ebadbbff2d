"""Attention: the scaled dot-product kernel (textbook and fast paths), multi-head attention and
Bahdanau's additive attention.

Dimension legend: B batch, H heads, L queries, S keys, D d_model, Dk/Dv per-head sizes, Hkv
key/value heads (grouped-query attention). Masks are boolean, True = may attend.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validation import broadcast_shape, check_attention_mask, check_float
from .config import head_sizes
from .kv_cache import LayerCache
from .masks import PackedMask, as_mask
from .positional import RopeAngles

__all__ = [
    "AdditiveAttention",
    "MultiHeadAttention",
    "attention_fast",
    "fused_attention",
    "scaled_dot_product_attention",
]


def _check_qkv(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> None:
    check_float("query", query)
    check_float("key", key)
    check_float("value", value)
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(
            "query, key and value must have the same rank >= 2, got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"query and key must share their last dimension Dk, got query {tuple(query.shape)} "
            f"and key {tuple(key.shape)}"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(
            f"key and value must have the same length S (dim -2), got key {tuple(key.shape)} "
            f"and value {tuple(value.shape)}"
        )
    if mask is not None:
        batch = broadcast_shape(
            "query's batch dimensions", query.shape[:-2], "key's", key.shape[:-2]
        )
        check_attention_mask("mask", mask, (*batch, query.size(-2), key.size(-2)))


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V, written out step by step (Vaswani et al., Eq. 1).

    This is the readable path the book teaches. :func:`attention_fast` computes the same
    with PyTorch's fused kernel; a test checks that the two agree.

    Args:
        query: queries Q.
        key: keys K.
        value: values V.
        mask: bool, True = may attend; broadcastable to (..., L, S). A query whose keys are
            all masked gets zero weights and a zero output (never NaN).
        dropout_p: dropout on the attention weights (applied only when > 0).

    Shape:
        query (..., L, Dk), key (..., S, Dk), value (..., S, Dv) -> output (..., L, Dv),
        weights (..., L, S).

    Returns:
        ``(output, weights)``; ``weights`` are before dropout and each unmasked row sums to 1.
    """
    _check_qkv(query, key, value, mask)
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., L, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., L, S)
    if mask is not None:
        # A fully masked row is softmax(-inf, ..., -inf) = NaN; every entry of such a row is
        # masked, so this also turns those NaNs into zeros.
        weights = weights.masked_fill(~mask, 0.0)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ value, weights  # (..., L, Dv), (..., L, S)


def attention_fast(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The same computation as :func:`scaled_dot_product_attention`, with the fused kernel.

    Uses :func:`torch.nn.functional.scaled_dot_product_attention` (whose boolean mask also
    means True = may attend) and returns no weights. Fully masked rows give zeros.

    Shape:
        query (..., L, Dk), key (..., S, Dk), value (..., S, Dv) -> (..., L, Dv).
    """
    _check_qkv(query, key, value, mask)
    return fused_attention(query, key, value, mask, dropout_p)


def fused_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | PackedMask | None, dropout_p: float
) -> Tensor:
    """:func:`attention_fast` without its argument checks, for callers that checked already.

    Shape:
        query (..., L, Dk), key (..., S, Dk), value (..., S, Dv) -> (..., L, Dv).
    """
    mask = as_mask(mask)  # a PackedMask's dense (T, S) tensor
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_p
    )  # (..., L, Dv)
    if mask is not None:
        # Some fused kernels return NaN for a query with no visible key; pin those to zero.
        # The check is on the (small) mask, so the common case costs no pass over ``out``.
        empty = ~mask.any(dim=-1, keepdim=True)  # (..., L, 1)
        if bool(empty.any()):
            out = out.masked_fill(empty, 0.0)
    return out


class MultiHeadAttention(nn.Module):
    """Multi-head attention, MultiHead(Q, K, V) = Concat(head_1..head_H) W^O (Eq. 4-5).

    Args:
        d_model: width D of the inputs and the output.
        n_heads: number of heads H.
        d_k: per-head query/key size Dk (default D // H).
        d_v: per-head value size Dv (default D // H).
        dropout: dropout on the attention weights during training.
        bias: whether the four projections have biases.
        n_kv_heads: key/value heads Hkv (grouped-query attention, Ainslie et al. 2023; 1 is
            multi-query, Shazeer 2019); it must divide H, and each key/value head serves H/Hkv
            consecutive query heads. Default H (every query head has its own).
        qk_norm: QK-norm (Qwen3, OLMo 2): a normalisation applied to each head's queries and keys
            before RoPE, made by calling this with Dk (the layers pass RMSNorm); None for none.

    Submodules ``q_proj``, ``k_proj``, ``v_proj`` (D -> H*Dk, Hkv*Dk, Hkv*Dv) and ``out_proj``
    (H*Dv -> D), and with ``qk_norm`` ``q_norm`` and ``k_norm`` (over Dk, shared by the heads).
    A cache stores the Hkv key/value heads, not H. Set ``record_weights = True`` to run the
    textbook attention kernel and keep the attention weights of the last call in
    ``last_weights`` (B, H, L, S), e.g. for plotting.

    This is the plain version, one way per step. The models build
    :class:`~coursepkg.fast_attention.FastMultiHeadAttention`, a subclass that overrides
    :meth:`_project` and :meth:`_attend` with faster routes to the same numbers.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_k: int | None = None,
        d_v: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        n_kv_heads: int | None = None,
        qk_norm: Callable[[int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        # A block passes the numbers its config resolved; built alone (chapter 4), None means
        # the defaults, which config.head_sizes, the one place that defines them, fills in.
        self.d_k, self.d_v, self.n_kv_heads = head_sizes(d_model, n_heads, d_k, d_v, n_kv_heads)
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, n_heads * self.d_k, bias=bias)
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * self.d_k, bias=bias)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * self.d_v, bias=bias)
        self.out_proj = nn.Linear(n_heads * self.d_v, d_model, bias=bias)
        self.q_norm = None if qk_norm is None else qk_norm(self.d_k)
        self.k_norm = None if qk_norm is None else qk_norm(self.d_k)
        self.record_weights = False
        self.last_weights: Tensor | None = None

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        cache: LayerCache | None = None,
        rope: RopeAngles | None = None,
    ) -> Tensor:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: (B, L, D).
            key: (B, S, D).
            value: (B, S, D).
            mask: bool, True = may attend, broadcastable to (B, H, L, S); with a cache, S counts
                the cached keys too.
            cache: optional key/value cache (see :mod:`coursepkg.kv_cache`). A growing cache
                appends this call's keys and values; a static one (cross-attention) keeps the
                keys and values of its last call.
            rope: rotary positions (:class:`~coursepkg.positional.RopeAngles` of the L new
                positions): queries and keys are turned by them before attending, and the
                cache keeps the turned keys; values are never turned.

        Shape:
            -> (B, L, D).
        """
        _check_inputs(self, query, key, value, mask, cache)
        q, k, v = self._project(query, key, value, cache)  # (B, H, L, Dk), (B, Hkv, S, Dk/Dv)
        if self.q_norm is not None:  # QK-norm: each head's query and key rows to a fixed scale
            q, k = self.q_norm(q), self.k_norm(k)  # (B, H, L, Dk), (B, Hkv, S, Dk)
        if rope is not None:  # rotary positions turn queries and keys, never values
            q, k = rope.rotate(q), rope.rotate(k)  # (B, H, L, Dk), (B, Hkv, S, Dk)
        if cache is not None:  # the cache keeps the Hkv heads: H / Hkv times less memory
            k, v = cache.update(k, v)  # (B, Hkv, S_total, Dk), (B, Hkv, S_total, Dv)
        out = self._merge_heads(self._attend(q, k, v, mask))  # (B, L, H*Dv)
        return self.out_proj(out)  # (B, L, D)

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, cache: LayerCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Project, then split the width into heads (``cache`` is for subclasses' shortcuts).

        Shape:
            query (B, L, D), key (B, S, D), value (B, S, D) -> (B, H, L, Dk), (B, Hkv, S, Dk),
            (B, Hkv, S, Dv).
        """
        q = self._split(self.q_proj(query), self.d_k)  # (B, H, L, Dk)
        k = self._split(self.k_proj(key), self.d_k, self.n_kv_heads)  # (B, Hkv, S, Dk)
        v = self._split(self.v_proj(value), self.d_v, self.n_kv_heads)  # (B, Hkv, S, Dv)
        return q, k, v

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """H query heads attend over Hkv key/value heads (Hkv = H without grouping).

        Shape:
            q (B, H, L, Dk), k (B, Hkv, S, Dk), v (B, Hkv, S, Dv) -> (B, H, L, Dv).
        """
        group = self.n_heads // self.n_kv_heads  # grouped-query: K/V head j serves query
        k = k.repeat_interleave(group, dim=1)  # heads j*group .. (j+1)*group - 1; (B, H, S, Dk)
        v = v.repeat_interleave(group, dim=1)  # (B, H, S, Dv)
        p = self.dropout if self.training else 0.0
        if self.record_weights:  # the textbook kernel, keeping the weights for plotting
            out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p=p)
            self.last_weights = weights.detach()  # (B, H, L, S)
            return out  # (B, H, L, Dv)
        return fused_attention(q, k, v, mask, p)  # (B, H, L, Dv)

    def _merge_heads(self, out: Tensor) -> Tensor:
        """Concat(head_1..head_H): the heads side by side again at each position.

        Shape:
            out (B, H, L, Dv) -> (B, L, H*Dv).
        """
        b, _, n_q, _ = out.shape
        return out.transpose(1, 2).reshape(b, n_q, self.n_heads * self.d_v)  # (B, L, H*Dv)

    def _split(self, x: Tensor, size: int, heads: int | None = None) -> Tensor:
        # (B, n, heads*size) -> (B, heads, n, size): one slice of the width per head
        # (``heads`` is H for queries, Hkv for keys and values).
        b, n, _ = x.shape
        heads = self.n_heads if heads is None else heads
        return x.view(b, n, heads, size).transpose(1, 2)  # (B, heads, n, size)


def _check_inputs(
    mha: MultiHeadAttention,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    cache: LayerCache | None,
) -> None:
    # MultiHeadAttention.forward's argument checks.
    self_attention = query is key and key is value  # one tensor: check it once
    named = [("query", query)]
    if not self_attention:
        named += [("key", key), ("value", value)]
    for name, x in named:
        check_float(name, x, ndim=3)
        if x.size(-1) != mha.d_model:
            raise ValueError(
                f"{name} must have last dimension d_model={mha.d_model}, got shape {tuple(x.shape)}"
            )
    if not self_attention and (key.shape[:2] != value.shape[:2] or key.size(0) != query.size(0)):
        raise ValueError(
            "query, key and value must share the batch size and key/value their length: "
            f"got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if mask is not None:  # a tensor, or a PackedMask (its dense tensor is checked)
        n_keys = _keys_after(cache, key.size(1))
        shape = (query.size(0), mha.n_heads, query.size(1), n_keys)
        check_attention_mask("mask", as_mask(mask), shape)


def _keys_after(cache: LayerCache | None, n_new: int) -> int:
    """How many keys attention sees once the cache has taken ``n_new`` more."""
    return n_new if cache is None else cache.keys_after(n_new)


class AdditiveAttention(nn.Module):
    """Additive attention score(s, h) = v^T tanh(W_q s + W_k h) (Bahdanau 2015, eq. 6; notes 1.1).

    The weights are ``softmax`` of the scores over the source positions that may be attended;
    the context is the weighted sum of the keys (which double as values, as in Bahdanau's model).

    Args:
        query_dim: Size Dq of a query vector (e.g. the decoder state s_{t-1}).
        key_dim: Size Dk of a key vector (e.g. an encoder state h_i).
        attn_dim: Size A of the hidden layer inside the score.

    Shape:
        - query: (B, Dq)
        - keys: (B, S, Dk)
        - mask: (B, S) bool, True = may attend, or None (attend everywhere)
        - context: (B, Dk)
        - weights: (B, S); each row sums to 1 over its attendable positions, and a fully
          masked row gives all-zero weights (and a zero context), never NaN.
    """

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int) -> None:
        super().__init__()
        for name, value in (("query_dim", query_dim), ("key_dim", key_dim), ("attn_dim", attn_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.query_dim = query_dim
        self.key_dim = key_dim
        self.attn_dim = attn_dim
        self.query_proj = nn.Linear(query_dim, attn_dim, bias=False)  # W_q
        self.key_proj = nn.Linear(key_dim, attn_dim, bias=True)  # W_k (its bias is the only one)
        self.score = nn.Linear(attn_dim, 1, bias=False)  # v^T

    def forward(
        self,
        query: Tensor,
        keys: Tensor,
        mask: Tensor | None = None,
        *,
        keys_proj: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from one query per batch row over that row's keys.

        Args:
            query: Query vectors.
            keys: Key vectors, also used as the values.
            mask: Bool, True = may attend; None attends to every position.
            keys_proj: Optional precomputed ``self.key_proj(keys)``. A recurrent decoder queries the
                same keys at every step, so it projects them once and passes them here.

        Shape:
            - query: (B, Dq)
            - keys: (B, S, Dk)
            - mask: (B, S)
            - keys_proj: (B, S, A)

        Returns:
            ``(context, weights)`` of shapes (B, Dk) and (B, S).
        """
        self._check_inputs(query, keys, mask, keys_proj)
        if keys_proj is None:
            keys_proj = self.key_proj(keys)  # (B, S, A)
        q = self.query_proj(query).unsqueeze(1)  # (B, 1, A)
        scores = self.score(torch.tanh(q + keys_proj)).squeeze(-1)  # (B, S)
        if mask is not None:
            # A finite fill (not -inf) keeps fully masked rows free of NaN; they are zeroed below.
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)  # (B, S)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)
        context = torch.bmm(weights.unsqueeze(1), keys).squeeze(1)  # (B, Dk)
        return context, weights

    def _check_inputs(
        self, query: Tensor, keys: Tensor, mask: Tensor | None, keys_proj: Tensor | None
    ) -> None:
        if query.dim() != 2 or query.shape[1] != self.query_dim:
            raise ValueError(
                f"query must have shape (B, {self.query_dim}), got {tuple(query.shape)}"
            )
        if keys.dim() != 3 or keys.shape[2] != self.key_dim:
            raise ValueError(
                f"keys must have shape (B, S, {self.key_dim}), got {tuple(keys.shape)}"
            )
        if keys.shape[0] != query.shape[0]:
            raise ValueError(
                f"keys batch size {keys.shape[0]} does not match query batch size {query.shape[0]}"
            )
        batch, src_len = keys.shape[0], keys.shape[1]
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be a bool tensor (True = may attend), got {mask.dtype}")
            if tuple(mask.shape) != (batch, src_len):
                raise ValueError(
                    f"mask must have shape (B, S) = {(batch, src_len)}, got {tuple(mask.shape)}"
                )
        if keys_proj is not None and tuple(keys_proj.shape) != (batch, src_len, self.attn_dim):
            raise ValueError(
                f"keys_proj must have shape (B, S, A) = {(batch, src_len, self.attn_dim)}, "
                f"got {tuple(keys_proj.shape)}"
            )
