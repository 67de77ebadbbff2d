"""The catalogue of ex14_post_training: the known mistakes of the SFT loss, the LoRA layer, the
DPO loss, the per-token pieces (entropy, masked mean, the clipped policy-gradient loss) and
GRPO's advantages and loss, each a runnable variant with the stub's signature (a wrong
function, or for LoRA a subclass of the correct layer named ``LoRALinear_<mistake>`` overriding
the step it gets wrong), built on :mod:`..framework.post_training`'s references. The check
reruns a variant on the student's inputs and names it only when the numbers match.

Dimension legend: B batch, L length, V vocabulary, P prompts, G answers per prompt, T targets.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...posttrain.sft import sft_loss as _sft_loss
from ...posttrain.sft import token_losses
from ..framework import BugVariant
from ..framework.post_training import (
    LoRAReference,
    answer_mean_loss,
    clip_terms,
    dpo_reference,
    k3,
    pg_reference,
)

# each item's name and mistakes, and all of them: pairs read as a table, not one a line
__all__ = [
    "SFT_ITEM", "SFT_BUGS", "LORA_ITEM", "LORA_BUGS", "DPO_ITEM", "DPO_BUGS", "ENTROPY_ITEM",
    "ENTROPY_BUGS", "MASKED_MEAN_ITEM", "MASKED_MEAN_BUGS", "ADVANTAGES_ITEM", "ADVANTAGES_BUGS",
    "PG_ITEM", "PG_BUGS", "GRPO_ITEM", "GRPO_BUGS", "BUGS",
]  # fmt: skip

SFT_ITEM = "sft_loss"
LORA_ITEM = "LoRALinear"
DPO_ITEM = "dpo_loss"
ADVANTAGES_ITEM = "group_advantages"
GRPO_ITEM = "grpo_loss"
ENTROPY_ITEM = "token_entropy"
MASKED_MEAN_ITEM = "masked_mean"
PG_ITEM = "grpo_clip_loss"


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
# The per-token pieces and GRPO
# ---------------------------------------------------------------------------------------------


def token_entropy_log_of_softmax(logits):
    p = torch.softmax(logits, dim=-1)  # (..., V): a far-off token's p rounds to 0
    return -(p * torch.log(p)).sum(dim=-1)  # 0 * log 0 = 0 * -inf = NaN


def token_entropy_unnormalised(logits):
    return -(torch.softmax(logits, dim=-1) * logits).sum(dim=-1)  # the logits taken as log p


def token_entropy_sign_flipped(logits):
    return (torch.softmax(logits, dim=-1) * torch.log_softmax(logits, dim=-1)).sum(dim=-1)


def masked_mean_all_entries(x, mask, dim=None):
    return x.mean() if dim is None else x.mean(dim=dim)  # the masked entries averaged too


def masked_mean_divided_by_all(x, mask, dim=None):
    kept = torch.where(mask, x, torch.zeros_like(x))
    return kept.mean() if dim is None else kept.mean(dim=dim)  # zeros kept out, but counted


def masked_mean_count_over_all(x, mask, dim=None):
    kept = torch.where(mask, x, torch.zeros_like(x))
    return kept.sum() / mask.sum() if dim is None else kept.sum(dim=dim) / mask.sum()


def grpo_clip_loss_sign_flipped(lp, old, adv, clip_eps):
    return -pg_reference(lp, old, adv, clip_eps)  # the objective, which a step would lower


def grpo_clip_loss_clip_wrong_side(lp, old, adv, clip_eps):
    ratio, a, clipped = clip_terms(lp, old, adv, clip_eps)
    return -torch.maximum(ratio * a, clipped * a)  # the optimistic bound


def grpo_clip_loss_not_clipped(lp, old, adv, clip_eps):
    ratio, a, _ = clip_terms(lp, old, adv, clip_eps)
    return -ratio * a  # no trust region


def grpo_clip_loss_ratio_inverted(lp, old, adv, clip_eps):
    ratio = torch.exp(old.detach() - lp)  # (B, T): pi_old / pi
    a = adv.detach()[:, None]  # (B, 1)
    return -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)


def grpo_clip_loss_old_gradient(lp, old, adv, clip_eps):
    ratio = torch.exp(lp - old)  # (B, T): the sampling policy's log-probs left attached
    a = adv.detach()[:, None]  # (B, 1)
    return -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)


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


def grpo_loss_clip_max(lp, old, ref, adv, mask, clip_eps, kl_coef):
    pg = grpo_clip_loss_clip_wrong_side(lp, old, adv, clip_eps)  # (B, T): max, not min
    return answer_mean_loss(-pg - kl_coef * k3(lp, ref), mask)


def grpo_loss_clip_upper_only(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, _ = clip_terms(lp, old, adv, clip_eps)
    clipped = torch.clamp(ratio, max=1 + clip_eps)  # no floor at 1 - eps
    return answer_mean_loss(torch.minimum(ratio * a, clipped * a) - kl_coef * k3(lp, ref), mask)


def grpo_loss_clip_lower_only(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, _ = clip_terms(lp, old, adv, clip_eps)
    clipped = torch.clamp(ratio, min=1 - clip_eps)  # no ceiling at 1 + eps
    return answer_mean_loss(torch.minimum(ratio * a, clipped * a) - kl_coef * k3(lp, ref), mask)


def grpo_loss_old_gradient(lp, old, ref, adv, mask, clip_eps, kl_coef):
    pg = grpo_clip_loss_old_gradient(lp, old, adv, clip_eps)  # (B, T): old attached
    return answer_mean_loss(-pg - kl_coef * k3(lp, ref), mask)


def grpo_loss_reference_gradient(lp, old, ref, adv, mask, clip_eps, kl_coef):
    log_r = ref - lp  # (B, T): the reference's log-probs left attached
    kl = torch.exp(log_r) - log_r - 1
    return answer_mean_loss(-pg_reference(lp, old, adv, clip_eps) - kl_coef * kl, mask)


def grpo_loss_all_tokens(lp, old, ref, adv, mask, clip_eps, kl_coef):
    per_token = pg_reference(lp, old, adv, clip_eps) + kl_coef * k3(lp, ref)  # (B, T)
    return per_token.mean(dim=1).mean()  # every position, the padding after the answer too


def grpo_loss_clip_advantage(lp, old, ref, adv, mask, clip_eps, kl_coef):
    ratio, a, _ = clip_terms(lp, old, adv, clip_eps)
    clipped = torch.clamp(ratio * a, 1 - clip_eps, 1 + clip_eps)  # the product is clipped
    objective = torch.minimum(ratio * a, clipped)
    return answer_mean_loss(objective - kl_coef * k3(lp, ref), mask)


def grpo_loss_kl_sign(lp, old, ref, adv, mask, clip_eps, kl_coef):
    log_r = lp - ref.detach()  # log pi / pi_ref: the estimator's ratio upside down
    kl = torch.exp(log_r) - log_r - 1
    return answer_mean_loss(-pg_reference(lp, old, adv, clip_eps) - kl_coef * kl, mask)


def grpo_loss_kl_rewarded(lp, old, ref, adv, mask, clip_eps, kl_coef):
    return answer_mean_loss(-pg_reference(lp, old, adv, clip_eps) + kl_coef * k3(lp, ref), mask)


def grpo_loss_token_mean(lp, old, ref, adv, mask, clip_eps, kl_coef):
    per_token = pg_reference(lp, old, adv, clip_eps) + kl_coef * k3(lp, ref)  # (B, T)
    return torch.where(mask, per_token, torch.zeros_like(per_token)).sum() / mask.sum()


# ---------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------


def _mistakes(item: str, *rows: tuple) -> list[BugVariant]:
    """One item's :class:`BugVariant` s, from ``(id, description, advice, impl)`` rows."""
    return [BugVariant(bug_id, item, *rest) for bug_id, *rest in rows]


SFT_BUGS = _mistakes(
    SFT_ITEM,
    (
        "sft.prompt_in_loss",
        "the prompt's tokens are in the loss: the mean runs over every real token (the token "
        "mask) instead of the response's (the loss mask)",
        "Mask the targets with loss_mask[:, 1:] (True on the assistant's tokens only).",
        sft_loss_prompt_in_loss,
    ),
    (
        "sft.padding_in_loss",
        "padding and prompt are in the loss: the mean runs over every position of the batch",
        "Keep only the targets loss_mask[:, 1:] marks, in the sum and in the count.",
        sft_loss_padding_in_loss,
    ),
    (
        "sft.per_sequence_mean",
        "the length normalisation is per sequence: each answer's mean, then the mean over "
        "answers, so a short answer's tokens weigh more than a long one's",
        "Sum the masked losses over the whole batch and divide by the number of response "
        "targets in the batch.",
        sft_loss_per_sequence_mean,
    ),
    (
        "sft.divided_by_positions",
        "the masked sum is divided by the number of positions (padding and prompt counted) "
        "instead of the number of response targets",
        "Divide by loss_mask[:, 1:].sum(), the count of response targets.",
        sft_loss_divided_by_positions,
    ),
    (
        "sft.not_shifted",
        "the logits at position t are scored against token t instead of token t + 1",
        "Compare logits[:, :-1] with tokens[:, 1:] and mask with loss_mask[:, 1:].",
        sft_loss_not_shifted,
    ),
    (
        "sft.mask_not_shifted",
        "the logits are shifted but the mask is not: entry t of the losses scores token t + 1, "
        "and it is kept where loss_mask marks token t, so the answer's first token is left out "
        "and the token after it (end of turn or padding) is counted",
        "Shift the mask with the targets: loss_mask[:, 1:].",
        sft_loss_mask_not_shifted,
    ),
)

LORA_BUGS = _mistakes(
    LORA_ITEM,
    (
        "lora.b_not_zero",
        "lora_B does not start at zero, so the adapted layer changes the model before any training",
        "Initialise lora_B with zeros (lora_A random, like nn.Linear's weight).",
        LoRALinear_b_not_zero,
    ),
    (
        "lora.both_zero",
        "lora_A and lora_B both start at zero: each one's gradient is a product with the other, "
        "so neither ever gets one and the adapter never trains",
        "Initialise lora_A at random (kaiming_uniform_, a=sqrt(5), like nn.Linear's weight) and "
        "lora_B with zeros.",
        LoRALinear_both_zero,
    ),
    (
        "lora.no_scaling",
        "the low-rank change is added without its alpha / r scale",
        "Multiply x A^T B^T by alpha / r.",
        LoRALinear_no_scaling,
    ),
    (
        "lora.scaled_by_alpha",
        "the low-rank change is scaled by alpha instead of alpha / r",
        "Divide alpha by the rank r: the scale is alpha / r.",
        LoRALinear_scaled_by_alpha,
    ),
    (
        "lora.base_not_frozen",
        "the base layer's weight still takes gradients, so fine-tuning changes it too",
        "Set requires_grad_(False) on every parameter of base.",
        LoRALinear_base_not_frozen,
    ),
)

DPO_BUGS = _mistakes(
    DPO_ITEM,
    (
        "dpo.sign_flipped",
        "the margin is rejected minus chosen, so the loss teaches the rejected answer",
        "Use (pi_w - ref_w) - (pi_l - ref_l): chosen minus rejected.",
        dpo_loss_sign_flipped,
    ),
    (
        "dpo.beta_left_out",
        "beta is left out: the margin enters the sigmoid unscaled",
        "Multiply the margin by beta inside the log-sigmoid.",
        dpo_loss_beta_left_out,
    ),
    (
        "dpo.beta_outside",
        "beta multiplies the log-sigmoid instead of the margin inside it",
        "Compute -log sigmoid(beta * margin), beta inside.",
        dpo_loss_beta_outside,
    ),
    (
        "dpo.reference_gradient",
        "the gradient flows into the reference model's log-probabilities, which must stay frozen",
        "Detach the reference's log-probabilities (or compute them under torch.no_grad()).",
        dpo_loss_reference_gradient,
    ),
    (
        "dpo.no_reference",
        "the reference model is left out: the margin is the policy's log-ratio alone, so "
        "nothing holds the policy near where it started",
        "Subtract the reference's log-ratio: beta * ((pi_w - ref_w) - (pi_l - ref_l)).",
        dpo_loss_no_reference,
    ),
)

ADVANTAGES_BUGS = _mistakes(
    ADVANTAGES_ITEM,
    (
        "advantages.batch_normalised",
        "the rewards are normalised over the whole batch instead of over each prompt's group",
        "Take the mean and the std along dim=1 (each row is one prompt's group), keepdim=True.",
        group_advantages_over_the_batch,
    ),
    (
        "advantages.zero_std",
        "the division by the group's std has no eps: a group whose rewards are all equal gives "
        "0 / 0 = NaN",
        "Divide by std + eps, so an equal group's advantages are 0.",
        group_advantages_zero_std,
    ),
    (
        "advantages.not_centred",
        "the group's mean is not subtracted: every answer of a group that scores well is pushed up",
        "Subtract each group's mean reward before dividing by its std.",
        group_advantages_not_centred,
    ),
    (
        "advantages.baseline_after_scaling",
        "the baseline is subtracted after normalising: the rewards are divided by the group's "
        "std, then the mean of the raw rewards is taken away, which centres nothing",
        "Subtract the group's mean first, then divide by std + eps: (r - mean) / (std + eps).",
        group_advantages_baseline_after_scaling,
    ),
)

GRPO_BUGS = _mistakes(
    GRPO_ITEM,
    (
        "grpo.clip_wrong_side",
        "the clipped and unclipped terms are combined with max instead of min, so the clip "
        "never limits a large step (the optimistic bound)",
        "Take torch.minimum(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A).",
        grpo_loss_clip_max,
    ),
    (
        "grpo.clip_advantage",
        "the product ratio * A is clipped to [1 - eps, 1 + eps] instead of the ratio",
        "Clip the ratio, then multiply by the advantage.",
        grpo_loss_clip_advantage,
    ),
    (
        "grpo.kl_sign",
        "the KL estimator uses log(pi / pi_ref) where Schulman's k3 needs log(pi_ref / pi)",
        "With d = ref_logprobs - logprobs, KL = exp(d) - d - 1.",
        grpo_loss_kl_sign,
    ),
    (
        "grpo.kl_rewarded",
        "the KL term is added to the objective, so drifting from the reference is rewarded",
        "Subtract kl_coef * KL from the objective (the loss is its negative).",
        grpo_loss_kl_rewarded,
    ),
    (
        "grpo.token_mean",
        "the tokens are averaged over the whole batch instead of over each answer first",
        "Average over each answer's own tokens (sum(dim=1) / mask.sum(dim=1)), then over "
        "the answers.",
        grpo_loss_token_mean,
    ),
    (
        "grpo.all_tokens",
        "each answer is averaged over every position, the ones after it (padding) too, instead "
        "of over its own tokens",
        "Average with the mask: (per_token * mask).sum(dim=1) / mask.sum(dim=1).",
        grpo_loss_all_tokens,
    ),
    (
        "grpo.clip_upper_only",
        "the ratio is clipped only from above (at 1 + eps), so an answer with a negative "
        "advantage is pushed down without limit",
        "Clip on both sides: torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps).",
        grpo_loss_clip_upper_only,
    ),
    (
        "grpo.clip_lower_only",
        "the ratio is clipped only from below (at 1 - eps), so an answer with a positive "
        "advantage is pushed up without limit",
        "Clip on both sides: torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps).",
        grpo_loss_clip_lower_only,
    ),
    (
        "grpo.old_gradient",
        "the gradient flows into the sampling policy's log-probabilities (old_logprobs), which "
        "are a constant of the loss",
        "Detach old_logprobs in the ratio: exp(logprobs - old_logprobs.detach()).",
        grpo_loss_old_gradient,
    ),
    (
        "grpo.reference_gradient",
        "the gradient flows into the reference's log-probabilities through the KL term; the "
        "reference is frozen",
        "Detach ref_logprobs in the KL estimator.",
        grpo_loss_reference_gradient,
    ),
)

ENTROPY_BUGS = _mistakes(
    ENTROPY_ITEM,
    (
        "entropy.log_of_softmax",
        "log p is taken of the softmax's output: a token far below the best one has p = 0 in "
        "floating point, and 0 * log 0 = 0 * -inf gives NaN",
        "Take log p from torch.log_softmax (or logsumexp(z) - z), never torch.log(softmax(z)).",
        token_entropy_log_of_softmax,
    ),
    (
        "entropy.unnormalised",
        "the logits are used as log-probabilities: log p = z - logsumexp(z), not z",
        "Use log_softmax(logits) for log p.",
        token_entropy_unnormalised,
    ),
    (
        "entropy.sign_flipped",
        "the minus sign is left out: sum p log p is the entropy's negative (<= 0)",
        "H = -sum_v p_v log p_v, which is >= 0.",
        token_entropy_sign_flipped,
    ),
)

MASKED_MEAN_BUGS = _mistakes(
    MASKED_MEAN_ITEM,
    (
        "masked_mean.all_entries",
        "the mask is ignored: every entry is averaged, the masked ones (prompt, padding) too",
        "Sum only the kept entries and divide by how many are kept: sum(x * mask) / sum(mask).",
        masked_mean_all_entries,
    ),
    (
        "masked_mean.divided_by_all",
        "the masked entries are left out of the sum but counted: (x * mask).mean() divides by "
        "every position instead of the kept ones",
        "Divide by mask.sum() (along dim when one is given), not by the number of entries.",
        masked_mean_divided_by_all,
    ),
    (
        "masked_mean.count_over_all",
        "along a dimension, each slice's sum is divided by the count of kept entries of the "
        "whole tensor instead of that slice's",
        "Count along the same dimension: mask.sum(dim=dim).",
        masked_mean_count_over_all,
    ),
)

PG_BUGS = _mistakes(
    PG_ITEM,
    (
        "pg.sign_flipped",
        "the objective is returned instead of the loss: minimising it lowers the probability of "
        "the answers with a positive advantage",
        "Negate: loss = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A).",
        grpo_clip_loss_sign_flipped,
    ),
    (
        "pg.clip_wrong_side",
        "the clipped and unclipped terms are combined with max instead of min (the optimistic "
        "bound), so the clip never limits a large step",
        "Take torch.minimum(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A), then negate.",
        grpo_clip_loss_clip_wrong_side,
    ),
    (
        "pg.not_clipped",
        "the ratio is never clipped: -ratio * A lets one batch move the policy without limit",
        "Also compute clip(ratio, 1 - eps, 1 + eps) * A and keep the minimum of the two.",
        grpo_clip_loss_not_clipped,
    ),
    (
        "pg.ratio_inverted",
        "the ratio is upside down: pi_old / pi instead of pi / pi_old",
        "ratio = exp(log_probs - old_log_probs).",
        grpo_clip_loss_ratio_inverted,
    ),
    (
        "pg.old_gradient",
        "the gradient flows into old_log_probs, the sampling policy's, a constant of the loss",
        "Detach old_log_probs in the ratio: exp(log_probs - old_log_probs.detach()).",
        grpo_clip_loss_old_gradient,
    ),
)

BUGS: list[BugVariant] = [
    *SFT_BUGS,
    *LORA_BUGS,
    *DPO_BUGS,
    *ENTROPY_BUGS,
    *MASKED_MEAN_BUGS,
    *ADVANTAGES_BUGS,
    *PG_BUGS,
    *GRPO_BUGS,
]
