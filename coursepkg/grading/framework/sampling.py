"""Checking code that samples: next-token scores compared as the distributions they define
(:func:`distribution`, :func:`compare_filter`), and a random rule's draws compared with a
distribution by Pearson's chi-square tests (:func:`chi_square_fit`: does a sample follow the
expected probabilities? :func:`chi_square_same`: do two samples come from one distribution?).

The chi-square statistics follow their law for large counts, so cells whose expected count is
under :data:`MIN_EXPECTED` are pooled into one before a test. The p-value is the chi-square
survival function, the regularised upper incomplete gamma function
(``torch.special.gammaincc``), computed in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from .calling import expect_tensor
from .compare import diagnose, expect_close
from .results import BugVariant, CheckFailure, CheckReport, NotImplementedYet

__all__ = [
    "MIN_EXPECTED",
    "SAME_RULE",
    "ChiSquare",
    "chi_square_fit",
    "chi_square_same",
    "compare_filter",
    "count_cells",
    "distribution",
    "misfit_message",
    "same_as_mistake",
]

#: Cells expected to hold fewer counts than this are pooled, which keeps the chi-square
#: approximation of the statistic's law accurate in its tail (Cochran's rule asks for 5).
MIN_EXPECTED = 20.0


@dataclass(frozen=True)
class ChiSquare:
    """One test's outcome.

    Attributes:
        statistic: Pearson's X^2.
        dof: its degrees of freedom (cells after pooling, less one).
        p_value: the probability of a statistic at least this large when the null holds.
    """

    statistic: float
    dof: int
    p_value: float


def count_cells(cells: Tensor, n_cells: int) -> Tensor:
    """How many samples fell in each cell.

    Args:
        cells: each sample's cell index, integers in [0, n_cells).
        n_cells: the number of cells C.

    Shape:
        cells (N,) -> (C,) float64.
    """
    return torch.bincount(cells.reshape(-1).long(), minlength=n_cells).double()


def _pooled(counts: Tensor, expected: Tensor) -> tuple[Tensor, Tensor]:
    """The cells whose expected count reaches MIN_EXPECTED, and one cell pooling the rest."""
    small = expected < MIN_EXPECTED  # (C,)
    if not bool(small.any()):
        return counts, expected
    counts = torch.cat([counts[~small], counts[small].sum()[None]])  # (C' + 1,)
    expected = torch.cat([expected[~small], expected[small].sum()[None]])  # (C' + 1,)
    return counts, expected


def _result(statistic: Tensor, dof: int) -> ChiSquare:
    if dof < 1:
        return ChiSquare(float(statistic), 0, 1.0)
    p_value = torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), statistic / 2)
    return ChiSquare(float(statistic), dof, float(p_value))


def chi_square_fit(counts: Tensor, probs: Tensor) -> ChiSquare:
    """Pearson's goodness-of-fit test of ``counts`` against ``probs``.

    Cells of probability 0 are left out (a count there is no chance event: the caller tells
    it apart first); cells expected to hold under :data:`MIN_EXPECTED` counts are pooled.

    Args:
        counts: observed counts per cell.
        probs: the cells' probabilities under the null (summing to 1).

    Shape:
        counts (C,), probs (C,) -> a :class:`ChiSquare`.
    """
    counts, probs = counts.double(), probs.double()
    possible = probs > 0  # (C,)
    expected = probs[possible] * counts.sum()  # (C',)
    observed, expected = _pooled(counts[possible], expected)
    statistic = ((observed - expected) ** 2 / expected).sum()
    return _result(statistic, observed.numel() - 1)


def chi_square_same(first: Tensor, second: Tensor) -> ChiSquare:
    """Pearson's test that two samples' counts come from one distribution (homogeneity).

    Args:
        first: counts per cell of one sample.
        second: counts per cell of the other, over the same cells.

    Shape:
        first (C,), second (C,) -> a :class:`ChiSquare`.
    """
    first, second = first.double(), second.double()
    total = first + second  # (C,)
    seen = total > 0
    n_first, n_second = first.sum(), second.sum()
    share = total[seen] / (n_first + n_second)  # (C',)
    exp_first, exp_second = share * n_first, share * n_second
    small = torch.minimum(exp_first, exp_second) < MIN_EXPECTED
    obs = torch.stack([first[seen], second[seen]])  # (2, C')
    exp = torch.stack([exp_first, exp_second])  # (2, C')
    if bool(small.any()):
        obs = torch.cat([obs[:, ~small], obs[:, small].sum(-1, keepdim=True)], dim=1)
        exp = torch.cat([exp[:, ~small], exp[:, small].sum(-1, keepdim=True)], dim=1)
    statistic = ((obs - exp) ** 2 / exp.clamp(min=1e-300)).sum()
    return _result(statistic, obs.size(1) - 1)


# ---------------------------------------------------------------------------------------------
# Scores compared as distributions
# ---------------------------------------------------------------------------------------------


def distribution(scores: Tensor) -> Tensor:
    """The log-probabilities ``scores`` define, float64, -inf where a token's probability is
    exactly 0 (a score of -inf, or one so low that the softmax gives 0).

    Shape:
        scores (B, V) -> (B, V).
    """
    logp = scores.detach().double().log_softmax(dim=-1)  # (B, V)
    return logp.masked_fill(logp.exp() == 0, float("-inf"))


def _kept_text(kept: Tensor) -> str:
    return str(kept.nonzero().squeeze(-1).tolist())


Evidence = Callable[[Sequence[Any], CheckFailure | None, Tensor | None, Tensor | None], Any]


def compare_filter(
    report: CheckReport,
    run: Callable[..., Any],
    item: str,
    bugs: Sequence[BugVariant],
    cases: Sequence[tuple[str, tuple[Any, ...]]],
    reference: Callable[..., Tensor],
    evidence: Evidence | None = None,
) -> None:
    """Compare a student's scores with ``reference``'s on each ``(where, inputs)`` case, as the
    distributions they define: the tokens removed first (row by row), then the kept tokens'
    log-probabilities (so a score shifted by a constant per row, or -1e9 for -inf, is as good).

    Args:
        report: the running check's report.
        run: ``run(*inputs)`` calls the student's function (guarded).
        item: what the student implements.
        bugs: the item's catalogue, rerun on the same inputs to name a mismatch.
        cases: a description and the inputs of each comparison; ``inputs[0]`` the (B, V) scores.
        reference: the course's function.
        evidence: ``evidence(inputs, failure, got_kept, want_kept)`` names a mistake the
            outputs alone cannot: called with the failure when the student's code fails on
            ``inputs``, with the two (B, V) kept masks when they differ and no rerun matched.
    """
    for where, inputs in cases:
        expected = distribution(reference(*inputs))
        try:
            out = expect_tensor(run(*inputs), f"your scores ({where})", tuple(inputs[0].shape))
        except NotImplementedYet:
            raise
        except CheckFailure as failure:
            report.fail(
                failure.message, evidence(inputs, failure, None, None) if evidence else None
            )
        if bool(torch.isnan(out).any()):
            row = int(torch.isnan(out).any(dim=-1).nonzero()[0])
            report.fail(
                f"your scores ({where}) contain NaN in row {row}: give a removed token -inf "
                "(or a large negative number), never NaN, and keep every other score finite."
            )
        got = distribution(out)
        diagnosis = partial(
            diagnose,
            lambda *args: distribution(run(*args)),
            bugs,
            inputs,
            run=lambda bug, args: distribution(bug(*args)),
            reference_output=expected,
        )
        got_kept, want_kept = got > float("-inf"), expected > float("-inf")
        if not torch.equal(got_kept, want_kept):
            row = int((got_kept != want_kept).any(dim=-1).nonzero()[0])
            bug = diagnosis()
            if bug is None and evidence is not None:
                bug = evidence(inputs, None, got_kept, want_kept)
            report.fail(
                f"your {item} ({where}) keeps other tokens than the reference: in row {row} "
                f"yours keeps {_kept_text(got_kept[row])}, the reference "
                f"{_kept_text(want_kept[row])} (a kept token has a probability above 0 after "
                "the softmax; give a removed one -inf).",
                bug,
            )
        expect_close(
            report,
            got.masked_fill(~got_kept, 0.0),
            expected.masked_fill(~want_kept, 0.0),
            f"the log-probabilities your scores give ({where})",
            rtol=1e-4,
            atol=5e-5,
            diagnosis=diagnosis,
        )


# ---------------------------------------------------------------------------------------------
# Random rules: what a failed fit says, and which known mistake's draws look alike
# ---------------------------------------------------------------------------------------------

#: Two samples whose homogeneity test gives a p-value above this are taken as one rule's.
SAME_RULE = 1e-3


def misfit_message(
    what: str, counts: Tensor, probs: Tensor, fit: ChiSquare, labels: Sequence[str], alpha: float
) -> str:
    """Why ``counts`` cannot come from ``probs``: the statistic, and the three cells furthest
    from their expected counts, in standard deviations.

    Args:
        what: the draws, as the student knows them.
        counts: observed counts per cell.
        probs: the cells' probabilities under the rule.
        fit: :func:`chi_square_fit`'s outcome.
        labels: each cell's name.
        alpha: the test's level (the probability that a correct rule fails it).
    """
    n = counts.sum()
    expected = probs.double() * n  # (C,)
    spread = (expected * (1 - probs.double())).sqrt().clamp(min=1e-12)  # (C,)
    worst = ((counts - expected).abs() / spread).argsort(descending=True)[:3]
    cells = "; ".join(
        f"{labels[i]}: {int(counts[i])} times, expected {float(expected[i]):.0f} "
        f"+- {float(spread[i]):.0f}"
        for i in worst.tolist()
    )
    return (
        f"{what} do not come as often as the rule makes them (chi-square {fit.statistic:.1f} "
        f"on {fit.dof} degrees of freedom, p-value {fit.p_value:.2g}; a correct rule fails "
        f"this test with probability {alpha:.0e}). Furthest off: {cells}."
    )


def same_as_mistake(
    bugs: Sequence[BugVariant],
    counts_of: Callable[[Any], Tensor],
    counts: Tensor,
    probs: Tensor,
) -> BugVariant | None:
    """The known mistake whose draws look like the student's: each bug's ``impl`` is run
    (``counts_of(impl)``, its counts per cell on the same inputs with a generator of its own);
    a bug whose counts fit ``probs`` is skipped (it cannot be told apart here), and of those
    whose counts are homogeneous with the student's (p-value above :data:`SAME_RULE`), the
    most alike is returned. A bug that fails on these inputs is skipped.

    Shape:
        counts (C,), probs (C,).
    """
    best, best_p = None, SAME_RULE
    for bug in bugs:
        try:
            theirs = counts_of(bug.impl)
        except Exception:  # noqa: BLE001 - a variant that cannot run these inputs is skipped
            continue
        if bool((theirs[probs == 0] > 0).any()) is False and (
            chi_square_fit(theirs, probs).p_value > SAME_RULE
        ):
            continue
        alike = chi_square_same(counts, theirs).p_value
        if alike > best_p:
            best, best_p = bug, alike
    return best
