"""What each scheme costs a rank, in closed form: bytes of parameters, gradients and optimizer
state held, and bytes handed to each kind of collective per step.

Ψ is the number of parameter elements (a tied weight once), N the world size, b the bytes per
element (4 in float32), and AdamW keeps two numbers per element plus one 4-byte step count per
tensor it optimizes. A flat vector cut into N shards is padded to a multiple of N
(:func:`~coursepkg.parallel.comm.flat_size`), so "1/N" below is exact once padded.

========  ==========  ==========  ===============================  ==============================
scheme    parameters  gradients   optimizer state                  payload per step
========  ==========  ==========  ===============================  ==============================
ddp       Ψb          Ψb          2Ψb + 4 per tensor               all-reduce Ψb
zero1     Ψb          Ψb          2(Ψ/N)b + 4                      all-reduce Ψb, all-gather Ψb
fsdp      Σ(Ψu/N)b    Σ(Ψu/N)b    2Σ(Ψu/N)b + 4 per unit           all-gather 2Σ Ψu b,
                                                                   reduce-scatter Σ Ψu b
========  ==========  ==========  ===============================  ==============================

(Ψu: the elements of FSDP unit u, padded.) The DDP schemes also broadcast the buffers before each
forward. The measured side is :func:`~coursepkg.parallel.compare.train_ranks`.
"""

from __future__ import annotations

from torch import nn

from .comm import flat_size

__all__ = ["SCHEMES", "payload_per_step", "per_rank_bytes", "unit_numels"]

SCHEMES = ("ddp", "bucketed", "zero1", "fsdp")


def unit_numels(model: nn.Module, units: list[nn.Module] | None = None) -> list[int]:
    """The parameter elements of each FSDP unit, as :class:`~coursepkg.parallel.fsdp.FSDP`
    assigns them (by default the blocks ``model.layers``, then the rest of ``model``)."""
    units = [*model.layers, model] if units is None else units
    taken: set[nn.Parameter] = set()
    numels = []
    for module in units:
        params = [p for p in module.parameters() if p not in taken and p.requires_grad]
        taken.update(params)
        numels.append(sum(p.numel() for p in params))
    return numels


def _check(scheme: str, world_size: int) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")


def per_rank_bytes(
    scheme: str, numels: list[int], n_tensors: int, world_size: int, element: int = 4
) -> dict[str, int]:
    """The bytes one rank holds after a step with AdamW.

    Args:
        scheme: one of :data:`SCHEMES`.
        numels: the parameter elements of each FSDP unit (:func:`unit_numels`); the other
            schemes use their sum, Ψ.
        n_tensors: the number of parameter tensors (a tied weight once): DDP's AdamW keeps a
            step count for each.
        world_size: N.
        element: bytes per element.

    Returns:
        ``{"params", "grads", "state"}`` in bytes.
    """
    _check(scheme, world_size)
    psi = sum(numels)
    if scheme == "fsdp":
        shard = sum(flat_size(n, world_size) // world_size for n in numels) * element
        return dict(params=shard, grads=shard, state=2 * shard + 4 * len(numels))
    if scheme == "zero1":
        shard = flat_size(psi, world_size) // world_size * element
        return dict(params=psi * element, grads=psi * element, state=2 * shard + 4)
    return dict(params=psi * element, grads=psi * element, state=2 * psi * element + 4 * n_tensors)


def payload_per_step(
    scheme: str, numels: list[int], world_size: int, buffer_bytes: int = 0, element: int = 4
) -> dict[str, int]:
    """The bytes handed to each kind of collective in one training step (see the module's
    table; :func:`~coursepkg.parallel.comm.ring_bytes_sent` turns them into bytes sent).

    Args:
        scheme: one of :data:`SCHEMES`.
        numels: the parameter elements of each FSDP unit (:func:`unit_numels`).
        world_size: N.
        buffer_bytes: the model's buffers, which the DDP schemes broadcast before each forward.
        element: bytes per element (of the gathered parameters and reduced gradients).

    Returns:
        ``{kind: bytes}`` for the kinds the scheme calls.
    """
    _check(scheme, world_size)
    if scheme == "fsdp":
        padded = sum(flat_size(n, world_size) for n in numels) * element
        return dict(all_gather=2 * padded, reduce_scatter=padded)
    psi = sum(numels)
    out = dict(all_reduce=psi * element)
    if buffer_bytes:
        out["broadcast"] = buffer_bytes
    if scheme == "zero1":
        out["all_gather"] = flat_size(psi, world_size) * element
    return out
