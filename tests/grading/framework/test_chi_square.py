"""The framework's tests for random rules (``framework/sampling.py``): Pearson's goodness of fit
and homogeneity equal SciPy's where no cell is pooled, pooling keeps small cells out, and a
known mistake is named only when its draws look like the student's."""

from __future__ import annotations

import pytest
import torch

from coursepkg.grading.framework import (
    BugVariant,
    chi_square_fit,
    chi_square_same,
    count_cells,
    distribution,
    same_as_mistake,
)

stats = pytest.importorskip("scipy.stats")


def test_goodness_of_fit_equals_scipy():
    counts = torch.tensor([120.0, 90.0, 310.0, 480.0], dtype=torch.float64)
    probs = torch.tensor([0.1, 0.1, 0.3, 0.5], dtype=torch.float64)
    ours = chi_square_fit(counts, probs)
    theirs = stats.chisquare(counts.numpy(), (probs * counts.sum()).numpy())
    assert ours.dof == 3
    assert ours.statistic == pytest.approx(theirs.statistic)
    assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-9)


def test_homogeneity_equals_scipy():
    first = torch.tensor([50.0, 80.0, 70.0], dtype=torch.float64)
    second = torch.tensor([60.0, 65.0, 90.0], dtype=torch.float64)
    ours = chi_square_same(first, second)
    table = torch.stack([first, second]).numpy()
    statistic, p_value, dof, _ = stats.chi2_contingency(table, correction=False)
    assert (ours.statistic, ours.dof) == (pytest.approx(statistic), dof)
    assert ours.p_value == pytest.approx(p_value, rel=1e-9)


def test_small_cells_are_pooled_and_impossible_ones_left_out():
    counts = torch.tensor([500.0, 490.0, 6.0, 4.0, 0.0])
    probs = torch.tensor([0.5, 0.49, 0.005, 0.005, 0.0])
    fit = chi_square_fit(counts, probs)
    assert fit.dof == 2  # two large cells and the pooled pair; the impossible cell is out
    assert fit.p_value > 0.5
    assert count_cells(torch.tensor([0, 2, 2]), 4).tolist() == [1.0, 0.0, 2.0, 0.0]


def test_a_mistake_is_named_only_when_its_draws_look_alike():
    gen = torch.Generator().manual_seed(0)
    right, wrong = torch.tensor([0.5, 0.5]), torch.tensor([0.8, 0.2])

    def draws(probs):
        return count_cells(torch.multinomial(probs, 4000, replacement=True, generator=gen), 2)

    bugs = [BugVariant("x.right", "x", "", "", right), BugVariant("x.wrong", "x", "", "", wrong)]
    assert same_as_mistake(bugs, draws, draws(wrong), right).id == "x.wrong"
    assert same_as_mistake(bugs, draws, draws(torch.tensor([0.2, 0.8])), right) is None


def test_scores_define_the_same_distribution_whatever_removes_a_token():
    scores = torch.tensor([[1.0, float("-inf"), 0.0]])
    assert torch.equal(distribution(scores), distribution(torch.tensor([[3.0, -1e9, 2.0]])))
