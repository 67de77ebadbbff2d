"""One run's life, shared by ``coursepkg train`` and ``coursepkg finetune``: open or refuse the
run's checkpoint, restore from it, the step loop (warm-up + cosine learning rate, the progress
bar, SIGTERM, a diverged loss or a lost rank named), checkpoints, and the one place an auxiliary
loss joins the loss.

A trainer builds its model and a :class:`~coursepkg.training.schemes.Scheme` (how the ranks share
the work), puts them in a :class:`Run` and hands :func:`run_steps` its step: a callable that makes
one optimiser step at a learning rate and returns the step's numbers. Everything else a run
needs to stop and continue bit for bit is here, written once:

- the checkpoint holds the weights and the optimizer state (gathered whole on rank 0 when the
  scheme shards them), the data generator's state, every rank's CPU random state and, on CUDA,
  every rank's CUDA random state, the step and the log's rows;
- SIGTERM on one process (a batch system's notice) ends the step in progress, writes a
  checkpoint and exits with status 143; under ``torchrun`` (which sends it to the ranks left
  when one dies, so no collective can complete) it exits at once naming the last checkpoint.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import math
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from coursepkg.optim import warmup_cosine_lr
from coursepkg.training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from coursepkg.training.distributed import Dist
from coursepkg.training.schemes import Scheme

__all__ = [
    "CHECKPOINT",
    "Run",
    "Schedule",
    "autocast",
    "checkpoint",
    "open_checkpoint",
    "restore",
    "run_steps",
    "with_aux",
]

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
#: The exit status after SIGTERM (128 + 15, as a shell reports a process the signal ended).
SIGTERM_STATUS = 128 + signal.SIGTERM


@dataclass
class Run:
    """A run in progress: what a checkpoint saves and a step reads.

    Attributes:
        out: the run's folder (``checkpoint.pt``, ``log.csv``).
        dist: this process' place among the ranks.
        net: the model itself (its weights are what is saved).
        scheme: the wrapped model the step calls and the optimizer.
        batches: the generator that draws the data; the same on every rank.
        identity: the settings a checkpoint must agree with to be resumed.
        fields: the log's columns (a row may lack the trailing ones: left empty).
        step, rows, last_checkpoint: where the run stands.
    """

    out: Path
    dist: Dist
    net: nn.Module
    scheme: Scheme
    batches: torch.Generator
    identity: dict[str, Any]
    fields: tuple[str, ...]
    step: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    last_checkpoint: int = 0
    stopping: bool = False  # SIGTERM came: checkpoint after this step, then exit

    @property
    def model(self) -> nn.Module:
        """What the step calls: ``net``, wrapped in DDP or sharded, and/or compiled."""
        return self.scheme.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The scheme's optimizer (the course's AdamW, or its sharded form)."""
        return self.scheme.optimizer


def open_checkpoint(out: Path, resume: bool) -> dict[str, Any] | None:
    """The checkpoint in ``out`` to resume from, or None for a fresh start.

    Raises:
        CheckpointError: there is one and ``resume`` is False, or it is damaged.
    """
    path = out / CHECKPOINT
    if path.exists() and not resume:
        raise CheckpointError(
            f"{path} exists; pass --resume to continue that run, or choose another --out"
        )
    return load_checkpoint(path) if path.exists() else None


def restore(run: Run, saved: dict[str, Any]) -> None:
    """Put a checkpoint's optimizer state, data position, random states and log in place (its
    weights are already in ``run.net``: they go in before a scheme shards them)."""
    path = run.out / CHECKPOINT
    layout = saved.get("optimizer_layout", "replicated")  # written before the schemes: one
    if layout != run.scheme.layout:
        raise CheckpointError(
            f"{path} holds optimizer state laid out for {layout!r}; this run on "
            f"{run.dist.world_size} rank(s) uses {run.scheme.layout!r} (--parallel "
            f"{run.scheme.settings.parallel}): resume with the scheme that wrote it"
        )
    run.scheme.load_optimizer_state(saved["optimizer"])
    run.batches.set_state(saved["data_rng"])
    run.step = run.last_checkpoint = int(saved["step"])
    # A row written before a column existed (the expert loads, say) leaves it empty.
    padded = [[*row, *[None] * (len(run.fields) - len(row))] for row in saved["rows"]]
    run.rows = [dict(zip(run.fields, row, strict=True)) for row in padded]
    states = saved["rng"]
    if len(states) == run.dist.world_size:
        torch.set_rng_state(states[run.dist.rank])
    else:  # each rank keeps the state its trainer seeded
        log.warning(
            "the checkpoint was written by %d ranks, this run has %d: the data and the weights "
            "continue exactly, the dropout masks and samples do not",
            len(states),
            run.dist.world_size,
        )
    if run.dist.device.type == "cuda" and saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"][run.dist.rank % len(saved["cuda_rng"])])
    log.info("resumed from %s at step %d", path, run.step)


def checkpoint(run: Run) -> None:
    """Write the checkpoint (rank 0) with every rank's random states; then ``log.csv``."""
    rng = run.dist.gather(torch.get_rng_state())
    cuda = run.dist.device.type == "cuda"
    cuda_rng = run.dist.gather(torch.cuda.get_rng_state()) if cuda else None
    # Collectives when the scheme shards: every rank takes part, rank 0 writes.
    model, optimizer = run.scheme.model_state(), run.scheme.optimizer_state()
    if run.dist.is_main:
        payload = {
            "identity": run.identity,
            "model": model,
            "optimizer": optimizer,
            "optimizer_layout": run.scheme.layout,
            "data_rng": run.batches.get_state(),
            "rng": rng,
            "cuda_rng": cuda_rng,
            "step": run.step,
            "rows": [[row.get(k) for k in run.fields] for row in run.rows],
        }
        save_checkpoint(run.out / CHECKPOINT, payload)
        _write_log(run)
        log.info("checkpoint at step %d", run.step)
    run.last_checkpoint = run.step


def _write_log(run: Run) -> None:
    """``log.csv``: one row per step, floats written exactly (``repr``), empty for None."""
    with open(run.out / "log.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(run.fields)
        for row in run.rows:
            writer.writerow("" if row.get(k) is None else repr(row[k]) for k in run.fields)


def autocast(device: torch.device):
    """bf16 autocast on CUDA; nothing on CPU (fp32 there)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def with_aux(loss: Tensor, aux: Tensor | None, coef: float) -> Tensor:
    """The loss a step differentiates: the task's ``loss`` plus ``coef`` times the auxiliary
    loss the model's forward returned (a mixture of experts' load balancing; None when dense).
    The one place where both trainers add it."""
    return loss if aux is None or not coef else loss + coef * aux


@dataclass
class Schedule:
    """Warm-up then cosine decay from ``lr`` to ``min_lr`` over ``steps``."""

    steps: int
    lr: float
    warmup_steps: int
    min_lr: float

    def __call__(self, step: int) -> float:
        return warmup_cosine_lr(step, self.lr, self.warmup_steps, self.steps, self.min_lr)


def run_steps(
    run: Run,
    step: Callable[[float], dict[str, Any]],
    schedule: Schedule,
    stop_after: int = 0,
    checkpoint_every: int = 1,
    desc: str = "train",
    progress: bool = True,
    after: Callable[[dict[str, Any], Any], None] | None = None,
) -> None:
    """Steps from where ``run`` stands to ``schedule.steps`` (or ``stop_after``), each row
    logged, a checkpoint every ``checkpoint_every`` steps and at the end.

    Args:
        run: the run (restored or fresh).
        step: makes one optimiser step at the learning rate it is given; returns the row's
            numbers (``loss`` first; every number is checked finite).
        schedule: the learning rate of each step.
        stop_after: end after that step (0: at ``schedule.steps``).
        checkpoint_every: steps between checkpoints.
        desc, progress: the progress bar's label; show it (rank 0 only).
        after: called with each row (``step`` and ``lr`` in it) and the bar, before the row
            is logged (e.g. to evaluate).
    """
    from tqdm import tqdm

    show = progress and run.dist.is_main
    bar = tqdm(total=schedule.steps, initial=run.step, desc=desc, disable=not show)
    previous = _on_sigterm(run)
    try:
        end = stop_after or schedule.steps
        while run.step < end:
            lr = schedule(run.step)
            numbers = _guarded_step(run, step, lr)
            run.step += 1
            row = {"step": run.step, "lr": lr, **numbers}
            if after is not None:
                after(row, bar)
            run.rows.append(row)
            if run.step % checkpoint_every == 0 or run.step == end or run.stopping:
                checkpoint(run)
            bar.update(1)
            if run.stopping:
                log.error("stopped by SIGTERM at step %d; %s", run.step, _intact(run))
                raise SystemExit(SIGTERM_STATUS)
    finally:
        bar.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _on_sigterm(run: Run):
    """Catch SIGTERM: on one process, finish the step and checkpoint; under ``torchrun`` (a
    rank is gone, no collective can complete) end now, naming the last checkpoint. Returns
    the previous handler (None off the main thread, where no handler can be set)."""

    def stop(signum: int, frame: object) -> None:
        if not run.dist.distributed:
            run.stopping = True
            return
        name, rank = signal.Signals(signum).name, run.dist.rank
        log.error("rank %d stopped by %s at step %d; %s", rank, name, run.step, _intact(run))
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, stop)


def _intact(run: Run) -> str:
    """Where the last checkpoint is, and how to continue from it."""
    return (
        f"the checkpoint of step {run.last_checkpoint} in {run.out} is intact: run again with "
        "--resume (torchrun --max-restarts N does it for you)"
    )


def _guarded_step(run: Run, step: Callable[[float], dict[str, Any]], lr: float) -> dict[str, Any]:
    """``step(lr)``, with a clear message when a number diverges or a rank is lost."""
    try:
        numbers = step(lr)
    except RuntimeError as err:
        if not run.dist.distributed:
            raise
        message = (
            f"rank {run.dist.rank} lost the other ranks at step {run.step + 1} ({err}); "
            + _intact(run)
        )
        # Said now, while the SIGTERM handler still stands: torchrun's SIGTERM to the ranks
        # left comes within milliseconds, and once the loop has unwound (the default handler
        # back) it would end this process before the traceback below is printed.
        log.error("%s", message)
        raise RuntimeError(message) from err
    for name, value in numbers.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise FloatingPointError(f"the {name} became {value} at step {run.step + 1}")
    return numbers
