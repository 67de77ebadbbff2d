"""The pieces of ``coursepkg.parallel`` that need no second process: shards that tile the
padded vector, buckets that keep order and size, the ring's bytes, the closed forms' shape,
the errors for bad arguments."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from coursepkg.parallel import FSDP, run_ranks
from coursepkg.parallel.comm import Collectives, flat_size, flatten, ring_bytes_sent, shard_bounds
from coursepkg.parallel.compare import Run, split_batch
from coursepkg.parallel.ddp import make_buckets
from coursepkg.parallel.memory import payload_per_step, per_rank_bytes


@pytest.mark.parametrize("numel", [1, 7, 12, 1001])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_tile_the_padded_vector(numel, world_size):
    length = flat_size(numel, world_size)
    assert length % world_size == 0 and numel <= length < numel + world_size
    bounds = [shard_bounds(numel, world_size, r) for r in range(world_size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))


def test_flatten_lays_tensors_end_to_end_then_zeros():
    a, b = torch.arange(6.0).view(2, 3), torch.tensor([7.0])
    torch.testing.assert_close(flatten([a, b], 9), torch.tensor([0, 1, 2, 3, 4, 5, 7, 0, 0.0]))


@pytest.mark.parametrize("bucket_bytes", [4, 40, 100, 10_000])
def test_buckets_keep_order_and_size(bucket_bytes):
    sizes = [3, 10, 1, 25, 4, 4, 2]
    params = [nn.Parameter(torch.zeros(n)) for n in sizes]
    buckets = make_buckets(params, bucket_bytes)
    assert [p for b in buckets for p in b.params] == params
    for bucket in buckets:
        nbytes = sum(p.numel() * 4 for p in bucket.params)
        assert nbytes <= bucket_bytes or len(bucket.params) == 1
    for first, second in zip(buckets, buckets[1:], strict=False):  # none could take more
        used = sum(p.numel() * 4 for p in first.params)
        assert used + second.params[0].numel() * 4 > bucket_bytes


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_an_all_reduce_sends_as_much_as_a_reduce_scatter_and_an_all_gather(world_size):
    parts = [ring_bytes_sent(k, 800, world_size) for k in ("reduce_scatter", "all_gather")]
    assert ring_bytes_sent("all_reduce", 800, world_size) == sum(parts)
    assert ring_bytes_sent("all_reduce", 800, world_size) == 2 * 800 * (world_size - 1) / world_size
    with pytest.raises(ValueError, match="kind must be one of"):
        ring_bytes_sent("gather", 800, world_size)


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_sharding_saves_what_the_closed_forms_say(world_size):
    numels, tensors = [640, 640, 640, 320], 40  # divisible: no padding
    ddp, zero, fsdp = (
        per_rank_bytes(s, numels, tensors, world_size) for s in ("ddp", "zero1", "fsdp")
    )
    psi = sum(numels) * 4
    assert ddp == dict(params=psi, grads=psi, state=2 * psi + 4 * tensors)
    assert zero["params"] == ddp["params"] and zero["state"] == 2 * psi // world_size + 4
    assert fsdp["params"] == fsdp["grads"] == psi // world_size
    fsdp_payload = payload_per_step("fsdp", numels, world_size)
    assert fsdp_payload == dict(all_gather=2 * psi, reduce_scatter=psi)
    assert payload_per_step("zero1", numels, world_size) == dict(all_reduce=psi, all_gather=psi)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="world_size must be a positive int, got 0"):
        run_ranks(print, 0)
    with pytest.raises(ValueError, match="bucket_bytes must be a positive int, got 0"):
        make_buckets([], 0)
    with pytest.raises(ValueError, match="scheme must be one of"):
        per_rank_bytes("zero3", [10], 1, 2)
    with pytest.raises(RuntimeError, match="needs a process group"):
        Collectives()
    model = Run().make_model()
    with pytest.raises(
        ValueError, match="units must end with the model itself.*DecoderOnlyLayer last"
    ):
        FSDP(model, units=[model, *model.layers])


def test_a_batch_that_does_not_divide_among_the_ranks_is_refused():
    batch = torch.arange(12).view(6, 2)
    torch.testing.assert_close(split_batch(batch, 1, 3), batch[2:4])
    with pytest.raises(ValueError, match="global batch of 6 must divide among world_size=4"):
        split_batch(batch, 0, 4)
