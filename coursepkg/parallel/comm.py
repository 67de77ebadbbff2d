"""The collectives every scheme of :mod:`coursepkg.parallel` calls, counted as they go.

A scheme never calls ``torch.distributed`` itself: it calls a :class:`Collectives`, which passes
the call on and adds the tensor's bytes to a tally per kind of collective. The tally is what the
tests set against the closed forms of :mod:`coursepkg.parallel.memory`.

What is counted is the *payload*: the bytes of the whole tensor the collective works on (for an
all-gather the gathered tensor, for a reduce-scatter the tensor before scattering). What one
rank actually sends with a ring algorithm follows from it (:func:`ring_bytes_sent`).
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Collectives", "flat_size", "flatten", "ring_bytes_sent", "shard_bounds"]

# PyTorch renamed the one-tensor collectives ``all_gather_single`` and ``reduce_scatter_single``
# in 2026 (pytorch/pytorch#186123) and deprecated the old names; releases before that (the
# package allows torch>=2.2) have them only as ``all_gather_into_tensor`` and
# ``reduce_scatter_tensor``.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def ring_bytes_sent(kind: str, payload: int, world_size: int) -> float:
    """The bytes one rank sends for a collective on ``payload`` bytes, ring algorithm.

    An all-reduce is a reduce-scatter followed by an all-gather: each rank sends ``(N-1)/N``
    of the tensor in each half. A broadcast is counted as a pipelined chain, where each rank
    but the last forwards the whole tensor: ``(N-1)/N`` of it on average.

    Args:
        kind: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"`` or ``"broadcast"``.
        payload: the collective's tensor, in bytes (see the module's docstring).
        world_size: N, the number of ranks.

    Returns:
        The bytes sent by one rank (on average over the ranks).
    """
    share = (world_size - 1) / world_size
    factors = {"all_reduce": 2 * share, "all_gather": share, "reduce_scatter": share}
    factors["broadcast"] = share
    if kind not in factors:
        raise ValueError(f"kind must be one of {sorted(factors)}, got {kind!r}")
    return factors[kind] * payload


class Collectives:
    """``torch.distributed``'s collectives on the default group, each call's payload tallied.

    Attributes:
        payload: bytes per kind of collective since the last :meth:`reset`.
        calls: number of calls per kind since the last :meth:`reset`.
        rank: this process' rank.
        world_size: the number of ranks.
    """

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise RuntimeError("Collectives needs a process group: call init_process_group first")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.payload: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def reset(self) -> None:
        """Start a new tally (at the start of a step, say)."""
        self.payload.clear()
        self.calls.clear()

    def _count(self, kind: str, tensor: Tensor) -> None:
        self.payload[kind] += tensor.numel() * tensor.element_size()
        self.calls[kind] += 1

    def all_reduce(self, tensor: Tensor, async_op: bool = False):
        """Sum ``tensor`` over the ranks, in place (a handle to ``wait()`` on when async)."""
        self._count("all_reduce", tensor)
        return dist.all_reduce(tensor, async_op=async_op)

    def broadcast(self, tensor: Tensor, src: int, async_op: bool = False):
        """Copy rank ``src``'s ``tensor`` into every rank's, in place."""
        self._count("broadcast", tensor)
        return dist.broadcast(tensor, src, async_op=async_op)

    def all_gather(self, output: Tensor, shard: Tensor, async_op: bool = False):
        """Every rank's ``shard``, in rank order, into ``output``.

        Shape:
            shard (n,) -> output (N * n,).
        """
        self._count("all_gather", output)
        return _all_gather(output, shard, async_op=async_op)

    def reduce_scatter(self, output: Tensor, tensor: Tensor, async_op: bool = False):
        """Sum ``tensor`` over the ranks and keep this rank's slice of the sum in ``output``.

        Shape:
            tensor (N * n,) -> output (n,), the slice ``rank * n : (rank + 1) * n``.
        """
        self._count("reduce_scatter", tensor)
        return _reduce_scatter(output, tensor, async_op=async_op)

    def sent(self) -> float:
        """The bytes this rank sent since the last :meth:`reset` (:func:`ring_bytes_sent`)."""
        return sum(ring_bytes_sent(k, b, self.world_size) for k, b in self.payload.items())


def flat_size(numel: int, world_size: int) -> int:
    """``numel`` rounded up to a multiple of ``world_size``: the padded length of a flat
    tensor cut into ``world_size`` equal shards."""
    return -(-numel // world_size) * world_size


def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """Where rank ``rank``'s shard lies in the padded flat tensor of :func:`flat_size`."""
    size = flat_size(numel, world_size) // world_size
    return rank * size, (rank + 1) * size


def flatten(tensors: list[Tensor], length: int) -> Tensor:
    """``tensors`` one after the other in a new flat tensor of ``length`` (zeros after them)."""
    flat = torch.zeros(length, dtype=tensors[0].dtype, device=tensors[0].device)
    joined = torch.cat([t.reshape(-1) for t in tensors])  # (sum of numel,)
    flat[: joined.numel()] = joined
    return flat
