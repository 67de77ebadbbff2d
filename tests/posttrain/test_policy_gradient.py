"""Tests of coursepkg.posttrain.policy_gradient: each per-token loss against its formula written
element by element on random inputs, the gradient reaching only the policy's log-probabilities,
the baseline leaving the expected gradient unchanged, and the clip on the side the advantage
pushes."""

from __future__ import annotations

import math

import pytest
import torch

from coursepkg.posttrain.policy_gradient import (
    grpo_clip_loss,
    grpo_token_loss,
    k3_kl,
    policy_gradient_loss,
    reinforce_with_baseline_loss,
)

B, T = 4, 6


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    logp = -3.0 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old = logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios around 1
    ref = logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    rewards = torch.randn(B, generator=g, dtype=torch.float64)
    baseline = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, ref, rewards, baseline


def _each(fn):
    """fn(b, t) for every entry, as a (B, T) tensor: the formula written one number at a time."""
    return torch.tensor([[fn(b, t) for t in range(T)] for b in range(B)], dtype=torch.float64)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_each_loss_is_its_formula(seed):
    logp, old, ref, r, base = _inputs(seed)
    lp, o, rf, rw, bs = (x.tolist() for x in (logp, old, ref, r, base))
    close = dict(rtol=0, atol=1e-12)
    torch.testing.assert_close(
        policy_gradient_loss(logp, r), _each(lambda b, t: -rw[b] * lp[b][t]), **close
    )
    torch.testing.assert_close(
        reinforce_with_baseline_loss(logp, r, base),
        _each(lambda b, t: -(rw[b] - bs[b]) * lp[b][t]),
        **close,
    )

    def clip(b, t, eps=0.2):
        ratio = math.exp(lp[b][t] - o[b][t])
        return -min(ratio * rw[b], min(max(ratio, 1 - eps), 1 + eps) * rw[b])

    def k3(b, t):
        d = rf[b][t] - lp[b][t]
        return math.exp(d) - d - 1

    out = grpo_clip_loss(logp, old, r, 0.2)
    torch.testing.assert_close(out.loss, _each(clip), **close)
    torch.testing.assert_close(k3_kl(logp, ref), _each(k3), **close)
    both = grpo_token_loss(logp, old, ref, r, 0.2, 0.3)
    torch.testing.assert_close(both.loss, _each(lambda b, t: clip(b, t) + 0.3 * k3(b, t)), **close)
    ratio = (logp - old).exp()
    assert torch.equal(out.clipped, (ratio < 0.8) | (ratio > 1.2)) and out.clipped.any()


def test_only_the_policy_s_log_probs_take_a_gradient():
    logp, old, ref, r, base = (x.requires_grad_(True) for x in _inputs(14))
    grpo_token_loss(logp, old, ref, r, 0.2, 0.1).loss.sum().backward()
    reinforce_with_baseline_loss(logp, r, base).sum().backward()
    assert logp.grad is not None and logp.grad.abs().sum() > 0
    assert all(x.grad is None for x in (old, ref, r, base))


def test_the_policy_gradient_is_minus_the_reward_and_the_baseline_keeps_its_mean():
    logp, _, _, r, _ = _inputs(15)
    logp.requires_grad_(True)
    policy_gradient_loss(logp, r).sum().backward()
    torch.testing.assert_close(logp.grad, -r[:, None].expand(B, T))
    # E[grad log pi] = 0 over samples from pi: on a categorical policy, summed with the exact
    # probabilities, a baseline changes nothing in the expected gradient.
    theta = torch.randn(5, dtype=torch.float64, requires_grad=True)
    reward = torch.randn(5, dtype=torch.float64)
    grads = []
    for baseline in (0.0, 1.7):
        p = theta.softmax(-1).detach()  # the sampling distribution: a constant
        logp_all = theta.log_softmax(-1)[:, None]  # (5, 1): one "answer" per outcome
        loss = reinforce_with_baseline_loss(logp_all, reward, torch.full((5,), baseline))
        (grad,) = torch.autograd.grad((p[:, None] * loss).sum(), theta)
        grads.append(grad)
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize(
    ("advantage", "ratio", "flat"),
    [(1.0, 1.5, True), (1.0, 0.5, False), (-1.0, 0.5, True), (-1.0, 1.5, False)],
)
def test_the_clip_stops_the_push_only_on_the_advantage_s_side(advantage, ratio, flat):
    old = torch.full((1, 3), -1.0, dtype=torch.float64)
    logp = (old + math.log(ratio)).requires_grad_(True)
    grpo_clip_loss(
        logp, old, torch.tensor([advantage], dtype=torch.float64), 0.2
    ).loss.sum().backward()
    assert bool((logp.grad == 0).all()) == flat


def test_k3_is_non_negative_zero_at_the_reference_and_unbiased():
    logp, _, ref, _, _ = _inputs(16)
    assert (k3_kl(logp, ref) >= 0).all() and k3_kl(ref, ref).abs().max() == 0
    # Its mean under pi is KL(pi || pi_ref): exactly, weighting every outcome by pi.
    g = torch.Generator().manual_seed(17)
    pi = torch.randn(7, generator=g, dtype=torch.float64).log_softmax(-1)
    pi_ref = torch.randn(7, generator=g, dtype=torch.float64).log_softmax(-1)
    expected = (pi.exp() * (pi - pi_ref)).sum()
    got = (pi.exp() * k3_kl(pi[None], pi_ref[None])[0]).sum()
    torch.testing.assert_close(got, expected)


def test_bad_arguments_are_named():
    logp, old, ref, r, _ = _inputs(18)
    with pytest.raises(
        ValueError, match=r"advantages must have one entry per answer, shape \(4,\)"
    ):
        grpo_clip_loss(logp, old, r[:3], 0.2)
    with pytest.raises(ValueError, match=r"old_log_probs must have log_probs' shape"):
        grpo_clip_loss(logp, old[:, :2], r, 0.2)
    with pytest.raises(ValueError, match="clip_eps must be in"):
        grpo_clip_loss(logp, old, r, 1.5)
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        grpo_token_loss(logp, old, ref, r, 0.2, -1.0)
