"""Sharded optimizer state (ZeRO stage 1), written plainly.

With data parallelism every rank runs the same optimizer step on the same mean gradients, so
every rank holds the whole optimizer state: for AdamW two numbers per parameter, twice the
model. :class:`ShardedOptimizer` cuts the parameters, laid end to end in one flat vector padded
to a multiple of N, into N equal shards: rank r keeps the optimizer state of shard r only, steps
that shard, and an all-gather hands every rank the updated vector. The optimizer state per rank
falls to 1/N; the gradients are still averaged whole (by :class:`~coursepkg.parallel.ddp.NaiveDDP`
or :class:`~coursepkg.parallel.ddp.BucketedDDP`), as with PyTorch's ``ZeroRedundancyOptimizer``.

Use::

    ddp = NaiveDDP(model)
    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss_fn(ddp(tokens)).backward()
    ddp.sync_gradients()
    optimizer.step()
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .comm import Collectives, flat_size, flatten, shard_bounds

__all__ = ["ShardedOptimizer"]


class ShardedOptimizer:
    """An optimizer whose state is split over the ranks (ZeRO-1).

    Args:
        params: the model's parameters (a tied weight listed twice counts once); every rank
            must pass the same ones, in the same order.
        optimizer_class: an element-wise optimizer (SGD, Adam, AdamW: one whose update of an
            element depends on that element only).
        comm: the (counted) collectives; a new :class:`Collectives` by default.
        **defaults: passed to ``optimizer_class`` (``lr=...``).

    Attributes:
        shard: this rank's slice of the flat parameter vector, the only tensor it optimizes.
        optimizer: the wrapped optimizer, over ``[shard]``.
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        optimizer_class: type[torch.optim.Optimizer],
        comm: Collectives | None = None,
        **defaults,
    ) -> None:
        self.params = [p for p in dict.fromkeys(params) if p.requires_grad]
        if not self.params:
            raise ValueError("params must hold at least one parameter that requires grad")
        self.comm = comm if comm is not None else Collectives()
        self.numel = sum(p.numel() for p in self.params)
        self.length = flat_size(self.numel, self.comm.world_size)
        self.lo, self.hi = shard_bounds(self.numel, self.comm.world_size, self.comm.rank)
        flat = flatten([p.detach() for p in self.params], self.length)  # (length,)
        self.shard = nn.Parameter(flat[self.lo : self.hi].clone())  # (length / N,)
        self.optimizer = optimizer_class([self.shard], **defaults)

    @property
    def param_groups(self) -> list[dict]:
        """The wrapped optimizer's groups (a learning-rate schedule sets ``lr`` here)."""
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients and the shard's."""
        for p in self.params:
            p.grad = None if set_to_none else torch.zeros_like(p)
        self.optimizer.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        """Step this rank's shard with its slice of the (already averaged) gradients, then
        all-gather the updated shards into every rank's parameters."""
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        self.shard.grad = flatten(grads, self.length)[self.lo : self.hi].clone()  # (length / N,)
        self.optimizer.step()
        full = torch.empty(self.length, dtype=self.shard.dtype, device=self.shard.device)
        self.comm.all_gather(full, self.shard.detach())  # (length,)
        offset = 0
        for p in self.params:
            p.copy_(full[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
