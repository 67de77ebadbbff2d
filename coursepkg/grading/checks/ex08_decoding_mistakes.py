"""The catalogue of ex08_decoding: the known mistakes of greedy decoding and beam search, each a
runnable variant (on the checks' tiny model) with the advice a student gets when their output
matches it.

Each mistake is one wrong function with the stub's signature; the line that makes the mistake
says so in a comment. The beam-search mistakes that rank the finished hypotheses wrongly share a
correct search (:func:`_finished_hypotheses`) and differ only in how they pick from it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...decoding import beam_search as _reference_beam
from ...decoding import greedy_decode as _reference_greedy
from ..framework import BugVariant

__all__ = ["BEAM_BUGS", "BEAM_ITEM", "BUGS", "GREEDY_BUGS", "GREEDY_ITEM"]

GREEDY_ITEM = "greedy_decode"
BEAM_ITEM = "beam_search"

#: Token ids of the checks' tiny model: 0 is an ordinary token, 1 starts and 2 ends a sequence.
BOS, EOS = 1, 2


def pad_id(model: nn.Module) -> int:
    return model.config.pad_id if model.config.pad_id is not None else EOS


def _padded(rows: list[list[int]], pad: int) -> Tensor:
    """Token lists of different lengths as one (B, T) tensor, right-padded with ``pad``."""
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (B, T)


# Known mistakes: greedy decoding
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def _greedy_no_stop(model, src, max_len, bos_id, eos_id):
    memory = model.encode(src)  # (B, S, D)
    out = torch.full((src.size(0), 1), bos_id, dtype=torch.long)  # (B, 1)
    for _ in range(max_len):
        # The mistake: no row is ever finished, so none is padded and the loop never stops early.
        nxt = model.decode(out, memory)[:, -1].argmax(-1)  # (B,)
        out = torch.cat([out, nxt[:, None]], dim=1)  # (B, t + 1)
    return out


@torch.no_grad()
def _greedy_stop_at_first_eos(model, src, max_len, bos_id, eos_id):
    pad = pad_id(model)
    memory = model.encode(src)  # (B, S, D)
    out = torch.full((src.size(0), 1), bos_id, dtype=torch.long)  # (B, 1)
    done = torch.zeros(src.size(0), dtype=torch.bool)  # (B,)
    for _ in range(max_len):
        nxt = model.decode(out, memory)[:, -1].argmax(-1)  # (B,)
        nxt = nxt.masked_fill(done, pad)
        out = torch.cat([out, nxt[:, None]], dim=1)  # (B, t + 1)
        done |= nxt == eos_id
        if bool(done.any()):  # the mistake: any, where every row must be finished (all)
            break
    return out


@torch.no_grad()
def _greedy_first_position(model, src, max_len, bos_id, eos_id):
    pad = pad_id(model)
    memory = model.encode(src)  # (B, S, D)
    out = torch.full((src.size(0), 1), bos_id, dtype=torch.long)  # (B, 1)
    done = torch.zeros(src.size(0), dtype=torch.bool)  # (B,)
    for _ in range(max_len):
        # The mistake: the logits of position 0, where the next token's are the last position's.
        nxt = model.decode(out, memory)[:, 0].argmax(-1)  # (B,)
        nxt = nxt.masked_fill(done, pad)
        out = torch.cat([out, nxt[:, None]], dim=1)  # (B, t + 1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    return out


def _greedy_no_bos(model, src, max_len, bos_id, eos_id):
    return _reference_greedy(model, src, max_len, bos_id, eos_id)[:, 1:]


def _greedy_drops_eos(model, src, max_len, bos_id, eos_id):
    out = _reference_greedy(model, src, max_len, bos_id, eos_id)  # (B, 1 + T)
    rows = []
    for row in out.tolist():
        body = row[1:]
        if eos_id in body:
            body = body[: body.index(eos_id)]  # everything before EOS, without it
        rows.append([row[0], *body])
    return _padded(rows, pad_id(model))  # (B, 1 + T')


def _greedy_pads_with_zero(model, src, max_len, bos_id, eos_id):
    out = _reference_greedy(model, src, max_len, bos_id, eos_id)  # (B, 1 + T)
    is_eos = (out == eos_id).int()  # (B, 1 + T)
    after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0  # (B, 1 + T) strictly after the first EOS
    return out.masked_fill(after_eos, 0)


GREEDY_BUGS: list[BugVariant] = [
    BugVariant(
        id="greedy.no_stop_at_eos",
        item=GREEDY_ITEM,
        description="rows keep generating after their EOS (nothing is padded after EOS)",
        advice="Track which rows are finished (a bool tensor updated with next == eos_id), put "
        "the pad id in finished rows instead of the argmax, and stop once every row is finished.",
        impl=_greedy_no_stop,
    ),
    BugVariant(
        id="greedy.no_bos",
        item=GREEDY_ITEM,
        description="the output does not start with BOS",
        advice="Start from a column of bos_id and return it with the generated tokens: "
        "the result is (B, 1 + T), BOS first.",
        impl=_greedy_no_bos,
    ),
    BugVariant(
        id="greedy.stops_at_first_eos",
        item=GREEDY_ITEM,
        description="decoding stops for the whole batch as soon as one row produces EOS",
        advice="Stop only when every row is finished: finished.all(), not finished.any().",
        impl=_greedy_stop_at_first_eos,
    ),
    BugVariant(
        id="greedy.first_position_logits",
        item=GREEDY_ITEM,
        description="the next token is read from the logits of the first position instead of "
        "the last",
        advice="model.decode returns logits for every position; the next token comes from the "
        "last one: logits[:, -1].",
        impl=_greedy_first_position,
    ),
    BugVariant(
        id="greedy.pads_with_zero",
        item=GREEDY_ITEM,
        description="finished rows are padded with 0 instead of the pad id",
        advice="Pad with model.config.pad_id, or eos_id when the model has no pad id.",
        impl=_greedy_pads_with_zero,
    ),
    BugVariant(
        id="greedy.drops_eos",
        item=GREEDY_ITEM,
        description="a row stops at EOS without writing the EOS itself",
        advice="Append the EOS a row produces, then stop that row (pad it afterwards): the "
        "output keeps EOS, as in [BOS, a, b, EOS, pad].",
        impl=_greedy_drops_eos,
    ),
]

# ---------------------------------------------------------------------------------------------
# Known mistakes: beam search
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def _finished_hypotheses(
    model, src_row, beam_size, max_len, bos_id, eos_id
) -> list[tuple[float, list[int]]]:
    """A correct beam search of one source (1, S): every hypothesis that finished, in the order
    it finished (those still open after ``max_len`` tokens last), with its raw log-probability.
    The search stops once ``beam_size`` have finished. Ranking them is left to the caller."""
    memory = model.encode(src_row)  # (1, S, D)
    beams: list[tuple[float, list[int]]] = [(0.0, [bos_id])]
    finished: list[tuple[float, list[int]]] = []
    for t in range(1, max_len + 1):
        candidates = []
        for logp, seq in beams:
            tokens = torch.tensor([seq])  # (1, t)
            lp = model.decode(tokens, memory)[0, -1].float().log_softmax(-1)  # (V,)
            candidates += [(logp + v, seq + [tok]) for tok, v in enumerate(lp.tolist())]
        candidates.sort(key=lambda c: -c[0])
        beams = []
        for logp, seq in candidates:
            if seq[-1] == eos_id:
                finished.append((logp, seq))
                if len(finished) >= beam_size and t < max_len:
                    return finished
            else:
                beams.append((logp, seq))
                if len(beams) == beam_size:
                    break
        if not beams:
            return finished
    return finished + beams


def _beam_last_finished(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    rows, scores = [], []
    for i in range(src.size(0)):
        finished = _finished_hypotheses(model, src[i : i + 1], beam_size, max_len, bos_id, eos_id)
        logp, seq = finished[-1]  # the mistake: the last hypothesis to finish, not the best
        rows.append(seq)
        scores.append(logp / (len(seq) - 1) ** length_penalty)
    return _padded(rows, pad_id(model)), torch.tensor(scores)  # (B, 1 + T), (B,)


def _beam_length_counts_bos(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    rows, scores = [], []
    for i in range(src.size(0)):
        finished = _finished_hypotheses(model, src[i : i + 1], beam_size, max_len, bos_id, eos_id)
        # The mistake: len(seq) counts BOS; the generated tokens are len(seq) - 1.
        ranked = [(logp / len(seq) ** length_penalty, seq) for logp, seq in finished]
        score, seq = max(ranked, key=lambda f: f[0])
        rows.append(seq)
        scores.append(score)
    return _padded(rows, pad_id(model)), torch.tensor(scores)  # (B, 1 + T), (B,)


@torch.no_grad()
def _beam_keeps_finished(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    """The simplification where finished hypotheses stay in the beam (taking its slots) and
    compete with open ones by raw log-probability; the search ends when the beam holds only
    finished hypotheses or after max_len steps."""
    rows, scores = [], []
    for i in range(src.size(0)):
        memory = model.encode(src[i : i + 1])  # (1, S, D)
        beam: list[tuple[float, list[int]]] = [(0.0, [bos_id])]
        for _ in range(max_len):
            candidates = [(lp, seq) for lp, seq in beam if seq[-1] == eos_id]
            for logp, seq in beam:
                if seq[-1] == eos_id:
                    continue
                tokens = torch.tensor([seq])  # (1, t)
                lp = model.decode(tokens, memory)[0, -1].float().log_softmax(-1)
                candidates += [(logp + v, seq + [tok]) for tok, v in enumerate(lp.tolist())]
            candidates.sort(key=lambda c: -c[0])
            beam = candidates[:beam_size]
            if all(seq[-1] == eos_id for _, seq in beam):
                break
        score, seq = max(((lp / (len(s) - 1) ** length_penalty, s) for lp, s in beam))
        rows.append(seq)
        scores.append(score)
    return _padded(rows, pad_id(model)), torch.tensor(scores)  # (B, 1 + T), (B,)


def _beam_no_length_norm(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    return _reference_beam(model, src, beam_size, max_len, bos_id, eos_id, 0.0)


def _beam_size_ignored(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    return _reference_beam(model, src, 1, max_len, bos_id, eos_id, length_penalty)


def _beam_raw_scores(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    tokens, scores = _reference_beam(model, src, beam_size, max_len, bos_id, eos_id, length_penalty)
    lengths = generated_lengths(tokens, eos_id, max_len)  # (B,)
    return tokens, scores * lengths.to(scores.dtype) ** length_penalty


def generated_lengths(tokens: Tensor, eos_id: int, max_len: int) -> Tensor:
    """Tokens after BOS up to and including the first EOS (max_len when there is none)."""
    body = tokens[:, 1:]  # (B, T)
    is_eos = body == eos_id  # (B, T)
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, torch.full_like(body[:, 0], 0))
    return torch.where(first > 0, first, torch.full_like(first, max_len))  # (B,)


BEAM_BUGS: list[BugVariant] = [
    BugVariant(
        id="beam.no_length_normalisation",
        item=BEAM_ITEM,
        description="finished hypotheses are ranked by their raw log-probability, without the "
        "length normalisation",
        advice="Rank finished hypotheses by logp / t ** length_penalty (t = generated tokens, "
        "EOS included) and return that normalised score.",
        impl=_beam_no_length_norm,
    ),
    BugVariant(
        id="beam.last_instead_of_best",
        item=BEAM_ITEM,
        description="the answer is the last hypothesis that finished, not the best one",
        advice="Return the finished hypothesis with the highest normalised score: "
        "max(finished, key=score).",
        impl=_beam_last_finished,
    ),
    BugVariant(
        id="beam.length_counts_bos",
        item=BEAM_ITEM,
        description="the length in the normalisation counts BOS",
        advice="t counts the generated tokens only (EOS included, BOS not): a hypothesis "
        "[BOS, a, EOS] has length 2.",
        impl=_beam_length_counts_bos,
    ),
    BugVariant(
        id="beam.beam_size_ignored",
        item=BEAM_ITEM,
        description="only one hypothesis is kept per step (this is greedy decoding)",
        advice="Keep beam_size open hypotheses per step: extend each by every token, sort all "
        "candidates by total log-probability and keep the best beam_size that do not end in EOS.",
        impl=_beam_size_ignored,
    ),
    BugVariant(
        id="beam.raw_score_returned",
        item=BEAM_ITEM,
        description="the right hypothesis is chosen but its raw log-probability is returned "
        "as its score",
        advice="Return the normalised score logp / t ** length_penalty of the chosen hypothesis.",
        impl=_beam_raw_scores,
    ),
    BugVariant(
        id="beam.finished_kept_in_beam",
        item=BEAM_ITEM,
        description="finished hypotheses stay in the beam and take the places of open ones "
        "(ranked by raw log-probability), so fewer hypotheses are extended than beam_size",
        advice="Move a hypothesis that ends in EOS out of the beam into a finished list, and "
        "keep filling the beam with beam_size open candidates; stop a source once beam_size "
        "hypotheses have finished.",
        impl=_beam_keeps_finished,
    ),
]

BUGS: list[BugVariant] = [*GREEDY_BUGS, *BEAM_BUGS]
