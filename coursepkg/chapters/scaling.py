"""A toy scaling study on this CPU: a grid of small byte-level GPTs trained on Tiny Shakespeare,
a fit of held-out loss against parameters N and training tokens D, the compute-optimal size the
fit predicts for a larger budget, and that run made to measure the prediction's error.

The fit is Chinchilla's approach 3 (Hoffmann et al. 2022, section 3.3 and appendix D.2): the
parametric loss L(N, D) = E + A / N^alpha + B / D^beta, fitted by minimising the Huber loss
(delta = 1e-3) between log L and the log of the prediction with L-BFGS from a grid of starting
points. Under the budget C = 6 N D its minimum over N is at N_opt = G (C / 6)^(beta / (alpha +
beta)) with G = (alpha A / (beta B))^(1 / (alpha + beta)), and D_opt = C / (6 N_opt).

Dimension legend: B windows, L bytes per window, V = 256 byte values.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits
from torch import Tensor

from coursepkg.chapters.run_cache import cache_file, check_cache_mode, reuse_run, save_run
from coursepkg.chapters.token_lm import bits_per_byte, fit_on_windows
from coursepkg.chapters.train import seed_everything
from coursepkg.config import TransformerConfig
from coursepkg.data.text import tinyshakespeare_bytes
from coursepkg.decoder_only import DecoderOnlyLM

__all__ = [
    "ScalingLaw",
    "ScalingStudy",
    "count_params",
    "fit_scaling_law",
    "grid_run",
    "scaling_study",
]

#: The Huber loss's delta on log losses (Hoffmann et al. 2022, appendix D.2).
HUBER_DELTA = 1e-3


@dataclass(frozen=True)
class ScalingLaw:
    """L(N, D) = E + A / N^alpha + B / D^beta (Chinchilla's parametric loss).

    Attributes:
        E: the irreducible loss (the text's entropy as this model family sees it).
        A, alpha: the term a finite model adds.
        B, beta: the term finite data adds.
    """

    E: float
    A: float
    alpha: float
    B: float
    beta: float

    def predict(self, n: float | np.ndarray, d: float | np.ndarray) -> float | np.ndarray:
        """The predicted loss of a model of ``n`` parameters trained on ``d`` tokens."""
        return self.E + self.A / np.power(n, self.alpha) + self.B / np.power(d, self.beta)

    def optimal(self, compute: float) -> tuple[float, float]:
        """The (N, D) that minimise the predicted loss under the budget ``compute`` = 6 N D."""
        a, b = self.alpha, self.beta
        g = (a * self.A / (b * self.B)) ** (1 / (a + b))
        n = g * (compute / 6) ** (b / (a + b))
        return n, compute / (6 * n)


def _huber(residual: np.ndarray, delta: float) -> np.ndarray:
    small = np.abs(residual) <= delta
    return np.where(small, 0.5 * residual**2, delta * (np.abs(residual) - 0.5 * delta))


def fit_scaling_law(
    n: np.ndarray, d: np.ndarray, loss: np.ndarray, *, delta: float = HUBER_DELTA
) -> ScalingLaw:
    """Fit L(N, D) = E + A / N^alpha + B / D^beta to measured losses (Chinchilla's approach 3).

    The parameters are log A, log B, log E, alpha and beta; the objective is the sum of the Huber
    losses of log(exp(log A - alpha log N) + exp(log B - beta log D) + exp(log E)) - log L,
    minimised with L-BFGS from every point of a small grid of starts, keeping the best.

    Args:
        n: parameters of each run.
        d: training tokens of each run.
        loss: each run's held-out loss (any unit, > 0).
        delta: the Huber loss's delta.

    Shape:
        n, d, loss: (R,) with R >= 5 runs.

    Returns:
        The fitted :class:`ScalingLaw`.
    """
    n, d, loss = (np.asarray(x, dtype=np.float64) for x in (n, d, loss))
    if not n.shape == d.shape == loss.shape or n.ndim != 1 or len(n) < 5:
        raise ValueError(f"need n, d and loss of one shape (R,), R >= 5; got {n.shape, d.shape}")
    if (loss <= 0).any() or (n <= 0).any() or (d <= 0).any():
        raise ValueError("n, d and loss must be positive")
    log_n, log_d, log_loss = np.log(n), np.log(d), np.log(loss)

    def objective(p: np.ndarray) -> tuple[float, np.ndarray]:
        log_a, log_b, log_e, alpha, beta = p
        terms = np.stack([log_a - alpha * log_n, log_b - beta * log_d, np.full_like(log_n, log_e)])
        predicted = np.logaddexp.reduce(terms, axis=0)  # (R,)
        residual = predicted - log_loss  # (R,)
        weights = np.exp(terms - predicted)  # (3, R): each term's share of the prediction
        slope = np.clip(residual, -delta, delta)  # the Huber loss's derivative
        # (sums of products, not BLAS dot products: on 16 numbers a BLAS call's threads cost
        # more than the arithmetic)
        grad = (slope * np.stack([weights[0], weights[1], weights[2]])).sum(axis=1)  # (3,)
        slopes = [-(slope * weights[0] * log_n).sum(), -(slope * weights[1] * log_d).sum()]
        grad = np.concatenate([grad, slopes])  # (5,): log A, log B, log E, alpha, beta
        return float(_huber(residual, delta).sum()), grad

    best = None
    starts = itertools.product(
        (0.0, 10.0),
        (0.0, 10.0),
        (np.log(loss.min()) - 0.5,),
        (0.2, 0.6),
        (0.2, 0.6),
    )
    # One BLAS thread: L-BFGS-B makes thousands of BLAS calls on vectors of 5 numbers, between
    # which OpenBLAS's other threads spin; on 2 busy cores they cost 7x the fit's CPU time.
    with threadpool_limits(limits=1, user_api="blas"):
        for start in starts:
            result = minimize(objective, np.array(start), jac=True, method="L-BFGS-B")
            if best is None or result.fun < best.fun:
                best = result
    log_a, log_b, log_e, alpha, beta = best.x
    e, a, b = (float(np.exp(x)) for x in (log_e, log_a, log_b))
    return ScalingLaw(e, a, float(alpha), b, float(beta))


@dataclass
class ScalingStudy:
    """A grid of runs, the law fitted to them, and the run made at the law's optimum.

    Attributes:
        runs: one dict per grid run (``d_model``, ``steps``, ``params``, ``tokens``, ``bpb``).
        law: the fitted :class:`ScalingLaw`, as a dict.
        budget: the larger budget C (6 N D) the law is asked about.
        optimal: the law's (N, D) for ``budget``.
        check: the run made there (``d_model``, ``steps``, ``params``, ``tokens``, ``bpb``),
            its ``predicted`` bits per byte and the ``error`` (measured - predicted).
        settings: what every run shares.
    """

    runs: list[dict[str, float]]
    law: dict[str, float]
    budget: float
    optimal: tuple[float, float]
    check: dict[str, float]
    settings: dict[str, Any] = field(default_factory=dict)


def _config(d_model: int, settings: dict[str, Any]) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=256,
        d_model=d_model,
        n_heads=4,
        d_ff=4 * d_model,
        n_layers=settings["n_layers"],
        dropout=0.0,
        max_len=settings["block_size"],
        norm_first=True,
        positional="learned",
        activation="gelu",
    )


def count_params(d_model: int, settings: dict[str, Any]) -> int:
    """The parameter count N of the study's model of width ``d_model`` (embeddings included)."""
    return sum(p.numel() for p in DecoderOnlyLM(_config(d_model, settings)).parameters())


def _train(train: Tensor, heldout: Tensor, d_model: int, steps: int, settings: dict) -> dict:
    """One run: AdamW with a cosine decay over its own length; held-out bits per byte."""
    generator = seed_everything(settings["seed"])
    model = DecoderOnlyLM(_config(d_model, settings))
    block, batch = settings["block_size"], settings["batch_size"]
    fit_on_windows(
        model,
        train,
        block=block,
        batch=batch,
        steps=steps,
        lr=settings["lr"],
        generator=generator,
        min_lr=settings["lr"] / 10,
    )
    model.eval()
    bpb = bits_per_byte(model, heldout, torch.ones(256, dtype=torch.long), block)[0]
    params = sum(p.numel() for p in model.parameters())
    return dict(d_model=d_model, steps=steps, params=params, tokens=steps * batch * block, bpb=bpb)


def grid_run(d_model: int, steps: int, settings: dict[str, Any]) -> dict[str, float]:
    """One run of the study's grid made again, alone: the width ``d_model`` trained ``steps``
    steps with a study's ``settings`` (:attr:`ScalingStudy.settings`).

    Returns:
        The run's ``d_model``, ``steps``, ``params``, ``tokens`` and held-out ``bpb``, as in
        :attr:`ScalingStudy.runs`.
    """
    train, heldout = tinyshakespeare_bytes(settings["heldout_bytes"])
    return _train(train, heldout, d_model, steps, settings)


def _nearest_width(n_target: float, settings: dict[str, Any]) -> int:
    """The width (a multiple of 8 from 16 to 512) whose model's size is nearest ``n_target``
    on a log scale."""
    widths = range(16, 513, 8)
    return min(widths, key=lambda w: abs(math.log(count_params(w, settings) / n_target)))


def scaling_study(
    *,
    widths: tuple[int, ...] = (32, 48, 64, 96),
    steps: tuple[int, ...] = (150, 300, 600),
    budget_factor: float = 3.0,
    n_layers: int = 2,
    block_size: int = 64,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
    heldout_bytes: int = 16_384,
    cache: str | None = None,
) -> ScalingStudy:
    """Train the grid widths x steps, fit the law, and check its optimum at a larger budget.

    Every run trains one byte-level GPT (``n_layers`` pre-norm layers, 4 heads, d_ff = 4 d) on
    the first 90% of Tiny Shakespeare with AdamW and a cosine decay over its own steps, and is
    scored on ``heldout_bytes`` of the last 10% in bits per byte. The larger budget is
    ``budget_factor`` times the grid's largest 6 N D; the check run is the width nearest the
    law's N_opt, trained for D_opt tokens.

    Args:
        widths: the grid's model widths (d_model, multiples of 4).
        steps: the grid's training lengths.
        budget_factor: the check budget over the grid's largest.
        n_layers, block_size, batch_size, lr, seed: shared by every run.
        heldout_bytes: how much held-out text is scored.
        cache: None, ``"save"`` or ``"reuse"`` (:mod:`coursepkg.chapters.run_cache`).

    Returns:
        A :class:`ScalingStudy`.
    """
    check_cache_mode(cache)
    settings = dict(
        widths=list(widths),
        steps=list(steps),
        budget_factor=budget_factor,
        n_layers=n_layers,
        block_size=block_size,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        heldout_bytes=heldout_bytes,
    )
    path = cache_file(settings, "scaling-study") if cache is not None else None
    saved: dict[str, Any] = {}
    if cache == "reuse" and reuse_run(path, saved.update):
        return ScalingStudy(**saved)
    train, heldout = tinyshakespeare_bytes(heldout_bytes)
    runs = [_train(train, heldout, w, s, settings) for w in widths for s in steps]
    n, d, bpb = (np.array([r[k] for r in runs], dtype=float) for k in ("params", "tokens", "bpb"))
    law = fit_scaling_law(n, d, bpb)
    budget = budget_factor * float((6 * n * d).max())
    n_opt, d_opt = law.optimal(budget)
    width = _nearest_width(n_opt, settings)
    params = count_params(width, settings)
    check_steps = max(1, round(budget / (6 * params) / (batch_size * block_size)))
    check = _train(train, heldout, width, check_steps, settings)
    check["predicted"] = float(law.predict(check["params"], check["tokens"]))
    check["error"] = check["bpb"] - check["predicted"]
    study = ScalingStudy(runs, asdict(law), budget, (n_opt, d_opt), check, settings)
    if path is not None:
        save_run(path, asdict(study), "the scaling study")
    return study
