"""GRPO: reinforcement learning from a checkable reward, with the group as the baseline
(group relative policy optimisation; Shao et al., 2024, DeepSeekMath).

For each prompt the policy samples a *group* of G answers; a reward function scores each (1 if
the arithmetic is right, say). An answer's **advantage** is how much better it did than its own
group: ``A_i = (r_i - mean(r)) / (std(r) + eps)`` (or without the division). No value network is
needed, and a group whose answers all score the same teaches nothing (every A_i is 0, never a
division by zero).

The policy then raises the log-probability of the tokens of answers with A > 0 and lowers the
others', per token, with PPO's clipped objective and a penalty for drifting from the frozen
reference policy:

    ratio_t = pi(o_t) / pi_old(o_t)
    objective_t = min(ratio_t A, clip(ratio_t, 1 - eps, 1 + eps) A) - kl_coef * KL_t
    KL_t = pi_ref(o_t)/pi(o_t) - log(pi_ref(o_t)/pi(o_t)) - 1     (>= 0; Schulman's "k3")

averaged over each answer's own tokens (the response mask), then over the answers; the loss is
its negative. pi_old is the policy that sampled the answers: with one update per sample the
ratio is 1 and the clip matters only from the second update on.

Dimension legend: P prompts, G answers per prompt, B = P G rows, L length.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .chat import ChatExample
from .packing import Batch, pad_batch
from .per_token import masked_mean, token_log_probs
from .policy_gradient import grpo_token_loss

__all__ = [
    "GRPOOutput",
    "Rollouts",
    "group_advantages",
    "grpo_loss",
    "grpo_step",
    "per_token_logprobs",
    "sample_groups",
    "score_rollouts",
]

#: reward_fn(prompt ids, answer ids) -> a number.
RewardFn = Callable[[list[int], list[int]], float]


class Rollouts(NamedTuple):
    """Sampled answers: G per prompt, prompt p's at rows p G .. p G + G - 1.

    Attributes:
        batch: the prompts with their answers, padded (loss mask True on the answer's tokens,
            its end-of-turn included; nothing after it).
        prompts: the P prompts' ids.
        answers: the B = P G answers' ids (up to and including the end-of-turn token).
    """

    batch: Batch
    prompts: list[list[int]]
    answers: list[list[int]]


class GRPOOutput(NamedTuple):
    """What :func:`grpo_loss` returns: ``loss`` (scalar, with a gradient), ``kl`` (the mean
    per-token KL estimate) and ``clip_fraction`` (the fraction of tokens whose ratio was
    clipped), the last two detached."""

    loss: Tensor
    kl: Tensor
    clip_fraction: Tensor


@torch.no_grad()
def sample_groups(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    group_size: int,
    max_new_tokens: int,
    end_id: int,
    pad_id: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Rollouts:
    """Sample ``group_size`` answers to each prompt.

    Args:
        model: a :class:`~coursepkg.decoder_only.DecoderOnlyLM`.
        prompts: each prompt's ids, ending with the cue to answer (``<|assistant|>``).
        group_size: G, >= 2 (one answer has no group to be compared with).
        max_new_tokens: the longest answer; an answer stops at its first ``end_id``.
        end_id: the end-of-turn id.
        pad_id: the id filling the rows after each answer.
        temperature: the sampling temperature, > 0 (the answers of a group must differ).
        generator: for reproducible samples.

    Returns:
        :class:`Rollouts` with B = P G rows.
    """
    if not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size must be an integer >= 2, got {group_size!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to sample a group, got {temperature!r}")
    context = model.config.max_len
    device = next(model.parameters()).device
    prompts = [list(prompt) for prompt in prompts]
    for index, prompt in enumerate(prompts):
        if len(prompt) + max_new_tokens > context:
            raise ValueError(
                f"prompts[{index}] has {len(prompt)} tokens: with max_new_tokens={max_new_tokens} "
                f"it is longer than the context max_len={context}"
            )
    by_length: dict[int, list[int]] = {}  # prompts of one length share one call of generate
    for index, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(index)
    model.eval()
    groups: dict[int, list[list[int]]] = {}
    for length, indices in by_length.items():
        rows = [prompts[i] for i in indices for _ in range(group_size)]
        rows = torch.tensor(rows, device=device)  # (k G, P_len)
        out = model.generate(rows, max_new_tokens, temperature=temperature, generator=generator)
        out = out[:, length:].tolist()  # (k G, N) -> k G lists
        for j, index in enumerate(indices):
            groups[index] = out[j * group_size : (j + 1) * group_size]
    examples, answers = [], []
    for index, prompt in enumerate(prompts):
        for row in groups[index]:
            answer = row[: row.index(end_id) + 1] if end_id in row else row
            answers.append(answer)
            examples.append(
                ChatExample(prompt + answer, [False] * len(prompt) + [True] * len(answer))
            )
    return Rollouts(pad_batch(examples, pad_id), [list(p) for p in prompts], answers)


def score_rollouts(reward_fn: RewardFn, rollouts: Rollouts) -> Tensor:
    """Each answer's reward.

    Args:
        reward_fn: ``reward_fn(prompt_ids, answer_ids)`` -> a finite number (a bool counts as
            0 or 1).
        rollouts: from :func:`sample_groups`.

    Shape:
        -> (P, G) float32.
    """
    group = len(rollouts.answers) // len(rollouts.prompts)
    rewards = []
    for index, answer in enumerate(rollouts.answers):
        prompt = rollouts.prompts[index // group]
        try:
            reward = reward_fn(prompt, answer)
        except Exception as error:
            raise RuntimeError(
                f"the reward function raised on prompt {index // group}, answer {index % group} "
                f"(answer ids {answer}): {type(error).__name__}: {error}"
            ) from error
        # A bool counts (True = 1: "is the answer right?"), as does a one-number tensor.
        if not isinstance(reward, numbers.Real):
            if not (isinstance(reward, Tensor) and reward.numel() == 1):
                raise TypeError(
                    f"the reward function must return a number, got {type(reward).__name__} on "
                    f"prompt {index // group}, answer {index % group}"
                )
        if not math.isfinite(float(reward)):
            raise ValueError(
                f"the reward function returned {float(reward)} on prompt {index // group}, "
                f"answer {index % group}: rewards must be finite"
            )
        rewards.append(float(reward))
    return torch.tensor(rewards).view(len(rollouts.prompts), group)  # (P, G)


def group_advantages(rewards: Tensor, scale_by_std: bool = True, eps: float = 1e-4) -> Tensor:
    """Each answer's reward relative to its own group.

    Args:
        rewards: one row per prompt, one column per answer.
        scale_by_std: divide by the group's standard deviation (the unbiased one, G - 1) plus
            ``eps``; without it the advantage is the reward minus the group's mean.
        eps: keeps the division finite when a group's rewards are all equal (their advantages
            are then 0).

    Shape:
        rewards (P, G) -> (P, G).
    """
    if rewards.dim() != 2 or rewards.size(1) < 2:
        raise ValueError(
            f"rewards must have shape (P, G) with G >= 2 answers per prompt, got "
            f"{tuple(rewards.shape)}"
        )
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (P, G)
    if not scale_by_std:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)  # (P, G)


def per_token_logprobs(model: nn.Module, batch: Batch) -> Tensor:
    """log pi(token t + 1 | tokens <= t) at every position.

    Shape:
        batch (B, L) -> (B, L - 1).
    """
    logits = model(batch.tokens, batch.token_mask)  # (B, L, V)
    return token_log_probs(logits, batch.tokens)  # (B, L-1)


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    kl_coef: float = 0.04,
) -> GRPOOutput:
    """GRPO's clipped objective with the KL penalty, negated (a loss to minimise).

    Args:
        logprobs: the policy's per-token log-probabilities (with a gradient).
        old_logprobs: those of the policy that sampled the answers.
        ref_logprobs: those of the frozen reference.
        advantages: one per answer (:func:`group_advantages`, flattened).
        mask: bool, True on the answer's tokens (the targets: the loss mask without position 0).
        clip_eps: the ratio is clipped to [1 - clip_eps, 1 + clip_eps].
        kl_coef: the weight of the KL penalty (0 removes it).

    Shape:
        logprobs, old_logprobs, ref_logprobs, mask (B, T); advantages (B,) -> :class:`GRPOOutput`.
    """
    for name, x in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs), ("mask", mask)):
        if x.shape != logprobs.shape:
            raise ValueError(
                f"{name} must have logprobs' shape {tuple(logprobs.shape)}, got {tuple(x.shape)}"
            )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(
            f"advantages must have shape (B,)={tuple(logprobs.shape[:1])}, got "
            f"{tuple(advantages.shape)}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    counts = mask.sum(dim=1)  # (B,)
    if bool((counts == 0).any()):
        raise ValueError(
            f"mask marks no token in rows {(counts == 0).nonzero().flatten().tolist()}"
        )
    token = grpo_token_loss(logprobs, old_logprobs, ref_logprobs, advantages, clip_eps, kl_coef)
    per_answer = masked_mean(token.loss, mask, dim=1)  # (B,): each answer's own tokens first
    kl_mean = masked_mean(token.kl, mask)
    clip_fraction = masked_mean(token.clipped.float(), mask)
    return GRPOOutput(per_answer.mean(), kl_mean, clip_fraction)


def grpo_step(
    policy: nn.Module,
    reference: nn.Module,
    optimizer: torch.optim.Optimizer,
    prompts: Sequence[Sequence[int]],
    reward_fn: RewardFn,
    *,
    group_size: int,
    max_new_tokens: int,
    end_id: int,
    pad_id: int,
    temperature: float = 1.0,
    scale_by_std: bool = True,
    clip_eps: float = 0.2,
    kl_coef: float = 0.04,
    updates: int = 1,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Sample a group per prompt, score it, and take ``updates`` optimiser steps on it.

    Args:
        policy: the model trained (a :class:`~coursepkg.decoder_only.DecoderOnlyLM`).
        reference: its frozen starting point (:func:`~coursepkg.posttrain.dpo.frozen_copy`).
        optimizer: over the policy's trainable parameters.
        prompts: the prompts' ids.
        reward_fn: ``reward_fn(prompt_ids, answer_ids)`` -> a number.
        group_size, max_new_tokens, end_id, pad_id, temperature: see :func:`sample_groups`.
        scale_by_std: see :func:`group_advantages`.
        clip_eps, kl_coef: see :func:`grpo_loss`.
        updates: optimiser steps on the same answers (the ratio leaves 1 after the first).
        generator: for reproducible samples.

    Returns:
        ``reward`` (the mean), ``loss`` and ``kl`` (of the last update), ``clip_fraction``.
    """
    if not isinstance(updates, int) or updates < 1:
        raise ValueError(f"updates must be an integer >= 1, got {updates!r}")
    rollouts = sample_groups(
        policy, prompts, group_size, max_new_tokens, end_id, pad_id, temperature, generator
    )
    rewards = score_rollouts(reward_fn, rollouts)  # (P, G)
    advantages = group_advantages(rewards, scale_by_std).flatten()  # (B,)
    device = next(policy.parameters()).device
    batch = Batch(*(x.to(device) for x in rollouts.batch))
    mask = batch.loss_mask[:, 1:]  # (B, L-1): the targets that are answer tokens
    with torch.no_grad():
        old = per_token_logprobs(policy, batch)  # (B, L-1), policy still in eval mode
        ref = per_token_logprobs(reference, batch)  # (B, L-1)
    policy.train()
    for _ in range(updates):
        out = grpo_loss(
            per_token_logprobs(policy, batch), old, ref, advantages, mask, clip_eps, kl_coef
        )
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
    return {
        "reward": float(rewards.mean()),
        "loss": float(out.loss.detach()),
        "kl": float(out.kl),
        "clip_fraction": float(out.clip_fraction),
    }
