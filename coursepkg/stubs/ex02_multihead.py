"""Assignment ex02_multihead: multi-head attention (chapter 4).

Masks follow the course convention: boolean, True = may attend.
"""

from __future__ import annotations

import math  # noqa: F401  (you will need it)

import torch  # noqa: F401
from torch import Tensor, nn


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O, with
    head_h = Attention(Q W^Q_h, K W^K_h, V W^V_h) (Vaswani et al., Eq. 4-5).

    Each head works on Dk = D // H features. Write the attention yourself (you may paste your
    ``scaled_dot_product_attention`` from ex01 into this notebook); the check rejects
    ``torch.nn.MultiheadAttention``, ``torch.nn.functional.scaled_dot_product_attention`` and
    ``coursepkg``'s reference classes.

    Args:
        d_model: width D of the inputs and the output.
        n_heads: number of heads H (D must be divisible by H).

    Submodules (the check copies the reference weights into them by these names):
        ``q_proj``, ``k_proj``, ``v_proj`` (each ``nn.Linear(D, D)``, with bias): all H heads'
        projections side by side, head h in output features h*Dk .. (h+1)*Dk - 1;
        ``out_proj`` (``nn.Linear(D, D)``, with bias): W^O. No dropout is needed: the check
        runs in eval mode.
    """

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """Attend from ``query`` to ``key``/``value`` with H heads.

        Args:
            query: the sequence that asks (the decoder's states in cross-attention).
            key: the sequence that is searched.
            value: what is read out (same length as ``key``).
            mask: None or a bool tensor broadcastable to (B, H, L, S), **True = may attend**;
                e.g. a padding mask (B, 1, 1, S) or a causal mask (L, S). A query with no key
                to attend gets a zero attention output (so the layer returns the bias of
                ``out_proj`` there), never NaN.

        Shape:
            query (B, L, D), key (B, S, D), value (B, S, D) -> (B, L, D).

        Returns:
            The attended values of all heads, concatenated and projected by ``out_proj``.
        """
        raise NotImplementedError
