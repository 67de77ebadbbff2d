"""Data parallelism written plainly: every rank holds the whole model, sees its slice of the
batch, and the ranks average their gradients before the optimizer steps.

:class:`NaiveDDP` all-reduces each gradient after backward has finished. :class:`BucketedDDP`
starts the all-reduces during backward instead: a hook on each parameter notes when its
gradient is complete, and once every gradient of a bucket (a group of about ``bucket_bytes``)
is ready the bucket's all-reduce is launched asynchronously, so communication overlaps the rest
of backward. Both equal one process that sees the whole batch (``tests/parallel/``), as
PyTorch's ``DistributedDataParallel`` does.

Use::

    ddp = BucketedDDP(model, bucket_bytes=2**20)
    loss_fn(ddp(tokens)).backward()
    ddp.sync_gradients()        # wait for the buckets; every rank now holds the mean gradient
    optimizer.step()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .comm import Collectives, flatten

__all__ = ["BucketedDDP", "NaiveDDP", "make_buckets"]


class NaiveDDP(nn.Module):
    """Wrap ``module`` so that every rank starts from rank 0's weights and averages gradients.

    Args:
        module: the model; after wrapping, its parameters and buffers are rank 0's.
        comm: the (counted) collectives; a new :class:`Collectives` by default.
        broadcast_buffers: copy rank 0's buffers to every rank before each forward, as
            PyTorch's DDP does (a buffer a forward changes, like a running mean, stays equal).
    """

    def __init__(
        self, module: nn.Module, comm: Collectives | None = None, broadcast_buffers: bool = True
    ) -> None:
        super().__init__()
        self.module = module
        self.comm = comm if comm is not None else Collectives()
        self.broadcast_buffers = broadcast_buffers
        self.syncing = True  # False inside no_sync(): gradients accumulate, nothing is sent
        # parameters() lists a tied weight once: it is one tensor, with one gradient.
        self.params = [p for p in module.parameters() if p.requires_grad]
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                self.comm.broadcast(tensor, src=0)

    def forward(self, *args, **kwargs):
        """The wrapped module's forward (after rank 0's buffers are copied, if asked)."""
        if self.broadcast_buffers:
            with torch.no_grad():
                for buffer in self.module.buffers():
                    self.comm.broadcast(buffer, src=0)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside accumulates gradients locally (the micro-steps of gradient
        accumulation but the last); call :meth:`sync_gradients` after the last one."""
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    def sync_gradients(self) -> None:
        """After backward: replace each gradient by its mean over the ranks."""
        for p in self.params:
            if p.grad is None:  # not used by this rank's forward: it contributes zeros
                p.grad = torch.zeros_like(p)
            self.comm.all_reduce(p.grad)
            p.grad /= self.comm.world_size


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one all-reduce.

    Attributes:
        params: the parameters, in the order their gradients usually become ready.
        ready: how many of them have their gradient for this step.
        flat: the gradients, flattened, while their all-reduce runs (None otherwise).
        handle: the all-reduce's handle to ``wait()`` on (None before it is launched).
    """

    params: list[nn.Parameter]
    ready: int = 0
    flat: Tensor | None = None
    handle: object = field(default=None, repr=False)


def make_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[Bucket]:
    """Cut ``params``, in the order given, into buckets of at most ``bucket_bytes`` of
    gradient each (a parameter larger than that gets a bucket of its own).

    Args:
        params: the parameters, in the order their gradients are expected.
        bucket_bytes: the most bytes of gradient per bucket, > 0.

    Returns:
        The buckets, in the same order.
    """
    if not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be a positive int, got {bucket_bytes!r}")
    buckets: list[Bucket] = []
    size = bucket_bytes  # full: the first parameter opens a bucket
    for p in params:
        nbytes = p.numel() * p.element_size()
        if size + nbytes > bucket_bytes:
            buckets.append(Bucket([]))
            size = 0
        buckets[-1].params.append(p)
        size += nbytes
    return buckets


class BucketedDDP(NaiveDDP):
    """:class:`NaiveDDP` whose all-reduces overlap backward, one per bucket of gradients.

    Args:
        module: the model (see :class:`NaiveDDP`).
        bucket_bytes: the most bytes of gradient per bucket.
        comm: the (counted) collectives.
        broadcast_buffers: see :class:`NaiveDDP`.
    """

    def __init__(
        self,
        module: nn.Module,
        bucket_bytes: int = 2**20,
        comm: Collectives | None = None,
        broadcast_buffers: bool = True,
    ) -> None:
        super().__init__(module, comm, broadcast_buffers)
        # Backward meets the parameters roughly in reverse order of definition: the last
        # layer's gradients are ready first, so they fill the first bucket.
        self.buckets = make_buckets(self.params[::-1], bucket_bytes)
        for bucket in self.buckets:
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(self._hook(bucket))

    def _hook(self, bucket: Bucket):
        def gradient_ready(param: nn.Parameter) -> None:
            # Called once per backward, after the gradient is complete (a tied weight's too).
            if not self.syncing:  # a micro-step of accumulation: the sum is not final yet
                return
            bucket.ready += 1
            if bucket.ready == len(bucket.params):
                self._launch(bucket)

        return gradient_ready

    def _launch(self, bucket: Bucket) -> None:
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in bucket.params]
        bucket.flat = flatten(grads, sum(g.numel() for g in grads))  # (bucket's numel,)
        bucket.handle = self.comm.all_reduce(bucket.flat, async_op=True)

    def sync_gradients(self) -> None:
        """After backward: wait for every bucket's all-reduce and set the mean gradients.

        A bucket some of whose parameters got no gradient this step (unused by this rank's
        forward) is launched here, its missing gradients counted as zeros.
        """
        for bucket in self.buckets:
            if bucket.handle is None:
                self._launch(bucket)
        for bucket in self.buckets:
            bucket.handle.wait()
            offset = 0
            for p in bucket.params:
                mean = bucket.flat[offset : offset + p.numel()] / self.comm.world_size
                p.grad = mean.view_as(p).clone()  # (shape of p)
                offset += p.numel()
            bucket.ready, bucket.flat, bucket.handle = 0, None, None
