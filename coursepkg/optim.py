"""AdamW, the warm-up + cosine learning-rate schedule and clipping by global norm, written out.

These are what :mod:`coursepkg.training` trains with; each equals its PyTorch counterpart
(``torch.optim.AdamW``, ``LinearLR`` then ``CosineAnnealingLR``,
``torch.nn.utils.clip_grad_norm_``) step for step, which ``tests/test_optim.py`` checks on random
problems.

AdamW (Loshchilov & Hutter, 2019) differs from Adam with an L2 penalty in one line: the weight
decay shrinks the weights directly, ``w <- w - lr * wd * w``, instead of being added to the
gradient, where Adam's per-coordinate scaling would weaken it exactly for the weights with large
gradients.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["AdamW", "clip_grad_norm_", "param_groups", "warmup_cosine_lr"]


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay and bias correction.

    For each parameter w with gradient g, at update t = 1, 2, ...::

        w <- w * (1 - lr * weight_decay)                  # decoupled decay
        m <- beta1 * m + (1 - beta1) * g                  # first moment
        v <- beta2 * v + (1 - beta2) * g * g              # second moment
        m_hat = m / (1 - beta1^t),  v_hat = v / (1 - beta2^t)   # bias correction
        w <- w - lr * m_hat / (sqrt(v_hat) + eps)

    Args:
        params: parameters, or parameter groups (dicts) with their own settings.
        lr: learning rate (the trainer sets it every step from the schedule).
        betas: (beta1, beta2), the moments' decay rates.
        eps: added to the denominator.
        weight_decay: the decoupled decay rate.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas) or len(betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D417 (the Optimizer interface)
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            for w in group["params"]:
                if w.grad is None:
                    continue
                state = self.state[w]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(w)
                    state["exp_avg_sq"] = torch.zeros_like(w)
                state["step"] += 1
                t = float(state["step"])
                m, v, g = state["exp_avg"], state["exp_avg_sq"], w.grad
                w.mul_(1.0 - lr * decay)
                m.lerp_(g, 1.0 - beta1)  # m + (1 - beta1) (g - m) = beta1 m + (1 - beta1) g
                v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                denom = (v.sqrt() / math.sqrt(1.0 - beta2**t)).add_(eps)
                w.addcdiv_(m, denom, value=-lr / (1.0 - beta1**t))
        return loss


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two parameter groups: matrices (decayed) and vectors such as biases and norms (not).

    Decaying a LayerNorm gain or a bias towards 0 only fights the model; GPT-2's and most
    later recipes decay the weight matrices (embeddings included) only.

    Args:
        model: the model to be trained.
        weight_decay: the decay of the matrices.

    Returns:
        Two groups: the matrices with ``weight_decay``, the other parameters with 0.
    """
    trainable = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    return [
        {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
    ]


def warmup_cosine_lr(
    step: int,
    max_lr: float,
    warmup_steps: int,
    total_steps: int,
    min_lr: float = 0.0,
    warmup_from_zero: bool = False,
) -> float:
    """The learning rate of update ``step`` (from 0): linear warm-up, cosine decay, then flat.

    Three phases:

    1. ``step < warmup_steps``: ``max_lr * (step + 1) / warmup_steps`` (reaches ``max_lr``);
    2. up to ``total_steps``: from ``max_lr`` down to ``min_lr`` along half a cosine,
       ``min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2`` with ``r`` going from 0 to 1;
    3. after ``total_steps``: ``min_lr``.

    Two conventions for the warm-up, which differ by one step:

    - ``warmup_from_zero=False`` (the default, the course's): ``(step + 1) / warmup_steps``:
      update 0 already moves the weights, and update ``warmup_steps - 1`` is the first at
      ``max_lr``;
    - ``warmup_from_zero=True`` (Hugging Face's ``get_cosine_schedule_with_warmup``, CS336's
      ``get_lr_cosine_schedule``): ``step / warmup_steps``: 0 at step 0 (that update changes
      nothing but the optimizer's moments), ``max_lr`` at step ``warmup_steps``.

    The decay is the same in both.

    Args:
        step: the update's index, >= 0.
        max_lr: the peak.
        warmup_steps: updates of warm-up (0: none).
        total_steps: the update at which the decay ends, > ``warmup_steps``.
        min_lr: the floor.
        warmup_from_zero: the warm-up convention (above).

    Returns:
        The learning rate.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps < 0 or total_steps <= warmup_steps:
        raise ValueError(
            f"need 0 <= warmup_steps < total_steps, got warmup_steps={warmup_steps}, "
            f"total_steps={total_steps}"
        )
    if step < warmup_steps:
        return max_lr * (step if warmup_from_zero else step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    r = (step - warmup_steps) / (total_steps - warmup_steps)  # 0 -> 1 over the decay
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * r))


def clip_grad_norm_(parameters: Iterable[Tensor], max_norm: float, eps: float = 1e-6) -> Tensor:
    """Scale every gradient by the same factor so that their global L2 norm is at most ``max_norm``.

    The global norm is sqrt(sum of every gradient's squared entries), all parameters together;
    clipping it (rather than each tensor) keeps the update's direction and only shortens it.

    Args:
        parameters: the parameters whose ``.grad`` are clipped in place (those without are skipped).
        max_norm: the largest norm allowed.
        eps: added to the norm in the scale factor, as PyTorch does.

    Returns:
        The global norm before clipping (a 0-d tensor).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norms = torch.stack([g.detach().norm(2.0) for g in grads])  # (P,) one norm per tensor
    total = norms.norm(2.0)  # sqrt(sum of squares) of all the entries
    scale = (max_norm / (total + eps)).clamp(max=1.0)
    for g in grads:
        g.detach().mul_(scale.to(g.device, g.dtype))
    return total
