"""Assignment ex01_attention: scaled dot-product attention and, optionally, Bahdanau's additive
score (chapters 2-3).

Masks follow the course convention: boolean, True = may attend.
"""

from __future__ import annotations

import math  # noqa: F401  (you will need it)

import torch  # noqa: F401
from torch import Tensor


def additive_score(query: Tensor, keys: Tensor, W_q: Tensor, W_k: Tensor, v: Tensor) -> Tensor:
    """Bahdanau's additive score (Bahdanau et al. 2015; notes 1.1):

    score(s, h_j) = v^T tanh(W_q s + W_k h_j)

    for one query vector ``s`` per batch row against every key ``h_j`` of that row. Return the
    raw scores: no softmax, no masking (the caller does both).

    Args:
        query: one query vector per batch row (e.g. the decoder state s_{t-1}).
        keys: the keys of each row (e.g. the encoder states h_1 .. h_S).
        W_q: query weight, stored like ``nn.Linear.weight`` as (out, in) = (A, Dq).
        W_k: key weight, (A, Dk).
        v: the vector that turns the hidden layer into one number per key.

    Shape:
        query (B, Dq), keys (B, S, Dk), W_q (A, Dq), W_k (A, Dk), v (A,) -> scores (B, S).

    Returns:
        The scores, with the dtype of the inputs and differentiable with respect to all five.
    """
    raise NotImplementedError


def scaled_dot_product_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (Vaswani et al., Eq. 1).

    Write the steps yourself (matmul, scale, mask, softmax over the keys, matmul); the check
    rejects a call to ``torch.nn.functional.scaled_dot_product_attention``.

    Args:
        query: queries Q; any leading dimensions (batch, heads, ...) are kept.
        key: keys K.
        value: values V (their size Dv may differ from Dk).
        mask: None (attend everywhere) or a bool tensor broadcastable to (..., L, S),
            **True = may attend**, False = must not attend. A query whose keys are all masked
            gets all-zero weights and a zero output, never NaN.

    Shape:
        query (..., L, Dk), key (..., S, Dk), value (..., S, Dv), e.g. (B, L, Dk) or
        (B, H, L, Dk) -> output (..., L, Dv), weights (..., L, S).

    Returns:
        ``(output, weights)``: the attended values, and the attention weights (after softmax
        and masking; each row that may attend something sums to 1). Both have the dtype and
        device of the inputs.
    """
    raise NotImplementedError
