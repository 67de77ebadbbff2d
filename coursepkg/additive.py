"""Additive (Bahdanau) attention, the score function of the RNN chapters.

``coursepkg.attention`` re-exports :class:`AdditiveAttention`; import it from there.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["AdditiveAttention"]


class AdditiveAttention(nn.Module):
    """Additive attention, score(s, h) = v^T tanh(W_q s + W_k h) (Bahdanau et al. 2015, eq. 6; notes 1.1).

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
            raise ValueError(f"keys must have shape (B, S, {self.key_dim}), got {tuple(keys.shape)}")
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
