"""Sampling filters on next-token logits: temperature, top-k, top-p (nucleus), min-p and a
repetition penalty, each one small function; :func:`process_logits` applies them in the order
Hugging Face's ``generate`` does, and :func:`sample_token` draws from what is left.

Each filter equals its ``transformers`` counterpart (``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper``, ``MinPLogitsWarper``,
``RepetitionPenaltyLogitsProcessor``): same logits in, same scores out
(``tests/serving/test_sampling.py``). A filtered token gets ``-inf``, so its probability after
the softmax is exactly zero.

Dimension legend: B batch, V vocabulary, T tokens seen so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "SamplingParams",
    "min_p_filter",
    "process_logits",
    "repetition_penalty",
    "sample_token",
    "temperature_scale",
    "top_k_filter",
    "top_p_filter",
]

_NEG_INF = float("-inf")


def temperature_scale(logits: Tensor, temperature: float) -> Tensor:
    """Divide logits by ``temperature`` (< 1 sharpens the distribution, > 1 flattens it).

    Args:
        logits: next-token scores.
        temperature: a positive number (greedy decoding is temperature 0: use the argmax).

    Shape:
        logits (B, V) -> (B, V).
    """
    _check_positive("temperature", temperature)
    return logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` highest scores (and every score tied with the k-th), the rest to -inf.

    Args:
        logits: next-token scores.
        k: an integer >= 1; a ``k`` above V keeps everything.

    Shape:
        logits (B, V) -> (B, V).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {k!r}")
    k = min(k, logits.size(-1))
    kth = logits.topk(k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, _NEG_INF)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keep the most probable tokens whose
    probabilities add up to ``p``, always at least the most probable one.

    Walking up from the least probable token, a token is dropped while the mass of it and
    everything below it is at most 1 - p: what survives is the smallest top set holding at least
    ``p`` of the mass. ``p = 1`` keeps every token.

    Args:
        logits: next-token scores.
        p: in (0, 1].

    Shape:
        logits (B, V) -> (B, V).
    """
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p!r}")
    ascending, order = torch.sort(logits, descending=False)  # (B, V) each
    mass_up_to = ascending.softmax(dim=-1).cumsum(dim=-1)  # (B, V): mass at or below each
    drop_sorted = mass_up_to <= 1 - p  # (B, V)
    drop_sorted[..., -1] = False  # the most probable token always stays
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # (B, V), vocab order
    return logits.masked_fill(drop, _NEG_INF)


def min_p_filter(logits: Tensor, min_p: float) -> Tensor:
    """Min-p filtering (Nguyen et al. 2024): drop tokens less probable than ``min_p`` times
    the most probable token's probability, so the cut adapts to how confident the model is.

    Args:
        logits: next-token scores.
        min_p: in [0, 1]; 0 keeps everything, 1 keeps only the top token (and its ties).

    Shape:
        logits (B, V) -> (B, V).
    """
    if isinstance(min_p, bool) or not isinstance(min_p, int | float) or not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {min_p!r}")
    probs = logits.softmax(dim=-1)  # (B, V)
    floor = min_p * probs.max(dim=-1, keepdim=True).values  # (B, 1)
    drop = probs < floor  # (B, V)
    drop.scatter_(-1, probs.argmax(dim=-1, keepdim=True), False)  # never the top token
    return logits.masked_fill(drop, _NEG_INF)


def repetition_penalty(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019): every token already in ``seen`` has its
    score pushed down: divided by ``penalty`` when positive, multiplied when negative.

    Args:
        logits: next-token scores.
        seen: the ids so far (prompt and generated); a repeated id is penalised once.
        penalty: a positive number; 1 changes nothing, > 1 discourages repeats.

    Shape:
        logits (B, V), seen (B, T) -> (B, V).
    """
    _check_positive("repetition_penalty", penalty)
    scores = logits.gather(-1, seen)  # (B, T)
    scores = torch.where(scores < 0, scores * penalty, scores / penalty)  # (B, T)
    return logits.scatter(-1, seen, scores)  # (B, V)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen; the defaults are greedy decoding.

    Attributes:
        temperature: 0 = greedy (argmax); otherwise sample from softmax(logits / temperature).
        top_k: None or an integer >= 1.
        top_p: None or a number in (0, 1].
        min_p: None or a number in [0, 1].
        repetition_penalty: None or a positive number (applied greedy or not, as
            ``transformers`` does).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or t < 0 or math.isnan(t):
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {t!r}")
        # Each filter checks its own argument; run them once on a dummy row to fail early.
        dummy = torch.zeros(1, 2)
        if self.top_k is not None:
            top_k_filter(dummy, self.top_k)
        if self.top_p is not None:
            top_p_filter(dummy, self.top_p)
        if self.min_p is not None:
            min_p_filter(dummy, self.min_p)
        if self.repetition_penalty is not None:
            _check_positive("repetition_penalty", self.repetition_penalty)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def process_logits(logits: Tensor, seen: Tensor | None, params: SamplingParams) -> Tensor:
    """The scores a token is drawn from: repetition penalty, then (when sampling) temperature,
    top-k, top-p and min-p, in the order of ``transformers``' ``generate``.

    Args:
        logits: next-token scores.
        seen: the ids so far (for the repetition penalty; may be None without one).
        params: the sampling settings.

    Shape:
        logits (B, V), seen (B, T) -> (B, V) float32.
    """
    logits = logits.float()
    if params.repetition_penalty is not None:
        logits = repetition_penalty(logits, seen, params.repetition_penalty)
    if params.greedy:
        return logits
    if params.temperature != 1:
        logits = temperature_scale(logits, params.temperature)
    if params.top_k is not None:
        logits = top_k_filter(logits, params.top_k)
    if params.top_p is not None and params.top_p < 1:
        logits = top_p_filter(logits, params.top_p)
    if params.min_p is not None:
        logits = min_p_filter(logits, params.min_p)
    return logits


def sample_token(
    logits: Tensor,
    seen: Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The next token: the argmax when greedy, else a draw from the processed softmax.

    Args:
        logits: next-token scores.
        seen: the ids so far (for the repetition penalty).
        params: the sampling settings.
        generator: a ``torch.Generator`` for reproducible draws.

    Shape:
        logits (B, V), seen (B, T) -> (B,).
    """
    scores = process_logits(logits, seen, params)  # (B, V)
    if params.greedy:
        return scores.argmax(dim=-1)  # (B,)
    probs = scores.softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


def _check_positive(name: str, x: object) -> None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not x > 0 or math.isinf(x):
        raise ValueError(f"{name} must be a positive finite number, got {x!r}")
