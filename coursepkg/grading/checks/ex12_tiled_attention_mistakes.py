"""The catalogue of ex12_tiled_attention: the known mistakes of exact attention computed in
tiles (FlashAttention's online softmax, and its backward pass by recomputation) written as a
``torch.autograd.Function``.

:class:`TiledFunction` is a correct tiled attention written in steps (which tiles a causal mask
skips, one online-softmax update, the end of a query block, the term D of the backward pass);
each catalogued mistake is a subclass named ``TiledAttention_<mistake>`` that overrides the one
step it gets wrong. The evidence: the check reruns the variant on the student's inputs and
names the mistake only when its outputs (or its gradients) match the student's.

Dimension legend: B batch, H heads, L queries, S keys, Dk/Dv per-head sizes; ``...`` stands for
the leading dims; n and m are the rows of a query block and of a key block.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ...efficient_attention import tiled_attention
from ..framework import BugVariant

__all__ = ["BUGS", "TILED_BUGS", "TILED_ITEM", "TiledFunction", "Tiling"]

TILED_ITEM = "TiledAttention"


class Tiling:
    """Where the tiles of one call lie and which keys a tile's queries may see.

    Args:
        query: (..., L, Dk). key: (..., S, Dk).
        mask: bool, True = may attend, broadcastable to (..., L, S), or None.
        causal: a causal mask aligned bottom-right (query i at position i + S - L).
        block_q, block_k: rows of a query block and of a key block.
    """

    def __init__(self, query, key, mask, causal, block_q, block_k) -> None:
        self.L, self.S = query.size(-2), key.size(-2)
        self.shift = self.S - self.L  # bottom-right alignment
        self.block_q, self.block_k, self.causal = block_q, block_k, causal
        self.mask = None if mask is None else mask.expand(*mask.shape[:-2], self.L, self.S)
        self.device = query.device

    def query_blocks(self) -> list[tuple[int, int]]:
        return [(i, min(i + self.block_q, self.L)) for i in range(0, self.L, self.block_q)]

    def key_blocks(self) -> list[tuple[int, int]]:
        return [(j, min(j + self.block_k, self.S)) for j in range(0, self.S, self.block_k)]

    def visible(self, i0: int, i1: int, j0: int, j1: int) -> Tensor | None:
        """The tile's mask (..., n, m), or None when every key of it is visible."""
        tile = None
        if self.causal:
            rows = torch.arange(i0, i1, device=self.device) + self.shift  # (n,) positions
            cols = torch.arange(j0, j1, device=self.device)  # (m,)
            tile = rows[:, None] >= cols[None, :]  # (n, m): key j visible from query i
        if self.mask is not None:
            given = self.mask[..., i0:i1, j0:j1]  # (..., n, m)
            tile = given if tile is None else given & tile
        return tile

    def allowed(self) -> Tensor | None:
        """The whole (..., L, S) mask, or None: for the variants that call a built-in."""
        return self.visible(0, self.L, 0, self.S)


class TiledFunction(torch.autograd.Function):
    """The correct tiled attention, in the steps its mistakes override (the stub's signature:
    ``apply(query, key, value, mask, causal, block_q, block_k)``)."""

    #: where the tiles lie (a mistake about the causal mask's alignment replaces it)
    tiling = Tiling

    @classmethod
    def forward(cls, ctx, query, key, value, mask=None, causal=False, block_q=16, block_k=16):
        tiles = cls.tiling(query, key, mask, causal, block_q, block_k)
        out, lse = cls.run_forward(query, key, value, tiles)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.tiles, ctx.variant = tiles, cls
        return out  # (..., L, Dv)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grads = ctx.variant.run_backward(q, k, v, out, lse, grad_out, ctx.tiles)
        return (*grads, None, None, None, None)

    # -- the steps ----------------------------------------------------------------------------

    @staticmethod
    def skipped(tiles: Tiling, i0: int, i1: int, j0: int) -> bool:
        """Whether the causal mask hides the whole tile: its first key comes after its last
        query."""
        return tiles.causal and j0 > i1 - 1 + tiles.shift

    @staticmethod
    def update(state, scores: Tensor, v_j: Tensor):
        """One key block of the online softmax: the running max m, sum l and the unnormalised
        output acc, rescaled to the new maximum."""
        row_max, row_sum, acc = state
        new_max = torch.maximum(row_max, scores.amax(dim=-1))  # (..., n)
        shift = new_max.masked_fill(new_max == -math.inf, 0.0)  # no -inf - -inf
        p = torch.exp(scores - shift[..., None])  # (..., n, m)
        rescale = torch.exp(row_max - shift)  # (..., n)
        row_sum = rescale * row_sum + p.sum(dim=-1)  # (..., n)
        acc = rescale[..., None] * acc + p @ v_j  # (..., n, Dv)
        return new_max, row_sum, acc

    @staticmethod
    def finish(state) -> tuple[Tensor, Tensor]:
        """The block's output acc / l and log-sum-exp m + log l; a row that sees no key gets
        zeros and lse = +inf (its recomputed weights exp(s - lse) are then 0)."""
        row_max, row_sum, acc = state
        seen = row_sum > 0  # (..., n)
        safe = torch.where(seen, row_sum, 1.0)  # (..., n)
        out = torch.where(seen[..., None], acc / safe[..., None], 0.0)  # (..., n, Dv)
        return out, torch.where(seen, row_max + torch.log(safe), math.inf)

    @staticmethod
    def tile_delta(delta: Tensor, p: Tensor, grad_p: Tensor) -> Tensor:
        """The D of a tile's rows: rowsum(dO * O) over the whole row, computed once."""
        return delta  # (..., n)

    # -- the passes ---------------------------------------------------------------------------

    @classmethod
    def run_forward(cls, q, k, v, tiles: Tiling) -> tuple[Tensor, Tensor]:
        scale = 1.0 / math.sqrt(q.size(-1))
        out = q.new_zeros(*q.shape[:-1], v.size(-1))  # (..., L, Dv)
        lse = q.new_zeros(q.shape[:-1])  # (..., L)
        for i0, i1 in tiles.query_blocks():
            q_i = q[..., i0:i1, :] * scale  # (..., n, Dk)
            state = (
                q_i.new_full(q_i.shape[:-1], -math.inf),  # (..., n)
                q_i.new_zeros(q_i.shape[:-1]),  # (..., n)
                q_i.new_zeros(*q_i.shape[:-1], v.size(-1)),  # (..., n, Dv)
            )
            for j0, j1 in tiles.key_blocks():
                if cls.skipped(tiles, i0, i1, j0):
                    continue
                scores = q_i @ k[..., j0:j1, :].transpose(-2, -1)  # (..., n, m)
                visible = tiles.visible(i0, i1, j0, j1)
                if visible is not None:
                    scores = scores.masked_fill(~visible, -math.inf)
                state = cls.update(state, scores, v[..., j0:j1, :])
            out[..., i0:i1, :], lse[..., i0:i1] = cls.finish(state)
        return out, lse

    @classmethod
    def run_backward(cls, q, k, v, out, lse, grad_out, tiles: Tiling):
        scale = 1.0 / math.sqrt(q.size(-1))
        delta = (grad_out * out).sum(dim=-1)  # (..., L)
        grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for i0, i1 in tiles.query_blocks():
            q_i, do_i = q[..., i0:i1, :], grad_out[..., i0:i1, :]  # (..., n, Dk), (..., n, Dv)
            for j0, j1 in tiles.key_blocks():
                if cls.skipped(tiles, i0, i1, j0):
                    continue
                k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]  # (..., m, Dk), (..., m, Dv)
                scores = q_i @ k_j.transpose(-2, -1) * scale  # (..., n, m)
                visible = tiles.visible(i0, i1, j0, j1)
                if visible is not None:
                    scores = scores.masked_fill(~visible, -math.inf)
                p = torch.exp(scores - lse[..., i0:i1, None])  # (..., n, m)
                grad_v[..., j0:j1, :] += p.transpose(-2, -1) @ do_i  # (..., m, Dv)
                grad_p = do_i @ v_j.transpose(-2, -1)  # (..., n, m)
                d_i = cls.tile_delta(delta[..., i0:i1], p, grad_p)  # (..., n)
                grad_s = p * (grad_p - d_i[..., None]) * scale  # (..., n, m)
                grad_q[..., i0:i1, :] += grad_s @ k_j  # (..., n, Dk)
                grad_k[..., j0:j1, :] += grad_s.transpose(-2, -1) @ q_i  # (..., m, Dk)
        return grad_q, grad_k, grad_v


# ---------------------------------------------------------------------------------------------
# The mistakes, each in its own lines
# ---------------------------------------------------------------------------------------------


class TiledAttention_no_rescale(TiledFunction):
    @staticmethod
    def update(state, scores, v_j):
        row_max, row_sum, acc = state
        new_max = torch.maximum(row_max, scores.amax(dim=-1))  # (..., n)
        shift = new_max.masked_fill(new_max == -math.inf, 0.0)
        p = torch.exp(scores - shift[..., None])  # (..., n, m)
        rescale = torch.exp(row_max - shift)  # (..., n)
        row_sum = rescale * row_sum + p.sum(dim=-1)
        acc = acc + p @ v_j  # (..., n, Dv): the old terms keep the old maximum
        return new_max, row_sum, acc


class TiledAttention_sum_not_rescaled(TiledFunction):
    @staticmethod
    def update(state, scores, v_j):
        new_max, _, acc = TiledFunction.update(state, scores, v_j)
        p = torch.exp(scores - new_max.masked_fill(new_max == -math.inf, 0.0)[..., None])
        return new_max, state[1] + p.sum(dim=-1), acc  # (..., n): the old sum, old maximum


class _TopLeftTiling(Tiling):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.shift = 0  # query i sees keys 0 .. i, as if the keys began with the queries


class TiledAttention_causal_top_left(TiledFunction):
    tiling = _TopLeftTiling


class TiledAttention_max_not_subtracted(TiledFunction):
    @staticmethod
    def update(state, scores, v_j):
        row_max, row_sum, acc = state
        p = torch.exp(scores)  # (..., n, m): overflows once a score passes ~88 in float32
        return torch.zeros_like(row_max), row_sum + p.sum(dim=-1), acc + p @ v_j


class TiledAttention_normalised_in_loop(TiledFunction):
    @staticmethod
    def update(state, scores, v_j):
        row_max, row_sum, acc = TiledFunction.update(state, scores, v_j)
        seen = (row_sum > 0)[..., None]  # (..., n, 1)
        acc = torch.where(seen, acc / torch.where(seen, row_sum[..., None], 1.0), 0.0)
        return row_max, row_sum, acc  # divided by l at every block, not once at the end

    @staticmethod
    def finish(state):
        row_max, row_sum, acc = state
        seen = row_sum > 0
        lse = torch.where(seen, row_max + torch.log(torch.where(seen, row_sum, 1.0)), math.inf)
        return acc, lse


class TiledAttention_lse_without_max(TiledFunction):
    @staticmethod
    def finish(state):
        out, lse = TiledFunction.finish(state)
        row_max = state[0]
        return out, torch.where(torch.isinf(lse), lse, lse - row_max)  # log l alone


class TiledAttention_masked_row_nan(TiledFunction):
    @staticmethod
    def finish(state):
        row_max, row_sum, acc = state
        return acc / row_sum[..., None], row_max + torch.log(row_sum)  # 0 / 0 for a masked row


class TiledAttention_causal_skip_off_by_one(TiledFunction):
    @staticmethod
    def skipped(tiles, i0, i1, j0):
        return tiles.causal and j0 >= i1 - 1 + tiles.shift  # drops the diagonal's first key


class TiledAttention_delta_per_block(TiledFunction):
    @staticmethod
    def tile_delta(delta, p, grad_p):
        return (p * grad_p).sum(dim=-1)  # (..., n): this tile's keys only, not the whole row


class TiledAttention_delta_left_out(TiledFunction):
    @staticmethod
    def tile_delta(delta, p, grad_p):
        return torch.zeros_like(delta)  # dS = P * dP: softmax's Jacobian without its - D term


class TiledAttention_mask_not_in_backward(TiledFunction):
    @classmethod
    def run_backward(cls, q, k, v, out, lse, grad_out, tiles):
        unmasked = copy.copy(tiles)
        unmasked.mask = None  # the recomputed scores lose the padding mask (causal kept)
        return super().run_backward(q, k, v, out, lse, grad_out, unmasked)


class TiledAttention_backward_unscaled(TiledFunction):
    @classmethod
    def run_backward(cls, q, k, v, out, lse, grad_out, tiles):
        grad_q, grad_k, grad_v = super().run_backward(q, k, v, out, lse, grad_out, tiles)
        root = math.sqrt(q.size(-1))  # dS K and dS^T Q without their 1 / sqrt(Dk)
        return grad_q * root, grad_k * root, grad_v


class _FullKeyBlocksTiling(Tiling):
    def key_blocks(self) -> list[tuple[int, int]]:
        stop = self.S - self.S % self.block_k  # the shorter last block of keys never visited
        return [(j, j + self.block_k) for j in range(0, stop, self.block_k)]


class TiledAttention_last_key_block_dropped(TiledFunction):
    tiling = _FullKeyBlocksTiling


class TiledAttention_builtin_sdpa(TiledFunction):
    @classmethod
    def run_forward(cls, q, k, v, tiles):
        _, lse = super().run_forward(q, k, v, tiles)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=tiles.allowed()), lse


class TiledAttention_reference_tiled_attention(TiledFunction):
    @classmethod
    def run_forward(cls, q, k, v, tiles):
        _, lse = super().run_forward(q, k, v, tiles)
        block = (tiles.block_q, tiles.block_k)
        return tiled_attention(q, k, v, tiles.mask, block, tiles.causal), lse


TILED_BUGS: list[BugVariant] = [
    BugVariant(
        "tiled.no_rescale",
        TILED_ITEM,
        "the accumulated output is not rescaled when a row's running maximum grows: the terms "
        "of earlier key blocks keep the old maximum while the sum l uses the new one",
        "When m grows to m_new, multiply the accumulator (and l) by exp(m - m_new) before "
        "adding this block's P V.",
        TiledAttention_no_rescale,
    ),
    BugVariant(
        "tiled.sum_not_rescaled",
        TILED_ITEM,
        "the running sum l is not rescaled when a row's running maximum grows: the output's "
        "accumulator is, but l keeps the terms of earlier key blocks at the old maximum, so "
        "the weights no longer sum to 1",
        "When m grows to m_new, multiply l by exp(m - m_new) as well as the accumulator, "
        "then add this block's exp(scores - m_new) to it.",
        TiledAttention_sum_not_rescaled,
    ),
    BugVariant(
        "tiled.causal_top_left",
        TILED_ITEM,
        "the causal mask is anchored top-left: query i sees keys 0 to i, which is right only "
        "when there are as many keys as queries; with S > L (a prefix or a KV cache) the "
        "queries are the last L positions, and query i sees keys 0 to i + S - L",
        "Align the causal mask bottom-right: key j is visible from query i when "
        "j <= i + S - L (and skip a key block only when it starts after that).",
        TiledAttention_causal_top_left,
    ),
    BugVariant(
        "tiled.max_not_subtracted",
        TILED_ITEM,
        "the weights are exp(scores) without the running maximum subtracted: right for small "
        "scores, but exp overflows to inf (and the output to NaN) once a score passes about 88 "
        "in float32, as it does when the queries are scaled up",
        "Keep the running maximum m of each row and compute exp(scores - m); rescale the "
        "accumulator and l when m grows.",
        TiledAttention_max_not_subtracted,
    ),
    BugVariant(
        "tiled.normalised_in_loop",
        TILED_ITEM,
        "the softmax normaliser is applied before the last key block: the accumulator is "
        "divided by l inside the loop, and later blocks add unnormalised terms to it",
        "Keep the accumulator unnormalised while looping over the key blocks; divide by l "
        "once, after the last block.",
        TiledAttention_normalised_in_loop,
    ),
    BugVariant(
        "tiled.lse_without_max",
        TILED_ITEM,
        "the log-sum-exp saved for the backward pass is log l without the running maximum m, "
        "so the weights recomputed as exp(scores - lse) are off by a factor exp(m)",
        "Save lse = m + log(l) per query row (m the final running maximum, l the final sum).",
        TiledAttention_lse_without_max,
    ),
    BugVariant(
        "tiled.masked_row_nan",
        TILED_ITEM,
        "a query that may attend no key gives NaN: its sum l is 0 and the output acc / l is 0 / 0",
        "Where l == 0 return zeros (torch.where(l > 0, acc / l, 0)) and save an lse that makes "
        "exp(scores - lse) zero there (+inf).",
        TiledAttention_masked_row_nan,
    ),
    BugVariant(
        "tiled.causal_skip_off_by_one",
        TILED_ITEM,
        "the causal skip of whole key blocks is off by one: a key block that starts exactly at "
        "the position of the query block's last query is skipped, though that query sees it",
        "Skip key block [j0, j1) only when j0 > the absolute position of the block's last "
        "query (i1 - 1 + S - L with the bottom-right alignment).",
        TiledAttention_causal_skip_off_by_one,
    ),
    BugVariant(
        "tiled.delta_per_block",
        TILED_ITEM,
        "D is computed inside the key loop from the tile's own weights and their gradients, "
        "rowsum(P_ij * dP_ij), a sum over one key block instead of the whole row",
        "Compute D = rowsum(dO * O) once per query row, before the loops, from the saved "
        "output O and the incoming gradient dO.",
        TiledAttention_delta_per_block,
    ),
    BugVariant(
        "tiled.delta_left_out",
        TILED_ITEM,
        "the gradient of the scores is P * dP: the - D term of softmax's Jacobian, "
        "dS = P * (dP - D) with D = rowsum(dO * O), is left out",
        "Compute D = rowsum(dO * O) per query row and use dS = P * (dP - D) (times the scale).",
        TiledAttention_delta_left_out,
    ),
    BugVariant(
        "tiled.mask_not_in_backward",
        TILED_ITEM,
        "the backward pass recomputes the scores without the padding mask, so the weights "
        "exp(s - lse) of masked keys are not 0 there: the output is right but the gradients "
        "flow into keys and values the queries never attended",
        "Apply the same mask (and the causal test) to the recomputed scores in backward as in "
        "forward, -inf where a query may not attend.",
        TiledAttention_mask_not_in_backward,
    ),
    BugVariant(
        "tiled.backward_unscaled",
        TILED_ITEM,
        "the backward pass leaves out the 1 / sqrt(Dk) of the scores: the gradients of the "
        "queries and the keys are sqrt(Dk) times too large (the values' gradient is right)",
        "The scores are Q K^T / sqrt(Dk), so dQ = dS K / sqrt(Dk) and dK = dS^T Q / sqrt(Dk).",
        TiledAttention_backward_unscaled,
    ),
    BugVariant(
        "tiled.last_key_block_dropped",
        TILED_ITEM,
        "the loop over key blocks stops before the last, shorter block when block_k does not "
        "divide S, so the last keys are never attended",
        "Loop over range(0, S, block_k) and end each block at min(j + block_k, S).",
        TiledAttention_last_key_block_dropped,
    ),
    BugVariant(
        "tiled.builtin_sdpa",
        TILED_ITEM,
        "your tiled attention calls PyTorch's fused scaled_dot_product_attention instead of "
        "computing the tiles",
        "Write the tiles, the online softmax and the backward pass yourself.",
        TiledAttention_builtin_sdpa,
        calls=(F.scaled_dot_product_attention,),
    ),
    BugVariant(
        "tiled.reference_tiled_attention",
        TILED_ITEM,
        "your tiled attention calls the course's own coursepkg.efficient_attention.tiled_attention",
        "Write the tiles, the online softmax and the backward pass yourself.",
        TiledAttention_reference_tiled_attention,
        calls=(tiled_attention,),
    ),
]

BUGS: list[BugVariant] = [*TILED_BUGS]
