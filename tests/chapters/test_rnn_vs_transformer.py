"""Chapter 8's race between the attention RNN and the Transformer: same models, same data."""

from types import SimpleNamespace

import pytest
import torch

import coursepkg.chapters.rnn_vs_transformer as race
from coursepkg.chapters.recipes import _untrained_translator, date_batches
from coursepkg.data.dates import date_split, date_vocabs, encode_batch
from coursepkg.data.vocab import PAD_ID
from coursepkg.rnn import Seq2SeqRNN

TINY_RACE = dict(eval_every=2, max_steps=4, n_test=6, batch_size=4)


def test_the_transformer_is_chapter_8s_model_with_the_same_initial_weights():
    run = SimpleNamespace(
        seed=3,
        steps=4,
        batch_size=4,
        n_test=6,
        d_model=64,
        n_heads=4,
        d_ff=128,
        n_layers=1,
        dropout=0.0,
    )
    chapter_8 = _untrained_translator(run)[0].model
    ours = race.transformer(seed=3).model
    assert ours.config == chapter_8.config
    for (name, a), (_, b) in zip(
        ours.state_dict().items(), chapter_8.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, msg=name)


def test_the_rnn_is_chapter_2s_model():
    model = race.attention_rnn(seed=0).model
    assert isinstance(model, Seq2SeqRNN)
    assert model.use_attention and model.bidirectional
    assert (model.emb_dim, model.hidden_dim) == (32, 64)


def test_tokens_count_the_real_source_and_target_characters():
    src_vocab, tgt_vocab = date_vocabs()
    pairs = [("1 Jan 2000", "2000-01-01"), ("Sunday, 22 November 2026", "2026-11-22")]
    batch = encode_batch(pairs, src_vocab, tgt_vocab)
    # each target is its 10 characters and BOS (in) or EOS (out): 11 positions
    assert race.tokens_in(batch) == len(pairs[0][0]) + len(pairs[1][0]) + 2 * 11


@pytest.mark.parametrize("name", list(race.CONTENDERS))
def test_a_perfect_translator_scores_one_and_a_wrong_one_zero(name):
    contender = race.CONTENDERS[name](seed=0)
    src_vocab, tgt_vocab = date_vocabs()
    _, pairs = date_split(0, 5, seed=1)
    truth = encode_batch(pairs, src_vocab, tgt_vocab).tgt_out  # (B, T)
    contender.translate = lambda model, src, mask: truth
    assert race._exact_match(contender, pairs, tgt_vocab) == 1.0
    contender.translate = lambda model, src, mask: torch.full_like(truth, PAD_ID)
    assert race._exact_match(contender, pairs, tgt_vocab) == 0.0


@pytest.mark.parametrize("name", list(race.CONTENDERS))
def test_a_training_step_lowers_the_loss_on_its_batch(name):
    contender = race.CONTENDERS[name](seed=0)
    src_vocab, tgt_vocab = date_vocabs()
    train, _ = date_split(32, 2, seed=0)
    batch = next(date_batches(train, 32, src_vocab, tgt_vocab, seed=0))
    before = contender.loss_fn(contender.model, batch).item()
    for _ in range(15):
        race._train_step(contender, batch)
    assert contender.loss_fn(contender.model, batch).item() < before


def test_a_race_never_won_records_every_evaluation():
    results = race.race_to_quality(1.0, **TINY_RACE)
    assert set(results) == set(race.CONTENDERS)
    for record in results.values():
        assert record["steps"] == 0  # 4 steps cannot translate every held-out date
        assert record["eval_step"] == [2, 4]
        assert all(0.0 <= a <= 1.0 for a in record["exact_match"])
        assert record["seconds"] > 0


def test_both_contenders_see_the_same_batches():
    results = race.race_to_quality(1.0, **TINY_RACE)
    src_vocab, tgt_vocab = date_vocabs()
    train, _ = date_split(4 * 4, 6, seed=0)
    tokens = sum(race.tokens_in(b) for b in date_batches(train, 4, src_vocab, tgt_vocab, seed=0))
    assert [r["tokens"] for r in results.values()] == [tokens, tokens]


def test_the_race_stops_at_the_first_evaluation_over_the_threshold(monkeypatch):
    scores = iter([0.2, 0.6, 0.9])
    monkeypatch.setattr(race, "_exact_match", lambda *args: next(scores))
    record = race._race_one(race.attention_rnn(0), 0.5, 0, 1, 10, 4, 2)
    assert record["steps"] == 2
    assert record["eval_step"] == [1, 2]


def test_a_saved_race_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSEPKG_CACHE_DIR", str(tmp_path))
    saved = race.race_to_quality(1.0, cache="save", **TINY_RACE)
    assert len(list(tmp_path.iterdir())) == 1
    monkeypatch.setattr(race, "_race_one", lambda *args: pytest.fail("trained again"))
    assert race.race_to_quality(1.0, cache="reuse", **TINY_RACE) == saved


def test_step_seconds_times_both_on_every_round():
    times = race.step_seconds(rounds=2, batch_size=4, warmup=1, max_steps=4, n_test=6)
    assert set(times) == set(race.CONTENDERS)
    for t in times.values():
        assert t["seconds"] > 0 and t["tokens_per_second"] > 0


def test_forward_backward_times_one_value_per_length():
    times = race.forward_backward_seconds([2, 5], batch_size=2, repeats=1)
    assert {name: len(t) for name, t in times.items()} == {name: 2 for name in race.CONTENDERS}
    assert all(s > 0 for t in times.values() for s in t)


def test_random_batches_have_no_padding_and_the_asked_length():
    batch = race._random_batch(torch.Generator().manual_seed(0), 3, 7, 40, 15)
    assert batch.src.shape == batch.tgt_in.shape == batch.tgt_out.shape == (3, 7)
    assert bool(batch.src_mask.all()) and bool(batch.tgt_mask.all())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(threshold=0.0), "threshold must be a number in"),
        (dict(threshold=0.5, max_steps=0), "max_steps must be a positive int"),
        (dict(threshold=0.5, cache="yes"), "cache must be None"),
    ],
)
def test_bad_race_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        race.race_to_quality(**kwargs)


def test_bad_lengths_are_named():
    with pytest.raises(ValueError, match="lengths must be ints >= 2"):
        race.forward_backward_seconds([1, 4])
    with pytest.raises(ValueError, match="rounds must be a positive int"):
        race.step_seconds(rounds=0)
