"""The ranks of ex15's checks: :func:`launch` forks :data:`WORLD` of them from the calling
process (a notebook's kernel: the student's classes exist only there), joins them by gloo over
127.0.0.1 and returns what each trained (:func:`..training.train_rank`). Each rank watches the
collectives of ``torch.distributed`` (where it is, for a launch out of time; the asynchronous
all-reduces it launched and whether they were waited on). Every wait is bounded: a collective
gives up after :data:`COLLECTIVE_TIMEOUT_S`, and the ranks still running after
:data:`TIMEOUT_S` are killed, the message naming the collective and the step each rank was in.
"""

from __future__ import annotations

import datetime
import functools
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ...framework import BugVariant, CheckFailure, NotImplementedYet
from ...framework.ranks import (
    probe_loopback,
    rank_errors,
    stderr_without_hostname_warning,
    where_ranks_were,
)
from ..ex15_data_parallel_mistakes import NAIVE_DDP_ITEM, ZERO_ITEM
from .training import Config, optimizer_for, train_rank

__all__ = [
    "COLLECTIVE_TIMEOUT_S",
    "JOIN_S",
    "TIMEOUT_S",
    "WORLD",
    "RankFailure",
    "Watch",
    "launch",
]

WORLD = 2  #: ranks per launch
#: seconds for a whole launch: a guard against a hang, far above a launch's time even on a
#: loaded machine (one took over 40 s with CI's two cores shared), below nbgrader's 120 s a cell
TIMEOUT_S = 100.0
#: seconds for every rank to join the group (forked, connected to the store, through gloo's
#: rendezvous): a few even on a busy machine. A launch whose ranks have not all joined by then has
#: run none of the student's code, so it is started once more, within the same TIMEOUT_S (a CI
#: run under load lost a solution's points to a launch where no rank reported anything; whether
#: its ranks had joined was not recorded then)
JOIN_S = 30.0
#: seconds a rank waits in one collective before gloo gives up: longer than a launch, so that a
#: hang is reported by the launch, which knows the step each rank was in
COLLECTIVE_TIMEOUT_S = 120.0
_COLLECTIVES = (
    "broadcast",
    "all_reduce",
    "all_gather",
    "all_gather_single",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "barrier",
    "send",
    "recv",
)


class Watch:
    """One rank's notes: where it is (a file the parent reads if time runs out or the rank
    fails), the length of the shard its ShardedAdamW steps, and the asynchronous all-reduces
    it launched, during backward or not, waited on or not."""

    def __init__(self, out: Path, rank: int) -> None:
        self.file, self.phase, self.in_backward = out / f"rank{rank}.where", "starting", False
        self.shard_file = out / f"rank{rank}.shard"
        self.handles: list[_Handle] = []
        self.during_backward = 0

    def note(self, phase: str, collective: str = "") -> None:
        self.phase = phase if not collective else self.phase
        where = f"torch.distributed.{collective}, called from {self.phase}"
        self.file.write_text(where if collective else phase)

    def keep_shard(self, numel: int | None) -> None:
        """Note the number of elements this rank's optimizer steps (None: not known)."""
        self.shard_file.write_text(json.dumps(numel))

    def install(self, impl: Any) -> None:
        """Watch every collective of ``torch.distributed``, called as ``dist.all_reduce`` or
        by a name the student's module imported (``from torch.distributed import ...``); in
        this rank only (a forked copy of the student's namespace)."""
        namespaces = (
            {
                id(fn.__globals__): fn.__globals__
                for fn in vars(impl).values()
                if hasattr(fn, "__globals__")
            }
            if isinstance(impl, type)
            else {}
        )
        for name in _COLLECTIVES:
            plain = getattr(dist, name)
            watched = self._watched(name, plain)
            setattr(dist, name, watched)
            for namespace in namespaces.values():
                for key, value in list(namespace.items()):
                    if value is plain:
                        namespace[key] = watched

    def _watched(self, name: str, collective: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.note(self.phase, name)
            result = collective(*args, **kwargs)
            self.file.write_text(self.phase)
            if result is not None and kwargs.get("async_op"):
                result = _Handle(result)
                self.handles.append(result)
                self.during_backward += self.in_backward
            return result

        return call


class _Handle:
    """An asynchronous collective's handle that remembers whether it was waited on."""

    def __init__(self, work: Any) -> None:
        self.work, self.waited = work, False

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self.waited = True
        return self.work.wait(*args, **kwargs)

    def get_future(self) -> Any:
        self.waited = True  # the future's own wait is the student's to call
        return self.work.get_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)


def _rank_main(rank: int, port: int, out: str, job: tuple) -> None:
    """One rank: join the group, run ``job``, write its result or its error for the parent."""
    out_dir = Path(out)
    # A notebook kernel's streams go through its own threads, which a forked rank lacks: a
    # rank that wrote a warning there could block for ever. Each rank writes to its own file.
    sys.stdout = sys.stderr = open(out_dir / f"rank{rank}.log", "w", buffering=1)  # noqa: SIM115
    torch.set_num_threads(1)
    try:
        store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=False)
        limit = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=limit)
        (out_dir / f"rank{rank}.joined").touch()  # the parent's evidence that this rank started
        watch = Watch(out_dir, rank)
        item, impl, cfg, variants = job
        watch.install(impl)
        if variants is None:
            result = {"student": train_rank(item, impl, cfg, watch, True)}
            result["unwaited"] = sum(not h.waited for h in watch.handles)
            result["during_backward"] = watch.during_backward
        else:
            result = {bug.id: train_rank(item, bug.impl, cfg, watch, False) for bug in variants}
        torch.save(result, out_dir / f"rank{rank}.pt")
    except NotImplementedYet as failure:
        (out_dir / f"rank{rank}.error").write_text(json.dumps(["todo", failure.message]))
    except CheckFailure as failure:
        (out_dir / f"rank{rank}.error").write_text(json.dumps(["failure", failure.message]))
    except BaseException as error:  # noqa: BLE001 - the checker's own, reported as such
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        (out_dir / f"rank{rank}.error").write_text(json.dumps(["checker", text]))
    finally:
        os._exit(0)  # no atexit handler of the parent (a notebook's kernel) runs in a rank


class RankFailure(CheckFailure):
    """The student's code raised on a rank, with what the ranks showed when it did.

    Args:
        message: the student's error, as the rank reported it.
        where: where the rank that failed was (``torch.distributed.<collective>, called from
            ...`` when the error came out of a collective).
        shards: each rank's shard length (:meth:`Watch.keep_shard`), None where unknown.
    """

    def __init__(self, message: str, where: str, shards: list[int | None]) -> None:
        super().__init__(message)
        self.where, self.shards = where, shards


def _read(file: Path) -> Any:
    return json.loads(file.read_text()) if file.exists() else None


def _raise_error(kind: str, message: str, item: str, out: Path) -> None:
    if kind == "todo":
        raise NotImplementedYet(item)
    if kind == "failure":
        first = min(out.glob("rank*.error"), key=lambda f: f.stat().st_mtime_ns)
        where = out / first.name.replace(".error", ".where")
        raise RankFailure(
            message,
            where.read_text() if where.exists() else "",
            [_read(out / f"rank{r}.shard") for r in range(WORLD)],
        )
    raise RuntimeError(f"a rank of the checker failed: {message}")


@functools.cache
def _import_optimizers() -> None:
    """One step of each optimizer here, before the ranks are forked: an optimizer's first step
    imports hundreds of modules (seconds), which the ranks then inherit instead of each
    importing them again."""
    for item in (NAIVE_DDP_ITEM, ZERO_ITEM):
        weight = nn.Parameter(torch.zeros(1))
        weight.grad = torch.ones(1)
        optimizer_for(item, [weight]).step()


def launch(item: str, impl: Any, cfg: Config, variants: list[BugVariant] | None) -> list[dict]:
    """Fork :data:`WORLD` ranks that train with ``impl`` (or, given ``variants``, with each
    variant) and return each rank's result, in rank order.

    Ranks that have not all joined their group after :data:`JOIN_S` seconds (none of the
    student's code has run) are ended and started once more, within the same :data:`TIMEOUT_S`.

    Raises:
        CheckFailure: the student's code raised on some rank, or the ranks did not finish in
            :data:`TIMEOUT_S` (the message says where each rank was); every rank is ended.
    """
    with stderr_without_hostname_warning():
        return _launch_ranks(item, impl, cfg, variants)


class _NotJoined(Exception):
    """The ranks of a launch had not all joined their group after :data:`JOIN_S` seconds."""


def _launch_ranks(item: str, impl: Any, cfg: Config, variants: list[BugVariant] | None):
    _import_optimizers()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        return _launch_once(item, impl, cfg, variants, deadline, JOIN_S)
    except _NotJoined:  # none of the student's code ran: start the ranks once more
        return _launch_once(item, impl, cfg, variants, deadline, None)


def _launch_once(
    item: str,
    impl: Any,
    cfg: Config,
    variants: list[BugVariant] | None,
    deadline: float,
    join_s: float | None,
):
    """One launch of the ranks, until ``deadline`` (``time.monotonic``); with ``join_s``, raise
    :class:`_NotJoined` if the ranks have not all joined the group that many seconds in."""
    try:
        probe_loopback()  # without it, TCPStore would retry its own connection for minutes
        store = dist.TCPStore("127.0.0.1", 0, WORLD + 1, is_master=True, wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 - the machine's, never the student's: say so
        raise RuntimeError(
            f"no TCP port on 127.0.0.1 for the ranks' rendezvous ({exc}); this check needs the "
            "loopback network, which a sandbox without a network denies"
        ) from None
    context = mp.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="ex15-ranks-") as tmp:
        out = Path(tmp)
        ranks = [
            context.Process(
                target=_rank_main, args=(r, store.port, tmp, (item, impl, cfg, variants))
            )
            for r in range(WORLD)
        ]
        for process in ranks:
            process.start()
        join_by = None if join_s is None else time.monotonic() + join_s
        try:
            running = [p.sentinel for p in ranks]
            while running and not rank_errors(out):
                if join_by is not None and time.monotonic() >= join_by:
                    if not all((out / f"rank{r}.joined").exists() for r in range(WORLD)):
                        raise _NotJoined
                    join_by = None
                left = deadline - time.monotonic()
                if left <= 0:
                    where = where_ranks_were(out, WORLD)
                    if "torch.distributed." not in where:  # no rank in a collective: no evidence
                        raise RuntimeError(
                            f"the {WORLD} ranks did not finish within {TIMEOUT_S:g} s and none "
                            f"was waiting in a collective ({where or 'none had reported'}): the "
                            "machine may be too busy; this is not a verdict on your code"
                        )
                    raise CheckFailure(
                        f"your {item} did not finish on {WORLD} ranks within {TIMEOUT_S:g} s, "
                        f"so the checker stopped them: {where}. A collective returns only "
                        "once every rank has called it (the same collectives, in the same order, "
                        "on every rank), and an asynchronous one only once it is waited on."
                    )
                done = wait_for(running, timeout=min(left, 0.5))
                running = [s for s in running if s not in done]
            if rank_errors(out):
                _raise_error(*rank_errors(out)[0], item, out)
            return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]
        finally:
            for process in ranks:
                if process.is_alive():
                    process.kill()
                process.join()
            del store
