"""The character GPT recipe (chapters 12 and 13) and the count bigram baseline."""

from __future__ import annotations

import math

import pytest
import torch

from coursepkg import DecoderOnlyLM
from coursepkg.chapters.char_gpt import count_bigram, shakespeare_split, train_char_gpt
from coursepkg.chapters.run_cache import CACHE_ENV
from coursepkg.data import load_tinyshakespeare

TINY = dict(steps=6, d_model=16, n_heads=2, d_ff=32, n_layers=1, block_size=16, batch_size=4)


def test_a_short_run_records_its_evaluations_and_saves_then_reuses(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    run = train_char_gpt(progress=False, eval_every=3, cache="save", **TINY)
    assert isinstance(run.model, DecoderOnlyLM) and not run.model.training
    assert run.history.eval_step == [3, 6]
    assert set(run.history.metrics) == {"train", "held-out"}
    assert len(run.train_ids) + len(run.heldout_ids) > 1_000_000
    # the first evaluation is close to the uniform guess, the windows are the fixed ones
    assert run.history.metrics["held-out"][0] < math.log(len(run.vocab)) + 1
    assert len(run.eval_windows["held-out"]) == 4
    assert run.eval_windows["held-out"][0][0].shape == (64, 16)
    reused = train_char_gpt(progress=False, eval_every=3, cache="reuse", **TINY)
    assert reused.history == run.history
    for a, b in zip(reused.model.parameters(), run.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert len(list(tmp_path.glob("char_gpt-*.pt"))) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(steps=0), "steps"), (dict(block_size=1.5), "block_size"), (dict(cache="yes"), "cache")],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train_char_gpt(progress=False, **kwargs)


def test_count_bigram_is_the_smoothed_pair_frequency():
    ids = torch.tensor([0, 1, 1, 2, 0, 1])
    table = count_bigram(ids, 3, smoothing=1.0)  # pairs 01 11 12 20 01
    assert table.shape == (3, 3)
    assert torch.allclose(table.exp().sum(1), torch.ones(3))
    # row 0: counts (0, 2, 0) + 1 -> (1, 3, 1) / 5
    assert torch.allclose(table[0].exp(), torch.tensor([0.2, 0.6, 0.2]))
    # row 1: (0, 1, 1) + 1 -> (1, 2, 2) / 5
    assert torch.allclose(table[1].exp(), torch.tensor([0.2, 0.4, 0.4]))
    # smoothing -> 0 gives the plain frequencies
    assert table.exp()[0, 1] < count_bigram(ids, 3, smoothing=1e-6).exp()[0, 1] < 1.0


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((torch.tensor([0.0, 1.0]), 3), TypeError),
        ((torch.tensor([1]), 3), ValueError),
        ((torch.tensor([0, 3]), 3), ValueError),
        ((torch.tensor([0, 1]), 3, 0.0), ValueError),
    ],
)
def test_count_bigram_rejects_bad_input(args, error):
    with pytest.raises(error):
        count_bigram(*args)


def test_the_run_s_adam_gives_the_per_parameter_loop_s_numbers(per_parameter_adam):
    run = train_char_gpt(progress=False, eval_every=3, **TINY)
    per_parameter_adam()
    looped = train_char_gpt(progress=False, eval_every=3, **TINY)
    run.history.seconds = looped.history.seconds = 0.0  # the one field that is a timing
    assert run.history == looped.history
    for a, b in zip(run.model.parameters(), looped.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_each_split_is_the_corpus_encoded_and_a_caller_s_copy():
    vocab, train_ids, heldout_ids, _ = shakespeare_split(16)
    text = load_tinyshakespeare()
    assert torch.equal(torch.cat([train_ids, heldout_ids]), torch.tensor(vocab.encode(text)))
    train_ids.zero_()  # a caller may change what it was given ...
    _, again, _, _ = shakespeare_split(16)
    assert torch.equal(again[:1000], torch.tensor(vocab.encode(text[:1000])))  # ... not the next
