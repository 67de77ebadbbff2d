"""How the ranks of ``coursepkg train`` share the work: each ``--parallel`` scheme set up on the
model, with its optimizer, its clipping and its checkpoint state.

- replicated (``ddp``, ``course-ddp``, ``course-bucketed``, and one process): every rank holds
  the whole model and optimizer; the gradients are averaged;
- ``zero1`` / ``course-zero1``: the gradients are averaged as with DDP, but each rank keeps the
  optimizer state of its shard of the parameters only (PyTorch's ``ZeroRedundancyOptimizer``,
  or :class:`~coursepkg.parallel.zero.ShardedOptimizer`);
- ``fsdp`` / ``course-fsdp``: parameters, gradients and optimizer state all sharded, block by
  block (PyTorch's FSDP2 ``fully_shard``, or :class:`~coursepkg.parallel.fsdp.FSDP`). A forward
  needs every rank, so every rank evaluates and samples too (rank 0 alone writes).

A sharded checkpoint is gathered whole on rank 0 into the one file a replicated run writes: the
model's weights under their usual names, and the optimizer state of the scheme's own layout
(:attr:`Scheme.layout`), every shard made whole, so that a run resumes bit-identically, on any
number of ranks, with the scheme that wrote it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as tdist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from coursepkg.decoder_only import DecoderOnlyLM
from coursepkg.fast_optim import FusedAdamW, foreach_clip_grad_norm_
from coursepkg.optim import AdamW, param_groups
from coursepkg.parallel.comm import flatten, shard_bounds
from coursepkg.parallel.ddp import BucketedDDP, NaiveDDP
from coursepkg.parallel.fsdp import FSDP
from coursepkg.parallel.zero import ShardedOptimizer, gather_state, shard_state
from coursepkg.training.distributed import Dist
from coursepkg.training.settings import TrainSettings

__all__ = ["SHARDED", "Scheme", "make_scheme"]

#: The schemes that shard something (the optimizer state, or everything).
SHARDED = ("zero1", "course-zero1", "fsdp", "course-fsdp")


class Scheme:
    """The replicated scheme: the whole model and optimizer on every rank.

    Args:
        net: the model (on its device, with the checkpoint's weights if resuming).
        settings: the run: a :class:`TrainSettings` or a fine-tuning's settings (what the
            scheme reads: ``parallel``, ``compile``, ``lr``, ``beta1``, ``beta2``,
            ``weight_decay``).
        dist: this process' place among the ranks.

    Attributes:
        net: the model whose weights are saved.
        model: what the step calls (``net`` in DDP and/or compiled).
        optimizer: the course's AdamW (an ``optimizer_class``), or its sharded form.
        optimizer_class: :class:`~coursepkg.fast_optim.FusedAdamW`, the course's AdamW by
            PyTorch's fused kernel (one pass over the memory), or the plain
            :class:`~coursepkg.optim.AdamW`.
        layout: the name of the checkpoint's optimizer-state layout.
        every_rank_computes: a forward needs every rank (evaluation and sampling run on all).
    """

    layout = "replicated"
    every_rank_computes = False
    optimizer_class: type[AdamW] = FusedAdamW

    def __init__(self, net: nn.Module, settings: TrainSettings, dist: Dist) -> None:
        self.net, self.settings, self.dist = net, settings, dist
        self.model = self._wrap()
        self.optimizer = self._optimizer(param_groups(net, settings.weight_decay))

    def _optimizer(self, groups: list[dict]):
        s = self.settings
        return self.optimizer_class(groups, lr=s.lr, betas=(s.beta1, s.beta2))

    def _wrap(self) -> nn.Module:
        """``net`` in PyTorch's or the course's DDP, compiled if asked (inside the course's
        DDP, whose ``sync_gradients`` the step calls)."""
        net, s, dist = self.net, self.settings, self.dist
        if dist.distributed and s.parallel.startswith("course-"):
            inner = torch.compile(net) if s.compile else net
            if s.parallel in ("course-bucketed", "course-zero1"):
                return BucketedDDP(inner)
            return NaiveDDP(inner)
        model = net
        if dist.distributed:
            ids = [dist.device.index] if dist.device.type == "cuda" else None
            # An expert no token chose in a micro-batch gets no gradient: DDP must be told.
            unused = net.config.moe is not None
            model = DistributedDataParallel(net, device_ids=ids, find_unused_parameters=unused)
        return torch.compile(model) if s.compile else model

    def no_sync(self):
        """The context of a micro-step but the last: gradients accumulate, nothing is sent."""
        if self.dist.distributed and hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def sync(self) -> None:
        """After the last micro-step's backward: the course's DDP averages when asked."""
        if isinstance(self.model, NaiveDDP):
            self.model.sync_gradients()

    def clip(self, max_norm: float) -> None:
        """Clip the global gradient norm to ``max_norm`` (every rank holds every gradient)."""
        foreach_clip_grad_norm_(self.net.parameters(), max_norm)

    def model_state(self) -> dict[str, Tensor]:
        """The weights, whole, under the plain model's names (a collective when sharded)."""
        return self.net.state_dict()

    def optimizer_state(self) -> dict[str, Any] | None:
        """The optimizer state, whole, on rank 0 (a collective when sharded)."""
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Put a state from :meth:`optimizer_state` in place (on every rank)."""
        self.optimizer.load_state_dict(state)

    def plain_model(self) -> DecoderOnlyLM:
        """The trained model as one unsharded module (a collective when sharded)."""
        return self.net


class _TorchZero(Scheme):
    """``zero1``: PyTorch's DDP and ``ZeroRedundancyOptimizer`` over the course's AdamW."""

    layout = "zero1"

    def _optimizer(self, groups: list[dict]):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        s = self.settings
        return ZeroRedundancyOptimizer(
            groups, optimizer_class=AdamW, lr=s.lr, betas=(s.beta1, s.beta2)
        )

    def optimizer_state(self) -> dict[str, Any] | None:
        self.optimizer.consolidate_state_dict(to=0)
        return self.optimizer.state_dict() if self.dist.is_main else None


class _CourseZero(Scheme):
    """``course-zero1``: the course's bucketed DDP and :class:`ShardedOptimizer`."""

    layout = "course-zero1"

    def _optimizer(self, groups: list[dict]):
        s = self.settings
        return ShardedOptimizer(groups, AdamW, lr=s.lr, betas=(s.beta1, s.beta2))


def _sharded_clip(grads: list[Tensor], max_norm: float, eps: float = 1e-6) -> None:
    """Clip gradients spread over the ranks (each rank holding its shards) to a global norm
    of ``max_norm``: the squares are summed on each rank, then over the ranks."""
    squares = torch.zeros((), dtype=torch.float32, device=grads[0].device if grads else "cpu")
    for g in grads:
        squares += g.detach().float().pow(2).sum()
    tdist.all_reduce(squares)
    scale = (max_norm / (squares.sqrt() + eps)).clamp(max=1.0)
    for g in grads:
        g.detach().mul_(scale.to(g.dtype))


class _TorchFSDP(Scheme):
    """``fsdp``: PyTorch's FSDP2, ``fully_shard`` on each block, then on the model."""

    layout = "fsdp"
    every_rank_computes = True
    optimizer_class = AdamW  # the plain one: the fused kernel is untested on DTensors here

    def _wrap(self) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        for block in self.net.layers:
            fully_shard(block)
        fully_shard(self.net)
        return self.net

    def clip(self, max_norm: float) -> None:
        grads = [p.grad for p in self.net.parameters() if p.grad is not None]
        _sharded_clip([g.to_local() if hasattr(g, "to_local") else g for g in grads], max_norm)

    def _options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True)

    def model_state(self) -> dict[str, Tensor]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(self.net, options=self._options())
        return {k: v.cpu() for k, v in state.items()}

    def optimizer_state(self) -> dict[str, Any] | None:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.net, self.optimizer, options=self._options())

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.net, self.optimizer, state, options=self._options())

    def plain_model(self) -> DecoderOnlyLM:
        state = self.model_state()
        plain = DecoderOnlyLM(self.net.config)
        plain.load_state_dict(state)
        return plain


class _CourseFSDP(_TorchFSDP):
    """``course-fsdp``: the course's :class:`FSDP`, one unit per block, then the model.

    A unit's parameters are one flat vector, so AdamW sees one tensor per unit; the decay of
    matrices only (:func:`~coursepkg.optim.param_groups`) becomes a per-element mask over the
    unit's shard (``weight_decay`` where a matrix lies, 0 elsewhere).
    """

    layout = "course-fsdp"

    def _wrap(self) -> nn.Module:
        self.fsdp = FSDP(self.net)
        return self.net

    def _optimizer(self, groups: list[dict]):
        s, comm = self.settings, self.fsdp.comm
        masked = []
        for unit in self.fsdp.units:
            lo, hi = shard_bounds(unit.numel, comm.world_size, comm.rank)
            decays = [
                torch.full((p.numel(),), s.weight_decay if p.dim() >= 2 else 0.0)
                for p in unit.params
            ]
            mask = flatten(decays, unit.length)[lo:hi].to(unit.shard.device)  # (length / N,)
            masked.append({"params": [unit.shard], "weight_decay": mask})
        return super()._optimizer(masked)

    def clip(self, max_norm: float) -> None:
        shards = [unit.shard.grad for unit in self.fsdp.units if unit.shard.grad is not None]
        _sharded_clip(shards, max_norm)

    def _numels(self) -> list[int]:
        return [unit.numel for unit in self.fsdp.units]

    def model_state(self) -> dict[str, Tensor]:
        buffers = {k: v for k, v in self.net.state_dict().items() if "fsdp_shard" not in k}
        return {**buffers, **self.fsdp.full_state()}

    def optimizer_state(self) -> dict[str, Any] | None:
        state = gather_state(self.optimizer.state_dict(), self._numels(), self.fsdp.comm)
        for group in state["param_groups"]:
            group.pop("weight_decay")  # this world size's mask: rebuilt on loading
        return state

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        state = shard_state(state, self._numels(), self.fsdp.comm)
        groups = [dict(g) for g in state["param_groups"]]
        for group, current in zip(groups, self.optimizer.param_groups, strict=True):
            group["weight_decay"] = current["weight_decay"]
        self.optimizer.load_state_dict({**state, "param_groups": groups})


def make_scheme(net: nn.Module, settings: TrainSettings, dist: Dist) -> Scheme:
    """The :class:`Scheme` of ``settings.parallel`` (the replicated one on a single process,
    where there is nothing to shard)."""
    scheme = settings.parallel if dist.distributed else "one process"
    kinds = {"zero1": _TorchZero, "course-zero1": _CourseZero}
    kinds |= {"fsdp": _TorchFSDP, "course-fsdp": _CourseFSDP}
    return kinds.get(scheme, Scheme)(net, settings, dist)
