"""What each rank of ex15's checks trains, and the one process it is compared with: the
probe model (a seed per rank), the batches, the optimizer the DDP checks step with, the steps
of one rank with the student's code (:func:`train_rank`) and one process on the whole batches
(:func:`train_alone`, the expected weights)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from ...framework import CheckFailure, NotImplementedYet, call_student, generator, randn
from ..ex15_data_parallel_mistakes import BUCKETED_ITEM, NAIVE_DDP_ITEM, ZERO_ITEM

__all__ = [
    "NO_GRAD_STEP",
    "Config",
    "Probe",
    "batches",
    "model_for",
    "optimizer_for",
    "shard_numel",
    "state_numel",
    "train_alone",
    "train_rank",
    "weights_vector",
]

Config = dict[str, Any]


class Probe(nn.Module):
    """The model every rank trains: two linear layers, a gain vector (59 parameters: no slice
    of 2 is even) and a buffer added to the input (so unsynchronised buffers show). Its
    gradients arrive as 12, 84, 28 and then 28 and 84 bytes (the first layer's two in either
    order): a bucket of 130 to 150 bytes is launched during backward and leaves a last one
    partly filled."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 7)
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(7))
        self.out = nn.Linear(7, 3)
        self.register_buffer("offset", torch.randn(3))

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, 3) -> (B, 3)."""
        return self.out(torch.tanh(self.inp(x + self.offset)) * self.gain)  # (B, 3)


def model_for(cfg: Config, rank: int) -> Probe:
    torch.manual_seed(1000 * cfg["seed"] + 17 * rank + 1)  # each rank its own initial weights
    return Probe()


def batches(cfg: Config) -> tuple[Tensor, Tensor]:
    """Inputs (steps, batch, 3) and targets (steps, batch, 3)."""
    gen = generator(cfg["seed"], salt=151)
    return randn(gen, cfg["steps"], cfg["batch"], 3), randn(gen, cfg["steps"], cfg["batch"], 3)


def optimizer_for(item: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    # SGD for the DDP items: Adam would hide a sum (N times the gradient, the same update).
    if item == ZERO_ITEM:
        return torch.optim.AdamW(params, lr=0.05)
    return torch.optim.SGD(params, lr=0.2)


def weights_vector(model: nn.Module) -> Tensor:
    return nn.utils.parameters_to_vector(model.parameters()).detach().clone()  # (59,)


#: The step (from 0) after whose backward the ShardedAdamW check leaves ``gain`` without a
#: gradient, as an unused parameter is: the task says it steps with zeros; skipping it, as
#: ``torch.optim.AdamW`` does for a whole parameter a rank owns, passes too.
NO_GRAD_STEP = 1
_NO_GRAD_NOTE = (
    f"\n(At step {NO_GRAD_STEP + 1} the check leaves gain without a gradient, "
    "p.grad is None: the task says to use zeros for it.)"
)


def train_alone(item: str, cfg: Config, zeros: bool = True) -> Tensor:
    """One process from rank 0's model, the whole batch at every step: the expected weights
    (for ShardedAdamW, ``gain`` at :data:`NO_GRAD_STEP` with a zero gradient, or, not
    ``zeros``, none)."""
    model = model_for(cfg, 0)
    optimizer = optimizer_for(item, list(model.parameters()))
    xs, ys = batches(cfg)
    for step, (x, y) in enumerate(zip(xs, ys, strict=True)):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        if item == ZERO_ITEM and step == NO_GRAD_STEP:
            model.gain.grad = torch.zeros_like(model.gain) if zeros else None
        optimizer.step()
    return weights_vector(model)


def _broadcast_start(model: nn.Module) -> None:
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0)


def _average(model: nn.Module) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def train_rank(item: str, impl: Any, cfg: Config, watch: Any, student: bool) -> dict:
    """Train this rank's model with ``impl``; its weights and the watch's evidence."""
    rank, world = dist.get_rank(), dist.get_world_size()

    def call(fn: Callable, *args: Any) -> Any:
        return call_student(fn, *args, item=item) if student else fn(*args)

    model = model_for(cfg, rank)
    watch.note(f"your {item}(...) before the first step")
    if item == NAIVE_DDP_ITEM:
        wrapper = call(impl, model)
    else:
        _broadcast_start(model)
        wrapper = call(impl, model, cfg["bucket_bytes"]) if item == BUCKETED_ITEM else None
    optimizer = (
        call(impl, list(model.parameters()), 0.05)
        if item == ZERO_ITEM
        else (optimizer_for(item, list(model.parameters())))
    )
    if item == ZERO_ITEM:  # before the first all-reduce: every rank's is kept when one fails
        watch.keep_shard(shard_numel(getattr(optimizer, "optimizer", None)))
    xs, ys = batches(cfg)
    size = cfg["batch"] // world
    for step, (x, y) in enumerate(zip(xs, ys, strict=True)):
        when = f"step {step + 1} of {cfg['steps']}"
        call(optimizer.zero_grad)
        rows = slice(rank * size, (rank + 1) * size)
        watch.note(f"the backward of {when} (your hooks)")
        watch.in_backward = True
        F.mse_loss(model(x[rows]), y[rows]).backward()
        watch.in_backward = False
        if wrapper is not None:
            watch.note(f"your sync_gradients after the backward of {when}")
            call(wrapper.sync_gradients)
        else:
            _average(model)
        no_grad = item == ZERO_ITEM and step == NO_GRAD_STEP
        if no_grad:
            model.gain.grad = None
        watch.note(f"your step() of {when}" if item == ZERO_ITEM else f"the step of {when}")
        try:
            call(optimizer.step)
        except CheckFailure as failure:
            if not no_grad or isinstance(failure, NotImplementedYet):
                raise
            raise CheckFailure(failure.message + _NO_GRAD_NOTE) from None
    state = getattr(optimizer, "optimizer", None) if item == ZERO_ITEM else None
    return {"weights": weights_vector(model), "state": state_numel(state)}


def shard_numel(optimizer: Any) -> int | None:
    """The number of elements ``optimizer`` steps (None unless a torch optimizer)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    return sum(p.numel() for group in optimizer.param_groups for p in group["params"])


def state_numel(optimizer: Any) -> int | None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    return sum(
        v.numel() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
    )
