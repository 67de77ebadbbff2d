"""The engine room above :mod:`coursepkg.optim`: the trainer's AdamW update and gradient
clipping, the plain versions' numbers by fewer, larger operations.

:class:`FusedAdamW` runs :class:`~coursepkg.optim.AdamW`'s update with PyTorch's fused
kernel, one pass over the memory instead of eight operations, and
:func:`foreach_clip_grad_norm_` clips as :func:`~coursepkg.optim.clip_grad_norm_` does with
multi-tensor (``torch._foreach_*``) operations, one call for all the tensors instead of one
per tensor (a GPT-2-shaped model has 68). The two take about 4% off ``coursepkg train``'s
step on the GPT-2-shaped model of benchmarks/train_lm.py (0.543 -> 0.522 s, one thread's CPU
time, side by side). This module imports the plain one, never the reverse;
``reference/test_fast_optim.py`` holds the two equal.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from .optim import AdamW

__all__ = ["FusedAdamW", "foreach_clip_grad_norm_"]


class FusedAdamW(AdamW):
    """:class:`~coursepkg.optim.AdamW` by PyTorch's fused kernel: one pass over each tensor.

    The plain update reads and writes each parameter's tensors in eight separate operations
    (and allocates the denominator); ``torch._fused_adamw_`` (what ``torch.optim.AdamW(...,
    fused=True)`` and Hugging Face's ``Trainer`` run) computes the same update element by
    element in one pass over all the tensors of a group, on the CPU as on a GPU. Same
    arguments, parameter groups and state (``step``, ``exp_avg``, ``exp_avg_sq`` per parameter)
    as the plain class, so a state dict moves between the two. The kernel orders the
    arithmetic of the decay and of the moments its own way, so the weights agree with the
    plain update's to the last bits, not bit for bit (``reference/test_fast_optim.py``). A
    tensor ``weight_decay`` (a per-element decay, which the plain class takes) is left to the
    plain update.
    """

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D417 (the Optimizer interface)
        """One update of every parameter that has a gradient."""
        if any(isinstance(g["weight_decay"], Tensor) for g in self.param_groups):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            ws = [w for w in group["params"] if w.grad is not None]
            for w in ws:
                state = self.state[w]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(w)
                    state["exp_avg_sq"] = torch.zeros_like(w)
                if state["step"].device != w.device:  # the kernel reads it beside the weight
                    state["step"] = state["step"].to(w.device)
            if not ws:
                continue
            steps = [self.state[w]["step"] for w in ws]
            torch._foreach_add_(steps, 1.0)
            beta1, beta2 = group["betas"]
            torch._fused_adamw_(
                ws,
                [w.grad for w in ws],
                [self.state[w]["exp_avg"] for w in ws],
                [self.state[w]["exp_avg_sq"] for w in ws],
                [],  # no AMSGrad maxima
                steps,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                amsgrad=False,
                maximize=False,
            )
        return loss


def foreach_clip_grad_norm_(
    parameters: Iterable[Tensor], max_norm: float, eps: float = 1e-6
) -> Tensor:
    """:func:`~coursepkg.optim.clip_grad_norm_` with multi-tensor norms and scaling: the same
    arguments, the same gradients after, bit for bit, and the same global norm returned."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norms = torch.stack(torch._foreach_norm(grads, 2.0))  # (P,) one norm per tensor
    total = norms.norm(2.0)  # sqrt(sum of squares) of all the entries
    scale = (max_norm / (total + eps)).clamp(max=1.0)
    torch._foreach_mul_(grads, scale.to(grads[0].device, grads[0].dtype))
    return total
