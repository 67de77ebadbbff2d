"""Activation checkpointing, written plainly: keep a block's input, not its insides.

Backward needs what each operation saved in forward (the attention weights, the feed-forward's
hidden layer, ...). A checkpointed block runs its forward without recording any of that and
keeps only its input; when backward reaches the block it runs the forward again, this time
recording, and goes back through it. Memory held for backward falls to one input per block, for
the price of a second forward. The random state and autocast are restored for the second run,
so dropout draws the same masks and the gradients are those of the plain model.

Use::

    checkpoint_blocks(model)      # model.layers now recompute in backward
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.autograd.graph import saved_tensors_hooks

__all__ = ["checkpoint_blocks", "saved_bytes"]


class _Checkpoint(torch.autograd.Function):
    """Forward: the block without recording, its input kept. Backward: recompute, then go back."""

    @staticmethod
    def forward(ctx, run: Callable, x: Tensor, *rest):
        ctx.run, ctx.rest = run, rest
        kind = x.device.type
        # What the second run must see again: the random state (dropout) and autocast.
        ctx.devices = [x.device] if kind == "cuda" else []
        ctx.rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state(x.device) if ctx.devices else None
        ctx.autocast = (kind, torch.get_autocast_dtype(kind), torch.is_autocast_enabled(kind))
        ctx.save_for_backward(x)
        with torch.no_grad():
            return run(x, *rest)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_()
        kind, dtype, enabled = ctx.autocast
        with torch.random.fork_rng(devices=ctx.devices), torch.enable_grad():
            torch.set_rng_state(ctx.rng)  # the same dropout masks as the first run
            if ctx.devices:
                torch.cuda.set_rng_state(ctx.cuda_rng, ctx.devices[0])
            with torch.autocast(kind, dtype=dtype, enabled=enabled):
                out = ctx.run(x, *ctx.rest)
        # The parameters' gradients accumulate here; the input's goes on down the graph.
        torch.autograd.backward(out, grad)
        return None, x.grad, *[None] * len(ctx.rest)


def checkpoint_blocks(model: nn.Module, blocks: list[nn.Module] | None = None) -> nn.Module:
    """Make each block of ``model`` recompute its forward during backward.

    Args:
        model: a reference model.
        blocks: the modules to checkpoint, each called with its input first (default
            ``model.layers``, the reference's blocks).

    Returns:
        ``model``, changed in place (its parameters and their names are untouched).
    """
    blocks = list(model.layers) if blocks is None else blocks
    for block in blocks:
        plain = block.forward

        def forward(x, *rest, _plain=plain):
            if not torch.is_grad_enabled():  # nothing to save: run it as it is
                return _plain(x, *rest)
            if not x.requires_grad:  # else autograd would not record the block at all
                x = x.detach().requires_grad_()
            return _Checkpoint.apply(_plain, x, *rest)

        block.forward = forward
    return model


def saved_bytes(model: nn.Module, run: Callable[[], Tensor]) -> int:
    """The bytes of activations autograd keeps for backward while ``run()`` builds its graph:
    every tensor saved for backward, each storage once (a view costs nothing more), the
    parameters of ``model`` left out (they are held anyway).

    Args:
        model: the model whose parameters are not counted.
        run: builds the graph (a forward, a loss) and returns the loss.

    Returns:
        The bytes held for backward when ``run`` returns.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = run()  # the graph, and what it keeps, lives as long as the loss
        held = sum(storages.values())
    del loss
    return held
