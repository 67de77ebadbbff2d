"""What ex14's catalogue builds its mistakes on and its checks compare with: the references of
:mod:`coursepkg.posttrain` called with the stubs' signatures (the SFT loss, the LoRA layer, the
DPO loss, the per-token pieces, GRPO's advantages and loss) and the per-token terms several
mistakes share (the ratio and its clip, each answer's mean, Schulman's k3). Imported as
``framework.post_training`` by ex14 only, as ex11 imports ``framework.modern_blocks``.

Dimension legend: B batch (answers), L length, V vocabulary, T answer positions (targets).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...posttrain import dpo as _dpo
from ...posttrain import grpo as _grpo
from ...posttrain import lora as _lora
from ...posttrain import per_token as _per_token
from ...posttrain import policy_gradient as _pg
from ...posttrain.sft import sft_loss as _sft_loss

__all__ = [
    "LoRAReference",
    "advantages_reference",
    "answer_mean_loss",
    "clip_terms",
    "dpo_reference",
    "entropy_reference",
    "grpo_reference",
    "k3",
    "masked_mean_reference",
    "pg_reference",
    "sft_reference",
]


def sft_reference(logits: Tensor, tokens: Tensor, loss_mask: Tensor, token_mask: Tensor) -> Tensor:
    """The reference SFT loss (per-token mean over the response targets)."""
    return _sft_loss(logits, tokens, loss_mask, "token")


class LoRAReference(_lora.LoRALinear):
    """The reference LoRA layer with the stub's signature (no dropout)."""

    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__(base, r, alpha)


def dpo_reference(pc: Tensor, pr: Tensor, rc: Tensor, rr: Tensor, beta: float) -> Tensor:
    """The reference DPO loss (the mean over the pairs)."""
    return _dpo.dpo_loss(pc, pr, rc, rr, beta).loss


def advantages_reference(rewards: Tensor, eps: float = 1e-4) -> Tensor:
    """The reference group advantages, scaled by the group's standard deviation."""
    return _grpo.group_advantages(rewards, True, eps)


def grpo_reference(lp, old, ref, adv, mask, clip_eps: float, kl_coef: float) -> Tensor:
    """The reference GRPO loss."""
    return _grpo.grpo_loss(lp, old, ref, adv, mask, clip_eps, kl_coef).loss


def entropy_reference(logits: Tensor) -> Tensor:
    """The reference token entropy, (..., V) -> (...)."""
    return _per_token.token_entropy(logits)


def masked_mean_reference(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """The reference masked mean, over all kept entries or along ``dim``."""
    return _per_token.masked_mean(x, mask, dim)


def pg_reference(lp: Tensor, old: Tensor, adv: Tensor, clip_eps: float) -> Tensor:
    """The reference per-token clipped policy-gradient loss, (B, T)."""
    return _pg.grpo_clip_loss(lp, old, adv, clip_eps).loss


def clip_terms(lp: Tensor, old: Tensor, adv: Tensor, clip_eps: float) -> tuple[Tensor, ...]:
    """``(ratio, A, clipped ratio)``: (B, T), (B, 1), (B, T); old and A detached."""
    ratio = torch.exp(lp - old.detach())  # (B, T)
    return ratio, adv.detach()[:, None], torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)


def answer_mean_loss(per_token: Tensor, mask: Tensor) -> Tensor:
    """Minus the mean over answers of each answer's mean over its own tokens."""
    zero = torch.zeros_like(per_token)
    return -(torch.where(mask, per_token, zero).sum(dim=1) / mask.sum(dim=1)).mean()


def k3(lp: Tensor, ref: Tensor) -> Tensor:
    """Schulman's k3 estimate per token, ``exp(d) - d - 1`` with d = ref - lp (ref detached)."""
    log_r = ref.detach() - lp  # (B, T)
    return torch.exp(log_r) - log_r - 1
