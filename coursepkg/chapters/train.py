"""A small training loop with a progress bar, shared by the book's chapters.

:func:`fit` runs a fixed number of optimisation steps over an iterator of batches, with optional
learning-rate schedule, gradient clipping and periodic evaluation, and returns a :class:`History`
of what happened (for the loss/accuracy curves the chapters plot). It is deliberately plain: the
chapters teach what happens inside a step, this only removes the bookkeeping.
"""

from __future__ import annotations

import io
import itertools
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

__all__ = ["History", "fit", "fit_warmup_decay", "seed_everything"]

log = logging.getLogger(__name__)


#: Characters that fit one line of a code cell's output in the book's text column.
NOTEBOOK_COLUMNS = 74


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (a live notebook, or a page executed when the book is built)."""
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None)
    return get is not None and getattr(get(), "kernel", None) is not None


def _progress_bar(total: int, desc: str, disable: bool):
    """A tqdm bar; in a notebook, one output that each redraw replaces.

    In a terminal the bar redraws in place with carriage returns. A notebook keeps each write to
    stdout as an output of its own, so a page executed for the book would show every redraw on a
    line of its own (and tqdm.auto's widget shows nothing without a live kernel). There the bar
    is a text display that each redraw updates, which leaves exactly its final line in the saved
    notebook, no wider than the text column.
    """
    from tqdm import tqdm

    if disable or not _in_notebook():
        return tqdm(total=total, desc=desc, disable=disable, file=sys.stdout)
    from IPython.display import display

    class DisplayBar(tqdm):
        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            text = {"text/plain": self.__str__() if msg is None else msg}
            if getattr(self, "_handle", None) is None:
                self._handle = display(text, raw=True, display_id=True)
            else:
                self._handle.update(text, raw=True)
            return True

    return DisplayBar(
        total=total,
        desc=desc,
        file=io.StringIO(),  # tqdm's own writes (the newline at close) go nowhere
        ascii=False,
        ncols=NOTEBOOK_COLUMNS,  # the bar shrinks so that the line fits
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
    )


def seed_everything(seed: int) -> torch.Generator:
    """Seed torch's global RNG and return a CPU generator seeded the same way (for data)."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


@dataclass
class History:
    """What :func:`fit` measured.

    Attributes:
        step: optimisation step (from 1) of each entry in ``loss`` and ``lr``.
        loss: training loss at each step.
        lr: learning rate used at each step (of the first parameter group).
        eval_step: steps at which ``eval_fn`` ran.
        metrics: metric name -> values, one per entry of ``eval_step``.
        seconds: wall-clock time of the whole run.
    """

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0

    def smoothed_loss(self, window: int = 20) -> list[float]:
        """Running mean of the training loss over the last ``window`` steps."""
        out, total = [], 0.0
        for i, value in enumerate(self.loss):
            total += value
            if i >= window:
                total -= self.loss[i - window]
            out.append(total / min(i + 1, window))
        return out


def fit(
    model: nn.Module,
    batches: Iterable,
    loss_fn: Callable[[nn.Module, object], Tensor],
    steps: int,
    optimizer: torch.optim.Optimizer | None = None,
    lr: float = 1e-3,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    clip_norm: float | None = 1.0,
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
    eval_every: int = 100,
    progress: bool = True,
    desc: str = "training",
) -> History:
    """Train ``model`` for ``steps`` optimisation steps.

    Args:
        model: the module to train (put in train mode for the steps, eval mode for ``eval_fn``).
        batches: any iterable of batches; it is cycled if it runs out before ``steps``.
        loss_fn: ``loss_fn(model, batch) -> scalar loss``.
        steps: number of optimisation steps.
        optimizer: default Adam(lr) over the model's parameters.
        lr: learning rate of the default optimizer.
        scheduler: stepped once after every optimisation step.
        clip_norm: clip the gradients' global norm to this (None: no clipping).
        eval_fn: ``eval_fn(model) -> {metric: value}``, run every ``eval_every`` steps and at
            the end under ``torch.no_grad()``.
        eval_every: steps between evaluations.
        progress: show a tqdm progress bar with the running loss.
        desc: the progress bar's label.

    Returns:
        The :class:`History` of the run.

    Raises:
        ValueError: for a non-positive ``steps`` or ``eval_every``.
        FloatingPointError: when the loss becomes NaN or infinite (with the step it happened at).
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not isinstance(eval_every, int) or eval_every < 1:
        raise ValueError(f"eval_every must be a positive int, got {eval_every!r}")
    if optimizer is None:
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    history = History()
    start = time.perf_counter()
    source = itertools.cycle(batches) if not hasattr(batches, "__next__") else batches
    bar = _progress_bar(steps, desc, disable=not progress)
    running = None
    try:
        for step in range(1, steps + 1):
            batch = _next_batch(source, step, steps)
            value = _backward(model, loss_fn, batch, optimizer, clip_norm, step)
            history.lr.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            history.step.append(step)
            history.loss.append(value)
            running = value if running is None else 0.95 * running + 0.05 * value
            if eval_fn is not None and (step % eval_every == 0 or step == steps):
                results = _evaluate(model, eval_fn, step, history)
                # refresh=False: redraw at the bar's own pace (mininterval), not at every
                # postfix change.
                # the loss first: a line too long for the column loses its end
                shown = {"loss": f"{running:.3f}", **{k: f"{v:.3f}" for k, v in results.items()}}
                bar.set_postfix(shown, refresh=False)
            elif step % 10 == 0:
                bar.set_postfix(refresh=False, loss=f"{running:.3f}")
            bar.update(1)
    finally:
        bar.close()
        model.eval()
        history.seconds = time.perf_counter() - start
    return history


def fit_warmup_decay(
    model: nn.Module,
    batches: Iterable,
    loss_fn: Callable[[nn.Module, object], Tensor],
    heldout_loss: Callable[[nn.Module, object], Tensor],
    heldout: list,
    *,
    steps: int,
    lr: float,
    warmup: int,
    eval_every: int,
    progress: bool = False,
    desc: str = "training",
) -> History:
    """:func:`fit` with the chapters' small-run recipe: Adam at ``lr``, a linear warm-up over
    ``warmup`` steps, then a linear decay to 10% of ``lr`` at the last step.

    Args:
        model, batches, loss_fn, steps, eval_every, progress, desc: as :func:`fit`'s.
        heldout_loss: ``heldout_loss(model, batch) -> scalar``, the loss the held-out score is.
        heldout: the fixed held-out batches; ``"held-out"`` in the history is their mean loss.
        lr: the peak learning rate.
        warmup: warm-up steps (>= 1).

    Returns:
        The :class:`History` of the run.
    """

    def schedule(step: int) -> float:  # linear warm-up, then linear decay to 10%
        return min(1.0, (step + 1) / warmup) * max(0.1, 1 - step / steps)

    def evaluate(m: nn.Module) -> dict[str, float]:
        return {"held-out": sum(heldout_loss(m, b).item() for b in heldout) / len(heldout)}

    # foreach: one call per operation for all parameters, not one per parameter (the same
    # numbers; on a model this small the calls are much of a step's cost)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    return fit(
        model,
        batches,
        loss_fn,
        steps,
        optimizer=optimizer,
        scheduler=scheduler,
        eval_fn=evaluate,
        eval_every=eval_every,
        progress=progress,
        desc=desc,
    )


def _next_batch(source: Iterator, step: int, steps: int) -> object:
    """The batch of ``step``; a clear error when a finite iterator runs out early."""
    try:
        return next(source)
    except StopIteration as exc:
        raise ValueError(f"batches ran out after {step - 1} of {steps} steps") from exc


def _backward(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, object], Tensor],
    batch: object,
    optimizer: torch.optim.Optimizer,
    clip_norm: float | None,
    step: int,
) -> float:
    """The loss of ``batch`` in train mode and its gradients, clipped to a global norm of
    ``clip_norm``; returns the loss (the optimiser's step is the caller's)."""
    model.train()
    loss = loss_fn(model, batch)
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(f"loss became {value} at step {step}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    return value


def _evaluate(
    model: nn.Module,
    eval_fn: Callable[[nn.Module], dict[str, float]],
    step: int,
    history: History,
) -> dict[str, float]:
    """Run ``eval_fn`` in eval mode without gradients and record its metrics at ``step``."""
    model.eval()
    with torch.no_grad():
        results = eval_fn(model)
    history.eval_step.append(step)
    for name, metric in results.items():
        history.metrics.setdefault(name, []).append(float(metric))
    log.info("step %d: %s", step, results)
    return results
