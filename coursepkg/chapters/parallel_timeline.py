"""What the chapter on training across machines measures on its ranks: one step's events on a
clock (when backward ends, when each all-reduce starts and when its wait returns), beside the
weights and bytes of :func:`~coursepkg.parallel.compare.train_ranks`, kept on disk by
:mod:`coursepkg.chapters.run_cache` so that the page starts its processes once.

The clock is each rank's ``time.perf_counter()``, read by the collectives as they are called
(:class:`TimedCollectives`); no profiler is needed, and the events are the ones the schemes
themselves cause.
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch.nn.functional as F

from ..parallel.comm import Collectives
from ..parallel.compare import Run, split_batch, train_ranks
from ..parallel.ddp import BucketedDDP, NaiveDDP
from ..parallel.launch import run_ranks
from .run_cache import cache_file, reuse_run, save_run

__all__ = ["TimedCollectives", "chapter_ranks", "rank_report", "step_timeline"]


class _TimedHandle:
    """An async collective's handle that notes when its ``wait()`` returns."""

    def __init__(self, handle, event: dict) -> None:
        self.handle, self.event = handle, event

    def wait(self) -> None:
        self.handle.wait()
        self.event["done"] = time.perf_counter()


class TimedCollectives(Collectives):
    """:class:`~coursepkg.parallel.comm.Collectives` whose all-reduces are put on a clock.

    Attributes:
        events: one dict per all-reduce since :meth:`reset`: ``bytes``, ``start`` (when it was
            called), ``done`` (when it returned, or when its handle's ``wait()`` returned).
    """

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict] = []

    def reset(self) -> None:
        """Start a new tally and a new list of events."""
        super().reset()
        self.events = []

    def all_reduce(self, tensor, async_op: bool = False):
        """As :meth:`Collectives.all_reduce`, with its start and end noted."""
        event = dict(bytes=tensor.numel() * tensor.element_size(), start=time.perf_counter())
        self.events.append(event)
        handle = super().all_reduce(tensor, async_op=async_op)
        if not async_op:
            event["done"] = time.perf_counter()
            return handle
        return _TimedHandle(handle, event)


def step_timeline(rank: int, world_size: int, run: Run, scheme: str) -> dict:
    """One training step of naive (``"ddp"``) or bucketed DDP on this rank, on a clock.

    A first step warms up (gloo's connections, the allocator); the second is recorded.

    Args:
        rank: this process' rank (its process group joined).
        world_size: the number of ranks.
        run: the model, batch and bucket size.
        scheme: ``"ddp"`` or ``"bucketed"``.

    Returns:
        Seconds from the start of the step's forward: ``forward`` and ``backward`` (when each
        ended), ``synced`` (when every gradient was averaged), and ``all_reduces``, a list of
        ``(start, done, bytes)``.
    """
    if scheme not in ("ddp", "bucketed"):
        raise ValueError(f"scheme must be 'ddp' or 'bucketed', got {scheme!r}")
    model, comm = run.make_model(), TimedCollectives()
    ddp = (
        BucketedDDP(model, run.bucket_bytes, comm)
        if scheme == "bucketed"
        else NaiveDDP(model, comm)
    )
    tokens = split_batch(run.batches()[0], rank, world_size)
    for _ in range(2):
        model.zero_grad()
        comm.reset()
        start = time.perf_counter()
        logits = ddp(tokens[:, :-1])  # (B / N, L, V)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        ddp.sync_gradients()
        synced = time.perf_counter()
    return dict(
        forward=forward - start,
        backward=backward - start,
        synced=synced - start,
        all_reduces=[(e["start"] - start, e["done"] - start, e["bytes"]) for e in comm.events],
    )


def rank_report(rank: int, world_size: int, run: Run, schemes: tuple[str, ...], timed: Run):
    """What one rank of the chapter's run returns: :func:`train_ranks` on ``run`` for
    ``schemes``, :func:`step_timeline` of both DDPs on the larger ``timed`` run, and the CPU
    cores the rank may run on (``cores``: its affinity, shared by the ranks of one machine)."""
    timelines = {s: step_timeline(rank, world_size, timed, s) for s in ("ddp", "bucketed")}
    train = train_ranks(rank, world_size, run, schemes)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return dict(train=train, timeline=timelines, cores=cores)


def chapter_ranks(
    world_size: int, run: Run, schemes: tuple[str, ...], timed: Run, cache: bool = True
) -> list[dict]:
    """:func:`rank_report` on ``world_size`` ranks of this machine, reused from the run cache
    when the same settings and code already ran (starting processes takes seconds).

    Args:
        world_size: the number of ranks.
        run: the run every scheme trains.
        schemes: names from :data:`~coursepkg.parallel.compare.OURS` and ``PYTORCH``.
        timed: the run whose step is put on a clock.
        cache: look in, and save to, the run cache (``COURSEPKG_CACHE_DIR``).

    Returns:
        Each rank's :func:`rank_report`, in rank order.
    """
    settings = dict(
        world_size=world_size,
        run=dataclasses.asdict(run),
        schemes=list(schemes),
        timed=dataclasses.asdict(timed),
    )
    path = cache_file(settings, "parallel") if cache else None
    saved: dict = {}
    if reuse_run(path, saved.update):
        return saved["ranks"]
    ranks = run_ranks(rank_report, world_size, run, tuple(schemes), timed, timeout=300.0)
    if path is not None:
        save_run(path, dict(ranks=ranks), "the chapter's ranks")
    return ranks
