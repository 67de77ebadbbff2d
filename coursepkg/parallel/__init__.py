"""Training on several processes, written plainly: data parallelism (naive, then overlapped in
buckets), sharded optimizer state (ZeRO-1), fully sharded data parallelism (FSDP), activation
checkpointing, and the memory and communication each costs.

Each scheme is a short module over ``torch.distributed`` (gloo on CPU, nccl on CUDA) whose
collectives are counted (:mod:`~coursepkg.parallel.comm`); ``tests/parallel/`` proves each equal
to one process with the whole batch and to PyTorch's own implementation.
"""

from .comm import Collectives, ring_bytes_sent
from .ddp import BucketedDDP, NaiveDDP
from .fsdp import FSDP
from .launch import run_ranks
from .zero import ShardedOptimizer

__all__ = [
    "FSDP",
    "BucketedDDP",
    "Collectives",
    "NaiveDDP",
    "ShardedOptimizer",
    "ring_bytes_sent",
    "run_ranks",
]
