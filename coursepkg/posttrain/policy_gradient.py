"""Per-token policy-gradient losses, from the plain policy gradient to GRPO's clipped one with its
KL penalty (Williams, 1992; Schulman et al., 2017; Shao et al., 2024).

Each function returns a loss *per token* (B, T): what to average, and how, is the caller's
choice (:func:`~coursepkg.posttrain.per_token.masked_mean` over each answer, then over the
answers, is GRPO's). Every weight that comes from sampling (a reward, an advantage, the
sampling policy's or the reference's log-probabilities) is a constant of the loss: it is
detached here, so only the policy's log-probabilities take a gradient.

- :func:`policy_gradient_loss`: ``-R log pi(o_t)``; its gradient is the REINFORCE estimate
  ``-R grad log pi``, whose mean is the gradient of the expected reward.
- :func:`reinforce_with_baseline_loss`: ``-(R - b) log pi(o_t)``: a baseline b that does not
  depend on the answer leaves the mean unchanged (E[grad log pi] = 0) and lowers the variance.
- :func:`grpo_clip_loss`: ``-min(ratio A, clip(ratio, 1 - eps, 1 + eps) A)`` with
  ``ratio = pi(o_t) / pi_old(o_t)``: the step stops paying once the ratio left the range on the
  side the advantage pushes.
- :func:`k3_kl`: Schulman's estimator of KL(pi || pi_ref) from one sample,
  ``r - log r - 1`` with ``r = pi_ref / pi``: unbiased and never negative.
- :func:`grpo_token_loss`: the two together, ``clip loss + kl_coef * k3``.

Dimension legend: B answers, T answer positions (targets).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._validation import check_float

__all__ = [
    "ClippedLoss",
    "GRPOTokenLoss",
    "grpo_clip_loss",
    "grpo_token_loss",
    "k3_kl",
    "policy_gradient_loss",
    "reinforce_with_baseline_loss",
]


class ClippedLoss(NamedTuple):
    """What :func:`grpo_clip_loss` returns: ``loss`` (B, T) per token, and ``clipped`` (B, T)
    bool, True where the ratio lay outside [1 - eps, 1 + eps]."""

    loss: Tensor
    clipped: Tensor


class GRPOTokenLoss(NamedTuple):
    """What :func:`grpo_token_loss` returns, each (B, T): ``loss`` per token, ``clipped`` (as in
    :class:`ClippedLoss`) and ``kl``, the k3 estimate (detached, for logging)."""

    loss: Tensor
    clipped: Tensor
    kl: Tensor


def _per_answer(name: str, weights: Tensor, log_probs: Tensor) -> Tensor:
    """``weights`` (B,) as a detached column (B, 1) that broadcasts over the answer's tokens."""
    check_float("log_probs", log_probs, 2)
    check_float(name, weights, 1)
    if weights.size(0) != log_probs.size(0):
        raise ValueError(
            f"{name} must have one entry per answer, shape ({log_probs.size(0)},), got "
            f"{tuple(weights.shape)}"
        )
    return weights.detach()[:, None]  # (B, 1)


def _same_shape(name: str, x: Tensor, log_probs: Tensor) -> Tensor:
    check_float(name, x)
    if x.shape != log_probs.shape:
        raise ValueError(
            f"{name} must have log_probs' shape {tuple(log_probs.shape)}, got {tuple(x.shape)}"
        )
    return x.detach()


def policy_gradient_loss(log_probs: Tensor, rewards: Tensor) -> Tensor:
    """The plain policy gradient's loss, ``-R log pi(o_t)``, per token.

    Args:
        log_probs: the policy's log-probability of each sampled token (with a gradient).
        rewards: each answer's reward (or any per-answer weight, e.g. an advantage).

    Shape:
        log_probs (B, T), rewards (B,) -> (B, T).
    """
    weights = _per_answer("rewards", rewards, log_probs)  # (B, 1)
    return -weights * log_probs  # (B, T)


def reinforce_with_baseline_loss(log_probs: Tensor, rewards: Tensor, baseline: Tensor) -> Tensor:
    """REINFORCE with a baseline, ``-(R - b) log pi(o_t)``, per token.

    Args:
        log_probs: the policy's log-probability of each sampled token (with a gradient).
        rewards: each answer's reward.
        baseline: each answer's baseline (the mean reward of its group, say); it must not
            depend on the answer it is subtracted from for the estimate to stay unbiased.

    Shape:
        log_probs (B, T), rewards (B,), baseline (B,) -> (B, T).
    """
    check_float("baseline", baseline, 1)
    if baseline.shape != rewards.shape:
        raise ValueError(
            f"baseline must have rewards' shape {tuple(rewards.shape)}, got {tuple(baseline.shape)}"
        )
    return policy_gradient_loss(log_probs, rewards - baseline)  # (B, T)


def grpo_clip_loss(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, clip_eps: float
) -> ClippedLoss:
    """PPO's clipped surrogate as a loss, ``-min(ratio A, clip(ratio, 1 - eps, 1 + eps) A)``.

    Args:
        log_probs: the policy's log-probability of each sampled token (with a gradient).
        old_log_probs: those of the policy that sampled the answers (no gradient).
        advantages: one per answer.
        clip_eps: the ratio is clipped to [1 - clip_eps, 1 + clip_eps], 0 < clip_eps < 1.

    Shape:
        log_probs, old_log_probs (B, T), advantages (B,) -> :class:`ClippedLoss` of (B, T).
    """
    if not 0 < clip_eps < 1:
        raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps!r}")
    a = _per_answer("advantages", advantages, log_probs)  # (B, 1)
    old = _same_shape("old_log_probs", old_log_probs, log_probs)  # (B, T)
    ratio = torch.exp(log_probs - old)  # (B, T)
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)  # (B, T)
    loss = -torch.minimum(ratio * a, clipped * a)  # (B, T)
    return ClippedLoss(loss, (ratio != clipped).detach())


def k3_kl(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """Schulman's k3 estimate of KL(pi || pi_ref) per token: ``r - log r - 1``, r = pi_ref / pi.

    Its mean over tokens sampled from pi is the KL divergence (E_pi[r] = 1), and every term is
    >= 0 (log r <= r - 1), unlike the plain ``-log r``.

    Args:
        log_probs: the policy's log-probability of each sampled token (with a gradient).
        ref_log_probs: the frozen reference's (no gradient).

    Shape:
        log_probs, ref_log_probs (B, T) -> (B, T).
    """
    check_float("log_probs", log_probs)
    log_r = _same_shape("ref_log_probs", ref_log_probs, log_probs) - log_probs  # (B, T)
    return torch.exp(log_r) - log_r - 1  # (B, T), >= 0


def grpo_token_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    ref_log_probs: Tensor,
    advantages: Tensor,
    clip_eps: float = 0.2,
    kl_coef: float = 0.04,
) -> ClippedLoss:
    """GRPO's loss per token: the clipped policy loss plus ``kl_coef`` times the k3 estimate.

    Args:
        log_probs: the policy's log-probability of each sampled token (with a gradient).
        old_log_probs: those of the policy that sampled the answers.
        ref_log_probs: those of the frozen reference.
        advantages: one per answer.
        clip_eps: see :func:`grpo_clip_loss`.
        kl_coef: the weight of the KL penalty, >= 0 (0 removes it).

    Shape:
        log_probs, old_log_probs, ref_log_probs (B, T), advantages (B,) -> :class:`GRPOTokenLoss`.
    """
    if not kl_coef >= 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef!r}")
    policy = grpo_clip_loss(log_probs, old_log_probs, advantages, clip_eps)  # (B, T)
    kl = k3_kl(log_probs, ref_log_probs)  # (B, T)
    return GRPOTokenLoss(policy.loss + kl_coef * kl, policy.clipped, kl.detach())
