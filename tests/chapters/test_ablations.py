"""coursepkg.chapters.ablations: variants trained alike (the cache returns the same run) and the
loss measured position by position."""

from __future__ import annotations

import math

import pytest
import torch

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.chapters.ablations import BASE, position_losses, train_variant

TINY_CHANGES = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1)
TINY_RUN = dict(steps=3, block_size=16, batch_size=2, warmup_steps=1)


def test_a_model_that_knows_nothing_pays_ln_v_at_every_position():
    model = DecoderOnlyLM(TransformerConfig(vocab_size=13, **{**BASE, **TINY_CHANGES}))
    with torch.no_grad():
        model.embed.weight.zero_()  # tied head: every logit is 0
    ids = torch.randint(13, (500,))
    model.train()
    losses = position_losses(model, ids, 40, windows=5)
    assert losses.shape == (40,)
    torch.testing.assert_close(losses, torch.full((40,), math.log(13)))
    assert model.training  # the caller's mode is kept


def test_causal_models_lose_the_same_at_a_position_whatever_follows():
    model = DecoderOnlyLM(TransformerConfig(vocab_size=13, **{**BASE, **TINY_CHANGES})).eval()
    ids = torch.randint(13, (500,))
    long = position_losses(model, ids, 48, windows=4, seed=3)
    # the same windows, cut after 24 characters: identical offsets need the same bound
    offsets = torch.randint(500 - 48, (4,), generator=torch.Generator().manual_seed(3))
    rows = offsets[:, None] + torch.arange(25)  # (B, 25)
    logits = model(ids[rows[:, :-1]])  # (B, 24, V)
    short = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), ids[rows[:, 1:]], reduction="none"
    ).mean(0)  # (24,)
    torch.testing.assert_close(long[:24], short, atol=1e-5, rtol=1e-5)


def test_position_losses_rejects_a_window_longer_than_the_text():
    model = DecoderOnlyLM(TransformerConfig(vocab_size=13, **{**BASE, **TINY_CHANGES}))
    with pytest.raises(ValueError, match="length must be shorter"):
        position_losses(model, torch.randint(13, (50,)), 50)


def test_a_cached_variant_comes_back_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSEPKG_CACHE_DIR", str(tmp_path))
    first = train_variant({**TINY_CHANGES, "norm": "rmsnorm"}, cache="reuse", **TINY_RUN)
    assert first.model.config.norm == "rmsnorm" and first.model.config.d_model == 16
    assert len(first.history.loss) == 3 and "held-out" in first.history.metrics
    assert len(list(tmp_path.iterdir())) == 1
    again = train_variant({**TINY_CHANGES, "norm": "rmsnorm"}, cache="reuse", **TINY_RUN)
    assert again.history.loss == first.history.loss
    for name, value in first.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[name]), name
    assert not again.model.training


def test_same_seed_same_run_and_one_change_one_difference():
    a = train_variant(TINY_CHANGES, **TINY_RUN)
    b = train_variant(TINY_CHANGES, **TINY_RUN)
    assert a.history.loss == b.history.loss
    relu = train_variant({**TINY_CHANGES, "activation": "relu"}, **TINY_RUN)
    assert relu.history.loss[0] != a.history.loss[0]  # the first batch is the same, not the model
    assert relu.parameters == a.parameters


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="cache"):
        train_variant(TINY_CHANGES, cache="always", **TINY_RUN)
    with pytest.raises(ValueError, match="norm"):
        train_variant({**TINY_CHANGES, "norm": "batchnorm"}, **TINY_RUN)
