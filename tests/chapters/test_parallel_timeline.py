"""One DDP step on a clock: the all-reduces' order against backward (naive after it, bucketed
during it), the bytes they carry, and the chapter's rank run kept by the run cache."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from coursepkg.chapters.parallel_timeline import chapter_ranks, step_timeline
from coursepkg.parallel.compare import Run
from coursepkg.parallel.memory import unit_numels

TIMED = Run(
    model=dict(
        vocab_size=32,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_layers=3,
        max_len=16,
        dropout=0.0,
        bias=False,
    ),
    batch=2,
    length=8,
    steps=1,
    bucket_bytes=10_000,
)


@pytest.fixture
def one_rank():
    """A process group of one rank in this process (a collective then returns at once)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_naive_reduces_after_backward_and_buckets_during_it(one_rank):
    naive = step_timeline(0, 1, TIMED, "ddp")
    bucketed = step_timeline(0, 1, TIMED, "bucketed")
    params = list(TIMED.make_model().parameters())
    psi_bytes = sum(unit_numels(TIMED.make_model())) * 4
    assert len(naive["all_reduces"]) == len(params)
    assert 1 < len(bucketed["all_reduces"]) < len(params)
    for t in (naive, bucketed):
        assert 0 < t["forward"] < t["backward"] <= t["synced"]
        assert sum(b for *_, b in t["all_reduces"]) == psi_bytes
        assert all(t["forward"] < s <= d <= t["synced"] for s, d, _ in t["all_reduces"])
    assert all(s >= naive["backward"] for s, _, _ in naive["all_reduces"])
    assert any(s < bucketed["backward"] for s, _, _ in bucketed["all_reduces"])


def test_only_the_two_ddps_have_a_timeline(one_rank):
    with pytest.raises(ValueError, match="scheme must be 'ddp' or 'bucketed', got 'fsdp'"):
        step_timeline(0, 1, TIMED, "fsdp")


@pytest.mark.slow  # starts a rank: a Python process that imports torch
def test_the_chapters_ranks_run_once_then_come_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSEPKG_CACHE_DIR", str(tmp_path))
    run = Run(steps=1)
    first = chapter_ranks(1, run, ("ddp", "zero1"), TIMED)
    saved = list(tmp_path.glob("parallel-*.pt"))
    assert len(saved) == 1
    stamp = saved[0].stat().st_mtime_ns
    again = chapter_ranks(1, run, ("ddp", "zero1"), TIMED)
    assert saved[0].stat().st_mtime_ns == stamp  # read, not written again
    assert again[0]["timeline"] == first[0]["timeline"]
    for scheme in ("ddp", "zero1"):
        for name, tensor in first[0]["train"][scheme]["weights"].items():
            assert tensor.equal(again[0]["train"][scheme]["weights"][name])
    assert set(first[0]["timeline"]) == {"ddp", "bucketed"}
