"""Assignment ex04_encoder: LayerNorm, the position-wise feed-forward network and the encoder
layer (chapter 6).

Masks follow the course convention: boolean, True = may attend.
"""

from __future__ import annotations

import torch  # noqa: F401  (you will need it)
from torch import Tensor, nn


class LayerNorm(nn.Module):
    """Layer normalisation over the last axis (Ba et al., 2016):

    y = (x - mean) / sqrt(var + eps) * weight + bias

    where mean and var are taken over the D features of each position, and var is the biased
    variance (divide by D, as ``nn.LayerNorm`` does). Write it yourself: the check rejects
    ``nn.LayerNorm`` and ``torch.nn.functional.layer_norm``.

    Args:
        d_model: width D.
        eps: added to the variance inside the square root.

    Parameters (the check copies the reference weights into them by these names):
        ``weight`` (gamma, shape (D,), initialised to ones) and ``bias`` (beta, shape (D,),
        initialised to zeros), both ``nn.Parameter``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Normalise each position's features.

        Shape:
            x (..., D) -> (..., D), e.g. (B, L, D).
        """
        raise NotImplementedError


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, the same two-layer network applied at every position
    on its own (Vaswani et al., Eq. 2).

    Args:
        d_model: width D of input and output.
        d_ff: inner width F.

    Submodules (names used by the check): ``linear1`` (``nn.Linear(D, F)``) and ``linear2``
    (``nn.Linear(F, D)``), both with bias; ReLU between them. No dropout is needed.
    """

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, L, D) -> (B, L, D)."""
        raise NotImplementedError


class EncoderLayer(nn.Module):
    """One encoder layer, post-LN as in the paper (Sec. 3.1):

    x = norm1(x + self_attn(x, x, x, mask))
    x = norm2(x + ffn(x))

    Build it from YOUR pieces: ``MultiHeadAttention`` (ex02) and ``LayerNorm`` and
    ``PositionwiseFeedForward`` (above), defined in earlier cells of this notebook. Do not use
    ``coursepkg``'s reference classes or ``torch.nn.MultiheadAttention``: the check rejects them.

    Args:
        d_model: width D.
        n_heads: number of heads H (D must be divisible by H).
        d_ff: inner width F of the feed-forward network.

    Submodules (the check copies the reference weights into them by these names):
        ``self_attn`` (with ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``), ``ffn``
        (``linear1``, ``linear2``), ``norm1``, ``norm2`` (each with ``weight`` and ``bias``).
        No dropout is needed: the check runs in eval mode.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Encode ``x``.

        Args:
            x: the layer's input (embeddings plus positions, or the previous layer's output).
            mask: None or a bool tensor broadcastable to (B, H, L, L), **True = may attend**;
                normally the source padding mask of shape (B, 1, 1, L).

        Shape:
            x (B, L, D) -> (B, L, D).

        Returns:
            The layer's output, same shape as ``x``.
        """
        raise NotImplementedError
