"""The catalogue of ex14_post_training: the known mistakes of the SFT loss, the LoRA layer, the
DPO loss and GRPO's advantages and clipped loss, each a runnable variant with the stub's
signature (a wrong function, or for LoRA a subclass of the correct layer named
``LoRALinear_<mistake>`` overriding the step it gets wrong). The check reruns a variant on the
student's inputs and names it only when the numbers match.

Dimension legend: B batch, L length, V vocabulary, P prompts, G answers per prompt, T targets.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...posttrain import dpo as _dpo
from ...posttrain import grpo as _grpo
from ...posttrain import lora as _lora
from ...posttrain.sft import sft_loss as _sft_loss
from ...posttrain.sft import token_losses
from ..framework import BugVariant

__all__ = [
    "ADVANTAGES_BUGS",
    "ADVANTAGES_ITEM",
    "BUGS",
    "DPO_BUGS",
    "DPO_ITEM",
    "GRPO_BUGS",
    "GRPO_ITEM",
    "LORA_BUGS",
    "LORA_ITEM",
    "SFT_BUGS",
    "SFT_ITEM",
    "LoRAReference",
    "advantages_reference",
    "dpo_reference",
    "grpo_reference",
    "sft_reference",
]

SFT_ITEM = "sft_loss"
LORA_ITEM = "LoRALinear"
DPO_ITEM = "dpo_loss"
ADVANTAGES_ITEM = "group_advantages"
GRPO_ITEM = "grpo_loss"


# ---------------------------------------------------------------------------------------------
# The correct answers, with the stubs' signatures
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# SFT
# ---------------------------------------------------------------------------------------------


def _masked_mean(losses: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, losses, torch.zeros_like(losses)).sum() / mask.sum()


def sft_loss_prompt_in_loss(logits, tokens, loss_mask, token_mask):
    return _masked_mean(token_losses(logits, tokens), token_mask[:, 1:])  # every real token


def sft_loss_padding_in_loss(logits, tokens, loss_mask, token_mask):
    return token_losses(logits, tokens).mean()  # every position, padding included


def sft_loss_per_sequence_mean(logits, tokens, loss_mask, token_mask):
    return _sft_loss(logits, tokens, loss_mask, "sequence")


def sft_loss_divided_by_positions(logits, tokens, loss_mask, token_mask):
    losses = token_losses(logits, tokens)  # (B, L-1)
    mask = loss_mask[:, 1:]  # (B, L-1)
    return torch.where(mask, losses, torch.zeros_like(losses)).sum() / mask.numel()


def sft_loss_not_shifted(logits, tokens, loss_mask, token_mask):
    losses = F.cross_entropy(logits.flatten(0, 1), tokens.flatten(), reduction="none")
    return _masked_mean(losses.view_as(tokens), loss_mask)  # logits at t against token t


def sft_loss_mask_not_shifted(logits, tokens, loss_mask, token_mask):
    losses = token_losses(logits, tokens)  # (B, L-1): target t + 1 at entry t
    return _masked_mean(losses, loss_mask[:, :-1])  # the mask of the inputs, not the targets


# ---------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------


class LoRALinear_b_not_zero(LoRAReference):
    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__(base, r, alpha)
        nn.init.kaiming_uniform_(self.lora_B, a=math.sqrt(5))  # the change is not 0 at step 0


class LoRALinear_both_zero(LoRAReference):
    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__(base, r, alpha)
        nn.init.zeros_(self.lora_A)  # with B = 0 too, neither adapter ever gets a gradient


class LoRALinear_no_scaling(LoRAReference):
    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T  # alpha / r left out


class LoRALinear_scaled_by_alpha(LoRAReference):
    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + self.alpha * ((x @ self.lora_A.T) @ self.lora_B.T)


class LoRALinear_base_not_frozen(LoRAReference):
    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__(base, r, alpha)
        for parameter in base.parameters():
            parameter.requires_grad_(True)  # the pre-trained weight trains too


# ---------------------------------------------------------------------------------------------
# DPO
# ---------------------------------------------------------------------------------------------


def dpo_loss_sign_flipped(pc, pr, rc, rr, beta):
    return dpo_reference(pr, pc, rr, rc, beta)  # the rejected answer is preferred


def dpo_loss_beta_left_out(pc, pr, rc, rr, beta):
    return dpo_reference(pc, pr, rc, rr, 1.0)


def dpo_loss_beta_outside(pc, pr, rc, rr, beta):
    margin = (pc - rc.detach()) - (pr - rr.detach())  # (B,)
    return -(beta * F.logsigmoid(margin)).mean()


def dpo_loss_reference_gradient(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()  # nothing detached


def dpo_loss_no_reference(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * (pc - pr)).mean()  # the reference's log-ratio left out


# ---------------------------------------------------------------------------------------------
# GRPO
# ---------------------------------------------------------------------------------------------


def group_advantages_over_the_batch(rewards, eps=1e-4):
    return (rewards - rewards.mean()) / (rewards.std() + eps)  # one mean, one std for all


def group_advantages_zero_std(rewards, eps=1e-4):
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (P, G)
    return centred / rewards.std(dim=1, keepdim=True)  # 0 / 0 for an equal group


def group_advantages_not_centred(rewards, eps=1e-4):
    return rewards / (rewards.std(dim=1, keepdim=True) + eps)


def group_advantages_baseline_after_scaling(rewards, eps=1e-4):
    scaled = rewards / (rewards.std(dim=1, keepdim=True) + eps)  # (P, G)
    return scaled - rewards.mean(dim=1, keepdim=True)  # the raw mean taken from scaled rewards


def _grpo_terms(lp, old, ref, adv, clip_eps):
    ratio = torch.exp(lp - old.detach())  # (B, T)
    a = adv.detach()[:, None]  # (B, 1)
    return ratio, a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)  # (B, T) each


def _grpo_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    zero = torch.zeros_like(per_token)
    return -(torch.where(mask, per_token, zero).sum(dim=1) / mask.sum(dim=1)).mean()


def _k3(lp, ref):
    log_r = ref.detach() - lp  # (B, T)
    return torch.exp(log_r) - log_r - 1


def grpo_loss_clip_max(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, clipped = _grpo_terms(lp, old, ref, adv, clip_eps)
    objective = torch.maximum(ratio * a, clipped * a)  # the optimistic bound
    return _grpo_mean(objective - kl_coef * _k3(lp, ref), mask)


def grpo_loss_clip_upper_only(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, _ = _grpo_terms(lp, old, ref, adv, clip_eps)
    clipped = torch.clamp(ratio, max=1 + clip_eps)  # no floor at 1 - eps
    return _grpo_mean(torch.minimum(ratio * a, clipped * a) - kl_coef * _k3(lp, ref), mask)


def grpo_loss_clip_lower_only(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, _ = _grpo_terms(lp, old, ref, adv, clip_eps)
    clipped = torch.clamp(ratio, min=1 - clip_eps)  # no ceiling at 1 + eps
    return _grpo_mean(torch.minimum(ratio * a, clipped * a) - kl_coef * _k3(lp, ref), mask)


def grpo_loss_old_gradient(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio = torch.exp(lp - old)  # (B, T): the sampling policy's log-probs left attached
    a = adv.detach()[:, None]  # (B, 1)
    objective = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    return _grpo_mean(objective - kl_coef * _k3(lp, ref), mask)


def grpo_loss_reference_gradient(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, clipped = _grpo_terms(lp, old, ref, adv, clip_eps)
    log_r = ref - lp  # (B, T): the reference's log-probs left attached
    kl = torch.exp(log_r) - log_r - 1
    return _grpo_mean(torch.minimum(ratio * a, clipped * a) - kl_coef * kl, mask)


def grpo_loss_all_tokens(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, clipped = _grpo_terms(lp, old, ref, adv, clip_eps)
    per_token = torch.minimum(ratio * a, clipped * a) - kl_coef * _k3(lp, ref)  # (B, T)
    return -per_token.mean(dim=1).mean()  # every position, the padding after the answer too


def grpo_loss_clip_advantage(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, _ = _grpo_terms(lp, old, ref, adv, clip_eps)
    clipped = torch.clamp(ratio * a, 1 - clip_eps, 1 + clip_eps)  # the product is clipped
    objective = torch.minimum(ratio * a, clipped)
    return _grpo_mean(objective - kl_coef * _k3(lp, ref), mask)


def grpo_loss_kl_sign(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, clipped = _grpo_terms(lp, old, ref, adv, clip_eps)
    log_r = lp - ref.detach()  # log pi / pi_ref: the estimator's ratio upside down
    kl = torch.exp(log_r) - log_r - 1
    return _grpo_mean(torch.minimum(ratio * a, clipped * a) - kl_coef * kl, mask)


def grpo_loss_kl_rewarded(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, clipped = _grpo_terms(lp, old, ref, adv, clip_eps)
    return _grpo_mean(torch.minimum(ratio * a, clipped * a) + kl_coef * _k3(lp, ref), mask)


def grpo_loss_token_mean(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, clipped = _grpo_terms(lp, old, ref, adv, clip_eps)
    per_token = torch.minimum(ratio * a, clipped * a) - kl_coef * _k3(lp, ref)  # (B, T)
    return -torch.where(mask, per_token, torch.zeros_like(per_token)).sum() / mask.sum()


# ---------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------

SFT_BUGS = [
    BugVariant(
        "sft.prompt_in_loss",
        SFT_ITEM,
        "the prompt's tokens are in the loss: the mean runs over every real token (the token "
        "mask) instead of the response's (the loss mask)",
        "Mask the targets with loss_mask[:, 1:] (True on the assistant's tokens only).",
        sft_loss_prompt_in_loss,
    ),
    BugVariant(
        "sft.padding_in_loss",
        SFT_ITEM,
        "padding and prompt are in the loss: the mean runs over every position of the batch",
        "Keep only the targets loss_mask[:, 1:] marks, in the sum and in the count.",
        sft_loss_padding_in_loss,
    ),
    BugVariant(
        "sft.per_sequence_mean",
        SFT_ITEM,
        "the length normalisation is per sequence: each answer's mean, then the mean over "
        "answers, so a short answer's tokens weigh more than a long one's",
        "Sum the masked losses over the whole batch and divide by the number of response "
        "targets in the batch.",
        sft_loss_per_sequence_mean,
    ),
    BugVariant(
        "sft.divided_by_positions",
        SFT_ITEM,
        "the masked sum is divided by the number of positions (padding and prompt counted) "
        "instead of the number of response targets",
        "Divide by loss_mask[:, 1:].sum(), the count of response targets.",
        sft_loss_divided_by_positions,
    ),
    BugVariant(
        "sft.not_shifted",
        SFT_ITEM,
        "the logits at position t are scored against token t instead of token t + 1",
        "Compare logits[:, :-1] with tokens[:, 1:] and mask with loss_mask[:, 1:].",
        sft_loss_not_shifted,
    ),
    BugVariant(
        "sft.mask_not_shifted",
        SFT_ITEM,
        "the logits are shifted but the mask is not: entry t of the losses scores token t + 1, "
        "and it is kept where loss_mask marks token t, so the answer's first token is left out "
        "and the token after it (end of turn or padding) is counted",
        "Shift the mask with the targets: loss_mask[:, 1:].",
        sft_loss_mask_not_shifted,
    ),
]

LORA_BUGS = [
    BugVariant(
        "lora.b_not_zero",
        LORA_ITEM,
        "lora_B does not start at zero, so the adapted layer changes the model before any training",
        "Initialise lora_B with zeros (lora_A random, like nn.Linear's weight).",
        LoRALinear_b_not_zero,
    ),
    BugVariant(
        "lora.both_zero",
        LORA_ITEM,
        "lora_A and lora_B both start at zero: each one's gradient is a product with the other, "
        "so neither ever gets one and the adapter never trains",
        "Initialise lora_A at random (kaiming_uniform_, a=sqrt(5), like nn.Linear's weight) and "
        "lora_B with zeros.",
        LoRALinear_both_zero,
    ),
    BugVariant(
        "lora.no_scaling",
        LORA_ITEM,
        "the low-rank change is added without its alpha / r scale",
        "Multiply x A^T B^T by alpha / r.",
        LoRALinear_no_scaling,
    ),
    BugVariant(
        "lora.scaled_by_alpha",
        LORA_ITEM,
        "the low-rank change is scaled by alpha instead of alpha / r",
        "Divide alpha by the rank r: the scale is alpha / r.",
        LoRALinear_scaled_by_alpha,
    ),
    BugVariant(
        "lora.base_not_frozen",
        LORA_ITEM,
        "the base layer's weight still takes gradients, so fine-tuning changes it too",
        "Set requires_grad_(False) on every parameter of base.",
        LoRALinear_base_not_frozen,
    ),
]

DPO_BUGS = [
    BugVariant(
        "dpo.sign_flipped",
        DPO_ITEM,
        "the margin is rejected minus chosen, so the loss teaches the rejected answer",
        "Use (pi_w - ref_w) - (pi_l - ref_l): chosen minus rejected.",
        dpo_loss_sign_flipped,
    ),
    BugVariant(
        "dpo.beta_left_out",
        DPO_ITEM,
        "beta is left out: the margin enters the sigmoid unscaled",
        "Multiply the margin by beta inside the log-sigmoid.",
        dpo_loss_beta_left_out,
    ),
    BugVariant(
        "dpo.beta_outside",
        DPO_ITEM,
        "beta multiplies the log-sigmoid instead of the margin inside it",
        "Compute -log sigmoid(beta * margin), beta inside.",
        dpo_loss_beta_outside,
    ),
    BugVariant(
        "dpo.reference_gradient",
        DPO_ITEM,
        "the gradient flows into the reference model's log-probabilities, which must stay frozen",
        "Detach the reference's log-probabilities (or compute them under torch.no_grad()).",
        dpo_loss_reference_gradient,
    ),
    BugVariant(
        "dpo.no_reference",
        DPO_ITEM,
        "the reference model is left out: the margin is the policy's log-ratio alone, so "
        "nothing holds the policy near where it started",
        "Subtract the reference's log-ratio: beta * ((pi_w - ref_w) - (pi_l - ref_l)).",
        dpo_loss_no_reference,
    ),
]

ADVANTAGES_BUGS = [
    BugVariant(
        "advantages.batch_normalised",
        ADVANTAGES_ITEM,
        "the rewards are normalised over the whole batch instead of over each prompt's group",
        "Take the mean and the std along dim=1 (each row is one prompt's group), keepdim=True.",
        group_advantages_over_the_batch,
    ),
    BugVariant(
        "advantages.zero_std",
        ADVANTAGES_ITEM,
        "the division by the group's std has no eps: a group whose rewards are all equal gives "
        "0 / 0 = NaN",
        "Divide by std + eps, so an equal group's advantages are 0.",
        group_advantages_zero_std,
    ),
    BugVariant(
        "advantages.not_centred",
        ADVANTAGES_ITEM,
        "the group's mean is not subtracted: every answer of a group that scores well is pushed up",
        "Subtract each group's mean reward before dividing by its std.",
        group_advantages_not_centred,
    ),
    BugVariant(
        "advantages.baseline_after_scaling",
        ADVANTAGES_ITEM,
        "the baseline is subtracted after normalising: the rewards are divided by the group's "
        "std, then the mean of the raw rewards is taken away, which centres nothing",
        "Subtract the group's mean first, then divide by std + eps: (r - mean) / (std + eps).",
        group_advantages_baseline_after_scaling,
    ),
]

GRPO_BUGS = [
    BugVariant(
        "grpo.clip_wrong_side",
        GRPO_ITEM,
        "the clipped and unclipped terms are combined with max instead of min, so the clip "
        "never limits a large step (the optimistic bound)",
        "Take torch.minimum(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A).",
        grpo_loss_clip_max,
    ),
    BugVariant(
        "grpo.clip_advantage",
        GRPO_ITEM,
        "the product ratio * A is clipped to [1 - eps, 1 + eps] instead of the ratio",
        "Clip the ratio, then multiply by the advantage.",
        grpo_loss_clip_advantage,
    ),
    BugVariant(
        "grpo.kl_sign",
        GRPO_ITEM,
        "the KL estimator uses log(pi / pi_ref) where Schulman's k3 needs log(pi_ref / pi)",
        "With d = ref_logprobs - logprobs, KL = exp(d) - d - 1.",
        grpo_loss_kl_sign,
    ),
    BugVariant(
        "grpo.kl_rewarded",
        GRPO_ITEM,
        "the KL term is added to the objective, so drifting from the reference is rewarded",
        "Subtract kl_coef * KL from the objective (the loss is its negative).",
        grpo_loss_kl_rewarded,
    ),
    BugVariant(
        "grpo.token_mean",
        GRPO_ITEM,
        "the tokens are averaged over the whole batch instead of over each answer first",
        "Average over each answer's own tokens (sum(dim=1) / mask.sum(dim=1)), then over "
        "the answers.",
        grpo_loss_token_mean,
    ),
    BugVariant(
        "grpo.all_tokens",
        GRPO_ITEM,
        "each answer is averaged over every position, the ones after it (padding) too, instead "
        "of over its own tokens",
        "Average with the mask: (per_token * mask).sum(dim=1) / mask.sum(dim=1).",
        grpo_loss_all_tokens,
    ),
    BugVariant(
        "grpo.clip_upper_only",
        GRPO_ITEM,
        "the ratio is clipped only from above (at 1 + eps), so an answer with a negative "
        "advantage is pushed down without limit",
        "Clip on both sides: torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps).",
        grpo_loss_clip_upper_only,
    ),
    BugVariant(
        "grpo.clip_lower_only",
        GRPO_ITEM,
        "the ratio is clipped only from below (at 1 - eps), so an answer with a positive "
        "advantage is pushed up without limit",
        "Clip on both sides: torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps).",
        grpo_loss_clip_lower_only,
    ),
    BugVariant(
        "grpo.old_gradient",
        GRPO_ITEM,
        "the gradient flows into the sampling policy's log-probabilities (old_logprobs), which "
        "are a constant of the loss",
        "Detach old_logprobs in the ratio: exp(logprobs - old_logprobs.detach()).",
        grpo_loss_old_gradient,
    ),
    BugVariant(
        "grpo.reference_gradient",
        GRPO_ITEM,
        "the gradient flows into the reference's log-probabilities through the KL term; the "
        "reference is frozen",
        "Detach ref_logprobs in the KL estimator.",
        grpo_loss_reference_gradient,
    ),
]

BUGS: list[BugVariant] = [*SFT_BUGS, *LORA_BUGS, *DPO_BUGS, *ADVANTAGES_BUGS, *GRPO_BUGS]
