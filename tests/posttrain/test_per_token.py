"""Tests of coursepkg.posttrain.per_token: entropy and per-token log-probabilities against their
formulas and TRL's implementations on random inputs, the masked mean and the masked normalisation
against their definitions, along a dimension and over all."""

from __future__ import annotations

import pytest
import torch

from coursepkg.posttrain.per_token import (
    masked_mean,
    masked_normalize,
    token_entropy,
    token_log_probs,
)


def _logits(seed, shape=(3, 7, 11)):
    g = torch.Generator().manual_seed(seed)
    return 3.0 * torch.randn(shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_entropy_is_minus_sum_p_log_p(seed):
    logits = _logits(seed)
    p = torch.softmax(logits, dim=-1)
    torch.testing.assert_close(token_entropy(logits), -(p * p.log()).sum(-1), rtol=0, atol=1e-10)


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_entropy_is_trl_s_and_finite_where_a_probability_is_zero():
    trl_utils = pytest.importorskip("trl.trainer.utils")
    logits = _logits(4)
    torch.testing.assert_close(
        token_entropy(logits), trl_utils.entropy_from_logits(logits), rtol=0, atol=1e-10
    )
    certain = torch.tensor([[0.0, -float("inf"), -float("inf")]])  # one token of probability 1
    assert token_entropy(certain).tolist() == [0.0]
    uniform = torch.zeros(2, 5, dtype=torch.float64)
    torch.testing.assert_close(token_entropy(uniform), torch.full((2,), 5.0).double().log())


@pytest.mark.parametrize("seed", [5, 6])
def test_log_probs_are_the_next_token_s_and_trl_s(seed):
    logits = _logits(seed)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 11, (3, 7), generator=g)
    logp, entropy = token_log_probs(logits, tokens, with_entropy=True)
    assert logp.shape == entropy.shape == (3, 6)
    for b in range(3):
        for t in range(6):  # position t predicts token t + 1
            expected = logits[b, t].log_softmax(-1)[tokens[b, t + 1]]
            assert abs(float(logp[b, t] - expected)) < 1e-12
    torch.testing.assert_close(entropy, token_entropy(logits[:, :-1]))
    trl_utils = pytest.importorskip("trl.trainer.utils")
    expected = trl_utils.selective_log_softmax(logits[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(logp, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(token_log_probs(logits, tokens), logp)


def test_log_probs_refuse_logits_and_tokens_that_disagree():
    with pytest.raises(ValueError, match=r"must agree on \(B, L\)"):
        token_log_probs(_logits(0), torch.zeros(3, 6, dtype=torch.long))


@pytest.mark.parametrize("dim", [None, 0, 1, -1])
def test_masked_mean_and_normalize_are_their_definitions(dim):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=g) < 0.6
    mask[:, 0] = mask[0, :] = True  # no empty slice
    x_nan = torch.where(mask, x, torch.full_like(x, float("nan")))  # masked entries never leak
    kept = x * mask
    if dim is None:
        mean, total = kept.sum() / mask.sum(), kept.sum()
    else:
        mean, total = kept.sum(dim) / mask.sum(dim), kept.sum(dim)
    torch.testing.assert_close(masked_mean(x_nan, mask, dim), mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(masked_normalize(x_nan, mask, 3.5, dim), total / 3.5)


def test_masked_pieces_name_a_bad_mask_and_constant():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"mask must be a bool tensor of x's shape \(2, 3\)"):
        masked_mean(x, torch.ones(2, 3))
    with pytest.raises(ValueError, match="constant must be > 0, got 0"):
        masked_normalize(x, x > 0, 0)
    with pytest.raises(ValueError, match="dim must be None or in"):
        masked_mean(x, x > 0, dim=2)
