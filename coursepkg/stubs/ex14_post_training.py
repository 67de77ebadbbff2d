"""Assignment ex14_post_training: the losses that turn a language model into an assistant.
Supervised fine-tuning's masked loss, a LoRA linear layer, DPO's loss from log-probabilities,
the per-token pieces (the entropy of each next-token distribution, a masked mean, the clipped
policy-gradient loss of each token), and GRPO's group advantages and loss, which can be
assembled from those pieces.

Dimension legend: B batch, L length, V vocabulary, P prompts, G answers per prompt, T targets.
"""

from __future__ import annotations

import math  # noqa: F401  (you may need it)

import torch  # noqa: F401  (you will need it)
import torch.nn.functional as F  # noqa: F401  (you may need it)
from torch import Tensor, nn


def sft_loss(logits: Tensor, tokens: Tensor, loss_mask: Tensor, token_mask: Tensor) -> Tensor:
    """The masked next-token loss of supervised fine-tuning, averaged over response tokens.

    Position t's logits predict token t + 1. Only targets marked by ``loss_mask`` (the
    assistant's tokens) count: never the prompt, never padding. The mean is over every
    response target of the batch (each token weighs the same, so a long answer weighs more).

    Args:
        logits: the model's next-token scores.
        tokens: the ids the model read.
        loss_mask: bool, True on the tokens to learn (the response); position 0 is never a target.
        token_mask: bool, True on real tokens, False on padding.

    Shape:
        logits (B, L, V), tokens (B, L), loss_mask (B, L), token_mask (B, L) -> a scalar.

    Returns:
        The mean cross-entropy in nats per response token, with a gradient.
    """
    raise NotImplementedError


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank change of its weight (LoRA).

    ``y = base(x) + (alpha / r) * x A^T B^T`` with ``lora_A`` of shape (r, in) initialised
    like ``nn.Linear``'s weight (kaiming-uniform, a=sqrt(5)) and ``lora_B`` of shape (out, r).
    The adapted layer must compute exactly what ``base`` computes before training, and only
    ``lora_A`` and ``lora_B`` may train.

    Args:
        base: the layer to adapt.
        r: the rank of the change.
        alpha: the change is scaled by alpha / r.

    Attributes:
        base: the given layer, its parameters frozen.
        lora_A, lora_B: ``nn.Parameter`` s of shapes (r, in) and (out, r).

    Shape:
        (..., in) -> (..., out).
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """The base layer's output plus the scaled low-rank change."""
        raise NotImplementedError


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    reference_chosen: Tensor,
    reference_rejected: Tensor,
    beta: float,
) -> Tensor:
    """DPO's loss, -log sigmoid(beta * ((pi_w - ref_w) - (pi_l - ref_l))), averaged over pairs.

    Args:
        policy_chosen: log pi(y_w | x), the policy's summed log-probability of each chosen answer.
        policy_rejected: log pi(y_l | x), the same for each rejected answer.
        reference_chosen: log pi_ref(y_w | x), the frozen reference's: no gradient may reach it.
        reference_rejected: log pi_ref(y_l | x).
        beta: how strongly the policy is held to the reference, > 0.

    Shape:
        each (B,) -> a scalar.

    Returns:
        The mean loss, with a gradient for the policy's log-probabilities only.
    """
    raise NotImplementedError


def token_entropy(logits: Tensor) -> Tensor:
    """The entropy of each next-token distribution, ``H = -sum_v p_v log p_v``, in nats.

    ``p = softmax(logits)`` over the last dimension. Some logits are so far below the largest
    that their probability is exactly 0 in floating point: take ``log p`` from the logits
    (``log_softmax``), where it stays finite, so such a token adds 0 to the sum, never NaN.

    Args:
        logits: unnormalised next-token scores (finite), the vocabulary on the last dimension.

    Shape:
        logits (..., V) -> (...).

    Returns:
        The entropy of each position, in the logits' dtype, with a gradient.
    """
    raise NotImplementedError


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """The mean of the entries of ``x`` that ``mask`` keeps: ``sum(x * mask) / sum(mask)``.

    With ``dim`` the sum and the count are taken along that dimension only, so each slice is
    divided by its own number of kept entries (each answer by its own length). Every slice the
    check uses keeps at least one entry.

    Args:
        x: per-token numbers.
        mask: bool, x's shape, True on the entries to average (the response's tokens).
        dim: the dimension to average along; None averages over all kept entries.

    Shape:
        x, mask (...) -> a scalar (dim None), or x's shape without ``dim``.

    Returns:
        The mean, with a gradient with respect to ``x``.
    """
    raise NotImplementedError


def grpo_clip_loss(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, clip_eps: float
) -> Tensor:
    """GRPO's policy-gradient loss of each token: PPO's clipped objective, negated.

    ``ratio = exp(log_probs - old_log_probs)`` (pi / pi_old) and, with A the answer's
    advantage on each of its tokens, ``loss = -min(ratio * A, clip(ratio, 1 - clip_eps,
    1 + clip_eps) * A)``. ``old_log_probs`` (the policy that sampled the answers) takes no
    gradient. With a single step per sample, ratio = 1 and the gradient is that of
    ``-A log pi``: REINFORCE with the group's mean reward as baseline.

    Args:
        log_probs: the policy's log-probability of each sampled token.
        old_log_probs: those of the policy that sampled the answers.
        advantages: one per answer.
        clip_eps: the ratio's clipping range, 0 < clip_eps < 1.

    Shape:
        log_probs, old_log_probs (B, T); advantages (B,) -> (B, T).

    Returns:
        The loss of every token (averaging is :func:`masked_mean`'s job), with a gradient.
    """
    raise NotImplementedError


def group_advantages(rewards: Tensor, eps: float = 1e-4) -> Tensor:
    """GRPO's advantages: each answer's reward against the other answers to the same prompt.

    ``A = (r - mean(r)) / (std(r) + eps)``, the mean and the (unbiased, G - 1) standard deviation
    taken over each prompt's group (each row). A group whose rewards are all equal gets
    advantages 0, never NaN.

    Args:
        rewards: one row per prompt, one column per answer.
        eps: added to the standard deviation.

    Shape:
        rewards (P, G) -> (P, G).
    """
    raise NotImplementedError


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    kl_coef: float,
) -> Tensor:
    """GRPO's clipped policy objective with a KL penalty, negated (a loss to minimise).

    Per token: ``ratio = exp(logprobs - old_logprobs)``,
    ``objective = min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A) - kl_coef * KL``
    with Schulman's estimator ``KL = exp(ref - logprobs) - (ref - logprobs) - 1`` (>= 0).
    Average over each answer's own tokens (``mask``), then over the answers, and negate.
    ``old_logprobs`` and ``ref_logprobs`` take no gradient. Your :func:`grpo_clip_loss` and
    :func:`masked_mean` are most of it.

    Args:
        logprobs: the policy's log-probability of each sampled token.
        old_logprobs: those of the policy that sampled the answers.
        ref_logprobs: those of the frozen reference.
        advantages: one per answer (flattened :func:`group_advantages`).
        mask: bool, True on the answer's tokens.
        clip_eps: the ratio's clipping range.
        kl_coef: the KL penalty's weight.

    Shape:
        logprobs, old_logprobs, ref_logprobs, mask (B, T); advantages (B,) -> a scalar.
    """
    raise NotImplementedError
