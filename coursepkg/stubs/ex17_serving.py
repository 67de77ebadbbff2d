"""Assignment ex17_serving: how a served model picks its next token (the sampling filters of
Hugging Face's ``generate``: temperature, top-k, top-p, min-p, the repetition penalty) and
speculative decoding's acceptance rule (Leviathan et al. 2023; Chen et al. 2023).

A filter takes next-token scores and returns scores: a token it removes gets ``-inf``, so that
its probability after the softmax is exactly zero. Dimension legend: B batch, V vocabulary,
T tokens seen so far.
"""

from __future__ import annotations

import torch  # noqa: F401  (you will need it)
from torch import Tensor


def temperature_scale(logits: Tensor, temperature: float) -> Tensor:
    """Divide the scores by the temperature (< 1 sharpens the distribution, > 1 flattens it).

    Args:
        logits: next-token scores.
        temperature: a positive number.

    Shape:
        logits (B, V) -> (B, V).

    Returns:
        The scores a token is drawn from: softmax(result) is the tempered distribution.
    """
    raise NotImplementedError


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep each row's ``k`` highest scores, and every score tied with the k-th; the rest -inf.

    Args:
        logits: next-token scores.
        k: an integer >= 1; a ``k`` of V or more keeps every token.

    Shape:
        logits (B, V) -> (B, V).

    Returns:
        The scores with the removed tokens set to -inf (the kept ones unchanged).
    """
    raise NotImplementedError


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering: keep the smallest set of most probable tokens whose probabilities add
    up to at least ``p``; the rest -inf.

    In order of decreasing probability, a token is kept while the mass of the tokens before it
    is below ``p``: the token whose probability makes the sum reach ``p`` is kept, the ones
    after it are not. The most probable token is always kept, and ``p = 1`` keeps every token.

    Args:
        logits: next-token scores.
        p: in (0, 1].

    Shape:
        logits (B, V) -> (B, V).

    Returns:
        The scores with the removed tokens set to -inf (the kept ones unchanged).
    """
    raise NotImplementedError


def min_p_filter(logits: Tensor, min_p: float) -> Tensor:
    """Min-p filtering: remove the tokens whose probability is below ``min_p`` times the most
    probable token's probability (the cut follows the model's confidence).

    Args:
        logits: next-token scores.
        min_p: in [0, 1]; 0 keeps everything, 1 only the most probable token and its ties.

    Shape:
        logits (B, V) -> (B, V).

    Returns:
        The scores with the removed tokens set to -inf (the kept ones unchanged).
    """
    raise NotImplementedError


def repetition_penalty(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty: the score of every token already seen is pushed down, divided
    by ``penalty`` when it is positive and multiplied by it when it is negative. A token seen
    several times is penalised once.

    Args:
        logits: next-token scores.
        seen: the ids of the tokens so far (the prompt and what was generated), per row.
        penalty: a positive number; 1 changes nothing, above 1 discourages repeats.

    Shape:
        logits (B, V), seen (B, T) -> (B, V).

    Returns:
        The scores with the seen tokens' scores penalised (the others unchanged).
    """
    raise NotImplementedError


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    """What speculative decoding draws from when it rejects a draft token: max(0, p - q),
    normalised to sum to 1.

    When nothing is left (p equals q, and a rejection cannot happen), return ``p`` itself.

    Args:
        p: the target model's next-token probabilities.
        q: the draft model's, from which the draft token was drawn.

    Shape:
        p (B, V), q (B, V) -> (B, V).

    Returns:
        Each row's residual distribution (non-negative, summing to 1).
    """
    raise NotImplementedError


def speculative_accept(
    p: Tensor, q: Tensor, draft: Tensor, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Speculative decoding's rule for one draft token per row: accept the draft token x with
    probability min(1, p(x) / q(x)); when it is rejected, emit a token drawn from the residual
    distribution max(0, p - q) normalised. The emitted token is then distributed as p exactly.

    Draw every random number with ``generator`` (``torch.rand(..., generator=generator)``,
    ``torch.multinomial(..., generator=generator)``).

    Args:
        p: the target model's next-token probabilities.
        q: the draft model's probabilities, from which each draft token was drawn.
        draft: the draft token of each row.
        generator: the source of every random draw.

    Shape:
        p (B, V), q (B, V), draft (B,) -> accepted (B,), token (B,).

    Returns:
        ``(accepted, token)``: whether each row's draft token was accepted (bool), and the
        token emitted (an integer tensor: the draft token where accepted).
    """
    raise NotImplementedError
