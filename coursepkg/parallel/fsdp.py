"""Fully sharded data parallelism (FSDP), written plainly.

The model is cut into *units* (each block of the reference, then the rest of the model). Each
unit's parameters are laid end to end in one flat vector padded to a multiple of N; rank r keeps
only shard r of it, as one ``nn.Parameter``, with its gradient and optimizer state. So a rank
holds 1/N of everything, and a unit is whole only while it computes:

- forward: just before the unit runs, its shards are all-gathered into the full vector and the
  unit's parameters become views of it; just after, the views are dropped and the full vector
  freed. What backward needs of the parameters is not kept: a saved-tensor hook records *where*
  in the vector a saved parameter lay, not the tensor;
- backward: the first time the unit's backward asks for a parameter, the vector is all-gathered
  again; when the unit's gradient is complete it is reduce-scattered (summed over the ranks,
  each keeping its shard's slice), divided by N, and freed.

With ``compute_dtype`` (bfloat16, say) the gathered parameters and the gradients travel and
compute in that dtype, while the shards the optimizer updates stay in float32 (mixed precision).

**Replicated parameters.** By default every parameter is sharded (as PyTorch's ``fully_shard``
does). ``replicate`` names parameters to keep whole on every rank instead, as DDP would: their
gradients are all-reduced (averaged) as soon as backward has accumulated each one. Sharding a
LayerNorm's weight saves a few hundred bytes per rank and costs a gather per forward and per
backward; DeepSpeed's ZeRO-3 keeps every parameter under ``stage3_param_persistence_threshold``
elements whole for that reason. :func:`smaller_than` names such parameters by size.

Use::

    fsdp = FSDP(model, units=[*model.layers, model])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)   # the shards
    loss_fn(model(tokens)).backward()
    optimizer.step()
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.autograd.graph import saved_tensors_hooks

from .comm import Collectives, flat_size, flatten, shard_bounds

__all__ = ["FSDP", "Unit", "smaller_than"]

#: ``keep(name, parameter) -> bool``: True for a parameter to keep whole on every rank.
Replicate = Callable[[str, nn.Parameter], bool]


@dataclass(frozen=True)
class _Where:
    """A saved parameter, as a place in its unit's full vector."""

    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _Gather(torch.autograd.Function):
    """Forward: all-gather a unit's shards. Backward: reduce-scatter its gradient."""

    @staticmethod
    def forward(ctx, shard: Tensor, unit: Unit) -> Tensor:
        ctx.unit = unit
        return unit.gather()  # (length,)

    @staticmethod
    def backward(ctx, grad_full: Tensor) -> tuple[Tensor, None]:
        unit = ctx.unit
        unit.regathered = None  # the unit's backward is over: free its full vector
        return unit.scatter_gradient(grad_full), None  # (length / N,)


class Unit:
    """One unit of :class:`FSDP`: a module whose own parameters are sharded together.

    Args:
        module: the unit's module.
        params: its parameters (those no inner unit took), each once.
        comm: the (counted) collectives.
        compute_dtype: the dtype parameters are gathered and gradients reduced in.

    Attributes:
        shard: rank r's slice of the flat vector, float32 (the parameter the optimizer sees).
        regathered: the full vector gathered again during backward (None otherwise).
    """

    def __init__(
        self,
        module: nn.Module,
        params: list[nn.Parameter],
        comm: Collectives,
        compute_dtype: torch.dtype,
    ) -> None:
        self.module, self.params, self.comm = module, params, comm
        self.compute_dtype = compute_dtype
        # Where each parameter lives: (submodule, attribute) pairs; a tied weight has several.
        self.places = [
            [(m, n) for m in module.modules() for n, q in m._parameters.items() if q is p]
            for p in params
        ]
        self.numel = sum(p.numel() for p in params)
        self.length = flat_size(self.numel, comm.world_size)
        lo, hi = shard_bounds(self.numel, comm.world_size, comm.rank)
        flat = flatten([p.detach().float() for p in params], self.length)  # (length,)
        self.shard = nn.Parameter(flat[lo:hi].clone())  # (length / N,)
        self.full: Tensor | None = None
        self.regathered: Tensor | None = None
        for places in self.places:
            for m, n in places:
                del m._parameters[n]
        module.register_parameter("fsdp_shard", self.shard)
        module.register_forward_pre_hook(self._before_forward)
        module.register_forward_hook(self._after_forward)

    def gather(self) -> Tensor:
        """Every rank's shard, in ``compute_dtype``, into the full vector.

        Shape:
            -> (length,), the unit's parameters end to end, then padding.
        """
        shard = self.shard.detach().to(self.compute_dtype)  # (length / N,)
        full = torch.empty(self.length, dtype=self.compute_dtype, device=shard.device)
        self.comm.all_gather(full, shard)
        return full

    def scatter_gradient(self, grad_full: Tensor) -> Tensor:
        """The mean over the ranks of this rank's slice of ``grad_full``, in float32.

        Shape:
            grad_full (length,) -> (length / N,).
        """
        grad_full = grad_full.to(self.compute_dtype).contiguous()  # (length,)
        out = grad_full.new_empty(self.length // self.comm.world_size)  # (length / N,)
        self.comm.reduce_scatter(out, grad_full)  # (length / N,)
        return out.float() / self.comm.world_size

    def _set_views(self, full: Tensor | None) -> None:
        offset = 0
        for p, places in zip(self.params, self.places, strict=True):
            # a view of its stretch of the vector, in its own shape (p.shape)
            view = None if full is None else full[offset : offset + p.numel()].view(p.shape)
            for m, n in places:
                setattr(m, n, view)
            offset += p.numel()

    def _before_forward(self, module, args):
        self.full = _Gather.apply(self.shard, self)  # (length,)
        self._set_views(self.full)
        self._saving = saved_tensors_hooks(self._pack, self._unpack)
        self._saving.__enter__()
        cast = self.compute_dtype
        return tuple(
            a.to(cast) if isinstance(a, Tensor) and a.is_floating_point() else a for a in args
        )

    def _after_forward(self, module, args, output):
        self._saving.__exit__(None, None, None)
        self._set_views(None)
        self.full = None  # nothing else holds it now: freed

    def _pack(self, tensor: Tensor):
        full = self.full
        if full is not None and tensor.untyped_storage().data_ptr() == full.data_ptr():
            return _Where(tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        return tensor

    def _unpack(self, saved):
        if not isinstance(saved, _Where):
            return saved
        if self.regathered is None:
            with torch.no_grad():
                self.regathered = self.gather()  # (length,)
        return self.regathered.as_strided(saved.size, saved.stride, saved.offset)


def smaller_than(numel: int) -> Replicate:
    """The parameters of fewer than ``numel`` elements (norm weights, biases): a ``replicate``
    for :class:`FSDP` in ZeRO-3's "persistence threshold" convention."""
    if not isinstance(numel, int) or numel < 1:
        raise ValueError(f"numel must be an integer >= 1, got {numel!r}")
    return lambda name, parameter: parameter.numel() < numel


class FSDP:
    """Shard ``model`` over the ranks, unit by unit (see the module's docstring).

    Args:
        model: the model; every rank starts from rank 0's weights and buffers.
        units: its submodules to shard separately, inner ones before the modules that hold
            them, ``model`` itself last (by default the reference's blocks ``model.layers``,
            then ``model``); each parameter goes to the first unit that holds it.
        comm: the (counted) collectives; a new :class:`Collectives` by default.
        compute_dtype: the dtype of the gathered parameters, activations and reduced
            gradients (the shards stay float32).
        replicate: the parameters to keep whole on every rank, their gradients all-reduced:
            names (as ``model.named_parameters()`` gives them; a tied weight by any of its
            names) or ``keep(name, parameter) -> bool`` (:func:`smaller_than`). Default:
            none, every parameter is sharded. Only with ``compute_dtype`` float32 (a whole
            float32 parameter would meet activations of another dtype).

    Attributes:
        units: the :class:`Unit` objects, in the order given.
        replicated: the names of the parameters kept whole, each once.
    """

    def __init__(
        self,
        model: nn.Module,
        units: list[nn.Module] | None = None,
        comm: Collectives | None = None,
        compute_dtype: torch.dtype = torch.float32,
        replicate: Collection[str] | Replicate = (),
    ) -> None:
        units = [*model.layers, model] if units is None else list(units)
        if not units or units[-1] is not model:
            last = type(units[-1]).__name__ if units else "nothing"
            raise ValueError(
                f"units must end with the model itself (it takes the parameters no other unit "
                f"holds), got {last} last"
            )
        self.model = model
        self.comm = comm if comm is not None else Collectives()
        names = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            names.setdefault(p, []).append(name)
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                self.comm.broadcast(tensor, src=0)
        whole = self._replicated(names, replicate, compute_dtype)
        self._whole = {p: names[p] for p in whole}
        self.replicated = [names[p][0] for p in whole]
        for p in whole:  # averaged over the ranks once backward has accumulated its gradient
            p.register_post_accumulate_grad_hook(self._average_gradient)
        taken: set[nn.Parameter] = set(whole)
        self.units, self.names = [], []
        for module in units:
            params = [p for p in module.parameters() if p not in taken and p.requires_grad]
            self.names.append([names[p] for p in params])
            self.units.append(Unit(module, params, self.comm, compute_dtype))
            taken.update([*params, self.units[-1].shard])

    @staticmethod
    def _replicated(
        names: dict[nn.Parameter, list[str]],
        replicate: Collection[str] | Replicate,
        compute_dtype: torch.dtype,
    ) -> list[nn.Parameter]:
        """The trainable parameters ``replicate`` names, in the model's order."""
        if callable(replicate):
            whole = [p for p, aliases in names.items() if replicate(aliases[0], p)]
        else:
            wanted = {replicate} if isinstance(replicate, str) else set(replicate)
            known = {name for aliases in names.values() for name in aliases}
            if wanted - known:
                raise ValueError(
                    f"replicate names parameters the model does not have: {sorted(wanted - known)}"
                )
            whole = [p for p, aliases in names.items() if wanted & set(aliases)]
        whole = [p for p in whole if p.requires_grad]
        if whole and compute_dtype != torch.float32:
            raise ValueError(
                f"replicate works with compute_dtype float32 only, got {compute_dtype} and "
                f"{len(whole)} parameters to replicate"
            )
        return whole

    def _average_gradient(self, parameter: nn.Parameter) -> None:
        self.comm.all_reduce(parameter.grad)
        parameter.grad.div_(self.comm.world_size)

    @torch.no_grad()
    def full_state(self) -> dict[str, Tensor]:
        """Every parameter whole, float32, on the shards' device (nccl gathers only into CUDA
        tensors), under its name in the unsharded model (a tied weight under each of its
        names); a collective: every rank must call it."""
        state = {}
        for unit, names in zip(self.units, self.names, strict=True):
            full = torch.empty(unit.length, dtype=torch.float32, device=unit.shard.device)
            self.comm.all_gather(full, unit.shard.detach())  # (length,)
            offset = 0
            for p, aliases in zip(unit.params, names, strict=True):
                for name in aliases:
                    state[name] = full[offset : offset + p.numel()].view(p.shape).clone()
                offset += p.numel()
        for p, aliases in self._whole.items():  # kept whole: the same on every rank
            for name in aliases:
                state[name] = p.detach().float().clone()
        return state
