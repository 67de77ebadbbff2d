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

Each parameter group (``[{"params": matrices, "weight_decay": 0.1}, ...]``) is flattened and
sharded on its own, so groups keep their options; :meth:`ShardedOptimizer.state_dict` gathers
the shards' state whole for a checkpoint, and :meth:`ShardedOptimizer.load_state_dict` cuts it
again, for any number of ranks.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .comm import Collectives, flat_size, flatten, shard_bounds

__all__ = ["ShardedOptimizer", "gather_state", "shard_state"]


class _Group:
    """One parameter group of :class:`ShardedOptimizer`: its parameters laid end to end in one
    flat vector padded to a multiple of N, and this rank's shard of it.

    Attributes:
        params: the group's parameters, each once.
        numel: their number of elements; length: that, padded to a multiple of N.
        lo, hi: where this rank's shard lies in the padded vector.
        shard: this rank's slice, the only tensor of the group it optimizes.
    """

    def __init__(self, params: list[nn.Parameter], comm: Collectives) -> None:
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.length = flat_size(self.numel, comm.world_size)
        self.lo, self.hi = shard_bounds(self.numel, comm.world_size, comm.rank)
        flat = flatten([p.detach() for p in params], self.length)  # (length,)
        self.shard = nn.Parameter(flat[self.lo : self.hi].clone())  # (length / N,)


def _groups(params: Iterable[nn.Parameter] | Iterable[dict]) -> list[dict]:
    """``params`` as parameter groups (dicts), each parameter once over all of them, only
    those that require grad, empty groups left out."""
    groups = list(params)
    if not groups or not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    seen: set[nn.Parameter] = set()
    out = []
    for group in groups:
        kept = [p for p in dict.fromkeys(group["params"]) if p.requires_grad and p not in seen]
        seen.update(kept)
        if kept:
            out.append({**group, "params": kept})
    return out


class ShardedOptimizer:
    """An optimizer whose state is split over the ranks (ZeRO-1).

    Args:
        params: the model's parameters (a tied weight listed twice counts once), or parameter
            groups (dicts with their own options, as for any PyTorch optimizer: each group is
            flattened and sharded on its own); every rank must pass the same ones, in the
            same order.
        optimizer_class: an element-wise optimizer (SGD, Adam, AdamW: one whose update of an
            element depends on that element only).
        comm: the (counted) collectives; a new :class:`Collectives` by default.
        **defaults: passed to ``optimizer_class`` (``lr=...``).

    Attributes:
        groups: one :class:`_Group` per parameter group, each with this rank's ``shard``.
        shard: the first group's shard (with plain parameters, the only one).
        optimizer: the wrapped optimizer, over the shards (one group per shard).
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter] | Iterable[dict],
        optimizer_class: type[torch.optim.Optimizer],
        comm: Collectives | None = None,
        **defaults,
    ) -> None:
        groups = _groups(params)
        if not groups:
            raise ValueError("params must hold at least one parameter that requires grad")
        self.comm = comm if comm is not None else Collectives()
        self.groups = [_Group(group["params"], self.comm) for group in groups]
        self.params = [p for group in self.groups for p in group.params]
        self.shard = self.groups[0].shard
        self.optimizer = optimizer_class(
            [{**g, "params": [s.shard]} for g, s in zip(groups, self.groups, strict=True)],
            **defaults,
        )

    @property
    def param_groups(self) -> list[dict]:
        """The wrapped optimizer's groups (a learning-rate schedule sets ``lr`` here)."""
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients and the shards'."""
        for p in self.params:
            p.grad = None if set_to_none else torch.zeros_like(p)
        self.optimizer.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        """Step this rank's shards with their slices of the (already averaged) gradients,
        then all-gather the updated shards into every rank's parameters."""
        for group in self.groups:
            grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in group.params]
            flat = flatten(grads, group.length)  # (length,)
            group.shard.grad = flat[group.lo : group.hi].clone()  # (length / N,)
        self.optimizer.step()
        for group in self.groups:
            shard = group.shard.detach()  # (length / N,)
            full = torch.empty(group.length, dtype=shard.dtype, device=shard.device)
            self.comm.all_gather(full, shard)  # (length,)
            offset = 0
            for p in group.params:
                p.copy_(full[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def state_dict(self) -> dict:
        """The wrapped optimizer's state, every shard's gathered whole (:func:`gather_state`;
        a collective: every rank must call it)."""
        numels = [group.numel for group in self.groups]
        return gather_state(self.optimizer.state_dict(), numels, self.comm)

    def load_state_dict(self, state: dict) -> None:
        """Take this rank's shards of a state from :meth:`state_dict` (any world size)."""
        numels = [group.numel for group in self.groups]
        self.optimizer.load_state_dict(shard_state(state, numels, self.comm))


@torch.no_grad()
def gather_state(state: dict, numels: list[int], comm: Collectives) -> dict:
    """An optimizer's ``state_dict()`` over flat shards (one per group), made whole.

    Each tensor of the state shaped like its shard (AdamW's moments; not its step count) is
    all-gathered and cut to the group's ``numel`` elements, without the padding, so that the
    state resumes on any number of ranks (a collective: every rank must call it).

    Args:
        state: the ``state_dict()`` of an optimizer whose group i holds one shard of a flat
            vector of ``numels[i]`` elements (padded to a multiple of N, cut in N shards).
        numels: each group's number of elements.
        comm: the collectives.

    Returns:
        The same dict with each shard's tensors whole, ``(numels[i],)``.
    """
    out = {**state, "state": {k: dict(v) for k, v in state["state"].items()}}
    for index, numel in enumerate(numels):
        shard = flat_size(numel, comm.world_size) // comm.world_size
        for key, value in out["state"].get(index, {}).items():
            if torch.is_tensor(value) and value.shape == (shard,):
                full = value.new_empty(shard * comm.world_size)  # (length,)
                comm.all_gather(full, value.contiguous())
                out["state"][index][key] = full[:numel].clone()  # (numel,)
    return out


def shard_state(state: dict, numels: list[int], comm: Collectives) -> dict:
    """The inverse of :func:`gather_state`: this rank's shard of each whole tensor.

    Shape:
        each tensor (numels[i],) -> (length / N,), padded with zeros as the vector is.
    """
    out = {**state, "state": {k: dict(v) for k, v in state["state"].items()}}
    for index, numel in enumerate(numels):
        lo, hi = shard_bounds(numel, comm.world_size, comm.rank)
        for key, value in out["state"].get(index, {}).items():
            if torch.is_tensor(value) and value.shape == (numel,):
                full = flatten([value], flat_size(numel, comm.world_size))  # (length,)
                out["state"][index][key] = full[lo:hi].clone()  # (length / N,)
    return out
