"""ex13's clipping mistakes: clipping gradients by their global norm, each mistake a wrong
function with the stub's signature.
"""

from __future__ import annotations

import inspect

import torch

from ....optim import clip_grad_norm_ as reference_clip
from ...framework import BugVariant

__all__ = [
    "CLIP_BUGS",
    "CLIP_ITEM",
    "TORCH_CLIP",
]

CLIP_ITEM = "clip_grad_norm_"

TORCH_CLIP = inspect.unwrap(torch.nn.utils.clip_grad_norm_)


# ---------------------------------------------------------------------------------------------
# Clipping
# ---------------------------------------------------------------------------------------------


def clip_grad_norm_per_tensor(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.stack([g.norm() for g in grads]).norm()
    for g in grads:
        g.mul_((max_norm / (g.norm() + 1e-6)).clamp(max=1.0))  # each tensor on its own
    return total


def _scale_by(grads, total, max_norm):
    """Every gradient scaled by min(1, max_norm / total), ``total`` however it was computed."""
    for g in grads:
        g.mul_((max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


def clip_grad_norm_norms_added(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.stack([g.norm() for g in grads]).sum()  # not sqrt(sum of squares)
    return _scale_by(grads, total, max_norm)


def clip_grad_norm_l1_norm(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.stack([g.abs().sum() for g in grads]).sum()  # the L1 norm, not the L2
    return _scale_by(grads, total, max_norm)


def clip_grad_norm_grad_none_crashes(parameters, max_norm):
    params = list(parameters)
    total = torch.cat([p.grad.reshape(-1) for p in params]).norm()  # None.reshape raises
    return _scale_by([p.grad for p in params], total, max_norm)


def clip_grad_norm_always_scales(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.stack([g.norm() for g in grads]).norm()
    for g in grads:
        g.mul_(max_norm / (total + 1e-6))  # small gradients are scaled up
    return total


def clip_grad_norm_returns_clipped_norm(parameters, max_norm):
    params = list(parameters)
    reference_clip(params, max_norm)
    return torch.stack([p.grad.norm() for p in params if p.grad is not None]).norm()


def clip_grad_norm_builtin(parameters, max_norm):
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm)


CLIP_BUGS = [
    BugVariant(
        "clip.per_tensor",
        CLIP_ITEM,
        "each gradient is clipped to max_norm on its own, which changes the update's direction "
        "(and lets the whole update grow with the number of tensors)",
        "Compute one global norm over all the gradients and scale them all by the same factor "
        "max_norm / norm.",
        clip_grad_norm_per_tensor,
    ),
    BugVariant(
        "clip.norms_added",
        CLIP_ITEM,
        "the global norm is the sum of the tensors' norms instead of the square root of the sum "
        "of their squares",
        "total = sqrt(sum over tensors of (norm of the tensor) ** 2).",
        clip_grad_norm_norms_added,
    ),
    BugVariant(
        "clip.always_scales",
        CLIP_ITEM,
        "the gradients are scaled by max_norm / norm even when the norm is below max_norm, so "
        "small gradients are blown up to max_norm",
        "Scale only when the norm exceeds max_norm: factor min(1, max_norm / norm).",
        clip_grad_norm_always_scales,
    ),
    BugVariant(
        "clip.returns_clipped_norm",
        CLIP_ITEM,
        "the norm returned is the one after clipping, so a log of it never shows a spike",
        "Return the global norm computed before scaling the gradients.",
        clip_grad_norm_returns_clipped_norm,
    ),
    BugVariant(
        "clip.builtin",
        CLIP_ITEM,
        "your clip_grad_norm_ calls PyTorch's torch.nn.utils.clip_grad_norm_",
        "Compute the global norm and scale the gradients yourself.",
        clip_grad_norm_builtin,
        calls=(TORCH_CLIP,),
    ),
    BugVariant(
        "clip.l1_norm",
        CLIP_ITEM,
        "the global norm is the L1 norm (the sum of the gradients' absolute values) instead of "
        "the L2 norm (the square root of the sum of their squares), so it is larger and the "
        "gradients are clipped too often and too hard",
        "total = sqrt(sum of g ** 2 over every element of every gradient), e.g. "
        "torch.stack([g.norm() for g in grads]).norm().",
        clip_grad_norm_l1_norm,
    ),
    BugVariant(
        "clip.grad_none_crashes",
        CLIP_ITEM,
        "your code fails on a parameter whose .grad is None (one the loss does not reach, or a "
        "frozen one; the check passes one): the same call without that parameter runs and "
        "gives the right gradients",
        "Skip the parameters without a gradient, as torch.nn.utils.clip_grad_norm_ does: "
        "grads = [p.grad for p in parameters if p.grad is not None].",
        clip_grad_norm_grad_none_crashes,
    ),
]
