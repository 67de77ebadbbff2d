"""Tests of the scaling study's fit (``chapters/scaling.py``): Chinchilla's approach 3 recovers
known parameters from points drawn from the law, with and without noise, and the law's
compute-optimal size is the minimum along its iso-compute line. The grid itself is trained by
``benchmarks/scaling_study.py``, not here."""

from __future__ import annotations

import numpy as np
import pytest

from coursepkg.chapters.scaling import ScalingLaw, fit_scaling_law

TRUE = ScalingLaw(E=1.7, A=400.0, alpha=0.34, B=410.0, beta=0.28)


def _grid():
    n = np.array([1e4, 3e4, 1e5, 3e5])
    d = np.array([1e5, 3e5, 1e6, 3e6])
    nn, dd = np.meshgrid(n, d)
    return nn.ravel(), dd.ravel()


def test_the_fit_recovers_the_law_it_was_drawn_from():
    n, d = _grid()
    law = fit_scaling_law(n, d, TRUE.predict(n, d))
    assert law.E == pytest.approx(TRUE.E, rel=0.02)
    assert law.alpha == pytest.approx(TRUE.alpha, abs=0.02)
    assert law.beta == pytest.approx(TRUE.beta, abs=0.02)
    far = (3e6, 3e7)  # ten times beyond the grid: the prediction still holds
    assert law.predict(*far) == pytest.approx(TRUE.predict(*far), rel=0.005)


def test_with_noise_the_prediction_beyond_the_grid_stays_close():
    """0.5% multiplicative noise (about a seed's spread on these runs): the fitted law's
    prediction four times beyond the grid's largest compute is within 2% of the truth."""
    rng = np.random.default_rng(0)
    n, d = _grid()
    loss = TRUE.predict(n, d) * np.exp(rng.normal(0, 0.005, n.shape))
    law = fit_scaling_law(n, d, loss)
    budget = 4 * float((6 * n * d).max())
    n_opt, d_opt = TRUE.optimal(budget)
    assert law.predict(n_opt, d_opt) == pytest.approx(TRUE.predict(n_opt, d_opt), rel=0.02)


def test_the_optimum_is_the_minimum_on_its_iso_compute_line():
    budget = 1e13
    n_opt, d_opt = TRUE.optimal(budget)
    assert 6 * n_opt * d_opt == pytest.approx(budget)
    sizes = n_opt * np.geomspace(0.1, 10, 401)
    losses = TRUE.predict(sizes, budget / (6 * sizes))
    assert sizes[np.argmin(losses)] == pytest.approx(n_opt, rel=0.02)


def test_bad_points_are_refused():
    with pytest.raises(ValueError, match="R >= 5"):
        fit_scaling_law(np.ones(3), np.ones(3), np.ones(3))
    n, d = _grid()
    with pytest.raises(ValueError, match="positive"):
        fit_scaling_law(n, d, -np.ones_like(n))
