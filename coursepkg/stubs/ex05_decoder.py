"""Assignment ex05_decoder: the causal mask and the decoder layer (chapter 7).

Masks follow the course convention: boolean, True = may attend.
"""

from __future__ import annotations

import torch  # noqa: F401  (you will need it)
from torch import Tensor, nn


def causal_mask(length: int) -> Tensor:
    """The decoder's look-ahead mask (Vaswani et al., Sec. 3.2.3).

    Position ``i`` may attend positions ``0 .. i`` (itself and the past), never the future.

    Args:
        length: number of positions L (>= 1).

    Shape:
        Returns (L, L); it broadcasts against attention scores (B, H, L, L).

    Returns:
        A ``torch.bool`` tensor, True where query ``i`` may attend key ``j`` (that is, ``j <= i``).
    """
    raise NotImplementedError


class DecoderLayer(nn.Module):
    """One decoder layer, post-LN as in the paper (Sec. 3.1):

    x = norm1(x + self_attn(x, x, x, self_mask))
    x = norm2(x + cross_attn(x, memory, memory, cross_mask))
    x = norm3(x + ffn(x))

    Build it from YOUR pieces of the earlier assignments: ``MultiHeadAttention`` (ex02) and
    ``LayerNorm`` and ``PositionwiseFeedForward`` (ex04), defined in an earlier cell of this
    notebook. Do not use ``coursepkg``'s reference classes or ``torch.nn.MultiheadAttention``:
    the check rejects them.

    Args:
        d_model: width D.
        n_heads: number of heads H (D must be divisible by H).
        d_ff: inner width F of the feed-forward network.

    Submodules (the check copies the reference weights into them by these names):
        ``self_attn``, ``cross_attn`` (each with ``q_proj``, ``k_proj``, ``v_proj``,
        ``out_proj``), ``ffn`` (``linear1``, ``linear2``), ``norm1``, ``norm2``, ``norm3``
        (each with ``weight`` and ``bias``). No dropout is needed: the check runs in eval mode.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None = None,
        cross_mask: Tensor | None = None,
    ) -> Tensor:
        """Run one decoder layer.

        Args:
            x: the decoder's input (target embeddings, or the previous layer's output).
            memory: the encoder's output; cross-attention takes its keys and values from it.
            self_mask: bool, True = may attend, broadcastable to (B, H, L, L); the caller passes
                the causal mask (combined with target padding) here, the layer does not build it.
            cross_mask: bool, True = may attend, broadcastable to (B, H, L, S); normally the
                source padding mask, e.g. of shape (B, 1, 1, S).

        Shape:
            x (B, L, D), memory (B, S, D) -> (B, L, D).

        Returns:
            The layer's output, same shape as ``x``.
        """
        raise NotImplementedError
