"""The process group ``torchrun`` describes, or a single process when there is none.

``torchrun`` starts one process per rank with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the
rendezvous address in the environment; :func:`setup` joins them with ``gloo`` on CPU and
``nccl`` on CUDA. Without those variables the run is one process and nothing is initialised.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Dist", "setup", "teardown"]


@dataclass
class Dist:
    """Where this process stands.

    Attributes:
        rank: this process' rank (0 writes every file).
        world_size: the number of processes.
        local_rank: its rank on this machine (0 writes the machine's token files).
        device: the device this process trains on.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the only one that writes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether a process group joins several processes."""
        return self.world_size > 1

    def barrier(self) -> None:
        """Wait for every rank (nothing on a single process)."""
        if self.distributed:
            dist.barrier()

    def mean(self, value: torch.Tensor) -> float:
        """The mean of a scalar over the ranks."""
        if self.distributed:
            value = value.clone()
            dist.all_reduce(value)
            value /= self.world_size
        return float(value)

    def total(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of a tensor over the ranks (the tensor itself on a single process)."""
        if self.distributed:
            value = value.clone()
            dist.all_reduce(value)
        return value

    def gather(self, obj: object) -> list[object]:
        """Every rank's ``obj``, in rank order."""
        if not self.distributed:
            return [obj]
        out: list[object] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def _pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but PyTorch sees no CUDA device")
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def _join(backend: str) -> None:
    """``init_process_group`` through the store ``torchrun`` set up, under a prefix of its own
    for each restart: a restarted job must not read the addresses the dead attempt's ranks
    left there (seen with ``--max-restarts``: gloo then dials a port nobody listens on)."""
    from torch.distributed.rendezvous import rendezvous

    store, rank, world_size = next(rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefixed = dist.PrefixStore(f"coursepkg/attempt-{attempt}", store)
    dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world_size)


def setup(device: str) -> Dist:
    """Join the process group ``torchrun`` set up (if any) and pick this rank's device.

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when there is one).

    Returns:
        This process' :class:`Dist`.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    where = _pick_device(device, local_rank)
    if where.type == "cuda":
        torch.cuda.set_device(where)
    if world_size == 1:
        return Dist(device=where)
    if not dist.is_initialized():
        _join(backend="nccl" if where.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, where)


def teardown() -> None:
    """Leave the process group, if one was joined."""
    if dist.is_initialized():
        dist.destroy_process_group()
