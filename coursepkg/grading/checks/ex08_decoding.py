"""Checks of assignment ex08_decoding: greedy decoding and beam search.

Both checks run the student's decoder on a tiny seeded reference :class:`~coursepkg.Transformer`
and compare its tokens (and beam scores) with :func:`coursepkg.decoding.greedy_decode` and
:func:`coursepkg.decoding.beam_search`. The sources are picked from a seeded pool so that the
outputs are not trivial: in every batch some rows stop early at EOS and others run to
``max_len``, beam search disagrees with greedy decoding on some rows, and the length
normalisation changes the winner on some rows.

Dimension legend: B batch (sources), S source length, T generated length, K beam size,
V vocabulary.

The catalogue of known mistakes these checks name is in :mod:`.ex08_decoding_mistakes`.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from ...config import TransformerConfig
from ...decoding import beam_search as _reference_beam
from ...decoding import greedy_decode as _reference_greedy
from ...model import Transformer
from ..framework import (
    BugVariant,
    CheckReport,
    call_student,
    configs,
    describe,
    expect_tensor,
    forbidden_calls,
    public_check,
    register_configs,
)
from .ex08_decoding_mistakes import (
    BEAM_BUGS,
    BEAM_ITEM,
    BOS,
    EOS,
    GREEDY_BUGS,
    GREEDY_ITEM,
    generated_lengths,
    pad_id,
)

__all__ = ["check_beam_search", "check_greedy_decode", "decoding_case"]

_VOCAB = 10
_POOL = 32  # candidate sources a case's batch is picked from

# ---------------------------------------------------------------------------------------------
# The tiny model and its sources
# ---------------------------------------------------------------------------------------------


def _tiny_model(seed: int) -> Transformer:
    """A seeded one-layer Transformer in float64 (so that batched and per-row decoding agree to
    ~1e-15 and no argmax flips between them). The output projection is untied and sharpened:
    with tied embeddings a random model mostly repeats its input token."""
    torch.manual_seed(seed)
    config = TransformerConfig(
        vocab_size=_VOCAB,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=1,
        dropout=0.0,
        max_len=16,
        tie_embeddings=False,
    )
    model = Transformer(config).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    return model


def _finished_early(tokens: Tensor, max_len: int) -> Tensor:
    """Rows that produced EOS before their last allowed token."""
    body = tokens[:, 1:max_len]  # (B, T - 1) every position but the last allowed one
    return (body == EOS).any(dim=1)  # (B,)


def _pick(flags: list[Tensor], n: int) -> list[int] | None:
    """Choose ``n`` pool rows covering every flag (each a (POOL,) bool tensor) when ``n``
    allows, then fill in pool order. None when some flag has no row at all."""
    if any(not bool(f.any()) for f in flags):
        return None
    chosen: list[int] = []
    for flag in flags:
        if len(chosen) == n:
            break
        if not any(bool(flag[i]) for i in chosen):
            score = sum(f.int() for f in flags)  # (POOL,) rows covering more flags first
            order = sorted(range(len(flag)), key=lambda i: (-int(score[i]), i))
            chosen.append(next(i for i in order if bool(flag[i]) and i not in chosen))
    chosen += [i for i in range(len(flags[0])) if i not in chosen][: n - len(chosen)]
    return sorted(chosen)


def decoding_case(config: dict[str, Any]) -> tuple[Transformer, Tensor]:
    """The model and source batch of a decoding configuration.

    Args:
        config: ``seed``, ``B``, ``S``, ``max_len`` and, for beam search, ``beam`` and
            ``alpha``.

    Returns:
        ``(model, src)`` with src (B, S): a fresh model each call (a student's code cannot
        leave changes behind for the next check), deterministic in ``config``.
    """
    seed, rows = _select(tuple(sorted(config.items())))
    model = _tiny_model(seed)
    return model, _pool(seed, config["S"])[list(rows)]


def _pool(seed: int, length: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, _VOCAB, (_POOL, length), generator=gen)  # (POOL, S)


@functools.lru_cache(maxsize=256)
def _select(key: tuple[tuple[str, Any], ...]) -> tuple[int, tuple[int, ...]]:
    """Model seed and pool rows of a configuration (cached: picking runs the reference over
    the whole pool)."""
    config = dict(key)
    b, s, max_len = config["B"], config["S"], config["max_len"]
    for attempt in range(20):
        seed = config["seed"] + 7919 * attempt
        model = _tiny_model(seed)
        pool = _pool(seed, s)  # (POOL, S)
        greedy = _reference_greedy(model, pool, max_len, BOS, EOS)  # (POOL, 1 + T)
        early = _finished_early(greedy, max_len)  # (POOL,)
        flags = [early, ~early]
        if "beam" in config and config["beam"] > 1:
            k, alpha = config["beam"], config["alpha"]
            beam, _ = _reference_beam(model, pool, k, max_len, BOS, EOS, alpha)
            raw, _ = _reference_beam(model, pool, k, max_len, BOS, EOS, 0.0)
            flags += [_rows_differ(beam, greedy), _rows_differ(beam, raw)]
        rows = _pick(flags, b)
        if rows is not None:
            return seed, tuple(rows)
    raise RuntimeError(f"no decoding case found for {config}")  # pragma: no cover


def _rows_differ(a: Tensor, b: Tensor) -> Tensor:
    """Per row, whether two padded token batches differ (different widths padded with EOS)."""
    width = max(a.size(1), b.size(1))
    a = torch.nn.functional.pad(a, (0, width - a.size(1)), value=EOS)  # (B, W)
    b = torch.nn.functional.pad(b, (0, width - b.size(1)), value=EOS)  # (B, W)
    return (a != b).any(dim=1)  # (B,)


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------


def _sample_greedy(rng: random.Random) -> dict[str, int]:
    return {
        "seed": rng.randint(10, 10_000),
        "B": rng.randint(1, 6),
        "S": rng.randint(2, 7),
        "max_len": rng.randint(3, 10),
    }


def _sample_beam(rng: random.Random) -> dict[str, Any]:
    return {
        **_sample_greedy(rng),
        "beam": rng.randint(2, 4),
        "alpha": rng.choice([0.6, 1.0, 1.5]),
    }


register_configs(
    GREEDY_ITEM,
    visible=[
        {"seed": 0, "B": 1, "S": 4, "max_len": 6},
        {"seed": 1, "B": 4, "S": 5, "max_len": 7},
        {"seed": 2, "B": 6, "S": 3, "max_len": 9},
    ],
    extra=[{"seed": 3, "B": 3, "S": 7, "max_len": 12}],
    sample=_sample_greedy,
)
register_configs(
    BEAM_ITEM,
    visible=[
        {"seed": 0, "B": 1, "S": 4, "max_len": 6, "beam": 3, "alpha": 1.0},
        {"seed": 1, "B": 4, "S": 5, "max_len": 7, "beam": 2, "alpha": 0.6},
        {"seed": 3, "B": 5, "S": 3, "max_len": 8, "beam": 4, "alpha": 1.0},
        {"seed": 4, "B": 3, "S": 4, "max_len": 6, "beam": 1, "alpha": 1.0},
    ],
    extra=[{"seed": 5, "B": 2, "S": 6, "max_len": 10, "beam": 3, "alpha": 1.5}],
    sample=_sample_beam,
)

# ---------------------------------------------------------------------------------------------
# Comparing token batches
# ---------------------------------------------------------------------------------------------


def _same_tokens(student: Any, expected: Tensor, pad: int) -> bool:
    """Equal, allowing the student extra trailing columns that hold only the pad id (a
    decoder that always runs ``max_len`` steps and pads)."""
    if not isinstance(student, Tensor) or student.dim() != 2:
        return False
    if student.size(0) != expected.size(0) or student.size(1) < expected.size(1):
        return False
    width = expected.size(1)
    student = student.detach().cpu().long()
    return bool((student[:, width:] == pad).all()) and torch.equal(student[:, :width], expected)


def _row(tokens: Tensor, i: int) -> str:
    return "[" + ", ".join(str(int(t)) for t in tokens[i]) + "]"


def _validate_tokens(report: CheckReport, tokens: Any, what: str, b: int, max_len: int) -> Tensor:
    tokens = expect_tensor(tokens, what)
    if tokens.is_floating_point() or tokens.dtype == torch.bool:
        report.fail(
            f"{what} has dtype {tokens.dtype}; token ids are integers (torch.long): build them "
            "with dtype=torch.long, and take argmax (an integer) rather than max values."
        )
    if tokens.dim() != 2 or tokens.size(0) != b:
        report.fail(f"{what} has shape {tuple(tokens.shape)}, expected (B, 1 + T) with B = {b}.")
    if tokens.size(1) > 1 + max_len:
        report.fail(
            f"{what} has {tokens.size(1)} columns, but with max_len={max_len} at most "
            f"{1 + max_len} (BOS plus max_len new tokens) are possible."
        )
    return tokens.detach().cpu().long()


def _compare_tokens(
    report: CheckReport,
    tokens: Tensor,
    expected: Tensor,
    pad: int,
    where: str,
    bug: Callable[[], BugVariant | None],
    explain: Callable[[int], str] | None = None,
) -> None:
    if _same_tokens(tokens, expected, pad):
        return
    lines = []
    width = min(tokens.size(1), expected.size(1))
    bad = [
        i
        for i in range(expected.size(0))
        if not torch.equal(tokens[i, :width], expected[i, :width])
    ]
    if tokens.size(1) < expected.size(1):
        # Rows that agree on the shared columns but where the reference goes on.
        ends = 1 + generated_lengths(expected, EOS, expected.size(1) - 1)  # (B,)
        short = [i for i in range(expected.size(0)) if int(ends[i]) > width]
        if not bad and short:
            lines.append(
                f"your output has {tokens.size(1)} columns, the reference {expected.size(1)} "
                f"{where}: some row stopped too early."
            )
            bad = short
        else:
            lines.append(
                f"your output has {tokens.size(1)} columns, the reference {expected.size(1)} "
                f"{where}."
            )
    if not bad and tokens.size(1) > expected.size(1):
        lines.append(
            f"after the reference stops, your extra columns should hold only the pad id ({pad}) "
            f"{where}."
        )
        bad = [i for i in range(expected.size(0)) if bool((tokens[i, width:] != pad).any())]
    if bad:
        i = bad[0]
        if not lines:
            lines.append(
                f"your tokens differ from the reference in {len(bad)} of "
                f"{expected.size(0)} rows {where}."
            )
        lines.append(
            f"Row {i}: yours {_row(tokens, i)}, reference {_row(expected, i)} "
            f"(BOS={BOS}, EOS={EOS}, pad={pad})."
        )
        if explain is not None:
            lines.append(explain(i))
    report.fail("\n".join(line for line in lines if line), bug())


def _diagnose_tokens(
    student: Callable[[], Any],
    bugs: list[BugVariant],
    args: tuple,
    expected: Any,
    pad: int,
    scores: bool = False,
) -> BugVariant | None:
    """The first catalogued mistake whose output equals the student's on ``args`` (tokens, and
    for beam search the scores too), skipping mistakes that agree with the reference here."""

    def same(a: Any, b: Any) -> bool:
        if scores:
            if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2):
                return False
            sa, sb = a[1], b[1]
            if not (isinstance(sa, Tensor) and sa.shape == sb.shape):
                return False
            close = torch.allclose(sa.detach().double().cpu(), sb.double(), rtol=1e-4, atol=1e-5)
            return close and _same_tokens(a[0], b[0].cpu().long(), pad)
        return isinstance(b, Tensor) and _same_tokens(a, b.cpu().long(), pad)

    try:
        theirs = student()
    except Exception:  # noqa: BLE001 - an erroring student output matches nothing
        return None
    for bug in bugs:
        try:
            candidate = bug.impl(*args)
        except Exception:  # noqa: BLE001
            continue
        if same(candidate, expected):
            continue
        if same(theirs, candidate):
            return bug
    return None


# ---------------------------------------------------------------------------------------------
# check_greedy_decode
# ---------------------------------------------------------------------------------------------

_DECODE_ADVICE = "use only model.encode and model.decode (the exercise is the decoding loop itself)"


@public_check(
    assignment="ex08_decoding", implements="greedy_decode", bugs=GREEDY_BUGS, kind="function"
)
def check_greedy_decode(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``greedy_decode(model, src, max_len, bos_id, eos_id)``."""
    for config in configs(GREEDY_ITEM, thorough, seed):
        model, src = decoding_case(config)
        max_len, pad, where = config["max_len"], pad_id(model), f"({describe(config)})"
        args = (model, src, max_len, BOS, EOS)
        expected = _reference_greedy(*args)  # (B, 1 + T)

        def diagnosis(args: tuple = args, expected: Tensor = expected, pad: int = pad):
            return _diagnose_tokens(lambda: impl(*args), GREEDY_BUGS, args, expected, pad)

        with forbidden_calls(GREEDY_ITEM, advice=_DECODE_ADVICE):
            out = call_student(impl, *args, item=GREEDY_ITEM)
        tokens = _validate_tokens(report, out, "your greedy_decode output", src.size(0), max_len)
        if not bool((tokens[:, 0] == BOS).all()):
            report.fail(
                f"every row should start with bos_id={BOS}, but yours starts with "
                f"{tokens[:, 0].tolist()} {where}.",
                diagnosis(),
            )
        _compare_tokens(report, tokens, expected, pad, where, diagnosis)
    report.ok("BOS first, argmax of the last position, padding after EOS, stops when all finish")
    report.ok("batches where some rows stop early and others run to max_len")


# ---------------------------------------------------------------------------------------------
# check_beam_search
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def _hypothesis_score(
    model: nn.Module, src: Tensor, hyp: list[int], pad: int, max_len: int, alpha: float
) -> float:
    """Normalised score of one hypothesis (BOS first), by teacher forcing in float64."""
    body = hyp[1:]
    if EOS in body:
        body = body[: body.index(EOS) + 1]
    else:
        while body and body[-1] == pad:
            body = body[:-1]
    if not body:
        return float("-inf")
    inputs = torch.tensor([[hyp[0], *body[:-1]]])  # (1, t)
    memory = model.encode(src[None])  # (1, S, D)
    logp = model.decode(inputs, memory)[0].double().log_softmax(-1)  # (t, V)
    total = float(logp.gather(1, torch.tensor(body)[:, None]).sum())
    length = len(body) if body[-1] == EOS else max_len
    return total / length**alpha


def _well_formed(hyp: list[int], pad: int, max_len: int) -> bool:
    """BOS first, then either tokens up to an EOS followed only by padding, or exactly
    ``max_len`` tokens without EOS."""
    if not hyp or hyp[0] != BOS:
        return False
    body = hyp[1:]
    if EOS in body:
        return all(t == pad for t in body[body.index(EOS) + 1 :])
    return len(body) == max_len


def _ties_only(
    model: nn.Module,
    src: Tensor,
    tokens: Tensor,
    expected: Tensor,
    pad: int,
    max_len: int,
    alpha: float,
) -> bool:
    """Whether the student's rows that differ from the reference's score the same (within
    1e-6): an exact tie, or a near tie that float32 (the reference's log-softmax) and float64
    order differently. Such a row is as good an answer as the reference's."""
    if _same_tokens(tokens, expected, pad) or tokens.size(0) != expected.size(0):
        return False
    for i in range(expected.size(0)):
        mine, ref = tokens[i].tolist(), expected[i].tolist()
        while len(mine) > 1 and mine[-1] == pad and len(mine) > len(ref):
            mine.pop()
        if mine == ref:
            continue
        if not _well_formed(mine, pad, max_len):
            return False
        a = _hypothesis_score(model, src[i], mine, pad, max_len, alpha)
        b = _hypothesis_score(model, src[i], ref, pad, max_len, alpha)
        if abs(a - b) > 1e-6 * max(1.0, abs(b)):
            return False
    return True


def _explain_scores(
    model: nn.Module,
    src: Tensor,
    tokens: Tensor,
    expected: Tensor,
    pad: int,
    max_len: int,
    config: dict[str, Any],
    i: int,
) -> str:
    """Both rows' normalised scores under the exercise's rule, so that a student sees whether
    the search missed a better hypothesis or scores hypotheses differently."""
    mine, ref = tokens[i].tolist(), expected[i].tolist()
    if not _well_formed(mine, pad, max_len):
        return ""
    alpha = config["alpha"]
    a = _hypothesis_score(model, src[i], mine, pad, max_len, alpha)
    b = _hypothesis_score(model, src[i], ref, pad, max_len, alpha)
    verdict = (
        "so the reference's is the better answer: your search did not find it (how are "
        "finished hypotheses kept, and what length divides their log-probability?)"
        if b > a
        else "yet the reference's is what the exercise's search returns"
    )
    return (
        f"Under the exercise's scoring (total log-probability / t ** {alpha:g}, t counting the "
        f"generated tokens with EOS, without BOS) your row {i} scores {a:.4f} and the "
        f"reference's {b:.4f}, {verdict}."
    )


@public_check(assignment="ex08_decoding", implements="beam_search", bugs=BEAM_BUGS, kind="function")
def check_beam_search(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``beam_search(model, src, beam_size, max_len, bos_id, eos_id,
    length_penalty)``: the chosen tokens and their normalised scores.
    """
    for config in configs(BEAM_ITEM, thorough, seed):
        model, src = decoding_case(config)
        max_len, pad, where = config["max_len"], pad_id(model), f"({describe(config)})"
        args = (model, src, config["beam"], max_len, BOS, EOS, config["alpha"])
        expected = _reference_beam(*args)  # (B, 1 + T), (B,)

        def diagnosis(
            args: tuple = args, expected: tuple = expected, pad: int = pad
        ) -> BugVariant | None:
            return _diagnose_tokens(lambda: impl(*args), BEAM_BUGS, args, expected, pad, True)

        with forbidden_calls(BEAM_ITEM, advice=_DECODE_ADVICE):
            out = call_student(impl, *args, item=BEAM_ITEM)
        if not (isinstance(out, tuple) and len(out) == 2):
            report.fail(
                f"beam_search should return a pair (tokens, scores), but yours returned "
                f"{type(out).__name__}."
            )
        tokens = _validate_tokens(report, out[0], "your beam_search tokens", src.size(0), max_len)
        if not _ties_only(model, src, tokens, expected[0], pad, max_len, config["alpha"]):
            _compare_tokens(
                report,
                tokens,
                expected[0],
                pad,
                where,
                diagnosis,
                partial(_explain_scores, model, src, tokens, expected[0], pad, max_len, config),
            )
        scores = expect_tensor(out[1], "the scores returned by your beam_search")
        if tuple(scores.shape) != (src.size(0),):
            report.fail(
                f"the scores have shape {tuple(scores.shape)}, expected ({src.size(0)},): one "
                "normalised score per source."
            )
        if not scores.is_floating_point():
            report.fail(f"the scores have dtype {scores.dtype}; they should be floats.")
        # The reference sums float32 log-probabilities; tolerances allow for a student who
        # sums them in float64 or in another order (differences ~1e-6).
        theirs = scores.detach().double().cpu()
        ref = expected[1].double()
        if not torch.allclose(theirs, ref, rtol=1e-4, atol=1e-5):
            i = int((theirs - ref).abs().argmax())
            report.fail(
                f"the score of row {i} is {theirs[i].item():.6g}, the reference "
                f"{ref[i].item():.6g} {where} (the tokens agree). The score is the total "
                "log-probability divided by t ** length_penalty, t counting the generated "
                "tokens with EOS but without BOS.",
                diagnosis(),
            )
    report.ok("tokens and normalised scores match the reference; beam_size=1 equals greedy")
    report.ok("batches where length normalisation and the beam change the answer")
