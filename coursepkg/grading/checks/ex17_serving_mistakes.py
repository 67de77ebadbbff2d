"""The catalogue of ex17_serving: the known mistakes of the sampling filters (temperature, top-k,
top-p, min-p, the repetition penalty) and of speculative decoding's acceptance rule and residual
distribution. Each is a wrong function with the stub's signature, its id, and the story and
advice a student reads when their output behaves as it does (the check reruns it on the
student's inputs; the speculative rule's mistakes are compared by their samples).

Dimension legend: B batch, V vocabulary, T tokens seen so far.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..framework import BugVariant

__all__ = [
    "BUGS",
    "MIN_P_BUGS",
    "MIN_P_ITEM",
    "REPETITION_BUGS",
    "REPETITION_ITEM",
    "RESIDUAL_BUGS",
    "RESIDUAL_ITEM",
    "SPECULATIVE_BUGS",
    "SPECULATIVE_ITEM",
    "TEMPERATURE_BUGS",
    "TEMPERATURE_ITEM",
    "TOP_K_BUGS",
    "TOP_K_ITEM",
    "TOP_P_BUGS",
    "TOP_P_ITEM",
]

TEMPERATURE_ITEM = "temperature_scale"
TOP_K_ITEM = "top_k_filter"
TOP_P_ITEM = "top_p_filter"
MIN_P_ITEM = "min_p_filter"
REPETITION_ITEM = "repetition_penalty"
RESIDUAL_ITEM = "residual_distribution"
SPECULATIVE_ITEM = "speculative_accept"

_NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------------
# temperature_scale
# ---------------------------------------------------------------------------------------------


def temperature_after_softmax(logits: Tensor, temperature: float) -> Tensor:
    """The probabilities divided by the temperature: softmax first, then the division."""
    return torch.softmax(logits, dim=-1) / temperature  # (B, V)


def temperature_multiplied(logits: Tensor, temperature: float) -> Tensor:
    """The scores multiplied by the temperature instead of divided."""
    return logits * temperature  # (B, V)


TEMPERATURE_BUGS: list[BugVariant] = [
    BugVariant(
        "temperature.after_softmax",
        TEMPERATURE_ITEM,
        "the temperature divides the probabilities after the softmax, not the scores before "
        "it: the softmax of probabilities divided by T is nearly uniform and not the tempered "
        "distribution",
        "Divide the logits themselves by the temperature and return scores: logits / "
        "temperature (the softmax comes later, when the token is drawn).",
        temperature_after_softmax,
    ),
    BugVariant(
        "temperature.multiplied",
        TEMPERATURE_ITEM,
        "the scores are multiplied by the temperature, so a temperature below 1 flattens the "
        "distribution and one above 1 sharpens it, the opposite of what it should do",
        "Divide by the temperature: logits / temperature.",
        temperature_multiplied,
    ),
]


# ---------------------------------------------------------------------------------------------
# top_k_filter
# ---------------------------------------------------------------------------------------------


def _kth_value(logits: Tensor, k: int) -> Tensor:
    """Each row's k-th highest score, (B, 1), k clamped to V."""
    return logits.topk(min(k, logits.size(-1)), dim=-1).values[..., -1:]  # (B, 1)


def top_k_keeps_one_more(logits: Tensor, k: int) -> Tensor:
    """The threshold read at the (k+1)-th score: k + 1 tokens survive."""
    return logits.masked_fill(logits < _kth_value(logits, k + 1), _NEG_INF)  # (B, V)


def top_k_drops_kth(logits: Tensor, k: int) -> Tensor:
    """``<=`` instead of ``<`` against the k-th score: the k-th itself goes, k - 1 survive."""
    return logits.masked_fill(logits <= _kth_value(logits, k), _NEG_INF)  # (B, V)


def top_k_ties_dropped(logits: Tensor, k: int) -> Tensor:
    """Exactly the k indices ``topk`` returns are kept: a token tied with the k-th is dropped."""
    chosen = logits.topk(min(k, logits.size(-1)), dim=-1).indices  # (B, k)
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, chosen, True)  # (B, V)
    return logits.masked_fill(~keep, _NEG_INF)


def top_k_k_above_vocab(logits: Tensor, k: int) -> Tensor:
    """``topk(k)`` without clamping k to V: it raises when k > V."""
    kth = logits.topk(k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, _NEG_INF)


TOP_K_BUGS: list[BugVariant] = [
    BugVariant(
        "top_k.keeps_one_more",
        TOP_K_ITEM,
        "one token too many survives: the threshold is the (k+1)-th highest score instead of "
        "the k-th",
        "Take the k-th highest score as the threshold, logits.topk(k).values[..., -1:], and "
        "remove the scores strictly below it.",
        top_k_keeps_one_more,
    ),
    BugVariant(
        "top_k.drops_kth",
        TOP_K_ITEM,
        "the k-th highest score is removed too (<= instead of < against the threshold), so "
        "only k - 1 tokens survive",
        "Remove only the scores strictly below the k-th highest: logits < kth.",
        top_k_drops_kth,
    ),
    BugVariant(
        "top_k.ties_dropped",
        TOP_K_ITEM,
        "exactly k tokens are kept (the indices topk returns), so a token whose score ties the "
        "k-th one is dropped while its equal is kept, depending only on its position",
        "Compare the scores with the k-th highest value instead of keeping topk's indices: "
        "every score equal to it stays.",
        top_k_ties_dropped,
    ),
    BugVariant(
        "top_k.k_above_vocab",
        TOP_K_ITEM,
        "a k larger than the vocabulary raises (topk cannot take more than V values) instead "
        "of keeping every token",
        "Clamp k first: k = min(k, logits.size(-1)).",
        top_k_k_above_vocab,
    ),
]


# ---------------------------------------------------------------------------------------------
# top_p_filter
# ---------------------------------------------------------------------------------------------


def _unsort(removed: Tensor, order: Tensor) -> Tensor:
    """A mask over sorted positions put back in vocabulary order."""
    return torch.zeros_like(removed).scatter(-1, order, removed)  # (B, V)


def _shift_right(removed: Tensor) -> Tensor:
    """Each position takes its left neighbour's value; the first is never removed."""
    shifted = torch.zeros_like(removed)
    shifted[..., 1:] = removed[..., :-1]
    return shifted


def top_p_excludes_crossing(logits: Tensor, p: float) -> Tensor:
    """Sorted by decreasing probability, a token is removed when the sum up to it is above p:
    the token that makes the sum reach p is removed (no shift)."""
    probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)  # (B, V) each
    removed = probs.cumsum(dim=-1) > p  # (B, V)
    removed[..., 0] = False
    return logits.masked_fill(_unsort(removed, order), _NEG_INF)


def top_p_keeps_one_more(logits: Tensor, p: float) -> Tensor:
    """The removal mask shifted by two places: the token after the crossing one stays too."""
    probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)  # (B, V) each
    removed = _shift_right(_shift_right(probs.cumsum(dim=-1) > p))  # (B, V)
    return logits.masked_fill(_unsort(removed, order), _NEG_INF)


def top_p_ascending_sort(logits: Tensor, p: float) -> Tensor:
    """The nucleus walk run on probabilities sorted in increasing order: it keeps the least
    probable tokens."""
    probs, order = logits.softmax(dim=-1).sort(dim=-1)  # (B, V) each, ascending
    removed = _shift_right(probs.cumsum(dim=-1) > p)  # (B, V)
    return logits.masked_fill(_unsort(removed, order), _NEG_INF)


def top_p_not_sorted(logits: Tensor, p: float) -> Tensor:
    """The cumulative sum taken in vocabulary order, without sorting."""
    removed = _shift_right(logits.softmax(dim=-1).cumsum(dim=-1) > p)  # (B, V)
    return logits.masked_fill(removed, _NEG_INF)


TOP_P_BUGS: list[BugVariant] = [
    BugVariant(
        "top_p.excludes_crossing",
        TOP_P_ITEM,
        "the token whose probability makes the running sum reach p is removed, so the kept "
        "tokens hold less than p of the mass",
        "Keep a token while the mass of the tokens before it is below p: compute the removal "
        "mask as cumsum > p and shift it right by one place (the first token always stays).",
        top_p_excludes_crossing,
    ),
    BugVariant(
        "top_p.keeps_one_more",
        TOP_P_ITEM,
        "one token past the one that reaches p is kept as well",
        "Shift the removal mask (cumsum > p) by one place only, so that the token that "
        "reaches p is the last one kept.",
        top_p_keeps_one_more,
    ),
    BugVariant(
        "top_p.ascending_sort",
        TOP_P_ITEM,
        "the probabilities are sorted in increasing order, so the running sum starts at the "
        "least probable tokens and keeps those",
        "Sort in decreasing order: torch.sort(probs, descending=True).",
        top_p_ascending_sort,
    ),
    BugVariant(
        "top_p.not_sorted",
        TOP_P_ITEM,
        "the running sum is taken in vocabulary order, without sorting the probabilities "
        "first, so which tokens survive depends on their ids",
        "Sort the probabilities in decreasing order, take the running sum there, and map the "
        "mask back to the vocabulary with the sort's indices (scatter).",
        top_p_not_sorted,
    ),
]


# ---------------------------------------------------------------------------------------------
# min_p_filter
# ---------------------------------------------------------------------------------------------


def _keep_top(removed: Tensor, scores: Tensor) -> Tensor:
    """The mask with each row's most probable token kept."""
    return removed.scatter(-1, scores.argmax(dim=-1, keepdim=True), False)  # (B, V)


def min_p_absolute(logits: Tensor, min_p: float) -> Tensor:
    """min_p used as an absolute threshold on the probabilities."""
    probs = logits.softmax(dim=-1)  # (B, V)
    return logits.masked_fill(_keep_top(probs < min_p, probs), _NEG_INF)


def min_p_on_logits(logits: Tensor, min_p: float) -> Tensor:
    """The threshold min_p times the highest logit, compared with the logits."""
    top = logits.max(dim=-1, keepdim=True).values  # (B, 1)
    return logits.masked_fill(_keep_top(logits < min_p * top, logits), _NEG_INF)


MIN_P_BUGS: list[BugVariant] = [
    BugVariant(
        "min_p.absolute",
        MIN_P_ITEM,
        "min_p is used as an absolute probability threshold; it is relative to the most "
        "probable token: remove p_i < min_p * max_j p_j",
        "Multiply min_p by each row's highest probability: probs < min_p * probs.max(dim=-1, "
        "keepdim=True).values.",
        min_p_absolute,
    ),
    BugVariant(
        "min_p.on_logits",
        MIN_P_ITEM,
        "the threshold is taken on the logits (min_p times the highest logit), not on the "
        "probabilities, so it means nothing when logits are negative or shifted",
        "Take the softmax first and compare probabilities: probs < min_p * max prob.",
        min_p_on_logits,
    ),
]


# ---------------------------------------------------------------------------------------------
# repetition_penalty
# ---------------------------------------------------------------------------------------------


def repetition_divides_negatives(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """Every seen score divided by the penalty, negative ones included."""
    return logits.scatter(-1, seen, logits.gather(-1, seen) / penalty)  # (B, V)


def repetition_sign_swapped(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """Positive scores multiplied, negative ones divided: repeats are encouraged."""
    scores = logits.gather(-1, seen)  # (B, T)
    scores = torch.where(scores < 0, scores / penalty, scores * penalty)  # (B, T)
    return logits.scatter(-1, seen, scores)


def repetition_per_occurrence(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """The penalty applied once per occurrence, in place: a token seen twice gets it twice."""
    out = logits.clone()  # (B, V)
    for row, ids in enumerate(seen.tolist()):
        for token in ids:
            score = out[row, token]
            out[row, token] = score * penalty if score < 0 else score / penalty
    return out


def repetition_subtracted(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """The penalty subtracted from every seen score (OpenAI's presence penalty)."""
    return logits.scatter(-1, seen, logits.gather(-1, seen) - penalty)  # (B, V)


REPETITION_BUGS: list[BugVariant] = [
    BugVariant(
        "repetition.divides_negatives",
        REPETITION_ITEM,
        "a negative score is divided by the penalty too, which brings it closer to 0 and makes "
        "the seen token more likely, not less",
        "Divide positive scores by the penalty and multiply negative ones: torch.where(s < 0, "
        "s * penalty, s / penalty).",
        repetition_divides_negatives,
    ),
    BugVariant(
        "repetition.sign_swapped",
        REPETITION_ITEM,
        "positive scores are multiplied by the penalty and negative ones divided, which makes "
        "every seen token more likely",
        "Divide positive scores by the penalty and multiply negative ones.",
        repetition_sign_swapped,
    ),
    BugVariant(
        "repetition.per_occurrence",
        REPETITION_ITEM,
        "a token seen several times is penalised once per occurrence; the penalty applies "
        "once to every token that appears in seen",
        "Gather the seen tokens' scores from the original logits, penalise them once, and "
        "scatter them back (a repeated id then writes the same value twice).",
        repetition_per_occurrence,
    ),
    BugVariant(
        "repetition.subtracted",
        REPETITION_ITEM,
        "the penalty is subtracted from the seen scores (the presence penalty of OpenAI's API, "
        "another rule); CTRL's penalty, which transformers implements, scales them",
        "Divide a positive score by the penalty and multiply a negative one.",
        repetition_subtracted,
    ),
]


# ---------------------------------------------------------------------------------------------
# residual_distribution
# ---------------------------------------------------------------------------------------------


def residual_not_clamped(p: Tensor, q: Tensor) -> Tensor:
    """p - q as it is: negative where the draft was more likely than the target."""
    return p - q  # (B, V)


def residual_not_normalised(p: Tensor, q: Tensor) -> Tensor:
    """max(0, p - q) without the division by its sum."""
    return (p - q).clamp(min=0)  # (B, V)


def residual_wrong_direction(p: Tensor, q: Tensor) -> Tensor:
    """max(0, q - p) normalised: the draft's excess instead of the target's."""
    left = (q - p).clamp(min=0)  # (B, V)
    return left / left.sum(dim=-1, keepdim=True)


def residual_target_itself(p: Tensor, q: Tensor) -> Tensor:
    """The target's own distribution, as if a rejection were a fresh draw from p."""
    return p.clone()  # (B, V)


RESIDUAL_BUGS: list[BugVariant] = [
    BugVariant(
        "residual.not_clamped",
        RESIDUAL_ITEM,
        "p - q is not clamped at 0, so the tokens the draft over-proposed get negative "
        "'probabilities' (and the row's sum is about 0, so dividing by it explodes)",
        "Clamp first, then normalise: left = (p - q).clamp(min=0); left / left.sum(dim=-1, "
        "keepdim=True).",
        residual_not_clamped,
    ),
    BugVariant(
        "residual.not_normalised",
        RESIDUAL_ITEM,
        "max(0, p - q) is not divided by its sum, so the row does not sum to 1",
        "Divide each row by its sum: left / left.sum(dim=-1, keepdim=True).",
        residual_not_normalised,
    ),
    BugVariant(
        "residual.wrong_direction",
        RESIDUAL_ITEM,
        "the residual is max(0, q - p), the draft's excess over the target; a rejection must "
        "add the mass the target has and the draft lacks, max(0, p - q)",
        "Subtract the draft from the target: (p - q).clamp(min=0), normalised.",
        residual_wrong_direction,
    ),
    BugVariant(
        "residual.target_itself",
        RESIDUAL_ITEM,
        "a rejected token is replaced by a draw from p itself; p's tokens that the draft "
        "already proposed would then come out too often",
        "Draw from max(0, p - q), normalised: only the mass the draft under-proposed.",
        residual_target_itself,
    ),
]


# ---------------------------------------------------------------------------------------------
# speculative_accept
# ---------------------------------------------------------------------------------------------


def _at(probs: Tensor, draft: Tensor) -> Tensor:
    """Each row's probability of its draft token, (B,)."""
    return probs.gather(-1, draft[:, None]).squeeze(-1)  # (B,)


def _residual(p: Tensor, q: Tensor) -> Tensor:
    left = (p - q).clamp(min=0)  # (B, V)
    mass = left.sum(dim=-1, keepdim=True)  # (B, 1)
    return torch.where(mass > 0, left / mass.clamp(min=1e-30), p)


def _emit(accepted: Tensor, draft: Tensor, source: Tensor, generator: torch.Generator):
    """``(accepted, token)``: the draft where accepted, else a draw from ``source``."""
    drawn = torch.multinomial(source, 1, generator=generator).squeeze(-1)  # (B,)
    return accepted, torch.where(accepted, draft, drawn)


def _uniform(draft: Tensor, p: Tensor, generator: torch.Generator) -> Tensor:
    return torch.rand(draft.shape, generator=generator, dtype=p.dtype)  # (B,)


def speculative_ratio_inverted(p: Tensor, q: Tensor, draft: Tensor, generator: torch.Generator):
    """Accepted with probability min(1, q(x) / p(x))."""
    accepted = _uniform(draft, p, generator) * _at(p, draft) < _at(q, draft)  # (B,)
    return _emit(accepted, draft, _residual(p, q), generator)


def speculative_accept_by_target(p: Tensor, q: Tensor, draft: Tensor, generator: torch.Generator):
    """Accepted with probability p(x), the draft's q(x) left out."""
    accepted = _uniform(draft, p, generator) < _at(p, draft)  # (B,)
    return _emit(accepted, draft, _residual(p, q), generator)


def speculative_accept_if_more_likely(
    p: Tensor, q: Tensor, draft: Tensor, generator: torch.Generator
):
    """Accepted exactly when p(x) >= q(x), with no random draw."""
    accepted = _at(p, draft) >= _at(q, draft)  # (B,)
    return _emit(accepted, draft, _residual(p, q), generator)


def speculative_resample_from_target(
    p: Tensor, q: Tensor, draft: Tensor, generator: torch.Generator
):
    """The right acceptance, but a rejected token replaced by a draw from p."""
    accepted = _uniform(draft, p, generator) * _at(q, draft) < _at(p, draft)  # (B,)
    return _emit(accepted, draft, p, generator)


def speculative_resample_from_draft(
    p: Tensor, q: Tensor, draft: Tensor, generator: torch.Generator
):
    """The right acceptance, but a rejected token replaced by a fresh draft from q."""
    accepted = _uniform(draft, p, generator) * _at(q, draft) < _at(p, draft)  # (B,)
    return _emit(accepted, draft, q, generator)


def speculative_ratio_not_clipped(p: Tensor, q: Tensor, draft: Tensor, generator: torch.Generator):
    """p(x) / q(x) handed to torch.bernoulli as it is: it raises where the ratio exceeds 1."""
    accepted = torch.bernoulli(_at(p, draft) / _at(q, draft), generator=generator).bool()
    return _emit(accepted, draft, _residual(p, q), generator)


SPECULATIVE_BUGS: list[BugVariant] = [
    BugVariant(
        "speculative.ratio_inverted",
        SPECULATIVE_ITEM,
        "a draft token is accepted with probability min(1, q(x) / p(x)), the ratio upside "
        "down: the tokens the draft over-proposes are accepted most",
        "Accept with probability min(1, p(x) / q(x)): u < p(x) / q(x) for u uniform in [0, 1).",
        speculative_ratio_inverted,
    ),
    BugVariant(
        "speculative.accept_by_target",
        SPECULATIVE_ITEM,
        "a draft token is accepted with probability p(x), without dividing by the draft's "
        "q(x), so good drafts are rejected far too often and the output is not p",
        "Accept with probability min(1, p(x) / q(x)).",
        speculative_accept_by_target,
    ),
    BugVariant(
        "speculative.accept_if_more_likely",
        SPECULATIVE_ITEM,
        "a draft token is accepted exactly when p(x) >= q(x) and always rejected otherwise; "
        "it must be accepted with probability p(x) / q(x) then, so a random draw is needed",
        "Draw u uniform in [0, 1) and accept when u < p(x) / q(x) (always when p(x) >= q(x)).",
        speculative_accept_if_more_likely,
    ),
    BugVariant(
        "speculative.resample_from_target",
        SPECULATIVE_ITEM,
        "a rejected draft token is replaced by a draw from p instead of from the residual "
        "max(0, p - q) normalised, so the tokens the draft already proposes come out too often",
        "On rejection draw from max(0, p - q) / sum(max(0, p - q)), your residual_distribution.",
        speculative_resample_from_target,
    ),
    BugVariant(
        "speculative.resample_from_draft",
        SPECULATIVE_ITEM,
        "a rejected draft token is replaced by a new draw from the draft's q, so the output "
        "keeps the draft's preferences instead of the target's",
        "On rejection draw from max(0, p - q) normalised, where the target has mass the draft "
        "lacks.",
        speculative_resample_from_draft,
    ),
    BugVariant(
        "speculative.ratio_not_clipped",
        SPECULATIVE_ITEM,
        "the acceptance probability p(x) / q(x) is not clipped at 1 (torch.bernoulli raises "
        "when it exceeds 1, where the target likes the token more than the draft)",
        "Use min(1, p(x) / q(x)): clamp the ratio with .clamp(max=1), or compare u < ratio.",
        speculative_ratio_not_clipped,
    ),
]

BUGS: list[BugVariant] = [
    *TEMPERATURE_BUGS,
    *TOP_K_BUGS,
    *TOP_P_BUGS,
    *MIN_P_BUGS,
    *REPETITION_BUGS,
    *RESIDUAL_BUGS,
    *SPECULATIVE_BUGS,
]
