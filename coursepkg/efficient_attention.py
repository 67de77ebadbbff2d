"""Attention at length: exact attention computed in tiles (FlashAttention's algorithm) and linear
attention (Katharopoulos et al., 2020) with its recurrent form.

:func:`tiled_attention` gives the same numbers as ``scaled_dot_product_attention`` without ever
holding the (L, S) table of scores: it walks blocks of queries against blocks of keys and keeps,
per query, the running maximum and the running sum of the online softmax. Its backward pass is
tiled the same way, recomputing each tile's weights from the saved log-sum-exp.

:func:`linear_attention` replaces softmax(q . k) by phi(q) . phi(k) with phi = elu + 1, so the sum
over keys factors and costs O(L) instead of O(L S); causally it is a prefix sum, and step by
step (:class:`LinearAttentionRecurrence`) a state of fixed size.

This module imports only :mod:`coursepkg.masks` and the validators, so :mod:`coursepkg.attention`
can re-export its functions without a cycle.

Dimension legend: B batch, H heads, L queries, S keys, Dk/Dv per-head sizes; ``...`` stands for
any leading dims (usually (B, H)). Masks are boolean, True = may attend.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ._validation import check_attention_mask, check_float
from .masks import causal_visibility

__all__ = [
    "LinearAttentionRecurrence",
    "elu_feature_map",
    "linear_attention",
    "linear_attention_recurrent",
    "tiled_attention",
]


def _check_inputs(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        check_float(name, x)
    if query.dim() < 2 or not query.shape[:-2] == key.shape[:-2] == value.shape[:-2]:
        raise ValueError(
            "query, key and value must have the same leading dims (..., L or S, D), got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError(
            "expected query (..., L, Dk), key (..., S, Dk), value (..., S, Dv), got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if mask is not None:
        check_attention_mask("mask", mask, (*query.shape[:-2], query.size(-2), key.size(-2)))


def _check_block(block: int | tuple[int, int]) -> tuple[int, int]:
    blocks = (block, block) if isinstance(block, int) else tuple(block)
    if len(blocks) != 2 or not all(isinstance(b, int) and b >= 1 for b in blocks):
        raise ValueError(
            f"block must be a positive integer or a pair (queries, keys) of them, got {block!r}"
        )
    return blocks


class _Tiles:
    """The tiling of one call: where the blocks lie and which keys each tile's queries see."""

    def __init__(self, query, key, mask, block, causal, window) -> None:
        self.L, self.S = query.size(-2), key.size(-2)
        self.bq, self.bk = block
        self.causal, self.window = causal, window
        # A view: slicing a broadcast (B, 1, 1, S) mask by query rows needs the L dim spelled out.
        self.mask = None if mask is None else mask.expand(*mask.shape[:-2], self.L, self.S)
        self.device = query.device

    def queries(self):
        return [(i, min(i + self.bq, self.L)) for i in range(0, self.L, self.bq)]

    def keys(self):
        return [(j, min(j + self.bk, self.S)) for j in range(0, self.S, self.bk)]

    def visible(self, i0: int, i1: int, j0: int, j1: int) -> Tensor | bool | None:
        """The tile's mask (n, m) or broadcastable; None: all visible; False: none visible."""
        tile = None
        if self.causal:
            shift = self.S - self.L  # bottom-right alignment, as causal_mask
            first, last = i0 + shift, i1 - 1 + shift  # absolute positions of the tile's queries
            if j0 > last or (self.window is not None and j1 - 1 <= first - self.window):
                return False  # the whole tile lies in the future or before the window
            rows = torch.arange(i0 + shift, i1 + shift, device=self.device)  # (n,)
            cols = torch.arange(j0, j1, device=self.device)  # (m,)
            tile = causal_visibility(rows, cols, self.window)  # (n, m)
        if self.mask is not None:
            given = self.mask[..., i0:i1, j0:j1]  # (..., n, m)
            tile = given if tile is None else given & tile
        return tile


def _forward(q: Tensor, k: Tensor, v: Tensor, tiles: _Tiles) -> tuple[Tensor, Tensor]:
    # The online softmax over key blocks, one query block at a time.
    scale = 1.0 / math.sqrt(q.size(-1))
    out = q.new_zeros(*q.shape[:-1], v.size(-1))  # (..., L, Dv)
    lse = q.new_full(q.shape[:-1], math.inf)  # (..., L); +inf marks a row with nothing to see
    for i0, i1 in tiles.queries():
        q_i = q[..., i0:i1, :] * scale  # (..., n, Dk)
        row_max = q_i.new_full(q_i.shape[:-1], -math.inf)  # (..., n) running maximum m
        row_sum = q_i.new_zeros(q_i.shape[:-1])  # (..., n) running sum l
        acc = q_i.new_zeros(*q_i.shape[:-1], v.size(-1))  # (..., n, Dv) unnormalised output
        for j0, j1 in tiles.keys():
            visible = tiles.visible(i0, i1, j0, j1)
            if visible is False:
                continue
            scores = q_i @ k[..., j0:j1, :].transpose(-2, -1)  # (..., n, m)
            if visible is not None:
                scores = scores.masked_fill(~visible, -math.inf)
            new_max = torch.maximum(row_max, scores.amax(dim=-1))  # (..., n)
            # A row that has seen only masked keys keeps max -inf; shift it by 0 instead (no NaN).
            shift = new_max.masked_fill(new_max == -math.inf, 0.0)  # (..., n)
            p = torch.exp(scores - shift[..., None])  # (..., n, m)
            rescale = torch.exp(row_max - shift)  # (..., n): old terms to the new maximum
            row_sum = rescale * row_sum + p.sum(dim=-1)
            acc = rescale[..., None] * acc + p @ v[..., j0:j1, :]  # (..., n, Dv)
            row_max = new_max
        seen = row_sum > 0  # (..., n); False for a fully masked row, whose output stays zero
        out[..., i0:i1, :] = torch.where(seen[..., None], acc / row_sum[..., None], 0.0)
        lse[..., i0:i1] = torch.where(seen, row_max + torch.log(row_sum), math.inf)
    return out, lse


def _backward(q, k, v, out, lse, grad_out, tiles: _Tiles) -> tuple[Tensor, Tensor, Tensor]:
    # FlashAttention-2's backward: each tile's weights recomputed as exp(scores - lse).
    scale = 1.0 / math.sqrt(q.size(-1))
    delta = (grad_out * out).sum(dim=-1)  # (..., L): rowsum(dO * O) = rowsum(P * dP)
    grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j0, j1 in tiles.keys():
        k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]  # (..., m, Dk), (..., m, Dv)
        for i0, i1 in tiles.queries():
            visible = tiles.visible(i0, i1, j0, j1)
            if visible is False:
                continue
            q_i, do_i = q[..., i0:i1, :], grad_out[..., i0:i1, :]  # (..., n, Dk), (..., n, Dv)
            scores = q_i @ k_j.transpose(-2, -1) * scale  # (..., n, m)
            if visible is not None:
                scores = scores.masked_fill(~visible, -math.inf)
            p = torch.exp(scores - lse[..., i0:i1, None])  # (..., n, m): the forward's weights
            grad_v[..., j0:j1, :] += p.transpose(-2, -1) @ do_i  # (..., m, Dv)
            grad_p = do_i @ v_j.transpose(-2, -1)  # (..., n, m)
            grad_s = p * (grad_p - delta[..., i0:i1, None]) * scale  # (..., n, m)
            grad_q[..., i0:i1, :] += grad_s @ k_j  # (..., n, Dk)
            grad_k[..., j0:j1, :] += grad_s.transpose(-2, -1) @ q_i  # (..., m, Dk)
    return grad_q, grad_k, grad_v


class _TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, tiles):
        out, lse = _forward(q, k, v, tiles)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.tiles = tiles
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        return (*_backward(q, k, v, out, lse, grad_out.contiguous(), ctx.tiles), None)


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    block: int | tuple[int, int] = 64,
    causal: bool = False,
    window: int | None = None,
) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V without the (L, S) table: FlashAttention's tiling
    (Dao et al., 2022, Algorithm 1; the backward of Dao, 2023) in plain PyTorch.

    Each block of queries meets the blocks of keys in turn; the online softmax keeps the
    running maximum m and sum l of each row and rescales the accumulated output whenever m
    grows. Only one (block x block) tile of scores exists at a time, in the forward and in the
    backward pass (which recomputes the tile's weights from the saved log-sum-exp). Tiles that
    ``causal`` or ``window`` hide entirely are skipped.

    Args:
        query: queries Q.
        key: keys K.
        value: values V.
        mask: bool, True = may attend; broadcastable to (..., L, S). A query whose keys are
            all masked gets a zero output (never NaN).
        block: rows per tile, for queries and keys alike, or a pair (queries, keys).
        causal: also apply :func:`~coursepkg.masks.causal_mask` (bottom-right aligned), built
            tile by tile rather than as an (L, S) tensor.
        window: with ``causal``, a sliding window of this many positions (as
            ``causal_mask(..., window=window)``).

    Shape:
        query (..., L, Dk), key (..., S, Dk), value (..., S, Dv) -> (..., L, Dv).

    Returns:
        The attention output, equal to ``scaled_dot_product_attention``'s up to rounding.
    """
    _check_inputs(query, key, value, mask)
    blocks = _check_block(block)
    if window is not None and not causal:
        raise ValueError("window needs causal=True (a sliding window looks back, not ahead)")
    if causal and query.size(-2) > key.size(-2):
        raise ValueError(
            f"causal needs L <= S (bottom-right alignment), got L={query.size(-2)}, "
            f"S={key.size(-2)}"
        )
    tiles = _Tiles(query, key, mask, blocks, causal, window)
    return _TiledAttention.apply(query, key, value, tiles)  # (..., L, Dv)


def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1, the positive feature map of Katharopoulos et al. (2020)."""
    return F.elu(x) + 1.0


def linear_attention(
    query: Tensor, key: Tensor, value: Tensor, causal: bool = False, eps: float = 1e-6
) -> Tensor:
    """Linear attention (Katharopoulos et al., 2020): softmax(q . k) replaced by
    phi(q) . phi(k), so that sum_j phi(k_j) v_j^T is computed once instead of per query.

    Args:
        query: queries Q.
        key: keys K.
        value: values V.
        causal: query i sees keys up to i only (then L must equal S); computed with prefix
            sums over positions.
        eps: added to each row's normaliser phi(q_i) . sum_j phi(k_j).

    Shape:
        query (..., L, Dk), key (..., S, Dk), value (..., S, Dv) -> (..., L, Dv).

    Returns:
        The output; its cost is O(L Dk Dv) rather than O(L S Dk).
    """
    _check_inputs(query, key, value, None)
    if causal and query.size(-2) != key.size(-2):
        raise ValueError(
            f"causal linear attention needs L == S, got {query.size(-2)}, {key.size(-2)}"
        )
    phi_q, phi_k = elu_feature_map(query), elu_feature_map(key)  # (..., L, Dk), (..., S, Dk)
    if not causal:
        state = phi_k.transpose(-2, -1) @ value  # (..., Dk, Dv): sum_j phi(k_j) v_j^T
        norm = phi_k.sum(dim=-2)  # (..., Dk): sum_j phi(k_j)
        numerator = phi_q @ state  # (..., L, Dv)
        denominator = phi_q @ norm[..., None]  # (..., L, 1)
    else:
        state = (phi_k[..., :, None] * value[..., None, :]).cumsum(dim=-3)  # (..., L, Dk, Dv)
        norm = phi_k.cumsum(dim=-2)  # (..., L, Dk)
        numerator = (phi_q[..., None, :] @ state).squeeze(-2)  # (..., L, Dv)
        denominator = (phi_q * norm).sum(dim=-1, keepdim=True)  # (..., L, 1)
    return numerator / (denominator + eps)  # (..., L, Dv)


class LinearAttentionRecurrence:
    """Causal linear attention one position at a time: a recurrent network whose state has a
    fixed size, whatever the number of positions seen (Katharopoulos et al., 2020).

    Attributes:
        state: (..., Dk, Dv), sum of phi(k_j) v_j^T over the positions seen; None before.
        norm: (..., Dk), sum of phi(k_j) over the positions seen; None before.
    """

    def __init__(self, eps: float = 1e-6) -> None:
        self.eps = eps
        self.state: Tensor | None = None
        self.norm: Tensor | None = None

    def step(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """Add one position's key and value to the state, then read it with its query.

        Shape:
            query (..., Dk), key (..., Dk), value (..., Dv) -> (..., Dv).
        """
        phi_q, phi_k = elu_feature_map(query), elu_feature_map(key)  # (..., Dk)
        update = phi_k[..., :, None] * value[..., None, :]  # (..., Dk, Dv)
        self.state = update if self.state is None else self.state + update
        self.norm = phi_k if self.norm is None else self.norm + phi_k
        numerator = (phi_q[..., None, :] @ self.state).squeeze(-2)  # (..., Dv)
        denominator = (phi_q * self.norm).sum(dim=-1, keepdim=True)  # (..., 1)
        return numerator / (denominator + self.eps)


def linear_attention_recurrent(
    query: Tensor, key: Tensor, value: Tensor, eps: float = 1e-6
) -> Tensor:
    """Causal :func:`linear_attention` computed by :class:`LinearAttentionRecurrence`, step by step.

    Shape:
        query (..., L, Dk), key (..., L, Dk), value (..., L, Dv) -> (..., L, Dv).
    """
    _check_inputs(query, key, value, None)
    if query.size(-2) != key.size(-2):
        raise ValueError(f"the recurrent form needs L == S, got {query.size(-2)}, {key.size(-2)}")
    recurrence = LinearAttentionRecurrence(eps)
    steps = [
        recurrence.step(query[..., t, :], key[..., t, :], value[..., t, :])  # (..., Dv)
        for t in range(query.size(-2))
    ]
    return torch.stack(steps, dim=-2)  # (..., L, Dv)
