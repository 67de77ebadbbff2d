"""Generation: batched greedy decoding and beam search for the encoder-decoder model.

The key/value cache they use lives in :mod:`coursepkg.kv_cache`; sampling a next token
(:func:`~coursepkg.decoder_only.sample_next`) lives with
:meth:`~coursepkg.DecoderOnlyLM.generate` in :mod:`coursepkg.decoder_only`.

Dimension legend: B batch, K beam size, H heads, T generated length, S source length,
V vocabulary. Token masks are bool, True = real token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ._validation import check_tokens
from .kv_cache import KVCache
from .model import Transformer

LENGTH_NORMS = ("power", "gnmt")
#: When beam search stops a source: once K hypotheses have finished (the convention of GNMT and
#: OpenNMT, and the exercise's), once no open hypothesis can still beat the best finished one
#: (exact: the same output as never stopping early), or only at max_len.
STOPPING = ("k_finished", "bound", "never")


def length_penalty(length: int | Tensor, alpha: float, form: str = "power") -> float | Tensor:
    """The divisor that length-normalises a hypothesis's summed log-probability.

    ``"power"`` is ``length ** alpha``; ``"gnmt"`` is Wu et al. (2016)'s
    ``((5 + length) / 6) ** alpha``, the form behind the Transformer paper's ``alpha = 0.6``.
    Both are 1 when ``alpha = 0`` (raw log-probability) or for a one-token output, and both grow
    with the length; what differs is GNMT's additive 5, which makes the divisor grow much more
    slowly over short outputs (at ``alpha = 0.6``, 1.73 against 3.98 for ten tokens).

    Args:
        length: generated tokens of the hypothesis, EOS included (>= 1).
        alpha: the exponent, >= 0.
        form: ``"power"`` or ``"gnmt"``.

    Returns:
        The divisor (a tensor when ``length`` is one).
    """
    if form not in LENGTH_NORMS:
        raise ValueError(f"form must be one of {LENGTH_NORMS}, got {form!r}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if form == "gnmt":
        return ((5 + length) / 6) ** alpha
    return length**alpha


_length_divisor = length_penalty  # beam_search's keyword of that name shadows the function


def _check_decode_args(model: Transformer, src: Tensor, max_len: int, bos_id: int, eos_id: int):
    vocab = model.config.vocab_size
    check_tokens("src", src, model.config.source_vocab_size)
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not (0 <= value < vocab):
            raise ValueError(f"{name} must be a token id in [0, {vocab}), got {value}")
    if 1 + max_len > model.config.max_len:
        raise ValueError(
            f"max_len={max_len} new tokens after BOS need {1 + max_len} target positions, more "
            f"than the model's max_len={model.config.max_len}"
        )


def _next_logits(
    model: Transformer,
    tokens: Tensor,
    memory: Tensor,
    src_mask: Tensor | None,
    cache: KVCache | None,
) -> Tensor:
    """Logits of the next token after ``tokens`` (B, t) -> (B, V).

    Every generated token is real, even one that happens to equal the pad id, so the target
    mask is all True rather than derived from ``pad_id``.
    """
    if cache is not None:
        return model.decode(tokens[:, -1:], memory, src_mask, cache=cache)[:, -1]
    real = torch.ones_like(tokens, dtype=torch.bool)  # (B, t)
    return model.decode(tokens, memory, src_mask, tgt_mask=real)[:, -1]


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    src_mask: Tensor | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Batched greedy decoding: at every step take the most probable next token.

    A sequence stops at its first ``eos_id``; later positions hold the pad id (the config's
    ``pad_id``, else ``eos_id``). Decoding ends when every sequence has stopped or after
    ``max_len`` new tokens.

    Args:
        model: an encoder-decoder :class:`~coursepkg.Transformer` (put it in eval mode).
        src: source ids.
        max_len: the most tokens to generate after BOS.
        bos_id: start-of-sequence id, the first decoder input.
        eos_id: end-of-sequence id.
        src_mask: bool (B, S), True = real token (derived from ``pad_id`` when omitted).
        use_cache: reuse keys/values of earlier steps (same tokens, fewer FLOPs).

    Shape:
        src (B, S) -> (B, 1 + T) with T <= max_len.

    Returns:
        Generated ids starting with ``bos_id``.
    """
    _check_decode_args(model, src, max_len, bos_id, eos_id)
    pad = model.config.pad_id if model.config.pad_id is not None else eos_id
    src_mask = model.source_mask(src, src_mask)
    memory = model.encode(src, src_mask)  # (B, S, D)
    b = src.size(0)
    tokens = torch.full((b, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(b, dtype=torch.bool, device=src.device)  # (B,)
    cache = model.new_cache(capacity=1 + max_len) if use_cache else None
    for _ in range(max_len):
        logits = _next_logits(model, tokens, memory, src_mask, cache)  # (B, V)
        nxt = logits.argmax(dim=-1)  # (B,)
        nxt = torch.where(finished, torch.full_like(nxt, pad), nxt)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (B, t + 1)
        finished |= nxt == eos_id
        if bool(finished.all()):
            break
    return tokens


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int,
    max_len: int,
    bos_id: int,
    eos_id: int,
    length_penalty: float = 1.0,
    src_mask: Tensor | None = None,
    use_cache: bool = True,
    length_norm: str = "power",
    stopping: str = "k_finished",
) -> tuple[Tensor, Tensor]:
    """Beam search with length normalisation.

    Keeps the ``beam_size`` best partial hypotheses by total log-probability. A hypothesis
    that emits ``eos_id`` is finished and ranked by ``log p / length ** length_penalty``
    (length counts generated tokens including EOS; ``length_penalty=0`` ranks by raw
    log-probability, which favours short outputs). By default a source is done once it has
    ``beam_size`` finished hypotheses; hypotheses still open after ``max_len`` tokens are
    ranked the same way. With ``beam_size=1`` and that rule this is exactly greedy decoding.
    With ``length_norm="gnmt"`` the divisor is ``((5 + length) / 6) ** length_penalty``
    instead (see :func:`length_penalty`).

    Stopping at ``beam_size`` finished hypotheses is a heuristic: with ``length_penalty > 0``
    an open hypothesis can still overtake them by growing longer (Huang et al., 2017).
    ``stopping="bound"`` stops a source only when the best finished score is at least the best
    any open hypothesis could reach (its log-probability, which can only fall, divided by the
    divisor of ``max_len``), so it returns what ``stopping="never"`` (run to ``max_len``)
    returns, usually in fewer steps.

    Args:
        model: an encoder-decoder :class:`~coursepkg.Transformer` (eval mode).
        src: source ids.
        beam_size: hypotheses kept per source, >= 1.
        max_len: the most tokens to generate after BOS.
        bos_id: start id.
        eos_id: end id.
        length_penalty: exponent alpha of the length normalisation.
        src_mask: bool (B, S), True = real token.
        use_cache: reuse keys/values across steps.
        length_norm: ``"power"`` (``length ** alpha``) or ``"gnmt"``.
        stopping: ``"k_finished"``, ``"bound"`` or ``"never"`` (see above).

    Shape:
        src (B, S) -> tokens (B, 1 + T), scores (B,).

    Returns:
        ``(tokens, scores)``: the best hypothesis per source (starting with BOS, padded with
        the pad id) and its normalised score.
    """
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}")
    if length_penalty < 0:
        raise ValueError(f"length_penalty must be >= 0, got {length_penalty}")
    if length_norm not in LENGTH_NORMS:
        raise ValueError(f"length_norm must be one of {LENGTH_NORMS}, got {length_norm!r}")
    if stopping not in STOPPING:
        raise ValueError(f"stopping must be one of {STOPPING}, got {stopping!r}")
    _check_decode_args(model, src, max_len, bos_id, eos_id)
    pad = model.config.pad_id if model.config.pad_id is not None else eos_id
    k = beam_size
    src_mask = model.source_mask(src, src_mask)
    memory = model.encode(src, src_mask).repeat_interleave(k, dim=0)  # (B*K, S, D)
    src_mask = None if src_mask is None else src_mask.repeat_interleave(k, dim=0)  # (B*K, S)
    beams = _Beams.start(src.size(0), k, bos_id, src.device)
    cache = model.new_cache(capacity=1 + max_len) if use_cache else None

    def normalise(logp: float, length: int) -> float:
        return logp / _length_divisor(length, length_penalty, length_norm)

    beams.stopping, beams.max_len = stopping, max_len
    for step in range(1, max_len + 1):
        logits = _next_logits(model, beams.tokens, memory, src_mask, cache)  # (B*K, V)
        index = _beam_step(beams, logits, step, step == max_len, eos_id, pad, normalise)
        if cache is not None:
            cache.reorder(index)
        if all(beams.done):
            break
    return _best_hypotheses(beams, pad, normalise)


@dataclass
class _Beams:
    """The state of beam search: K hypotheses per source and the finished ones."""

    tokens: Tensor  # (B*K, t) the open hypotheses, BOS first
    scores: Tensor  # (B, K) their total log-probabilities (-inf for placeholders)
    finished: list[list[tuple[float, list[int]]]] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    stopping: str = "k_finished"  # one of STOPPING
    max_len: int = 0  # the longest a hypothesis can grow (for stopping="bound")

    @classmethod
    def start(cls, b: int, k: int, bos_id: int, device: torch.device) -> _Beams:
        tokens = torch.full((b * k, 1), bos_id, dtype=torch.long, device=device)  # (B*K, 1)
        # Start from one live beam per source; the other K-1 copies are placeholders.
        scores = torch.full((b, k), float("-inf"), device=device)  # (B, K)
        scores[:, 0] = 0.0
        return cls(tokens, scores, [[] for _ in range(b)], [False] * b)


def _beam_step(
    beams: _Beams,
    logits: Tensor,
    step: int,
    last: bool,
    eos_id: int,
    pad: int,
    normalise: Callable[[float, int], float],
) -> Tensor:
    """Extend every hypothesis by one token and keep the K best per source.

    Returns the rows of the previous hypotheses the new ones continue (for the cache).

    Shape:
        logits (B*K, V) -> index (B*K,).
    """
    b, k = beams.scores.shape
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B*K, V)
    vocab = logp.size(-1)
    total = (beams.scores.view(b * k, 1) + logp).view(b, k * vocab)  # (B, K*V)
    top_val, top_idx = total.topk(min(2 * k, k * vocab), dim=-1)  # (B, 2K)
    top_val, top_idx = top_val.tolist(), top_idx.tolist()
    rows, next_tok, next_scores = [], [], []
    for i in range(b):
        kept = _extend_source(
            beams, i, top_val[i], top_idx[i], vocab, step, last, eos_id, normalise
        )
        kept = [(i * k + beam, tok, val) for beam, tok, val in kept]
        if beams.done[i] or not kept:
            beams.done[i] = True
            kept = [(i * k, pad, float("-inf"))] * k
        kept += [(kept[0][0], kept[0][1], float("-inf"))] * (k - len(kept))
        for row, tok, val in kept:
            rows.append(row)
            next_tok.append(tok)
            next_scores.append(val)
    device = beams.tokens.device
    index = torch.tensor(rows, device=device)  # (B*K,)
    new = torch.tensor(next_tok, device=device)[:, None]  # (B*K, 1)
    beams.tokens = torch.cat([beams.tokens.index_select(0, index), new], dim=1)  # (B*K, t + 1)
    beams.scores = torch.tensor(next_scores, device=device).view(b, k)  # (B, K)
    return index


def _extend_source(
    beams: _Beams,
    i: int,
    values: list[float],
    indices: list[int],
    vocab: int,
    step: int,
    last: bool,
    eos_id: int,
    normalise: Callable[[float, int], float],
) -> list[tuple[int, int, float]]:
    """Walk source ``i``'s best candidates: an EOS finishes a hypothesis (normalised score
    recorded in ``beams.finished``), any other token extends one; returns the extended ones
    as (beam, token, score), at most K."""
    k = beams.scores.size(1)
    kept: list[tuple[int, int, float]] = []
    if beams.done[i]:
        return kept
    for val, idx in zip(values, indices, strict=True):
        beam, tok = divmod(idx, vocab)
        if val == float("-inf"):
            break
        if tok == eos_id:
            hyp = beams.tokens[i * k + beam].tolist() + [eos_id]
            beams.finished[i].append((normalise(val, step), hyp))
            # Stop early with k finished hypotheses, except at the last step, where the open
            # ones are still ranked below.
            if beams.stopping == "k_finished" and len(beams.finished[i]) >= k and not last:
                beams.done[i] = True
                break
        else:
            kept.append((beam, tok, val))
            if len(kept) == k:
                break
    if beams.stopping == "bound" and kept and beams.finished[i] and not last:
        # An open hypothesis's log-probability only falls as it grows, and the divisor only
        # grows with the length: normalised by max_len's divisor is the best it can reach.
        best_open = normalise(max(val for _, _, val in kept), beams.max_len)
        beams.done[i] = max(score for score, _ in beams.finished[i]) >= best_open
    return kept


def _best_hypotheses(
    beams: _Beams, pad: int, normalise: Callable[[float, int], float]
) -> tuple[Tensor, Tensor]:
    """The best hypothesis per source, finished or (at max_len) still open, padded.

    Shape:
        -> tokens (B, 1 + T), scores (B,).
    """
    b, k = beams.scores.shape
    device = beams.tokens.device
    for i in range(b):
        if not beams.done[i]:
            # Hypotheses still open at max_len compete with the finished ones.
            for j in range(k):
                val = float(beams.scores[i, j])
                if val > float("-inf"):
                    hyp = beams.tokens[i * k + j].tolist()
                    beams.finished[i].append((normalise(val, _hyp_len(hyp)), hyp))
    best = [max(f, key=lambda t: t[0]) for f in beams.finished]
    width = max(len(hyp) for _, hyp in best)
    out = torch.full((b, width), pad, dtype=torch.long, device=device)  # (B, 1 + T)
    for i, (_, hyp) in enumerate(best):
        out[i, : len(hyp)] = torch.tensor(hyp, device=device)
    return out, torch.tensor([s for s, _ in best], device=device)


def _hyp_len(hyp: list[int]) -> int:
    """Generated length of a hypothesis that starts with BOS."""
    return max(len(hyp) - 1, 1)


__all__ = ["beam_search", "greedy_decode", "length_penalty"]
