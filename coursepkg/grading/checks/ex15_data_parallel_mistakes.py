"""The catalogue of ex15_data_parallel: the known mistakes of naive DDP, the bucketed
all-reduces and the sharded optimizer's step.

Each item has a correct version written in steps (:class:`NaiveDDPSteps`,
:class:`BucketedDDPSteps`, :class:`ShardedAdamWSteps`) and each mistake is a subclass that
overrides the one step it gets wrong, named ``<Item>_<mistake>``. The evidence: the check runs
each variant on the same ranks, models and batches as the student's code and names a mistake
when its weights after the steps match the student's on every rank; a bucketed all-reduce
whose handle is never waited on is named by the handle itself (the check watches
``dist.all_reduce``), since its numbers depend on a race, and a sharded AdamW whose unpadded
slices crash the all-gather by what the ranks show when it does (the error came out of the
all-gather, and the ranks' shards differ in length and hold every element once).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..framework import BugVariant

__all__ = [
    "BUCKETED_BUGS",
    "BUCKETED_ITEM",
    "BUGS",
    "NAIVE_DDP_BUGS",
    "NAIVE_DDP_ITEM",
    "ZERO_BUGS",
    "ZERO_ITEM",
    "BucketedDDPSteps",
    "NaiveDDPSteps",
    "ShardedAdamWSteps",
]

NAIVE_DDP_ITEM = "NaiveDDP"
BUCKETED_ITEM = "BucketedDDP"
ZERO_ITEM = "ShardedAdamW"


# ---------------------------------------------------------------------------------------------
# Naive DDP
# ---------------------------------------------------------------------------------------------


class NaiveDDPSteps:
    """The correct naive DDP (the stub's interface), in the steps its mistakes override."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        with torch.no_grad():
            for tensor in self.initial_tensors():
                dist.broadcast(tensor, src=self.source())

    def initial_tensors(self) -> list[Tensor]:
        """What the ranks must agree on before the first step."""
        return [*self.model.parameters(), *self.model.buffers()]

    def source(self) -> int:
        return 0

    def sync_gradients(self) -> None:
        for p in self.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad = self.mean(p.grad)

    def mean(self, total: Tensor) -> Tensor:
        return total / dist.get_world_size()


class NaiveDDP_summed(NaiveDDPSteps):  # noqa: N801 - the variant's name shows in messages
    def mean(self, total):
        return total  # the all-reduce's sum, never divided


class NaiveDDP_wrong_source(NaiveDDPSteps):  # noqa: N801
    def source(self):
        return dist.get_world_size() - 1  # the last rank's weights, not rank 0's


class NaiveDDP_no_broadcast(NaiveDDPSteps):  # noqa: N801
    def initial_tensors(self):
        return []


class NaiveDDP_buffers_not_synced(NaiveDDPSteps):  # noqa: N801
    def initial_tensors(self):
        return list(self.model.parameters())


class NaiveDDP_weights_averaged(NaiveDDPSteps):  # noqa: N801
    @torch.no_grad()
    def sync_gradients(self):
        for p in self.model.parameters():  # the weights, not p.grad: each keeps its own grad
            dist.all_reduce(p)
            p.copy_(self.mean(p))


NAIVE_DDP_BUGS = [
    BugVariant(
        "naive_ddp.summed",
        NAIVE_DDP_ITEM,
        "the gradients are summed over the ranks, not averaged (dist.all_reduce sums), so every "
        "step is N times too large",
        "Divide each all-reduced gradient by dist.get_world_size().",
        NaiveDDP_summed,
    ),
    BugVariant(
        "naive_ddp.broadcast_wrong_rank",
        NAIVE_DDP_ITEM,
        "the initial weights are broadcast from another rank than 0, so the ranks agree with "
        "each other but not with rank 0's model",
        "Broadcast every parameter and buffer with src=0.",
        NaiveDDP_wrong_source,
    ),
    BugVariant(
        "naive_ddp.no_initial_broadcast",
        NAIVE_DDP_ITEM,
        "the initial weights are not broadcast, so each rank trains its own model from its own "
        "seed and the averaged gradients belong to no single model",
        "In __init__, copy rank 0's parameters and buffers into every rank's with "
        "dist.broadcast(tensor, src=0), under torch.no_grad().",
        NaiveDDP_no_broadcast,
    ),
    BugVariant(
        "naive_ddp.buffers_not_synced",
        NAIVE_DDP_ITEM,
        "the parameters are broadcast but not the buffers (model.buffers(): a running mean, a "
        "fixed offset), so each rank's forward still differs",
        "Broadcast model.buffers() from rank 0 too, not only model.parameters().",
        NaiveDDP_buffers_not_synced,
    ),
    BugVariant(
        "naive_ddp.weights_averaged",
        NAIVE_DDP_ITEM,
        "sync_gradients averages the weights instead of the gradients: after the broadcast "
        "the weights are equal anyway, so each rank steps with its own half of the batch's "
        "gradient and the ranks drift apart",
        "All-reduce each parameter's .grad (not the parameter) and divide it by "
        "dist.get_world_size(), between backward and the optimizer's step.",
        NaiveDDP_weights_averaged,
    ),
]


# ---------------------------------------------------------------------------------------------
# Bucketed DDP
# ---------------------------------------------------------------------------------------------


class BucketedDDPSteps:
    """The correct bucketed all-reduce: buckets filled in the order gradients arrive, launched
    when full, the last one flushed by ``sync_gradients``."""

    def __init__(self, model: nn.Module, bucket_bytes: int) -> None:
        self.model, self.bucket_bytes = model, bucket_bytes
        self.pending: list[nn.Parameter] = []
        self.launched: list[tuple[list[nn.Parameter], Tensor, object]] = []
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.gradient_ready)

    def gradient_ready(self, p: nn.Parameter) -> None:
        self.pending.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in self.pending) >= self.bucket_bytes:
            self.launch()

    def launch(self) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.pending])  # (bucket's numel,)
        handle = dist.all_reduce(flat, async_op=True)
        self.launched.append((self.pending, flat, handle))
        self.pending = []

    def sync_gradients(self) -> None:
        self.flush()
        for params, flat, handle in self.launched:
            self.wait(handle)
            offset = 0
            for p in params:
                chunk = flat[offset : offset + p.numel()]  # (numel of p,)
                p.grad = self.averaged(chunk).view_as(p).clone()
                offset += p.numel()
        self.launched = []

    def flush(self) -> None:
        if self.pending:
            self.launch()

    def wait(self, handle) -> None:
        handle.wait()

    def averaged(self, summed: Tensor) -> Tensor:
        """The mean over the ranks of what the all-reduce summed."""
        return summed / dist.get_world_size()


class BucketedDDP_no_wait(BucketedDDPSteps):  # noqa: N801
    def wait(self, handle):
        pass  # the flat tensor is read while its all-reduce may still be running


class BucketedDDP_summed(BucketedDDPSteps):  # noqa: N801
    def averaged(self, summed):
        return summed  # the sum over the ranks written back, not the mean


class BucketedDDP_last_bucket_not_flushed(BucketedDDPSteps):  # noqa: N801
    def flush(self):
        self.pending = []  # the last, partly filled bucket is never all-reduced


BUCKETED_BUGS = [
    BugVariant(
        "bucketed.no_wait",
        BUCKETED_ITEM,
        "an asynchronous all-reduce's handle is never waited on, so the gradients are read "
        "while the all-reduce may still be running (a race: right on a quiet machine, wrong on "
        "a busy one)",
        "Keep every handle dist.all_reduce(..., async_op=True) returns and call handle.wait() "
        "in sync_gradients before reading the bucket's tensor.",
        BucketedDDP_no_wait,
    ),
    BugVariant(
        "bucketed.last_bucket_not_flushed",
        BUCKETED_ITEM,
        "the last bucket, which backward leaves below bucket_bytes, is never all-reduced, so "
        "its parameters keep this rank's own gradients and the ranks drift apart",
        "In sync_gradients, launch the bucket still being filled (if it holds any parameter) "
        "before waiting on the handles.",
        BucketedDDP_last_bucket_not_flushed,
    ),
    BugVariant(
        "bucketed.summed",
        BUCKETED_ITEM,
        "the buckets' all-reduced gradients are written back as they come, the sum over the "
        "ranks, not divided by the world size: every step is N times too large",
        "Divide each bucket's all-reduced tensor by dist.get_world_size() before copying it "
        "back into the gradients.",
        BucketedDDP_summed,
    ),
]


# ---------------------------------------------------------------------------------------------
# Sharded AdamW (ZeRO-1)
# ---------------------------------------------------------------------------------------------


class ShardedAdamWSteps:
    """The correct sharded AdamW: a flat vector padded to a multiple of N, rank r's slice
    stepped by rank r, every slice all-gathered back."""

    def __init__(self, params: list[nn.Parameter], lr: float) -> None:
        self.params = list(params)
        self.numel = sum(p.numel() for p in self.params)
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.size = -(-self.numel // self.world)  # elements per slice, padding included
        self.lo, self.hi = self.bounds()
        self.shard = nn.Parameter(self.flat([p.detach() for p in self.params])[self.lo : self.hi])
        self.optimizer = torch.optim.AdamW([self.shard], lr=lr)

    def bounds(self) -> tuple[int, int]:
        return self.rank * self.size, (self.rank + 1) * self.size

    def flat(self, tensors: list[Tensor]) -> Tensor:
        out = torch.zeros(self.size * self.world, dtype=tensors[0].dtype)  # (N * size,)
        out[: self.numel] = torch.cat([t.reshape(-1) for t in tensors])
        return out

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        self.shard.grad = self.flat(grads)[self.lo : self.hi].clone()  # (size,)
        self.optimizer.step()
        self.write_back(self.gather())

    def gather(self) -> Tensor:
        full = torch.empty(self.size * self.world)  # (N * size,)
        dist.all_gather_single(full, self.shard.detach())
        return full

    def write_back(self, full: Tensor) -> None:
        offset = 0
        for p in self.params:
            p.copy_(full[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


class ShardedAdamW_wrong_slice(ShardedAdamWSteps):  # noqa: N801
    def bounds(self):
        other = (self.rank + 1) % self.world  # the neighbour's slice, gathered into its own place
        return other * self.size, (other + 1) * self.size


class ShardedAdamW_tail_not_covered(ShardedAdamWSteps):  # noqa: N801
    def bounds(self):
        size = self.numel // self.world  # rounded down: the last elements are in no slice
        return self.rank * size, (self.rank + 1) * size

    def gather(self):
        part = torch.empty(len(self.shard) * self.world)  # (N * (numel // N),)
        dist.all_gather_single(part, self.shard.detach())
        full = self.flat([p.detach() for p in self.params])  # (N * size,)
        full[: len(part)] = part  # the elements after N * (numel // N) keep their old values
        return full


class ShardedAdamW_no_all_gather(ShardedAdamWSteps):  # noqa: N801
    def gather(self):
        full = self.flat([p.detach() for p in self.params])  # (N * size,)
        full[self.lo : self.hi] = self.shard.detach()  # only this rank's slice is updated
        return full


class ShardedAdamW_unpadded(ShardedAdamWSteps):  # noqa: N801
    def bounds(self):
        size = self.numel // self.world  # no padding: the last rank's slice takes the rest
        hi = self.numel if self.rank == self.world - 1 else (self.rank + 1) * size
        return self.rank * size, hi

    def gather(self):
        full = torch.empty(self.numel)  # (numel,): the slices differ in length, so this raises
        dist.all_gather_single(full, self.shard.detach())
        return full


ZERO_BUGS = [
    BugVariant(
        "zero.wrong_slice",
        ZERO_ITEM,
        "each rank steps another rank's slice of the parameters, so the all-gather puts every "
        "updated slice in the wrong place",
        "Rank r owns elements r * size to (r + 1) * size of the padded flat vector, size = "
        "ceil(numel / N); take the shard and its gradient from there.",
        ShardedAdamW_wrong_slice,
    ),
    BugVariant(
        "zero.tail_not_covered",
        ZERO_ITEM,
        "the slices are numel // N long, without padding, so the last parameters' elements "
        "belong to no rank's shard and are never updated",
        "Pad the flat vector with zeros to a multiple of N and cut it in N slices of "
        "ceil(numel / N) elements.",
        ShardedAdamW_tail_not_covered,
    ),
    BugVariant(
        "zero.no_all_gather",
        ZERO_ITEM,
        "each rank writes back only its own updated slice; without the all-gather, the other "
        "ranks' slices of its model keep their old values",
        "After the optimizer's step, dist.all_gather_single every rank's slice into the "
        "flat vector and copy all of it into the parameters.",
        ShardedAdamW_no_all_gather,
    ),
    BugVariant(
        "zero.unpadded_shards",
        ZERO_ITEM,
        "the flat vector is cut without padding, so when N does not divide the number of "
        "elements the ranks' slices differ in length, and the all-gather, which needs one "
        "length on every rank, raises",
        "Pad the flat vector with zeros to a multiple of N, give every rank a slice of "
        "ceil(numel / N) elements, all-gather into N * ceil(numel / N) elements and copy the "
        "first numel back into the parameters.",
        ShardedAdamW_unpadded,
    ),
]

BUGS = [*NAIVE_DDP_BUGS, *BUCKETED_BUGS, *ZERO_BUGS]
