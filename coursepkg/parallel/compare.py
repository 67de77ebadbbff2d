"""Each scheme of :mod:`coursepkg.parallel` trained for a few steps, beside one process that
sees the whole batch and beside PyTorch's own implementation of the same scheme.

:func:`train_alone` is the reference: one process, the global batch. :func:`train_ranks` is
what every rank runs (under :func:`~coursepkg.parallel.launch.run_ranks`): the same model from
the same seed, its slice of the same batches, with one scheme. Each returns the weights after
the steps, so the tests and the chapter can set them side by side, and each rank also reports
its bytes of parameters, gradients and optimizer state and its tally of collectives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import TransformerConfig
from ..decoder_only import DecoderOnlyLM
from .comm import Collectives
from .ddp import BucketedDDP, NaiveDDP
from .fsdp import FSDP
from .zero import ShardedOptimizer

__all__ = ["OURS", "PYTORCH", "Run", "split_batch", "train_alone", "train_ranks"]

#: The course's schemes, then PyTorch's (``DistributedDataParallel``, the same with
#: ``ZeroRedundancyOptimizer``, FSDP2's ``fully_shard``).
OURS = ("ddp", "bucketed", "zero1", "fsdp", "fsdp-bf16")
PYTORCH = ("torch-ddp", "torch-zero1", "torch-fsdp", "torch-fsdp-bf16")


@dataclass(frozen=True)
class Run:
    """A tiny training run: the model, the global batch, the steps.

    Attributes:
        model: :class:`~coursepkg.config.TransformerConfig` fields of a decoder-only LM
            (tied embeddings: the output head shares the token embedding).
        batch: the global batch (split among the ranks), length, steps, learning rate.
        bucket_bytes: the bucket size of ``"bucketed"``.
    """

    model: dict = field(
        default_factory=lambda: dict(
            vocab_size=13,
            d_model=9,
            n_heads=3,
            d_ff=16,
            n_layers=2,
            max_len=16,
            dropout=0.0,
            bias=False,
        )
    )
    batch: int = 4
    length: int = 8
    steps: int = 3
    lr: float = 1e-2
    bucket_bytes: int = 1000

    def make_model(self) -> DecoderOnlyLM:
        """The model, from seed 0 (every rank and the reference build the same one)."""
        torch.manual_seed(0)
        return DecoderOnlyLM(TransformerConfig.from_dict(self.model))

    def batches(self) -> list[Tensor]:
        """The global batches, one per step, from their own seeded generator.

        Shape:
            -> steps x (batch, length + 1) token ids.
        """
        g = torch.Generator().manual_seed(1)
        shape = (self.batch, self.length + 1)
        return [
            torch.randint(self.model["vocab_size"], shape, generator=g) for _ in range(self.steps)
        ]


def split_batch(batch: Tensor, rank: int, world_size: int) -> Tensor:
    """Rank ``rank``'s equal slice of a global batch.

    Shape:
        batch (B, ...) -> (B / N, ...).
    """
    if batch.size(0) % world_size:
        raise ValueError(
            f"the global batch of {batch.size(0)} must divide among world_size={world_size} "
            f"ranks in equal slices, so that the mean of their means is the batch's mean"
        )
    size = batch.size(0) // world_size
    return batch[rank * size : (rank + 1) * size]  # (B / N, ...)


def _loss(model: nn.Module, tokens: Tensor) -> Tensor:
    logits = model(tokens[:, :-1])  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def train_alone(run: Run) -> dict[str, Tensor]:
    """One process, the whole batch, AdamW: the weights after ``run.steps`` steps."""
    model = run.make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr)
    for tokens in run.batches():
        optimizer.zero_grad()
        _loss(model, tokens).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _local(tensor: Tensor) -> Tensor:
    """This rank's part of ``tensor`` (a DTensor of PyTorch's FSDP is whole only by name)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors if t is not None)


def _plain(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _ours(scheme: str, model: nn.Module, run: Run, comm: Collectives):
    """(the module to call, the optimizer, what runs after backward, the weights after)."""
    if scheme.startswith("fsdp"):
        dtype = torch.bfloat16 if scheme == "fsdp-bf16" else torch.float32
        sharded = FSDP(model, comm=comm, compute_dtype=dtype)
        return model, torch.optim.AdamW(model.parameters(), lr=run.lr), None, sharded.full_state
    if scheme == "bucketed":
        ddp = BucketedDDP(model, run.bucket_bytes, comm)
    else:
        ddp = NaiveDDP(model, comm)
    if scheme == "zero1":
        optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, comm, lr=run.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr)
    return ddp, optimizer, ddp.sync_gradients, lambda: _plain(model)


def _pytorchs(scheme: str, model: nn.Module, run: Run):
    """PyTorch's version of a scheme, as :func:`_ours` returns it."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    if scheme.startswith("torch-fsdp"):
        bf16 = torch.bfloat16 if scheme == "torch-fsdp-bf16" else None
        policy = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)
        for layer in model.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr)
        return (
            model,
            optimizer,
            None,
            lambda: {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()},
        )
    ddp = DistributedDataParallel(model)
    if scheme == "torch-zero1":
        optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=run.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr)
    return ddp, optimizer, None, lambda: _plain(model)


def _wrap(scheme: str, model: nn.Module, run: Run, comm: Collectives):
    if scheme in OURS:
        return _ours(scheme, model, run, comm)
    if scheme in PYTORCH:
        return _pytorchs(scheme, model, run)
    raise ValueError(f"scheme must be one of {OURS + PYTORCH}, got {scheme!r}")


def _state_bytes(optimizer) -> int:
    inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "optim", optimizer)
    return sum(
        _local(v).numel() * v.element_size()
        for state in inner.state.values()
        for v in state.values()
        if isinstance(v, Tensor)
    )


def train_ranks(rank: int, world_size: int, run: Run, schemes: tuple[str, ...]) -> dict:
    """What each rank runs: for each scheme, ``run`` on this rank's slice of every batch.

    Args:
        rank: this process' rank in the (joined) process group.
        world_size: the number of ranks.
        run: the run, the same on every rank.
        schemes: names from :data:`OURS` and :data:`PYTORCH`.

    Returns:
        ``{scheme: {"weights", "params", "grads", "state", "payload", "calls"}}``: the
        weights after the run (whole), this rank's bytes of parameters, of gradients (after
        the last backward) and of optimizer state, and the collectives' payload bytes and
        calls per kind during the last step (the course's schemes only).
    """
    out = {}
    for scheme in schemes:
        start = time.perf_counter()
        model, comm = run.make_model(), Collectives()
        call, optimizer, sync, weights = _wrap(scheme, model, run, comm)
        for tokens in run.batches():
            comm.reset()
            optimizer.zero_grad()
            _loss(call, split_batch(tokens, rank, world_size)).backward()
            if sync is not None:
                sync()
            grads = _bytes(p.grad for p in model.parameters())
            optimizer.step()
        out[scheme] = dict(
            payload=dict(comm.payload),  # the last step's, before gathering the weights
            calls=dict(comm.calls),
            params=_bytes(model.parameters()),
            grads=grads,
            state=_state_bytes(optimizer),
            weights=weights(),
            seconds=time.perf_counter() - start,
        )
    return out
