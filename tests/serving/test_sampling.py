"""The sampling filters (issue 50): each equal to its ``transformers`` logits processor on random
logits and on edge cases (ties, p = 1, k above the vocabulary, min-p 0 and 1); the whole chain
in ``generate``'s order; seeded draws reproducible; the sampled frequencies match the processed
softmax (a chi-square test at a false-alarm rate of 0.1%, seeded, so deterministic); bad
arguments named."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
lp = pytest.importorskip("transformers.generation.logits_process")

from serving_models import FALSE_ALARM, chi_square_p_value  # noqa: E402

from coursepkg.serving import (  # noqa: E402
    SamplingParams,
    min_p_filter,
    process_logits,
    repetition_penalty,
    sample_token,
    temperature_scale,
    top_k_filter,
    top_p_filter,
)

V = 23


def _logits(kind: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn(5, V, generator=g) * 3  # (B, V)
    if kind == "ties":  # few distinct values: many tokens share a score
        return torch.randint(-2, 3, (5, V), generator=g).float()  # (B, V)
    if kind == "peaked":  # one token takes almost all the mass
        x = torch.randn(5, V, generator=g)
        x[:, 3] = 30.0
        return x
    raise AssertionError(kind)


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (5, 9), generator=torch.Generator().manual_seed(seed))  # (B, T)


KINDS = ["random", "ties", "peaked"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("t", [0.3, 1.0, 2.5])
def test_temperature_equals_transformers(kind, t):
    x = _logits(kind)
    theirs = lp.TemperatureLogitsWarper(t)(_ids(), x.clone())
    torch.testing.assert_close(temperature_scale(x, t), theirs, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [1, 2, 5, V, V + 10])
def test_top_k_equals_transformers(kind, k):
    x = _logits(kind)
    theirs = lp.TopKLogitsWarper(k)(_ids(), x.clone())
    assert torch.equal(top_k_filter(x, k), theirs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.999, 1.0])
def test_top_p_equals_transformers(kind, p):
    x = _logits(kind)
    theirs = lp.TopPLogitsWarper(p)(_ids(), x.clone())
    ours = top_p_filter(x, p)
    assert torch.equal(ours, theirs)
    assert (ours.isfinite().sum(-1) >= 1).all()  # the top token always survives


def test_top_p_of_one_keeps_everything():
    x = _logits("random")
    assert torch.equal(top_p_filter(x, 1.0), x)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [0.0, 0.05, 0.2, 0.7, 1.0])
def test_min_p_equals_transformers(kind, m):
    x = _logits(kind)
    theirs = lp.MinPLogitsWarper(m)(_ids(), x.clone())
    assert torch.equal(min_p_filter(x, m), theirs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3, 4.0])
def test_repetition_penalty_equals_transformers(kind, penalty):
    x, ids = _logits(kind), _ids()
    theirs = lp.RepetitionPenaltyLogitsProcessor(penalty)(ids, x.clone())
    assert torch.equal(repetition_penalty(x, ids, penalty), theirs)


@pytest.mark.parametrize("seed", range(4))
def test_the_chain_equals_transformers_in_generates_order(seed):
    params = SamplingParams(
        temperature=0.8, top_k=9, top_p=0.85, min_p=0.05, repetition_penalty=1.2
    )
    x, ids = _logits("random", seed), _ids(seed + 1)
    chain = lp.LogitsProcessorList(
        [
            lp.RepetitionPenaltyLogitsProcessor(1.2),
            lp.TemperatureLogitsWarper(0.8),
            lp.TopKLogitsWarper(9),
            lp.TopPLogitsWarper(0.85),
            lp.MinPLogitsWarper(0.05),
        ]
    )
    assert torch.equal(process_logits(x, ids, params), chain(ids, x.clone()))


def test_seeded_sampling_is_reproducible_and_seeds_differ():
    x = _logits("random").repeat(40, 1)  # (200, V)
    params = SamplingParams(temperature=1.0, top_p=0.95)

    def draw(seed):
        return sample_token(x, None, params, torch.Generator().manual_seed(seed))

    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.1, repetition_penalty=1.5),
    ],
    ids=["plain", "top_k", "top_p", "min_p_penalty"],
)
def test_sampled_frequencies_match_the_processed_softmax(params):
    logits = torch.randn(1, 8, generator=torch.Generator().manual_seed(3)) * 1.5  # (1, V)
    seen = torch.tensor([[0, 2, 2]])
    probs = process_logits(logits, seen, params).softmax(-1)[0]  # (V,)
    n = 20_000
    draws = sample_token(
        logits.expand(n, -1), seen.expand(n, -1), params, torch.Generator().manual_seed(11)
    )
    counts = torch.bincount(draws, minlength=8)
    assert (counts[probs == 0] == 0).all()  # a filtered token is never drawn
    assert chi_square_p_value(counts, probs) > FALSE_ALARM


def test_the_chi_square_test_can_fail():
    counts = torch.tensor([600, 400])  # 1,000 tosses of a fair coin: 60/40 is far too lopsided
    assert chi_square_p_value(counts, torch.tensor([0.5, 0.5])) < FALSE_ALARM


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(min_p=-0.1), "min_p"),
        (dict(temperature=-1.0), "temperature"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
    ],
)
def test_bad_settings_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_greedy_is_the_argmax_after_the_penalty():
    x, ids = _logits("random"), _ids()
    got = sample_token(x, ids, SamplingParams(repetition_penalty=2.0))
    assert torch.equal(got, repetition_penalty(x, ids, 2.0).argmax(-1))
