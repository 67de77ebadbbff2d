"""Tests of the ex15 checks (``checks/ex15_data_parallel.py``): its catalogue (each mistake rerun
and named by its own id: test_check_protocol.py), correct answers in other styles pass in visible
and thorough mode, the same styles with a mistake get its id, and a student's code that hangs or
raises on one rank ends every rank, with a message naming the collective and the step. Each check
forks 2 gloo ranks (about half a second)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import grading_impls_data_parallel as impls
import pytest
import torch
import torch.distributed as dist

from coursepkg.grading import (
    CheckerError,
    CheckFailure,
    check_bucketed_ddp,
    check_naive_ddp,
    check_sharded_adamw,
    registered_checks,
)
from coursepkg.grading.checks import ex15_data_parallel as check_module
from coursepkg.grading.checks import ex15_data_parallel_mistakes as catalogue
from coursepkg.grading.checks.ex15_parts import ranks as ranks_module
from coursepkg.grading.checks.ex15_parts.training import train_alone
from coursepkg.grading.framework import configs
from coursepkg.grading.framework.ranks import stderr_without_hostname_warning

CHECK_OF = {
    bug.id: entry.check
    for entry in registered_checks()
    if entry.assignment == "ex15_data_parallel"
    for bug in entry.bugs
}


@pytest.fixture(autouse=True)
def _no_rank_left():
    yield
    assert not mp.active_children()  # every forked rank was ended and reaped


def test_the_issue_s_mistakes_are_catalogued_once_each():
    ids = [b.id for b in catalogue.BUGS]
    assert len(ids) == len(set(ids)) == len(CHECK_OF) == 12
    assert {
        "naive_ddp.summed",
        "naive_ddp.broadcast_wrong_rank",
        "naive_ddp.no_initial_broadcast",
        "naive_ddp.buffers_not_synced",
        "bucketed.no_wait",
        "bucketed.last_bucket_not_flushed",
        "zero.wrong_slice",
    } <= set(ids)


CORRECT = [
    (check_naive_ddp, catalogue.NaiveDDPSteps),
    (check_naive_ddp, impls.FlatNaiveDDP),
    (check_naive_ddp, impls.StateDictNaiveDDP),
    (check_bucketed_ddp, catalogue.BucketedDDPSteps),
    (check_bucketed_ddp, impls.PlannedBuckets),
    (check_bucketed_ddp, impls.FutureBuckets),
    (check_sharded_adamw, catalogue.ShardedAdamWSteps),
    (check_sharded_adamw, impls.ChunkedShardedAdamW),
    (check_sharded_adamw, impls.OwnedParamsAdamW),
]


@pytest.mark.parametrize(("check", "impl"), CORRECT, ids=lambda x: x.__name__)
def test_independent_answers_pass(check, impl):
    result = check(impl)
    assert result.passed and result.messages


@pytest.mark.parametrize(("check", "impl"), CORRECT[1::3], ids=lambda x: x.__name__)
def test_answers_in_other_styles_pass_the_hidden_tests(check, impl):
    """One style per check in thorough mode (each run is a launch of 2 ranks)."""
    result = check(impl, thorough=True, seed=5)
    assert result.passed and len(configs(catalogue.NAIVE_DDP_ITEM, True, 5)) >= 3


WRONG = [
    (check_naive_ddp, impls.FlatNaiveDDPSummed, "naive_ddp.summed"),
    (check_naive_ddp, impls.StateDictNaiveDDPFromLast, "naive_ddp.broadcast_wrong_rank"),
    (check_naive_ddp, impls.ParametersOnlyNaiveDDP, "naive_ddp.buffers_not_synced"),
    (check_bucketed_ddp, impls.PlannedBucketsNoWait, "bucketed.no_wait"),
    (check_bucketed_ddp, impls.FutureBucketsUnflushed, "bucketed.last_bucket_not_flushed"),
    (check_sharded_adamw, impls.ChunkedShardedAdamWFloor, "zero.tail_not_covered"),
    (check_sharded_adamw, impls.ChunkedShardedAdamWNoGather, "zero.no_all_gather"),
]


@pytest.mark.parametrize(
    ("check", "impl", "bug_id"), WRONG, ids=lambda x: getattr(x, "__name__", x)
)
def test_a_mistake_in_another_style_is_named(check, impl, bug_id):
    with pytest.raises(CheckFailure) as info:
        check(impl)
    assert info.value.diagnosis == bug_id, str(info.value)


@pytest.mark.parametrize(
    "impl",
    [impls.ChunkedShardedAdamWEveryGrad, impls.ChunkedShardedAdamWSkipsNone],
    ids=lambda x: x.__name__,
)
def test_a_parameter_without_a_gradient_steps_with_zeros(impl):
    """The check leaves one parameter without a gradient at one step (the task: zeros for it);
    code that reads its .grad crashes and is told why, code that leaves it out is rejected."""
    with pytest.raises(CheckFailure) as info:
        check_sharded_adamw(impl)
    assert not isinstance(info.value, CheckerError), str(info.value)
    crashed = "p.grad is None" in str(info.value)
    assert crashed == (impl is impls.ChunkedShardedAdamWEveryGrad), str(info.value)


def test_a_zero_gradient_and_none_differ_so_the_check_sees_it():
    """Skipping the parameter (torch's AdamW on a whole parameter) and stepping it with zeros
    move its weights apart: the rule is checked, not hidden by the tolerance."""
    cfg = configs(catalogue.ZERO_ITEM, False, None)[0]
    zeros, skipped = (train_alone(catalogue.ZERO_ITEM, cfg, z) for z in (True, False))
    assert not check_module._same(zeros, skipped)


def test_all_reduces_that_start_after_backward_are_told():
    with pytest.raises(CheckFailure, match="started during backward") as info:
        check_bucketed_ddp(impls.BucketsAfterBackward)
    assert info.value.diagnosis is None


def test_an_unsharded_optimizer_is_told():
    with pytest.raises(CheckFailure, match="numbers of state on the 2 ranks") as info:
        check_sharded_adamw(impls.UnshardedAdamW)
    assert info.value.diagnosis is None


class _PaddedGatheredUnpadded(catalogue.ShardedAdamWSteps):
    def gather(self):
        full = torch.empty(self.numel)  # equal, padded slices gathered into too few elements
        dist.all_gather_single(full, self.shard.detach())
        return full


class _UnpaddedRaisesBeforeTheGather(catalogue.ShardedAdamW_unpadded):
    def step(self):
        raise ValueError("a bad shard")  # unequal slices, but not what raised


@pytest.mark.parametrize(
    ("impl", "raised"),
    [
        (catalogue.ShardedAdamW_unpadded, "RuntimeError"),
        (_PaddedGatheredUnpadded, "RuntimeError"),
        (_UnpaddedRaisesBeforeTheGather, "ValueError"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_unpadded_shards_are_named_only_when_the_gather_raised_on_unequal_slices(impl, raised):
    """The student's error is always the message (never the checker's); it is named
    zero.unpadded_shards only when it came out of the all-gather and the ranks' shards
    differ in length and hold the 59 elements once."""
    with pytest.raises(CheckFailure) as info:
        check_sharded_adamw(impl)
    assert not isinstance(info.value, CheckerError)
    assert f"ShardedAdamW raised {raised}" in str(info.value)
    named = impl is catalogue.ShardedAdamW_unpadded
    assert info.value.diagnosis == ("zero.unpadded_shards" if named else None), str(info.value)


class _WaitsForNobody(catalogue.NaiveDDPSteps):
    def sync_gradients(self):
        if dist.get_rank() == 1:
            dist.recv(torch.zeros(1), src=0)  # rank 0 never sends: rank 1 waits for ever
        super().sync_gradients()


class _FailsOnOneRank(catalogue.NaiveDDPSteps):
    def sync_gradients(self):
        if dist.get_rank() == 1:
            raise ValueError("a bad bucket on rank 1")
        super().sync_gradients()  # rank 0 waits in all_reduce for rank 1, which has left


@pytest.mark.slow  # waits out the checker's launch timeout (about 30 s): not for make test-fast
def test_a_collective_that_never_returns_is_stopped_and_named(monkeypatch):
    # long enough for both ranks to reach their collectives on a loaded machine: a launch that
    # ends with no rank in a collective is the checker's error, not this verdict
    monkeypatch.setattr(ranks_module, "TIMEOUT_S", 30.0)
    with pytest.raises(CheckFailure) as info:
        check_naive_ddp(_WaitsForNobody)
    message = str(info.value)
    assert "did not finish on 2 ranks within 30 s" in message
    assert (
        "rank 1 was in torch.distributed.recv, called from your sync_gradients after the "
        "backward of step 1 of 3" in message
    )
    assert "rank 0 was in torch.distributed.all_reduce" in message


class _SleepsOutsideCollectives(catalogue.NaiveDDPSteps):
    def sync_gradients(self):
        time.sleep(3600)  # slow, but in no collective: no evidence of a hang of the student's


def test_a_launch_out_of_time_with_no_rank_in_a_collective_is_the_checkers_error(monkeypatch):
    monkeypatch.setattr(ranks_module, "TIMEOUT_S", 3.0)
    with pytest.raises(CheckerError) as info:
        check_naive_ddp(_SleepsOutsideCollectives)
    assert "none was waiting in a collective" in str(info.value)
    assert "not a verdict on your code" in str(info.value)


def test_an_error_on_one_rank_ends_both_and_is_told():
    with pytest.raises(CheckFailure) as info:
        check_naive_ddp(_FailsOnOneRank)
    assert "NaiveDDP raised ValueError" in str(info.value)
    assert "a bad bucket on rank 1" in str(info.value)


@pytest.mark.parametrize("item", [catalogue.NAIVE_DDP_ITEM, catalogue.ZERO_ITEM])
def test_the_runs_differ_and_repeat(item):
    """The visible and extra runs differ (another seed, batch and length), and one process's
    run is repeatable (the ranks and the reference build the same models and batches)."""
    first, extra = configs(item, True, 0)[:2]
    a, b = train_alone(item, first), train_alone(item, extra)
    assert a.shape == (59,) and not torch.allclose(a, b)
    assert torch.equal(a, train_alone(item, first))


def test_the_ranks_stderr_passes_on_all_but_pytorchs_hostname_warning(capfd):
    """In the grader's network namespace TCPStore cannot name a peer (no DNS) and says so on
    file descriptor 2; nbgrader would score the test cell 0 for it. Every other line passes."""
    with stderr_without_hostname_warning():
        os.write(2, b"[W socket.cpp:207] [c10d] The hostname of the client socket cannot be ")
        os.write(2, b"retrieved. err=-3\nrank 1 says this\n")
    assert capfd.readouterr().err == "rank 1 says this\n"


def _stalls_before_joining(flag: Path | None):
    """``dist.init_process_group`` that stalls for ever (as a forked rank stuck on a lock), the
    first time only when given ``flag``, every time without."""
    real = dist.init_process_group

    def init(*args, **kwargs):
        if flag is None or not flag.exists():
            if flag is not None:
                flag.touch()
            time.sleep(3600)
        return real(*args, **kwargs)

    return init


def test_ranks_that_stall_before_joining_are_started_once_more(monkeypatch, tmp_path):
    """None of the student's code ran before the ranks joined their group: the launch is started
    again, and a correct answer passes."""
    flag = tmp_path / "stalled once"
    monkeypatch.setattr(dist, "init_process_group", _stalls_before_joining(flag))
    monkeypatch.setattr(ranks_module, "JOIN_S", 3.0)
    check_naive_ddp(catalogue.NaiveDDPSteps)
    assert flag.exists()  # the first launch did stall


def test_ranks_that_never_join_are_the_checkers_error(monkeypatch):
    monkeypatch.setattr(dist, "init_process_group", _stalls_before_joining(None))
    monkeypatch.setattr(ranks_module, "JOIN_S", 2.0)
    monkeypatch.setattr(ranks_module, "TIMEOUT_S", 6.0)
    with pytest.raises(CheckerError) as info:
        check_naive_ddp(catalogue.NaiveDDPSteps)
    message = str(info.value)
    assert "rank 0 had not joined the group; rank 1 had not joined the group" in message
    assert "not a verdict on your code" in message
