"""Assignment ex15_data_parallel: data parallelism written by hand (chapter 17): naive DDP's
initial broadcast and gradient averaging, the bucketed all-reduces that start during backward,
and the step of an optimizer whose state is sharded over the ranks (ZeRO stage 1).

Every rank runs the same code on its own slice of the batch; the checks start 2 ranks on this
machine (gloo over 127.0.0.1), with the process group already joined, and call your code on
each. Use ``torch.distributed`` (imported as ``dist``): ``dist.get_rank()``,
``dist.get_world_size()``, ``dist.broadcast(tensor, src)``, ``dist.all_reduce(tensor)`` (a sum,
in place; ``async_op=True`` returns a handle whose ``wait()`` blocks until it is done) and
``dist.all_gather_single(output, shard)``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist  # noqa: F401  (you will need it)
from torch import nn


class NaiveDDP:
    """Data parallelism, the plain way: one copy of the model per rank, gradients averaged.

    ``__init__`` makes every rank start from rank 0's model: it copies rank 0's parameters
    *and buffers* into every rank's (``dist.broadcast``, in place, under ``torch.no_grad()``).
    ``sync_gradients``, called after ``loss.backward()`` and before the optimizer's step,
    replaces each parameter's ``.grad`` by its mean over the ranks (the all-reduce sums; divide
    by the world size). Then every rank takes the same step, which equals one process taking it
    on the whole batch.

    Args:
        model: this rank's model (built from another seed on each rank).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        raise NotImplementedError

    def sync_gradients(self) -> None:
        """After backward: every parameter's gradient becomes its mean over the ranks (a
        parameter whose ``grad`` is None is left alone)."""
        raise NotImplementedError


class BucketedDDP:
    """Gradients averaged in buckets whose all-reduces start during backward.

    ``__init__`` registers a hook on every parameter
    (``p.register_post_accumulate_grad_hook(fn)``: ``fn(p)`` runs once ``p.grad`` is complete).
    The hooks gather the parameters in the order their gradients arrive into the current
    bucket; once its gradients hold at least ``bucket_bytes`` bytes, the bucket's gradients are
    flattened into one tensor and its all-reduce is launched asynchronously
    (``dist.all_reduce(flat, async_op=True)``, keeping the handle), and a new bucket starts.
    ``sync_gradients``, called after ``loss.backward()``, launches the last bucket if it is not
    empty, waits on every handle, and writes each parameter's mean gradient back into its
    ``.grad``; the next backward starts with empty buckets. The checks broadcast the initial
    weights themselves (that is :class:`NaiveDDP`'s work).

    Args:
        model: this rank's model.
        bucket_bytes: the bytes of gradient at which a bucket is launched, > 0.
    """

    def __init__(self, model: nn.Module, bucket_bytes: int) -> None:
        self.model = model
        self.bucket_bytes = bucket_bytes
        raise NotImplementedError

    def sync_gradients(self) -> None:
        """After backward: flush the last bucket, wait for every all-reduce, set the means."""
        raise NotImplementedError


class ShardedAdamW:
    """AdamW whose state is split over the ranks (ZeRO stage 1).

    Lay the parameters end to end in one flat vector of ``numel`` elements and pad it with
    zeros to a multiple of the world size N; rank r owns the r-th of N equal slices. In
    ``__init__``, keep a copy of your slice as an ``nn.Parameter`` (``self.shard``) and build
    ``self.optimizer = torch.optim.AdamW([self.shard], lr=lr)``: only your slice has optimizer
    state, 1/N of the whole. ``step`` (the gradients are already averaged) sets
    ``self.shard.grad`` to your slice of the flat gradient (zeros for a parameter without one),
    steps ``self.optimizer``, then all-gathers the updated slices of every rank into the flat
    vector and copies it back into the parameters (under ``torch.no_grad()``).

    Args:
        params: the model's parameters, the same ones in the same order on every rank.
        lr: AdamW's learning rate.
    """

    def __init__(self, params: list[nn.Parameter], lr: float) -> None:
        self.params = list(params)
        raise NotImplementedError

    def zero_grad(self) -> None:
        """Clear the parameters' gradients (written for you)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Step this rank's slice, then all-gather every rank's into the parameters."""
        raise NotImplementedError
