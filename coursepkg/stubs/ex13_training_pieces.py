"""Assignment ex13_training_pieces: the pieces a real training run is made of (chapter 17):
AdamW with decoupled weight decay, the parameter groups that keep norms and biases undecayed,
linear warm-up then cosine decay to a floor, clipping by the global norm, and a training state
that resumes a run bit for bit.
"""

from __future__ import annotations

import math  # noqa: F401  (you will need it)
from collections.abc import Iterable

import torch
from torch import Tensor, nn


class AdamW(torch.optim.Optimizer):
    """Adam with bias correction and decoupled weight decay (Loshchilov & Hutter, 2019).

    For each parameter w with gradient g, in every group, at its update t = 1, 2, ...::

        w <- w - lr * weight_decay * w                       # decoupled: not through g
        m <- beta1 * m + (1 - beta1) * g
        v <- beta2 * v + (1 - beta2) * g * g
        m_hat = m / (1 - beta1 ** t),  v_hat = v / (1 - beta2 ** t)
        w <- w - lr * m_hat / (sqrt(v_hat) + eps)

    Read lr, betas, eps and weight_decay from the parameter's group at every step (a
    schedule changes ``group["lr"]`` between steps, and groups differ in ``weight_decay``);
    keep t, m and v in ``self.state[w]`` (so that ``state_dict`` saves them). A parameter whose
    ``grad`` is None is left alone. ``__init__`` is written for you; write ``step``.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient.

        Args:
            closure: unused here (the optimizer interface allows one); return ``None``.

        Returns:
            None.
        """
        raise NotImplementedError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The model's trainable parameters in two groups for :class:`AdamW`.

    The rule of this assignment: a parameter with two or more dimensions (a weight matrix, an
    embedding table) is decayed with ``weight_decay``; a parameter with fewer (a bias, a
    LayerNorm or RMSNorm gain) gets ``weight_decay = 0.0``. Every trainable parameter appears
    exactly once (a weight shared by two modules too); frozen ones (``requires_grad=False``)
    may be left out.

    Args:
        model: the model to train.
        weight_decay: the decay of the matrices.

    Returns:
        ``[{"params": [...], "weight_decay": weight_decay}, {"params": [...],
        "weight_decay": 0.0}]``.
    """
    raise NotImplementedError


def warmup_cosine_lr(
    step: int, max_lr: float, warmup_steps: int, total_steps: int, min_lr: float
) -> float:
    """The learning rate of update ``step`` (counted from 0).

    1. Warm-up, ``step < warmup_steps``: ``max_lr * (step + 1) / warmup_steps``, so the first
       update already moves and update ``warmup_steps - 1`` uses ``max_lr``.
    2. Decay, ``warmup_steps <= step <= total_steps``: half a cosine from ``max_lr`` down to
       ``min_lr``: ``min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2`` with
       ``r = (step - warmup_steps) / (total_steps - warmup_steps)``.
    3. After, ``step > total_steps``: ``min_lr``, held.

    Args:
        step: the update's index, >= 0.
        max_lr: the peak.
        warmup_steps: updates of warm-up, >= 0 (0: none).
        total_steps: the update at which the decay reaches ``min_lr``, > ``warmup_steps``.
        min_lr: the floor.

    Returns:
        The learning rate, a Python float.
    """
    raise NotImplementedError


def clip_grad_norm_(parameters: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale every gradient by one factor so that their global L2 norm is at most ``max_norm``.

    The global norm is sqrt(sum of every gradient's squared entries), all parameters together.
    When it exceeds ``max_norm``, every ``.grad`` is multiplied in place by ``max_norm / norm``
    (adding 1e-6 to the norm in that division is fine, as PyTorch does); otherwise nothing
    changes. Parameters whose ``grad`` is None are skipped.

    Args:
        parameters: the parameters whose gradients are clipped.
        max_norm: the largest global norm allowed.

    Returns:
        The global norm before clipping, a 0-dimensional tensor.
    """
    raise NotImplementedError


class TrainingState:
    """What a run must write to resume later exactly as if it had never stopped.

    The check trains a small model with dropout; it draws each batch's rows from a
    ``torch.Generator`` (``batches``: where the data stands) and sets each update's learning
    rate from the update's index (the schedule's step). It stops after some updates, calls
    ``capture``, writes the dict with ``torch.save`` and reads it back; then it builds a new
    model, optimizer and generator (other weights, other seeds, torch's global RNG moved),
    calls ``restore`` and trains on from the step ``restore`` returns. The weights at the end
    must equal, bit for bit, those of a run that never stopped.
    """

    @staticmethod
    def capture(
        model: nn.Module, optimizer: torch.optim.Optimizer, step: int, batches: torch.Generator
    ) -> dict:
        """Everything needed to resume, as a dict ``torch.save`` can write (tensors, numbers,
        lists and dicts of them).

        Args:
            model: the model being trained.
            optimizer: its optimizer (its moments and step counts are part of the run).
            step: the number of updates done (the schedule's position).
            batches: the generator that draws the batches' rows.

        Returns:
            The state.
        """
        raise NotImplementedError

    @staticmethod
    def restore(
        state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, batches: torch.Generator
    ) -> int:
        """Put a captured state back into a new model, optimizer, batch generator and torch's
        global random number generator (dropout draws from it).

        Args:
            state: what ``capture`` returned (after a round trip through ``torch.save``).
            model: a new model of the same architecture.
            optimizer: a new optimizer over its parameters.
            batches: a new batch generator.

        Returns:
            The step to continue from.
        """
        raise NotImplementedError
