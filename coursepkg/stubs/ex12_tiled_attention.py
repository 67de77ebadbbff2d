"""Assignment ex12_tiled_attention: exact attention computed in tiles (FlashAttention's online
softmax, Dao et al. 2022) and its backward pass by recomputation (Dao, 2023), as a
``torch.autograd.Function``.

Masks follow the course convention: boolean, True = may attend.
"""

from __future__ import annotations

import math  # noqa: F401  (you will need it)

import torch
from torch import Tensor


class TiledAttention(torch.autograd.Function):
    """softmax(Q K^T / sqrt(Dk)) V computed one (block_q x block_k) tile of scores at a time,
    never holding the whole (L, S) table, with a backward pass that recomputes each tile.

    Forward: for each block of queries, walk the blocks of keys keeping, per query row, the
    running maximum m of its scores, the running sum l of exp(score - m) and the unnormalised
    output acc. When a block raises m to m_new, rescale l and acc by exp(m - m_new) before
    adding the block's terms; after the last block the output is acc / l. Save the
    log-sum-exp lse = m + log(l) of each row (and what else the backward needs) with
    ``ctx.save_for_backward``.

    Backward: D = rowsum(dO * O) per query row, then for every tile recompute the weights
    P = exp(scores - lse) and accumulate dV += P^T dO, dP = dO V^T, dS = P * (dP - D),
    dQ += dS K / sqrt(Dk), dK += dS^T Q / sqrt(Dk).

    Masks: ``mask`` (True = may attend) and, with ``causal=True``, a causal mask aligned
    bottom-right (query i sits at position i + S - L and sees keys j <= i + S - L). With
    ``causal`` you may skip the key blocks that lie entirely after a query block's last
    query. A query that may attend no key gives a zero output row (never NaN) and no
    gradient. Block sizes need not divide L or S: the last block is shorter.

    Write the tiles yourself (helper functions above the class are welcome): the check
    rejects ``torch.nn.functional.scaled_dot_product_attention`` and the course's
    ``tiled_attention``, and the causal test ``j <= i + S - L`` is yours to write too.
    """

    @staticmethod
    def forward(
        ctx,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        block_q: int = 16,
        block_k: int = 16,
    ) -> Tensor:
        """The attention output, tile by tile; saves what the backward pass needs.

        Args:
            ctx: the autograd context (``ctx.save_for_backward(...)``; other attributes,
                such as ``ctx.causal = causal``, hold the non-tensor arguments).
            query: queries Q.
            key: keys K.
            value: values V.
            mask: bool, True = may attend, broadcastable to (..., L, S); or None.
            causal: also apply the bottom-right aligned causal mask (needs L <= S).
            block_q: queries per block.
            block_k: keys per block.

        Shape:
            query (..., L, Dk), key (..., S, Dk), value (..., S, Dv) -> (..., L, Dv).

        Returns:
            The output, in the inputs' dtype and on their device.
        """
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        """The gradients of query, key and value, tile by tile from the saved log-sum-exp.

        Shape:
            grad_out (..., L, Dv) -> (..., L, Dk), (..., S, Dk), (..., S, Dv).

        Returns:
            A tuple with one entry per argument of ``forward`` after ``ctx``: the three
            gradients, then ``None`` for mask, causal, block_q and block_k.
        """
        raise NotImplementedError
