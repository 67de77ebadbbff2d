"""The catalogue of ex16_experts: the known mistakes of the router's top-k, the load-balancing
loss and the latent attention's cached part. Each is a wrong function with the stub's
signature (the evidence: the check reruns it on the student's inputs and compares), its id,
and the story and advice a student reads when their output matches it.

Dimension legend: T tokens, E experts, k experts per token, B batch, L length, D d_model,
R the latent's width, Dr the rotated key part's width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...positional import apply_rope
from ..framework import BugVariant

__all__ = [
    "AUX_LOSS_BUGS",
    "AUX_LOSS_ITEM",
    "BUGS",
    "LATENT_BUGS",
    "LATENT_ITEM",
    "ROUTER_BUGS",
    "ROUTER_ITEM",
]

ROUTER_ITEM = "route_top_k"
AUX_LOSS_ITEM = "load_balancing_loss"
LATENT_ITEM = "compress_latent"


# ---------------------------------------------------------------------------------------------
# route_top_k
# ---------------------------------------------------------------------------------------------


def router_topk_before_softmax(
    logits: Tensor, k: int, renormalize: bool = True
) -> tuple[Tensor, Tensor]:
    """The k largest logits first, then a softmax over those k only (Mixtral's code order):
    the weights sum to 1 whatever ``renormalize`` says."""
    top, experts = logits.topk(k, dim=-1)  # (T, k), (T, k)
    return torch.softmax(top, dim=-1), experts


def router_not_renormalised(
    logits: Tensor, k: int, renormalize: bool = True
) -> tuple[Tensor, Tensor]:
    """Softmax over all E, then top-k, and never the division by the k weights' sum."""
    weights, experts = torch.softmax(logits, dim=-1).topk(k, dim=-1)  # (T, k), (T, k)
    return weights, experts


def router_logits_as_weights(
    logits: Tensor, k: int, renormalize: bool = True
) -> tuple[Tensor, Tensor]:
    """The k largest logits themselves as the weights: no softmax at all."""
    weights, experts = logits.topk(k, dim=-1)  # (T, k), (T, k)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def router_softmax_over_tokens(
    logits: Tensor, k: int, renormalize: bool = True
) -> tuple[Tensor, Tensor]:
    """The softmax over the tokens (dim 0), not over each token's experts."""
    weights, experts = torch.softmax(logits, dim=0).topk(k, dim=-1)  # (T, k), (T, k)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


ROUTER_BUGS: list[BugVariant] = [
    BugVariant(
        "router.topk_before_softmax",
        ROUTER_ITEM,
        "the softmax is taken over the k chosen logits only (top-k before softmax), which "
        "makes the weights sum to 1 even with renormalize=False; without renormalising they "
        "must be the probabilities of the softmax over all E experts, which sum to less",
        "Take the softmax over all E experts first, then the top k of those probabilities; "
        "divide by their sum only when renormalize is True.",
        router_topk_before_softmax,
    ),
    BugVariant(
        "router.not_renormalised",
        ROUTER_ITEM,
        "the k chosen probabilities are not divided by their sum when renormalize=True, so "
        "a token's weights add up to less than 1",
        "With renormalize=True, divide the k weights by their sum: weights / "
        "weights.sum(dim=-1, keepdim=True).",
        router_not_renormalised,
    ),
    BugVariant(
        "router.logits_as_weights",
        ROUTER_ITEM,
        "the weights are the chosen logits themselves, with no softmax: they can be "
        "negative and do not measure how much the router trusts each expert",
        "Turn the logits into probabilities with torch.softmax(logits, dim=-1) before "
        "choosing the top k.",
        router_logits_as_weights,
    ),
    BugVariant(
        "router.softmax_over_tokens",
        ROUTER_ITEM,
        "the softmax runs over the tokens (dim=0) instead of over each token's experts: each "
        "expert's column sums to 1, so a token's probabilities depend on the other tokens in "
        "the batch and do not sum to 1",
        "Take the softmax over the experts, the last dimension: torch.softmax(logits, dim=-1).",
        router_softmax_over_tokens,
    ),
]


# ---------------------------------------------------------------------------------------------
# load_balancing_loss
# ---------------------------------------------------------------------------------------------


def _fractions(experts: Tensor, n_experts: int) -> Tensor:
    """f_i: the (token, choice) pairs sent to each expert over the number of tokens, (E,)."""
    counts = torch.zeros(n_experts, dtype=torch.float64)  # (E,)
    counts = counts.index_add(0, experts.reshape(-1), torch.ones(experts.numel()).double())
    return counts / experts.size(0)  # (E,): they sum to k


def aux_loss_no_expert_factor(probs: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """sum_i f_i P_i without the factor E: its smallest value is k / E."""
    f = _fractions(experts, n_experts).to(probs)  # (E,)
    return (f * probs.mean(dim=0)).sum()


def aux_loss_experts_squared_with_sum(probs: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """Switch's code's E^2, which goes with a mean over the experts, put on the sum."""
    f = _fractions(experts, n_experts).to(probs)  # (E,)
    return n_experts**2 * (f * probs.mean(dim=0)).sum()


def aux_loss_fraction_of_choices(probs: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """f_i over the T * k choices (they sum to 1), not over the T tokens: the loss / k."""
    f = _fractions(experts, n_experts).to(probs) / experts.size(1)  # (E,)
    return n_experts * (f * probs.mean(dim=0)).sum()


def aux_loss_first_choice_only(probs: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """f_i counts each token's first choice only (Switch's k = 1 formula kept for k > 1)."""
    f = _fractions(experts[:, :1], n_experts).to(probs)  # (E,)
    return n_experts * (f * probs.mean(dim=0)).sum()


def aux_loss_probs_of_chosen_only(probs: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """P_i averages only the probabilities of the chosen experts (zeros for the others)."""
    chosen = torch.zeros_like(probs).scatter(1, experts, 1.0)  # (T, E): 1 where chosen
    f = _fractions(experts, n_experts).to(probs)  # (E,)
    return n_experts * (f * (probs * chosen).mean(dim=0)).sum()


AUX_LOSS_BUGS: list[BugVariant] = [
    BugVariant(
        "aux_loss.no_expert_factor",
        AUX_LOSS_ITEM,
        "the sum of f_i * P_i is not multiplied by the number of experts E, so an even load "
        "gives k / E instead of k and the loss (and the coefficient tuned for it) shrinks as "
        "experts are added",
        "Multiply the sum over the experts by n_experts: loss = E * sum_i f_i * P_i.",
        aux_loss_no_expert_factor,
    ),
    BugVariant(
        "aux_loss.experts_squared_with_sum",
        AUX_LOSS_ITEM,
        "the sum over the experts is multiplied by E^2: Switch's code uses E^2 with a mean "
        "over the experts (E^2 * mean = E * sum), so with a sum the loss is E times too large",
        "Use E * sum_i f_i * P_i (or E^2 * the mean over the experts, not both).",
        aux_loss_experts_squared_with_sum,
    ),
    BugVariant(
        "aux_loss.probs_of_chosen_only",
        AUX_LOSS_ITEM,
        "P_i averages the router's probability for expert i only over the tokens that chose "
        "it (zeros elsewhere); the loss needs the mean over every token",
        "Take P as probs.mean(dim=0): every token's probability for every expert, chosen or not.",
        aux_loss_probs_of_chosen_only,
    ),
    BugVariant(
        "aux_loss.fraction_of_choices",
        AUX_LOSS_ITEM,
        "f_i is divided by the T * k choices (so the f_i sum to 1) instead of by the T "
        "tokens (they sum to k): the loss is k times too small, its smallest value 1 instead "
        "of k",
        "f_i = (the (token, choice) pairs sent to expert i) / T, with T = probs.size(0).",
        aux_loss_fraction_of_choices,
    ),
    BugVariant(
        "aux_loss.first_choice_only",
        AUX_LOSS_ITEM,
        "f_i counts only each token's first choice (Switch's formula for k = 1): with k > 1 "
        "the other choices' load is not balanced",
        "Count every one of a token's k choices: bincount over experts.reshape(-1), divided by T.",
        aux_loss_first_choice_only,
    ),
]


# ---------------------------------------------------------------------------------------------
# compress_latent
# ---------------------------------------------------------------------------------------------


def _rotate(part: Tensor, positions: Tensor, theta: float, pairs: str = "halves") -> Tensor:
    """RoPE in the rotate-half pairing (or ``pairs``) on a (B, L, W) tensor, as one head."""
    return apply_rope(part[:, None], positions, theta, pairs)[:, 0]  # (B, L, W)


def latent_rope_with_latent(
    x: Tensor, w_down: Tensor, kv_rank: int, positions: Tensor, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """RoPE turns the whole (R + Dr)-wide projection before the split."""
    both = _rotate(x @ w_down.T, positions, theta)  # (B, L, R + Dr)
    latent, k_rope = both.split([kv_rank, w_down.size(0) - kv_rank], dim=-1)
    return latent, k_rope


def latent_split_swapped(
    x: Tensor, w_down: Tensor, kv_rank: int, positions: Tensor, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """The rotated part read from the first Dr rows of the projection, the latent after it."""
    d_rope = w_down.size(0) - kv_rank
    k_rope, latent = (x @ w_down.T).split([d_rope, kv_rank], dim=-1)  # (B, L, Dr), (B, L, R)
    return latent, _rotate(k_rope, positions, theta)


def latent_not_rotated(
    x: Tensor, w_down: Tensor, kv_rank: int, positions: Tensor, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """The key part is returned as projected, without its rotation."""
    latent, k_rope = (x @ w_down.T).split([kv_rank, w_down.size(0) - kv_rank], dim=-1)
    return latent, k_rope


def latent_rotation_reversed(
    x: Tensor, w_down: Tensor, kv_rank: int, positions: Tensor, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """The key part turned the other way (rotate-half's sign flipped: angle -pos * w_i)."""
    latent, k_rope = (x @ w_down.T).split([kv_rank, w_down.size(0) - kv_rank], dim=-1)
    return latent, _rotate(k_rope, -positions, theta)


def latent_interleaved_pairs(
    x: Tensor, w_down: Tensor, kv_rank: int, positions: Tensor, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """The key part rotated in pairs of neighbouring columns (2i, 2i + 1), the paper's and
    GPT-J's layout, instead of column i with column i + Dr/2."""
    latent, k_rope = (x @ w_down.T).split([kv_rank, w_down.size(0) - kv_rank], dim=-1)
    return latent, _rotate(k_rope, positions, theta, "interleaved")


def latent_angle_exponent_halved(
    x: Tensor, w_down: Tensor, kv_rank: int, positions: Tensor, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """Frequencies theta^(-i/Dr), the 2 of the exponent left out: theta^(-i/Dr) is
    sqrt(theta)^(-2i/Dr), so this is the right rotation with base sqrt(theta)."""
    latent, k_rope = (x @ w_down.T).split([kv_rank, w_down.size(0) - kv_rank], dim=-1)
    return latent, _rotate(k_rope, positions, theta**0.5)


LATENT_BUGS: list[BugVariant] = [
    BugVariant(
        "latent.rope_with_latent",
        LATENT_ITEM,
        "RoPE turns the whole projection, the latent together with the key part: the latent "
        "then depends on the position, so the up-projections can no longer rebuild the keys "
        "and values from it unchanged, and the key part turns at the frequencies of an "
        "(R + Dr)-wide rotation",
        "Split the projection first (latent = the first kv_rank columns, k_rope = the rest) "
        "and rotate k_rope alone, with its own width Dr in the frequencies.",
        latent_rope_with_latent,
    ),
    BugVariant(
        "latent.split_swapped",
        LATENT_ITEM,
        "the rotated part is taken from the first Dr columns of the projection and the "
        "latent from the rest; the latent comes first (DeepSeek's kv_a_proj_with_mqa)",
        "latent, k_rope = (x @ w_down.T).split([kv_rank, Dr], dim=-1): the latent's R "
        "columns first.",
        latent_split_swapped,
    ),
    BugVariant(
        "latent.not_rotated",
        LATENT_ITEM,
        "the key part is returned without its rotation, so no position reaches the scores",
        "Rotate k_rope by the positions (pair i: column i with column i + Dr/2, angle "
        "pos * theta^(-2i/Dr)).",
        latent_not_rotated,
    ),
    BugVariant(
        "latent.rotation_reversed",
        LATENT_ITEM,
        "the key part turns the wrong way: rotate-half's sign is flipped (cat(x2, -x1) "
        "instead of cat(-x2, x1)), which turns it by -pos * w_i, so its scores with queries "
        "turned the right way no longer depend on the distance alone",
        "x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1): pair (a, b) "
        "becomes (a cos - b sin, b cos + a sin).",
        latent_rotation_reversed,
    ),
    BugVariant(
        "latent.interleaved_pairs",
        LATENT_ITEM,
        "the key part is rotated in pairs of neighbouring columns (2i, 2i + 1), the layout "
        "of the RoPE paper and GPT-J; this task pairs column i with column i + Dr/2 (the "
        "rotate-half layout of DeepSeek's and Hugging Face's code), and a cached key must be "
        "turned as the queries that meet it are",
        "Pair column i with column i + Dr/2: a, b = k[..., :Dr//2], k[..., Dr//2:], then "
        "cat(a cos - b sin, b cos + a sin).",
        latent_interleaved_pairs,
    ),
    BugVariant(
        "latent.angle_exponent_halved",
        LATENT_ITEM,
        "the frequencies are theta^(-i/Dr), the 2 of the exponent left out: pair i turns by "
        "pos * theta^(-i/Dr), so the slow pairs turn too fast (the rotation of base "
        "sqrt(theta))",
        "Pair i turns by the angle pos * theta^(-2i/Dr), for i = 0 .. Dr/2 - 1: "
        "theta ** (-2 * torch.arange(Dr // 2) / Dr).",
        latent_angle_exponent_halved,
    ),
]

BUGS: list[BugVariant] = [*ROUTER_BUGS, *AUX_LOSS_BUGS, *LATENT_BUGS]
