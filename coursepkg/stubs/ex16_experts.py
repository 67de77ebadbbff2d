"""Assignment ex16_experts: the pieces of a mixture of experts (the router's top-k and the
load-balancing loss; Shazeer et al. 2017, Switch, Mixtral) and of multi-head latent attention
(the cached latent and the decoupled rotary key; DeepSeek-V2).

Dimension legend: T tokens, E experts, k experts per token, B batch, L length, D d_model,
R the latent's width, Dr the rotated key part's width.
"""

from __future__ import annotations

import torch  # noqa: F401  (you will need it)
from torch import Tensor


def route_top_k(logits: Tensor, k: int, renormalize: bool = True) -> tuple[Tensor, Tensor]:
    """The router's choice: the softmax over all E experts, then each token's k most probable.

    With ``renormalize=True`` the k chosen probabilities are divided by their sum, so that a
    token's weights sum to 1 (Mixtral, Qwen3-MoE's ``norm_topk_prob``); with ``False`` they
    stay the probabilities the softmax over all E experts gave (Switch, OLMoE), summing to at
    most 1.

    Args:
        logits: the router's scores, one row per token.
        k: experts per token, 1 <= k <= E.
        renormalize: whether the k weights are rescaled to sum to 1.

    Shape:
        logits (T, E) -> weights (T, k), experts (T, k).

    Returns:
        ``(weights, experts)``: the weight of each chosen expert and its index (an integer
        tensor), best first.
    """
    raise NotImplementedError


def load_balancing_loss(probs: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """The auxiliary loss that pushes the router to spread the tokens evenly (Switch, Eq. 4-6).

    loss = E * sum_i f_i * P_i, where f_i is the number of (token, choice) pairs sent to expert
    i divided by the number of tokens T (each of a token's k choices counts, so the f_i sum to
    k) and P_i the mean over the tokens of the router's probability for expert i. The
    smallest value, k, comes when both are uniform. Only P carries a gradient (the choice has
    none).

    Args:
        probs: the softmax over the E experts of every token.
        experts: the k experts each token was sent to.
        n_experts: E.

    Shape:
        probs (T, E), experts (T, k) -> a scalar.

    Returns:
        The loss, a 0-dimensional tensor through which gradients reach ``probs``.
    """
    raise NotImplementedError


def compress_latent(
    x: Tensor, w_down: Tensor, kv_rank: int, positions: Tensor, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """What multi-head latent attention caches per token: the latent and the rotated key part.

    One matrix ``w_down`` projects each token to R + Dr numbers (DeepSeek's
    ``kv_a_proj_with_mqa``): the first R are the latent c, from which every head's key and
    value are rebuilt later; the last Dr are the key part that carries the position, rotated
    by RoPE (pair i of the Dr columns is column i with column i + Dr/2, turned by the angle
    pos * theta^(-2i/Dr)). Only that part is rotated: the latent must not depend on the
    position, so that the up-projections can act on it unchanged (leave out the latent's
    RMSNorm here).

    Args:
        x: the tokens' inputs.
        w_down: the down-projection, an ``nn.Linear`` weight: latent rows first.
        kv_rank: R.
        positions: each position's index.
        theta: RoPE's base.

    Shape:
        x (B, L, D), w_down (R + Dr, D), positions (L,) -> latent (B, L, R), k_rope (B, L, Dr).

    Returns:
        ``(latent, k_rope)``.
    """
    raise NotImplementedError
