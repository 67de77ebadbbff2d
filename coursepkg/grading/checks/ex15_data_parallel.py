"""Checks of ex15_data_parallel: naive DDP, the bucketed all-reduces and the sharded AdamW
step, each run on 2 ranks this check starts itself; the catalogue of mistakes they name is in
:mod:`.ex15_data_parallel_mistakes`.

The ranks are forked from the process that calls the check (a notebook's kernel: the student's
classes exist only there) and joined by gloo over 127.0.0.1. Each rank builds a small model
from a seed of its own (so a missing broadcast shows), trains it for a few steps on its slice of
the batches with the student's code, and writes its weights; the expected weights are one
process's, started from rank 0's model and trained on the whole batches. Every wait is bounded:
a collective gives up after :data:`COLLECTIVE_TIMEOUT_S`, and the ranks still running after
:data:`TIMEOUT_S` are killed, the message naming the collective and the step each rank was in.
A wrong answer is diagnosed by a second launch that runs every catalogued variant on the same
models and batches.
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
import torch.nn.functional as F
from torch import Tensor, nn

from ..framework import (
    BugVariant,
    CheckFailure,
    CheckReport,
    NotImplementedYet,
    call_student,
    configs,
    describe,
    generator,
    public_check,
    randn,
    register_configs,
)
from ..framework.ranks import (
    probe_loopback,
    rank_errors,
    stderr_without_hostname_warning,
    where_ranks_were,
)
from .ex15_data_parallel_mistakes import (
    BUCKETED_BUGS,
    BUCKETED_ITEM,
    NAIVE_DDP_BUGS,
    NAIVE_DDP_ITEM,
    ZERO_BUGS,
    ZERO_ITEM,
)

__all__ = ["check_bucketed_ddp", "check_naive_ddp", "check_sharded_adamw", "train_alone"]

Config = dict[str, Any]

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
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "barrier",
    "send",
    "recv",
)

for _item in (NAIVE_DDP_ITEM, BUCKETED_ITEM, ZERO_ITEM):
    register_configs(
        _item,
        visible=[{"steps": 3, "batch": 8, "seed": 0, "bucket_bytes": 150}],
        extra=[{"steps": 4, "batch": 6, "seed": 11, "bucket_bytes": 130}],
        sample=lambda rng: {
            "steps": rng.randint(2, 4),
            "batch": rng.choice([4, 6, 8]),
            "seed": rng.randint(1, 999),
            "bucket_bytes": rng.choice([130, 140, 150]),
        },
    )


class Probe(nn.Module):
    """The model every rank trains: two linear layers, a gain vector (59 parameters: no slice
    of 2 is even) and a buffer added to the input (so unsynchronised buffers show). Its
    gradients arrive as 12, 84, 28 and then 28 and 84 bytes (the first layer's two in either
    order): a bucket of 130 to 150 bytes is launched during backward and leaves a last one
    partly filled."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 7)
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(7))
        self.out = nn.Linear(7, 3)
        self.register_buffer("offset", torch.randn(3))

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, 3) -> (B, 3)."""
        return self.out(torch.tanh(self.inp(x + self.offset)) * self.gain)  # (B, 3)


def _model(cfg: Config, rank: int) -> Probe:
    torch.manual_seed(1000 * cfg["seed"] + 17 * rank + 1)  # each rank its own initial weights
    return Probe()


def _batches(cfg: Config) -> tuple[Tensor, Tensor]:
    """Inputs (steps, batch, 3) and targets (steps, batch, 3)."""
    gen = generator(cfg["seed"], salt=151)
    return randn(gen, cfg["steps"], cfg["batch"], 3), randn(gen, cfg["steps"], cfg["batch"], 3)


def _optimizer(item: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    # SGD for the DDP items: Adam would hide a sum (N times the gradient, the same update).
    if item == ZERO_ITEM:
        return torch.optim.AdamW(params, lr=0.05)
    return torch.optim.SGD(params, lr=0.2)


def _vector(model: nn.Module) -> Tensor:
    return nn.utils.parameters_to_vector(model.parameters()).detach().clone()  # (59,)


#: The step (from 0) after whose backward the ShardedAdamW check leaves ``gain`` without a
#: gradient, as an unused parameter is: the task says it steps with zeros; skipping it, as
#: ``torch.optim.AdamW`` does for a whole parameter a rank owns, passes too.
NO_GRAD_STEP = 1
_NO_GRAD_NOTE = (
    f"\n(At step {NO_GRAD_STEP + 1} the check leaves gain without a gradient, "
    "p.grad is None: the task says to use zeros for it.)"
)


def train_alone(item: str, cfg: Config, zeros: bool = True) -> Tensor:
    """One process from rank 0's model, the whole batch at every step: the expected weights
    (for ShardedAdamW, ``gain`` at :data:`NO_GRAD_STEP` with a zero gradient, or, not
    ``zeros``, none)."""
    model = _model(cfg, 0)
    optimizer = _optimizer(item, list(model.parameters()))
    xs, ys = _batches(cfg)
    for step, (x, y) in enumerate(zip(xs, ys, strict=True)):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        if item == ZERO_ITEM and step == NO_GRAD_STEP:
            model.gain.grad = torch.zeros_like(model.gain) if zeros else None
        optimizer.step()
    return _vector(model)


# ---------------------------------------------------------------------------------------------
# What each rank runs
# ---------------------------------------------------------------------------------------------


class _Watch:
    """One rank's notes: where it is (a file the parent reads if time runs out) and the
    asynchronous all-reduces it launched, during backward or not, waited on or not."""

    def __init__(self, out: Path, rank: int) -> None:
        self.file, self.phase, self.in_backward = out / f"rank{rank}.where", "starting", False
        self.handles: list[_Handle] = []
        self.during_backward = 0

    def note(self, phase: str, collective: str = "") -> None:
        self.phase = phase if not collective else self.phase
        where = f"torch.distributed.{collective}, called from {self.phase}"
        self.file.write_text(where if collective else phase)

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


def _broadcast_start(model: nn.Module) -> None:
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0)


def _average(model: nn.Module) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def _train(item: str, impl: Any, cfg: Config, watch: _Watch, student: bool) -> dict:
    """Train this rank's model with ``impl``; its weights and the watch's evidence."""
    rank, world = dist.get_rank(), dist.get_world_size()

    def call(fn: Callable, *args: Any) -> Any:
        return call_student(fn, *args, item=item) if student else fn(*args)

    model = _model(cfg, rank)
    watch.note(f"your {item}(...) before the first step")
    if item == NAIVE_DDP_ITEM:
        wrapper = call(impl, model)
    else:
        _broadcast_start(model)
        wrapper = call(impl, model, cfg["bucket_bytes"]) if item == BUCKETED_ITEM else None
    optimizer = (
        call(impl, list(model.parameters()), 0.05)
        if item == ZERO_ITEM
        else (_optimizer(item, list(model.parameters())))
    )
    xs, ys = _batches(cfg)
    size = cfg["batch"] // world
    for step, (x, y) in enumerate(zip(xs, ys, strict=True)):
        when = f"step {step + 1} of {cfg['steps']}"
        call(optimizer.zero_grad)
        rows = slice(rank * size, (rank + 1) * size)
        watch.note(f"the backward of {when} (your hooks)")
        watch.in_backward = True
        F.mse_loss(model(x[rows]), y[rows]).backward()
        watch.in_backward = False
        if wrapper is not None:
            watch.note(f"your sync_gradients after the backward of {when}")
            call(wrapper.sync_gradients)
        else:
            _average(model)
        no_grad = item == ZERO_ITEM and step == NO_GRAD_STEP
        if no_grad:
            model.gain.grad = None
        watch.note(f"your step() of {when}" if item == ZERO_ITEM else f"the step of {when}")
        try:
            call(optimizer.step)
        except CheckFailure as failure:
            if not no_grad or isinstance(failure, NotImplementedYet):
                raise
            raise CheckFailure(failure.message + _NO_GRAD_NOTE) from None
    state = getattr(optimizer, "optimizer", None) if item == ZERO_ITEM else None
    return {"weights": _vector(model), "state": _state_numel(state)}


def _state_numel(optimizer: Any) -> int | None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    return sum(
        v.numel() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
    )


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
        watch = _Watch(out_dir, rank)
        item, impl, cfg, variants = job
        watch.install(impl)
        if variants is None:
            result = {"student": _train(item, impl, cfg, watch, True)}
            result["unwaited"] = sum(not h.waited for h in watch.handles)
            result["during_backward"] = watch.during_backward
        else:
            result = {bug.id: _train(item, bug.impl, cfg, watch, False) for bug in variants}
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


# ---------------------------------------------------------------------------------------------
# The launch
# ---------------------------------------------------------------------------------------------


def _raise_error(kind: str, message: str, item: str) -> None:
    if kind == "todo":
        raise NotImplementedYet(item)
    if kind == "failure":
        raise CheckFailure(message)
    raise RuntimeError(f"a rank of the checker failed: {message}")


@functools.cache
def _import_optimizers() -> None:
    """One step of each optimizer here, before the ranks are forked: an optimizer's first step
    imports hundreds of modules (seconds), which the ranks then inherit instead of each
    importing them again."""
    for item in (NAIVE_DDP_ITEM, ZERO_ITEM):
        weight = nn.Parameter(torch.zeros(1))
        weight.grad = torch.ones(1)
        _optimizer(item, [weight]).step()


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
                _raise_error(*rank_errors(out)[0], item)
            return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]
        finally:
            for process in ranks:
                if process.is_alive():
                    process.kill()
                process.join()
            del store


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------

_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def _runs(cfgs: list[Config]) -> str:
    return f"{len(cfgs)} run" + ("s" if len(cfgs) > 1 else "")


def _same(a: Tensor, b: Tensor) -> bool:
    return bool(torch.allclose(a, b, **_TOLERANCE))


def _diagnose(
    item: str, student: list[dict], cfg: Config, bugs: list[BugVariant]
) -> BugVariant | None:
    """The variant whose weights equal the student's on every rank (a second launch runs
    them all; the race of ``bucketed.no_wait`` is named by its handles, not here)."""
    rerun = [b for b in bugs if b.id != "bucketed.no_wait"]
    ranks = launch(item, None, cfg, rerun)
    for bug in rerun:
        if all(
            _same(s["student"]["weights"], r[bug.id]["weights"])
            for s, r in zip(student, ranks, strict=True)
        ):
            return bug
    return None


def _compare(
    report: CheckReport, item: str, ranks: list[dict], cfg: Config, bugs: list[BugVariant]
) -> None:
    """Fail unless every rank's weights equal one process's on the whole batch (for
    ShardedAdamW, with or without a zero gradient for the parameter that has none)."""
    got = [r["student"]["weights"] for r in ranks]
    alone = [train_alone(item, cfg, z) for z in ((True, False) if item == ZERO_ITEM else (True,))]
    if any(all(_same(g, e) for g in got) for e in alone):
        return
    expected = alone[0]
    apart = float((got[1] - got[0]).abs().max())
    off = max(float((g - expected).abs().max()) for g in got)
    what = f"after {cfg['steps']} steps ({describe(cfg)}), " + (
        f"the ranks' weights differ from each other by up to {apart:.3g}: they no longer hold "
        "one model"
        if apart > _TOLERANCE["atol"]
        else f"the ranks agree but their weights differ by up to {off:.3g} from one process's, "
        "started from rank 0's model and trained on the whole batch"
    )
    report.fail(what[0].upper() + what[1:] + ".", _diagnose(item, ranks, cfg, bugs))


@public_check(
    assignment="ex15_data_parallel", implements="NaiveDDP", bugs=NAIVE_DDP_BUGS, kind="class"
)
def check_naive_ddp(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``NaiveDDP(model)`` and its ``sync_gradients()`` on 2 gloo ranks:
    each rank builds the model from its own seed (with a buffer of its own), wraps it, and
    trains it with SGD on its half of every batch; after the steps every rank must hold the
    weights of one process started from rank 0's model and trained on the whole batches."""
    cfgs = configs(NAIVE_DDP_ITEM, thorough, seed)
    for cfg in cfgs:
        _compare(
            report, NAIVE_DDP_ITEM, launch(NAIVE_DDP_ITEM, impl, cfg, None), cfg, NAIVE_DDP_BUGS
        )
    report.ok(f"2 ranks equal one process on the whole batch ({_runs(cfgs)})")
    report.ok("rank 0's parameters and buffers broadcast; gradients averaged, not summed")


@public_check(
    assignment="ex15_data_parallel", implements="BucketedDDP", bugs=BUCKETED_BUGS, kind="class"
)
def check_bucketed_ddp(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``BucketedDDP(model, bucket_bytes)`` on 2 gloo ranks: its hooks
    launch asynchronous all-reduces during backward, ``sync_gradients()`` waits on every handle
    (the check watches ``dist.all_reduce``), and after the steps every rank holds the weights of
    one process trained on the whole batches, with bucket sizes that leave a last bucket
    partly filled."""
    cfgs = configs(BUCKETED_ITEM, thorough, seed)
    no_wait = next(b for b in BUCKETED_BUGS if b.id == "bucketed.no_wait")
    for cfg in cfgs:
        ranks = launch(BUCKETED_ITEM, impl, cfg, None)
        unwaited = max(r["unwaited"] for r in ranks)
        if unwaited:
            report.fail(
                f"{unwaited} of your asynchronous all-reduces were never waited on "
                f"({describe(cfg)}).",
                no_wait,
            )
        if min(r["during_backward"] for r in ranks) == 0:
            report.fail(
                "none of your all-reduces started during backward (async_op=True, from a hook): "
                "launch each bucket's all-reduce from the gradient hooks, as soon as it is full, "
                f"so that communication overlaps the rest of backward ({describe(cfg)})."
            )
        _compare(report, BUCKETED_ITEM, ranks, cfg, BUCKETED_BUGS)
    report.ok(f"2 ranks equal one process on the whole batch ({_runs(cfgs)})")
    report.ok("all-reduces launched during backward, every handle waited on, the last bucket sent")


@public_check(
    assignment="ex15_data_parallel", implements="ShardedAdamW", bugs=ZERO_BUGS, kind="class"
)
def check_sharded_adamw(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``ShardedAdamW(params, lr)`` on 2 gloo ranks, the gradients averaged
    by the checker: after the steps every rank holds the weights of ``torch.optim.AdamW`` in
    one process on the whole batches, and the ranks' ``optimizer`` s together keep AdamW's
    state once, not once per rank (any split passes: flat slices, whole parameters per rank)."""
    cfgs = configs(ZERO_ITEM, thorough, seed)
    params = list(Probe().parameters())
    numel = sum(p.numel() for p in params)
    # two moments per element, once over the ranks (the padding of N slices: < N elements
    # more), and a step count per tensor on every rank at most
    most = 2 * (numel + WORLD) + WORLD * len(params)
    for cfg in cfgs:
        ranks = launch(ZERO_ITEM, impl, cfg, None)
        _compare(report, ZERO_ITEM, ranks, cfg, ZERO_BUGS)
        state = [r["student"]["state"] for r in ranks]
        if None in state:
            report.fail(
                "ShardedAdamW should keep its torch.optim.AdamW, over this rank's shard "
                "only, as self.optimizer."
            )
        if sum(state) > most:
            report.fail(
                f"your optimizers keep {' + '.join(map(str, state))} numbers of state on the "
                f"{WORLD} ranks; AdamW's state for {numel} parameters, each element's moments "
                f"on one rank only, is at most {most} in all: build each rank's optimizer over "
                "its slice only."
            )
    report.ok(f"AdamW's state split over the ranks ({sum(state)} numbers in all, not {WORLD} x)")
