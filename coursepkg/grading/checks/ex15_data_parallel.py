"""Checks of ex15_data_parallel: naive DDP, the bucketed all-reduces and the sharded AdamW
step, each run on 2 ranks this check starts itself; the catalogue of mistakes they name is in
:mod:`.ex15_data_parallel_mistakes`.

Each rank builds a small model from a seed of its own (so a missing broadcast shows), trains it
for a few steps on its slice of the batches with the student's code, and writes its weights;
the expected weights are one process's, started from rank 0's model and trained on the whole
batches (:mod:`.ex15_parts.training`). The ranks are forked from the process that calls the
check, joined by gloo over 127.0.0.1 and bounded in time (:mod:`.ex15_parts.ranks`). A wrong
answer is diagnosed by a second launch that runs every catalogued variant on the same models
and batches."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..framework import (
    BugVariant,
    CheckReport,
    configs,
    describe,
    public_check,
    register_configs,
)
from .ex15_data_parallel_mistakes import (
    BUCKETED_BUGS,
    BUCKETED_ITEM,
    NAIVE_DDP_BUGS,
    NAIVE_DDP_ITEM,
    ZERO_BUGS,
    ZERO_ITEM,
)
from .ex15_parts.ranks import WORLD, RankFailure, launch
from .ex15_parts.training import Config, Probe, train_alone

__all__ = ["check_bucketed_ddp", "check_naive_ddp", "check_sharded_adamw"]

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

_TOLERANCE = dict(rtol=1e-5, atol=1e-6)
_NAMED_BY_EVIDENCE = ("bucketed.no_wait", "zero.unpadded_shards")


def _runs(cfgs: list[Config]) -> str:
    return f"{len(cfgs)} run" + ("s" if len(cfgs) > 1 else "")


def _same(a: Tensor, b: Tensor) -> bool:
    return bool(torch.allclose(a, b, **_TOLERANCE))


def _diagnose(
    item: str, student: list[dict], cfg: Config, bugs: list[BugVariant]
) -> BugVariant | None:
    """The variant whose weights equal the student's on every rank (a second launch runs
    them all but those named by what the ranks show: the race of ``bucketed.no_wait`` by its
    handles, the crash of ``zero.unpadded_shards`` by :func:`_unpadded_shards`)."""
    rerun = [b for b in bugs if b.id not in _NAMED_BY_EVIDENCE]
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
        try:
            ranks = launch(ZERO_ITEM, impl, cfg, None)
        except RankFailure as failure:
            report.fail(failure.message, _unpadded_shards(failure, numel))
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


def _unpadded_shards(failure: RankFailure, numel: int) -> BugVariant | None:
    """``zero.unpadded_shards``, on the ranks' evidence only: the error came out of an
    all-gather, and the ranks' shards (what their ``optimizer`` s step) differ in length and
    hold the ``numel`` elements exactly once, no padding. Any other crash stays unnamed."""
    shards = failure.shards
    if not failure.where.startswith("torch.distributed.all_gather") or None in shards:
        return None
    if len(set(shards)) > 1 and sum(shards) == numel:
        return next(b for b in ZERO_BUGS if b.id == "zero.unpadded_shards")
    return None
