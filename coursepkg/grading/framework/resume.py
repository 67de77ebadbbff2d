"""The interrupted run ``check_training_state`` (ex13) compares with an uninterrupted one: a
small model with dropout, trained with the course's AdamW, the warm-up + cosine schedule and
clipping on batches drawn from a generator, stopped, captured, written with ``torch.save`` and
read back, restored into a new model, optimizer and generator (torch's global RNG moved), and
trained to the end.
"""

from __future__ import annotations

import io
import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import optim as reference
from .inputs import generator, randn
from .results import CheckFailure

__all__ = ["resume_run", "run_uninterrupted"]

Config = dict[str, Any]


def _roundtrip(state: Any) -> Any:
    """``state`` written with ``torch.save`` and read back (a copy, as from a file)."""
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
    except Exception as exc:  # noqa: BLE001 - reported to the student
        raise CheckFailure(
            f"torch.save cannot write what your capture returned ({type(exc).__name__}: {exc}); "
            "return a dict of tensors, numbers, lists and dicts (no functions, no open files)."
        ) from None
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _setup(cfg: Config, seed: int, offset: int) -> tuple[nn.Module, Any, torch.Generator]:
    """Model, optimizer and batch generator, seeded from ``seed + offset``; torch's global RNG
    left at a state of the same seed (the resumed run's ``offset`` moves all of them)."""
    base = 7 * seed + offset
    torch.manual_seed(base)
    # dropout draws from torch's global RNG; the LayerNorm makes an undecayed group
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Dropout(cfg["p"]), nn.Linear(8, 3))
    optimizer = reference.AdamW(reference.param_groups(model, 0.1), lr=1e-2)
    batches = torch.Generator().manual_seed(base + 1)
    torch.manual_seed(base + 2)  # the dropout masks
    return model, optimizer, batches


def _train(run: tuple, data: tuple[Tensor, Tensor], start: int, stop: int, cfg: Config) -> None:
    """Updates ``start`` to ``stop - 1``: rows drawn from ``batches``, the schedule's rate,
    clipping to 1, an AdamW step."""
    model, optimizer, batches = run
    x, y = data
    for step in range(start, stop):
        lr = reference.warmup_cosine_lr(step, 1e-2, 2, cfg["steps"] - 1, 1e-3)
        for group in optimizer.param_groups:
            group["lr"] = lr
        rows = torch.randint(len(x), (8,), generator=batches)  # (8,)
        with torch.enable_grad():  # diagnose reruns the variants under no_grad
            loss = F.mse_loss(model(x[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
        reference.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()


def _data(seed: int) -> tuple[Tensor, Tensor]:
    gen = generator(seed, salt=137)
    return randn(gen, 48, 6), randn(gen, 48, 3)  # (48, 6), (48, 3)


def run_uninterrupted(cfg: Config, seed: int) -> Tensor:
    """The weights after ``cfg["steps"]`` updates in one go."""
    run = _setup(cfg, seed, 0)
    _train(run, _data(seed), 0, cfg["steps"], cfg)
    return nn.utils.parameters_to_vector(run[0].parameters()).detach()  # (P,)


def resume_run(capture: Callable, restore: Callable, cfg: Config, seed: int) -> Tensor:
    """The weights after ``cfg["stop"]`` updates, a capture, a round trip through
    ``torch.save``, a restore into a new run and the updates from the step restore returns."""
    data = _data(seed)
    first = _setup(cfg, seed, 0)
    _train(first, data, 0, cfg["stop"], cfg)
    state = _roundtrip(capture(first[0], first[1], cfg["stop"], first[2]))
    second = _setup(cfg, seed, 100)
    step = restore(state, *second)
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise CheckFailure(
            f"restore should return the step to continue from (an int), got {type(step).__name__}."
        )
    _train(second, data, int(step), cfg["steps"], cfg)
    return nn.utils.parameters_to_vector(second[0].parameters()).detach()  # (P,)
