"""ex14's GRPO mistakes: the per-token pieces (entropy, masked mean, the clipped
policy-gradient loss), the group advantages and GRPO's loss, each a wrong version with the
stub's signature.

Dimension legend: B batch, L length, V vocabulary, P prompts, G answers per prompt, T targets.
"""

from __future__ import annotations

import torch

from ...framework.post_training import (
    answer_mean_loss,
    clip_terms,
    k3,
    pg_reference,
)
from . import mistakes

__all__ = [
    "ADVANTAGES_BUGS",
    "ADVANTAGES_ITEM",
    "ENTROPY_BUGS",
    "ENTROPY_ITEM",
    "GRPO_BUGS",
    "GRPO_ITEM",
    "MASKED_MEAN_BUGS",
    "MASKED_MEAN_ITEM",
    "PG_BUGS",
    "PG_ITEM",
]

ADVANTAGES_ITEM = "group_advantages"
GRPO_ITEM = "grpo_loss"
ENTROPY_ITEM = "token_entropy"
MASKED_MEAN_ITEM = "masked_mean"
PG_ITEM = "grpo_clip_loss"


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


def masked_mean_dim_ignored(x, mask, dim=None):
    return x[mask].mean()  # one mean over every kept entry, whatever dim says


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


def group_advantages_population_std(rewards, eps=1e-4):
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (P, G)
    return centred / (rewards.std(dim=1, unbiased=False, keepdim=True) + eps)  # over G, not G - 1


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


ADVANTAGES_BUGS = mistakes(
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
    (
        "advantages.population_std",
        "the standard deviation divides by G (the population's) instead of G - 1 (the "
        "unbiased one the task asks for), so the advantages are sqrt(G / (G - 1)) too large",
        "Use rewards.std(dim=1, keepdim=True) (unbiased, G - 1), as torch.std does by default.",
        group_advantages_population_std,
    ),
)

GRPO_BUGS = mistakes(
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

ENTROPY_BUGS = mistakes(
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

MASKED_MEAN_BUGS = mistakes(
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
    (
        "masked_mean.dim_ignored",
        "dim is ignored: the mean is taken over every kept entry of x, one number, instead "
        "of along dim (one mean per slice, each divided by its own count of kept entries)",
        "With dim, sum x * mask and mask along that dimension only: (x * mask).sum(dim) / "
        "mask.sum(dim).",
        masked_mean_dim_ignored,
    ),
)

PG_BUGS = mistakes(
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
