"""The catalogue of ex08_decoding: the known mistakes of greedy decoding and beam search, each a
runnable variant (on the checks' tiny model) with the advice a student gets when their output
matches it.
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


# Known mistakes: greedy decoding
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def _greedy_with_mistake(model, src, max_len, bos_id, eos_id, *, mistake: str) -> Tensor:
    """Greedy decoding with one of the catalogued mistakes (there is no mistake-free mode)."""
    if mistake not in ("no_stop", "stop_at_first_eos", "first_position"):
        raise ValueError(f"unknown mistake {mistake!r}")
    pad = pad_id(model)
    memory = model.encode(src)  # (B, S, D)
    out = torch.full((src.size(0), 1), bos_id, dtype=torch.long)  # (B, 1)
    done = torch.zeros(src.size(0), dtype=torch.bool)  # (B,)
    for _ in range(max_len):
        logits = model.decode(out, memory)  # (B, t, V)
        nxt = (logits[:, 0] if mistake == "first_position" else logits[:, -1]).argmax(-1)
        if mistake != "no_stop":
            nxt = nxt.masked_fill(done, pad)
        out = torch.cat([out, nxt[:, None]], dim=1)  # (B, t + 1)
        done |= nxt == eos_id
        if mistake == "stop_at_first_eos" and bool(done.any()):
            break
        if mistake == "first_position" and bool(done.all()):
            break
    return out


def _greedy_no_stop(model, src, max_len, bos_id, eos_id):
    return _greedy_with_mistake(model, src, max_len, bos_id, eos_id, mistake="no_stop")


def _greedy_stop_at_first_eos(model, src, max_len, bos_id, eos_id):
    return _greedy_with_mistake(model, src, max_len, bos_id, eos_id, mistake="stop_at_first_eos")


def _greedy_first_position(model, src, max_len, bos_id, eos_id):
    return _greedy_with_mistake(model, src, max_len, bos_id, eos_id, mistake="first_position")


def _greedy_no_bos(model, src, max_len, bos_id, eos_id):
    return _reference_greedy(model, src, max_len, bos_id, eos_id)[:, 1:]


def _greedy_drops_eos(model, src, max_len, bos_id, eos_id):
    out = _reference_greedy(model, src, max_len, bos_id, eos_id)  # (B, 1 + T)
    pad = pad_id(model)
    rows = []
    for row in out.tolist():
        body = row[1:]
        if eos_id in body:
            body = body[: body.index(eos_id)]  # everything before EOS, without it
        rows.append([row[0], *body])
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (B, 1 + T')


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
def _beam_with_mistake(model, src, beam_size, max_len, bos_id, eos_id, length_penalty, *, mistake):
    """Beam search, one source at a time, with one of the catalogued mistakes (there is no
    mistake-free mode)."""
    if mistake not in ("last_finished", "length_counts_bos"):
        raise ValueError(f"unknown mistake {mistake!r}")
    extra = 1 if mistake == "length_counts_bos" else 0
    pad = pad_id(model)
    rows, scores = [], []
    for i in range(src.size(0)):
        memory = model.encode(src[i : i + 1])  # (1, S, D)
        beams: list[tuple[float, list[int]]] = [(0.0, [bos_id])]
        finished: list[tuple[float, list[int]]] = []
        stopped = False
        for t in range(1, max_len + 1):
            candidates = []
            for logp, seq in beams:
                tokens = torch.tensor([seq])  # (1, t)
                lp = model.decode(tokens, memory.expand(1, -1, -1))[0, -1].float().log_softmax(-1)
                candidates += [(logp + v, seq + [tok]) for tok, v in enumerate(lp.tolist())]
            candidates.sort(key=lambda c: -c[0])
            beams = []
            for logp, seq in candidates:
                if seq[-1] == eos_id:
                    finished.append((logp / (t + extra) ** length_penalty, seq))
                    if len(finished) >= beam_size and t < max_len:
                        stopped = True
                        break
                else:
                    beams.append((logp, seq))
                    if len(beams) == beam_size:
                        break
            if stopped or not beams:
                stopped = True
                break
        if not stopped:
            finished += [(lp / (max_len + extra) ** length_penalty, s) for lp, s in beams]
        if mistake == "last_finished":
            score, seq = finished[-1]
        else:
            score, seq = max(finished, key=lambda f: f[0])
        rows.append(seq)
        scores.append(score)
    width = max(len(r) for r in rows)
    out = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (B, 1 + T)
    return out, torch.tensor(scores)


@torch.no_grad()
def _beam_keeps_finished(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    """The simplification where finished hypotheses stay in the beam (taking its slots) and
    compete with open ones by raw log-probability; the search ends when the beam holds only
    finished hypotheses or after max_len steps."""
    pad = pad_id(model)
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
    width = max(len(r) for r in rows)
    out = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (B, 1 + T)
    return out, torch.tensor(scores)


def _beam_last_finished(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    return _beam_with_mistake(
        model, src, beam_size, max_len, bos_id, eos_id, length_penalty, mistake="last_finished"
    )


def _beam_length_counts_bos(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    return _beam_with_mistake(
        model, src, beam_size, max_len, bos_id, eos_id, length_penalty, mistake="length_counts_bos"
    )


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
