"""Checks of ex17_serving: the sampling filters, compared with :mod:`coursepkg.serving.sampling`
(equal to ``transformers``' logits processors) as the distributions the scores define
(:func:`..framework.compare_filter`), and speculative decoding's residual distribution (exactly)
and acceptance rule (by a chi-square test: the tokens must follow the target's p); the catalogue
of mistakes they recognise is in :mod:`.ex17_serving_mistakes`.

Dimension legend: B batch, V vocabulary, T tokens seen so far, N draws.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor

from ...serving import sampling
from ...serving.speculative import verify_drafts
from ..framework import (
    BugVariant,
    CheckFailure,
    CheckReport,
    NotImplementedYet,
    call_student,
    chi_square_fit,
    compare_filter,
    configs,
    count_cells,
    describe,
    diagnose,
    expect_close,
    expect_tensor,
    forbidden_calls,
    generator,
    misfit_message,
    public_check,
    randn,
    register_configs,
    same_as_mistake,
)
from .ex17_serving_mistakes import (
    BUGS,
    MIN_P_BUGS,
    MIN_P_ITEM,
    REPETITION_BUGS,
    REPETITION_ITEM,
    RESIDUAL_BUGS,
    RESIDUAL_ITEM,
    SPECULATIVE_BUGS,
    SPECULATIVE_ITEM,
    TEMPERATURE_BUGS,
    TEMPERATURE_ITEM,
    TOP_K_BUGS,
    TOP_K_ITEM,
    TOP_P_BUGS,
    TOP_P_ITEM,
)

__all__ = [
    "check_min_p_filter",
    "check_repetition_penalty",
    "check_residual_distribution",
    "check_speculative_accept",
    "check_temperature_scale",
    "check_top_k_filter",
    "check_top_p_filter",
]

Config = dict[str, Any]
_BUG = {bug.id: bug for bug in BUGS}

#: The course's filters and rule, which the exercise asks students to write.
_REFERENCE_SERVING = (
    *(getattr(sampling, name) for name in sampling.__all__ if name != "SamplingParams"),
    verify_drafts,
)

#: A row is drawn again while a token sits this close to a filter's cut (a mass or a ratio
#: within 1e-4 of p or min_p), where float32 rounding, not the rule, would decide.
_MARGIN = 1e-4


def _forbidden(item: str):
    """The honesty rule for ``item``: no call into the course's serving code."""
    return forbidden_calls(item, extra=_REFERENCE_SERVING)


def _clones(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    # fresh tensors: a student's in-place edit changes nothing here
    return tuple(x.clone() if isinstance(x, Tensor) else x for x in inputs)


def _check_filter(
    report: CheckReport,
    impl: Any,
    item: str,
    bugs: list[BugVariant],
    cases: list[tuple[str, tuple[Any, ...]]],
    reference: Callable[..., Tensor],
    evidence: Callable[..., BugVariant | None] | None = None,
) -> None:
    """The student's filter against ``reference`` on each case (:func:`compare_filter`)."""
    if not callable(impl):
        report.fail(f"expected your function {item}, got {type(impl).__name__}.")

    def run(*inputs: Any) -> Tensor:
        with _forbidden(item):
            return call_student(impl, *_clones(inputs), item=item)

    found = partial(evidence, run) if evidence else None
    compare_filter(report, run, item, bugs, cases, reference, found)


def _logits(gen: torch.Generator, b: int, v: int, ties: bool = False, scale: float = 2.0):
    """(B, V) scores; with ``ties``, small integers (many equal scores) in every other row."""
    logits = scale * randn(gen, b, v)  # (B, V)
    if ties:
        levels = torch.randint(-3, 4, (b, v), generator=gen).float()  # (B, V)
        logits[::2] = levels[::2]
    return logits


def _redraw(gen: torch.Generator, logits: Tensor, too_close: Callable[[Tensor], Tensor]) -> Tensor:
    """``logits`` (B, V) with no row near a cut: a row ``too_close`` marks is drawn again."""
    for _ in range(100):
        bad = too_close(logits.double())  # (B,)
        if not bool(bad.any()):
            break
        logits[bad] = 1.5 * randn(gen, int(bad.sum()), logits.size(-1))
    return logits


# temperature_scale --------------------------------------------------------------------------------

register_configs(
    TEMPERATURE_ITEM,
    visible=[{"B": 3, "V": 8, "T": 0.5}, {"B": 2, "V": 5, "T": 2.0}, {"B": 1, "V": 12, "T": 0.7}],
    extra=[{"B": 4, "V": 30, "T": 1.5}, {"B": 2, "V": 2, "T": 0.1}],
    sample=lambda r: {"B": r.randint(1, 4), "V": r.randint(2, 40), "T": r.choice([0.3, 1.3, 2.5])},
)


@public_check(assignment="ex17_serving", implements=TEMPERATURE_ITEM, bugs=TEMPERATURE_BUGS)
def check_temperature_scale(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check ``temperature_scale(logits, temperature) -> (B, V)`` scores.

    Compares the distribution the scores define with that of
    :func:`coursepkg.serving.sampling.temperature_scale` (logits / T) for temperatures below
    and above 1.
    """
    gen = generator(seed, salt=171)
    cfgs = configs(TEMPERATURE_ITEM, thorough, seed)
    cases = [(describe(c), (_logits(gen, c["B"], c["V"]), c["T"])) for c in cfgs]
    _check_filter(
        report, impl, TEMPERATURE_ITEM, TEMPERATURE_BUGS, cases, sampling.temperature_scale
    )
    report.ok(f"the tempered distribution of the reference on {len(cfgs)} shapes")


# top_k_filter -------------------------------------------------------------------------------------

register_configs(
    TOP_K_ITEM,
    visible=[
        {"B": 4, "V": 10, "k": 3, "ties": True},
        {"B": 2, "V": 6, "k": 1, "ties": False},
        {"B": 3, "V": 5, "k": 7, "ties": False},
    ],
    extra=[{"B": 4, "V": 20, "k": 5, "ties": True}, {"B": 2, "V": 4, "k": 4, "ties": True}],
    sample=lambda rng: _sample_top_k(rng),
)


def _sample_top_k(rng: random.Random) -> Config:
    v = rng.randint(2, 30)
    return {"B": rng.randint(1, 5), "V": v, "k": rng.randint(1, v + 3), "ties": rng.random() < 0.5}


def _tied_at_k(gen: torch.Generator, logits: Tensor, k: int) -> Tensor:
    """Row 0 made to hold a tie between its k-th and (k+1)-th highest scores."""
    v = logits.size(-1)
    if k >= v:
        return logits
    values = logits[0].sort(descending=True).values  # (V,)
    values[k] = values[k - 1]
    logits[0] = values[torch.randperm(v, generator=gen)]
    return logits


def _top_k_evidence(run, inputs, failure, got_kept, want_kept) -> BugVariant | None:
    """A crash for k above V only (the same call with k = V runs), or exactly k tokens kept
    where the reference keeps the k-th's ties too."""
    (logits, k), v = inputs, inputs[0].size(-1)
    if failure is not None:
        return _BUG["top_k.k_above_vocab"] if k > v and _runs(partial(run, logits, v)) else None
    keeps = got_kept.sum(dim=-1)  # (B,)
    if bool((got_kept <= want_kept).all() & (keeps == min(k, v)).all()):
        return _BUG["top_k.ties_dropped"]
    return None


@public_check(assignment="ex17_serving", implements=TOP_K_ITEM, bugs=TOP_K_BUGS)
def check_top_k_filter(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``top_k_filter(logits, k) -> (B, V)`` scores.

    Compares the tokens kept and their probabilities with
    :func:`coursepkg.serving.sampling.top_k_filter` (``TopKLogitsWarper``): one token, several,
    k at and above V, and scores tied with the k-th (which stay).
    """
    gen = generator(seed, salt=172)
    cfgs = configs(TOP_K_ITEM, thorough, seed)
    cases = []
    for c in cfgs:
        logits = _logits(gen, c["B"], c["V"], ties=c["ties"])
        if c["ties"]:
            logits = _tied_at_k(gen, logits, c["k"])
        cases.append((describe(c), (logits, c["k"])))
    _check_filter(
        report, impl, TOP_K_ITEM, TOP_K_BUGS, cases, sampling.top_k_filter, _top_k_evidence
    )
    report.ok(f"the same tokens and probabilities as the reference on {len(cfgs)} shapes")
    report.ok("ties with the k-th score kept; k >= V keeps every token")


# top_p_filter -------------------------------------------------------------------------------------

register_configs(
    TOP_P_ITEM,
    visible=[{"B": 4, "V": 10, "p": 0.8}, {"B": 3, "V": 6, "p": 0.5}, {"B": 2, "V": 8, "p": 1.0}],
    extra=[{"B": 4, "V": 30, "p": 0.9}, {"B": 3, "V": 3, "p": 0.05}],
    sample=lambda r: {"B": r.randint(1, 5), "V": r.randint(2, 30), "p": r.choice([0.3, 0.75, 1.0])},
)


def _near_mass_cut(p: float) -> Callable[[Tensor], Tensor]:
    """Rows where a token's mass before it, or up to it, is within the margin of ``p``."""

    def too_close(logits: Tensor) -> Tensor:
        probs = logits.softmax(dim=-1).sort(dim=-1, descending=True).values  # (B, V)
        upto = probs.cumsum(dim=-1)  # (B, V)
        before = upto - probs
        near = (before - p).abs() < _MARGIN  # decides the rule: keep while before < p
        if p < 1:  # a mistake's cut, so that its rerun is not decided by rounding either
            near |= (upto - p).abs() < _MARGIN
        return near.any(dim=-1)  # (B,)

    return too_close


@public_check(assignment="ex17_serving", implements=TOP_P_ITEM, bugs=TOP_P_BUGS)
def check_top_p_filter(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``top_p_filter(logits, p) -> (B, V)`` scores.

    Compares the tokens kept and their probabilities with
    :func:`coursepkg.serving.sampling.top_p_filter` (``TopPLogitsWarper``): the token whose
    probability reaches p is kept, the most probable one always, every token for p = 1. No
    token's mass sits within 1e-4 of p, where rounding would decide.
    """
    gen = generator(seed, salt=173)
    cfgs = configs(TOP_P_ITEM, thorough, seed)
    cases = [
        (
            describe(c),
            (_redraw(gen, _logits(gen, c["B"], c["V"], scale=1.5), _near_mass_cut(c["p"])), c["p"]),
        )
        for c in cfgs
    ]
    _check_filter(report, impl, TOP_P_ITEM, TOP_P_BUGS, cases, sampling.top_p_filter)
    report.ok(f"the same nucleus as the reference on {len(cfgs)} shapes, p = 1 included")


# min_p_filter -------------------------------------------------------------------------------------

register_configs(
    MIN_P_ITEM,
    visible=[
        {"B": 4, "V": 10, "min_p": 0.1, "ties": False},
        {"B": 4, "V": 8, "min_p": 1.0, "ties": True},
        {"B": 2, "V": 6, "min_p": 0.0, "ties": False},
    ],
    extra=[{"B": 4, "V": 30, "min_p": 0.05, "ties": True}, {"B": 2, "V": 12, "min_p": 0.5}],
    sample=lambda r: {
        **{"B": r.randint(1, 5), "V": r.randint(2, 30), "min_p": r.choice([0.02, 0.1, 0.3, 0.7])},
        "ties": r.random() < 0.5,
    },
)


def _near_ratio_cut(min_p: float) -> Callable[[Tensor], Tensor]:
    """Rows where a token's probability over the top one is within the margin of ``min_p``
    (an exact tie with the top token excepted)."""

    def too_close(logits: Tensor) -> Tensor:
        probs = logits.softmax(dim=-1)  # (B, V)
        ratio = probs / probs.max(dim=-1, keepdim=True).values  # (B, V)
        return (((ratio - min_p).abs() < _MARGIN) & (ratio != 1)).any(dim=-1)  # (B,)

    return too_close


@public_check(assignment="ex17_serving", implements=MIN_P_ITEM, bugs=MIN_P_BUGS)
def check_min_p_filter(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``min_p_filter(logits, min_p) -> (B, V)`` scores.

    Compares the tokens kept and their probabilities with
    :func:`coursepkg.serving.sampling.min_p_filter` (``MinPLogitsWarper``): a cut relative to
    the top probability, min_p 0 (everything kept) and 1 (the top token and its ties).
    """
    gen = generator(seed, salt=174)
    cfgs = configs(MIN_P_ITEM, thorough, seed)
    cases = [
        (
            describe(c),
            (
                _redraw(
                    gen,
                    _logits(gen, c["B"], c["V"], c.get("ties", False)),
                    _near_ratio_cut(c["min_p"]),
                ),
                c["min_p"],
            ),
        )
        for c in cfgs
    ]
    _check_filter(report, impl, MIN_P_ITEM, MIN_P_BUGS, cases, sampling.min_p_filter)
    report.ok(f"the same tokens and probabilities as the reference on {len(cfgs)} shapes")


# repetition_penalty -------------------------------------------------------------------------------

register_configs(
    REPETITION_ITEM,
    visible=[
        {"B": 3, "V": 10, "T": 6, "penalty": 1.3},
        {"B": 2, "V": 6, "T": 8, "penalty": 2.0},
        {"B": 1, "V": 12, "T": 1, "penalty": 0.8},
    ],
    extra=[{"B": 4, "V": 30, "T": 40, "penalty": 1.1}],
    sample=lambda r: {
        **{"B": r.randint(1, 4), "V": r.randint(2, 30), "T": r.randint(1, 20)},
        "penalty": r.choice([0.7, 1.2, 1.5, 3.0]),
    },
)


@public_check(assignment="ex17_serving", implements=REPETITION_ITEM, bugs=REPETITION_BUGS)
def check_repetition_penalty(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check ``repetition_penalty(logits, seen, penalty) -> (B, V)`` scores.

    Compares with :func:`coursepkg.serving.sampling.repetition_penalty`
    (``RepetitionPenaltyLogitsProcessor``) on scores of both signs, ids seen more than once,
    and penalties above and below 1.
    """
    gen = generator(seed, salt=175)
    cfgs = configs(REPETITION_ITEM, thorough, seed)
    cases = []
    for c in cfgs:
        seen = torch.randint(c["V"], (c["B"], c["T"]), generator=gen)  # (B, T)
        if c["T"] >= 2:
            seen[:, -1] = seen[:, 0]  # a repeat in every row
        cases.append((describe(c), (_logits(gen, c["B"], c["V"]), seen, c["penalty"])))
    _check_filter(
        report, impl, REPETITION_ITEM, REPETITION_BUGS, cases, sampling.repetition_penalty
    )
    report.ok(f"the reference's penalised scores on {len(cfgs)} shapes, repeated ids included")


# residual_distribution ----------------------------------------------------------------------------

register_configs(
    RESIDUAL_ITEM,
    visible=[{"B": 3, "V": 6}, {"B": 2, "V": 10}, {"B": 4, "V": 3}],
    extra=[{"B": 5, "V": 40}],
    sample=lambda rng: {"B": rng.randint(1, 6), "V": rng.randint(2, 40)},
)


def _probabilities(gen: torch.Generator, b: int, v: int) -> Tensor:
    """(B, V) distributions, each with about a quarter of its tokens filtered to 0."""
    logits = 1.5 * randn(gen, b, v)  # (B, V)
    removed = torch.rand(b, v, generator=gen) < 0.25  # (B, V)
    removed[torch.arange(b), logits.argmax(dim=-1)] = False
    return logits.masked_fill(removed, float("-inf")).softmax(dim=-1)


def reference_residual(p: Tensor, q: Tensor) -> Tensor:
    """max(0, p - q) normalised, p itself where nothing is left (as ``verify_drafts``).

    Shape:
        p (B, V), q (B, V) -> (B, V).
    """
    left = (p - q).clamp(min=0)  # (B, V)
    mass = left.sum(dim=-1, keepdim=True)  # (B, 1)
    return torch.where(mass > 0, left / mass.clamp(min=1e-30), p)


def _residual_diagnosis(run, got: Tensor, inputs, expected: Tensor) -> BugVariant | None:
    """Negative entries (p - q not clamped at 0, whatever it was divided by), else a rerun."""
    if bool((got.detach() < -1e-6).any()):
        return _BUG["residual.not_clamped"]
    return diagnose(run, RESIDUAL_BUGS, inputs, reference_output=expected)


@public_check(assignment="ex17_serving", implements=RESIDUAL_ITEM, bugs=RESIDUAL_BUGS)
def check_residual_distribution(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check ``residual_distribution(p, q) -> (B, V)``.

    Compares with max(0, p - q) normalised (what :func:`coursepkg.serving.speculative.
    verify_drafts` draws from on a rejection), on distributions with zeros, and requires p
    itself for a row where p equals q.
    """
    if not callable(impl):
        report.fail(f"expected your function {RESIDUAL_ITEM}, got {type(impl).__name__}.")

    def run(*inputs: Any) -> Tensor:
        with _forbidden(RESIDUAL_ITEM):
            return call_student(impl, *_clones(inputs), item=RESIDUAL_ITEM)

    gen = generator(seed, salt=176)
    cfgs = configs(RESIDUAL_ITEM, thorough, seed)
    for c in cfgs:
        where = describe(c)
        inputs = (_probabilities(gen, c["B"], c["V"]), _probabilities(gen, c["B"], c["V"]))
        expected = reference_residual(*inputs)
        got = expect_tensor(run(*inputs), f"your residual ({where})", tuple(expected.shape))
        expect_close(
            report,
            got,
            expected,
            f"your residual ({where})",
            diagnosis=partial(_residual_diagnosis, run, got, inputs, expected),
            hint="Expected max(0, p - q) divided by its row's sum.",
        )
    p = _probabilities(gen, 2, 5)  # (2, V)
    q = torch.stack([p[0], _probabilities(gen, 1, 5)[0]])  # row 0: q equals p
    expect_close(
        report,
        expect_tensor(run(p, q), "your residual (row 0: q equal to p)", (2, 5)),
        reference_residual(p, q),
        "your residual where row 0 has q equal to p (nothing is left: return p in that row)",
    )
    report.ok(f"max(0, p - q) normalised, as the reference, on {len(cfgs)} shapes")
    report.ok("p itself where q equals p")


# speculative_accept -------------------------------------------------------------------------------

#: Draws per configuration, and the chi-square test's level: a correct rule fails one
#: configuration's test with probability ALPHA (its nominal level; tests/grading/checks/
#: test_ex17_serving.py measures the rate at a level of 1%).
DRAWS, ALPHA = 10_000, 1e-9

#: (p, q) of the fixed configurations: tokens the target likes more, less and as much as the
#: draft, a token the target never emits (b) and tokens the draft never proposes (d).
_DESIGNS = {
    "a": ([0.35, 0.25, 0.20, 0.15, 0.05], [0.15, 0.35, 0.10, 0.30, 0.10]),
    "b": ([0.50, 0.00, 0.20, 0.10, 0.10, 0.10], [0.20, 0.30, 0.20, 0.05, 0.15, 0.10]),
    "c": ([0.05, 0.60, 0.05, 0.30], [0.40, 0.20, 0.30, 0.10]),
    "d": ([0.2, 0.1, 0.1, 0.15, 0.05, 0.2, 0.1, 0.1], [0.3, 0.0, 0.2, 0.1, 0.1, 0.2, 0.0, 0.1]),
}

register_configs(
    SPECULATIVE_ITEM,
    visible=[{"design": "a"}, {"design": "b"}, {"design": "c"}],
    extra=[{"design": "d"}],
    sample=lambda rng: {"design": "random", "V": rng.randint(3, 8), "case": rng.randint(0, 999)},
)


def _pair_of(gen: torch.Generator, cfg: Config) -> tuple[Tensor, Tensor]:
    """The configuration's target p and draft q, (V,) each."""
    if cfg["design"] in _DESIGNS:
        return tuple(torch.tensor(x) for x in _DESIGNS[cfg["design"]])  # type: ignore[return-value]
    v = cfg["V"]
    p, q = (0.7 * torch.softmax(randn(gen, 2, v), dim=-1) + 0.3 / v).unbind(0)  # (V,) each
    return p, q


def _cells(out: Any, draft: Tensor, v: int) -> Tensor:
    """Each draw's cell, (N,): its token if accepted, V + its token if rejected."""
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise CheckFailure("your speculative_accept should return a pair (accepted, token).")
    accepted = expect_tensor(out[0], "your accepted", tuple(draft.shape))
    token = expect_tensor(out[1], "your token", tuple(draft.shape))
    if not bool(((accepted == 0) | (accepted == 1)).all()):
        raise CheckFailure("your accepted should be True or False in every row.")
    if not bool((token == token.round()).all() & (token >= 0).all() & (token < v).all()):
        raise CheckFailure(f"your token should hold token ids in [0, {v}).")
    accepted, token = accepted.bool(), token.long()
    if not torch.equal(token[accepted], draft[accepted]):
        raise CheckFailure("your token is not the draft token in a row where it was accepted.")
    return torch.where(accepted, token, v + token)  # (N,)


def _exact_rules(report, cells, draft, p, q, where, name) -> None:
    """The rule's certain parts: p(x) >= q(x) always accepted, and no draw in a cell of
    probability 0 (a draft with p(x) = 0 accepted, a token with p(t) <= q(t) after a rejection)."""
    v = p.numel()
    wrong = (p >= q)[draft] & (cells >= v)  # (N,)
    if bool(wrong.any()):
        x = int(draft[wrong][0])
        report.fail(
            f"your speculative_accept ({where}) rejected draft token {x}, whose p = "
            f"{float(p[x]):.3g} >= q = {float(q[x]):.3g}: min(1, p/q) = 1, it is always kept.",
            name(),
        )
    impossible = torch.cat([torch.minimum(p, q), (p - q).clamp(min=0)]) == 0  # (2V,)
    if bool(impossible[cells].any()):
        cell = int(cells[impossible[cells]][0])
        what = "an accepted draft" if cell < v else "the token drawn after a rejection"
        report.fail(
            f"your speculative_accept ({where}) emitted token {cell % v} as {what}, which the "
            f"rule never does (p = {float(p[cell % v]):.3g}, q = {float(q[cell % v]):.3g}).",
            name(),
        )


@public_check(assignment="ex17_serving", implements=SPECULATIVE_ITEM, bugs=SPECULATIVE_BUGS)
def check_speculative_accept(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check ``speculative_accept(p, q, draft, generator) -> (accepted, token)``.

    Draws 10,000 draft tokens from q per (p, q) pair and requires what is certain (a draft with
    p(x) >= q(x) kept, no token the rule cannot emit) and, by Pearson's chi-square test at the
    level 1e-9, that each (accepted, token) pair comes as often as the rule makes it: min(p, q)(t)
    for an accepted t, max(0, p - q)(t) for a rejected one (so that the tokens follow p).
    """
    if not callable(impl):
        report.fail(f"expected your function {SPECULATIVE_ITEM}, got {type(impl).__name__}.")
    gen = generator(seed, salt=177)

    def cells_of(fn: Any, p: Tensor, q: Tensor, draft: Tensor, salt: int = 1000) -> Tensor:
        rows = (p.expand(len(draft), -1).clone(), q.expand(len(draft), -1).clone())  # (N, V)
        with _forbidden(SPECULATIVE_ITEM):
            out = call_student(
                fn, *rows, draft.clone(), generator(seed, salt), item=SPECULATIVE_ITEM
            )
        return _cells(out, draft, p.numel())

    cfgs = configs(SPECULATIVE_ITEM, thorough, seed)
    for index, cfg in enumerate(cfgs):
        _one_pair(report, partial(cells_of, impl), partial(cells_of, salt=2000 + index), gen, cfg)
    report.ok(f"(accepted, token) as often as the rule makes them on {len(cfgs)} (p, q) pairs")
    report.ok("the emitted tokens follow the target's p")


def _one_pair(report: CheckReport, student, mistake, gen: torch.Generator, cfg: Config) -> None:
    """One (p, q) pair: ``student(p, q, draft)`` and ``mistake(bug, p, q, draft)`` return the
    draws' cells; the certain parts first, then the chi-square test."""
    p, q = _pair_of(gen, cfg)
    v, rounded = p.numel(), (x.double().round(decimals=3).tolist() for x in (p, q))
    where = "p = {}, q = {}".format(*rounded)
    draft = torch.multinomial(q, DRAWS, replacement=True, generator=gen)  # (N,)
    expected = torch.cat([torch.minimum(p, q), (p - q).clamp(min=0)]).double()  # (2V,)
    try:
        cells = student(p, q, draft)  # (N,)
    except NotImplementedYet:
        raise
    except CheckFailure as failure:
        below = (p < q).double() * q  # (V,): the drafts whose ratio p/q is below 1
        safe = torch.multinomial(below, 64, replacement=True, generator=gen)
        unclipped = _runs(partial(student, p, q, safe))
        report.fail(
            f"{failure.message}\n(on {where})",
            _BUG["speculative.ratio_not_clipped"] if unclipped else None,
        )
    counts = count_cells(cells, 2 * v)  # (2V,)
    bug_counts = partial(_bug_counts, mistake, p, q, draft)
    name = partial(same_as_mistake, SPECULATIVE_BUGS, bug_counts, counts, expected)
    _exact_rules(report, cells, draft, p, q, where, name)
    fit = chi_square_fit(counts, expected)
    if fit.p_value < ALPHA:
        labels = [f"{'accepted' if i < v else 'resampled'} token {i % v}" for i in range(2 * v)]
        what = f"the (accepted, token) pairs of your speculative_accept ({where})"
        report.fail(misfit_message(what, counts, expected, fit, labels, ALPHA), name())


def _bug_counts(mistake, p: Tensor, q: Tensor, draft: Tensor, bug: Any) -> Tensor:
    return count_cells(mistake(bug, p, q, draft), 2 * p.numel())  # (2V,)


def _runs(fn: Callable[[], Any]) -> bool:
    """Whether ``fn()`` returns without a failure (the evidence of an unclipped ratio: code
    that fails runs when every draft token has p(x) < q(x), where min(1, p/q) = p/q)."""
    try:
        fn()
    except CheckFailure:
        return False
    return True
