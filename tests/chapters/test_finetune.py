"""Fine-tuning a pre-trained GPT on a labelled task (chapter 12): the task, the classifier, the
runs and the cached curve."""

from __future__ import annotations

import random
import re

import pytest
import torch
from torch.testing import assert_close

from coursepkg import DecoderOnlyLM
from coursepkg.chapters.finetune import (
    MODES,
    LabelledLines,
    SequenceClassifier,
    finetune_accuracy,
    labels_curve,
    scramble_words,
    spelling_task,
    zero_label_accuracy,
)
from coursepkg.chapters.run_cache import CACHE_ENV
from coursepkg.data import CharVocab, load_tinyshakespeare

TEXT = load_tinyshakespeare()
VOCAB = CharVocab.from_corpus(TEXT)
WORD = re.compile(r"[^\W\d_]+")


@pytest.fixture
def tiny_gpt(make_model):
    """``tiny_gpt(seed=0)`` -> a one-layer GPT over the corpus' characters (conftest's factory)."""

    def build(seed: int = 0) -> DecoderOnlyLM:
        options = dict(norm_first=True, positional="learned", activation="gelu")
        return make_model(
            kind="decoder-only", seed=seed, vocab_size=len(VOCAB), n_layers=1, max_len=64, **options
        )

    return build


@pytest.mark.parametrize("seed", range(20))
def test_scrambling_keeps_each_words_letters_and_ends_and_everything_else(seed):
    line = random.Random(seed).choice([s for s in TEXT.split("\n") if len(s) > 30])
    out = scramble_words(line, random.Random(seed))
    assert len(out) == len(line)
    assert [m.span() for m in WORD.finditer(out)] == [m.span() for m in WORD.finditer(line)]
    assert WORD.sub("", out) == WORD.sub("", line)  # spaces and punctuation in place
    for new, old in zip(WORD.findall(out), WORD.findall(line), strict=True):
        assert sorted(new) == sorted(old)
        assert (new[0], new[-1]) == (old[0], old[-1])
        if len(old) < 4:
            assert new == old


def test_the_task_is_balanced_seeded_and_its_scrambled_lines_are_new():
    task = spelling_task(TEXT, 40, seed=3)
    assert len(task) == 40 and sum(task.labels) == 20
    assert spelling_task(TEXT, 40, seed=3) == task
    assert spelling_task(TEXT, 40, seed=4).lines != task.lines
    lines = set(line.strip() for line in TEXT.split("\n"))
    for line, label in zip(task.lines, task.labels, strict=True):
        assert 20 <= len(line) <= 40 and not line.endswith(":")
        if label == 1:  # as written (cut at a space when long)
            assert any(full.startswith(line) for full in lines)
        else:  # never a line of the text (the shuffle moved some letter)
            assert line not in lines


@pytest.mark.parametrize("n", [0, 3, 2.0])
def test_the_task_rejects_an_odd_or_missing_size(n):
    with pytest.raises(ValueError, match="n must be an even int"):
        spelling_task(TEXT, n, seed=0)


def test_padding_changes_no_line_s_features(tiny_gpt):
    model = SequenceClassifier(tiny_gpt(), 3)
    task = LabelledLines(["To be, or not to be", "A horse!"], [0, 1])
    tokens, real, labels = task.encode(VOCAB)  # (2, L), (2, L), (2,)
    assert tokens.shape == real.shape == (2, 19) and labels.tolist() == [0, 1]
    with torch.no_grad():
        both = model.features(tokens, real)  # (2, D)
        alone = model.features(tokens[1:, :8], real[1:, :8])  # (1, D)
        assert model(tokens, real).shape == (2, 3)
    assert_close(both[1:], alone)


def test_the_features_sum_to_the_language_model_s_mean_logit_of_the_next_character(tiny_gpt):
    gpt = tiny_gpt()
    lines = LabelledLines(["Now is the winter", "of our discontent"], [0, 1])
    tokens, real, _ = lines.encode(VOCAB)  # (2, L), (2, L)
    with torch.no_grad():
        features = SequenceClassifier(gpt, 2).features(tokens, real)  # (2, D)
        logits = gpt(tokens)[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)  # (2, L - 1)
    weights = real[:, 1:].float()  # (2, L - 1)
    assert_close(features.sum(-1), (logits * weights).sum(1) / weights.sum(1))


def test_the_zero_label_rule_is_the_mirror_of_its_flipped_labels(tiny_gpt):
    task = spelling_task(TEXT[-100_000:], 40, seed=2)
    flipped = LabelledLines(task.lines, [1 - y for y in task.labels])
    gpt = tiny_gpt()
    plain = zero_label_accuracy(gpt, VOCAB, task)
    assert plain + zero_label_accuracy(gpt, VOCAB, flipped) == pytest.approx(1.0)
    assert 0.0 <= plain <= 1.0


@pytest.fixture(scope="module")
def small_task():
    return spelling_task(TEXT[:200_000], 32, seed=0), spelling_task(TEXT[-100_000:], 40, seed=1)


@pytest.mark.parametrize("mode", MODES)
def test_a_run_is_seeded_and_leaves_the_pretrained_model_alone(small_task, mode, tiny_gpt):
    train, test = small_task
    gpt = tiny_gpt()
    before = {k: v.clone() for k, v in gpt.state_dict().items()}
    first = finetune_accuracy(gpt, VOCAB, train, test, mode, seed=1, steps=4, batch_size=8)
    again = finetune_accuracy(gpt, VOCAB, train, test, mode, seed=1, steps=4, batch_size=8)
    assert first == again and 0.0 <= first <= 1.0
    assert (first * len(test)) == pytest.approx(round(first * len(test)), abs=1e-4)
    for name, value in gpt.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_training_from_scratch_learns_a_task_that_needs_no_pretraining(tiny_gpt):
    # is a line shouted (in capitals)? Every position shows it
    short = [s for s in TEXT.split("\n") if 20 < len(s) < 40][:96]
    lines = [s.upper() if i % 2 else s for i, s in enumerate(short)]
    labels = [i % 2 for i in range(96)]
    train = LabelledLines(lines[:64], labels[:64])
    test = LabelledLines(lines[64:], labels[64:])
    accuracy = finetune_accuracy(tiny_gpt(), VOCAB, train, test, "from scratch", steps=40, lr=3e-3)
    assert accuracy > 0.9


def test_a_wrong_mode_is_named(tiny_gpt):
    task = LabelledLines(["a line here", "another one"], [0, 1])
    with pytest.raises(ValueError, match="mode must be one of"):
        finetune_accuracy(tiny_gpt(), VOCAB, task, task, "linear probe")


def test_the_curve_has_every_mode_size_and_seed_and_is_cached(tmp_path, monkeypatch, tiny_gpt):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    gpt, train, test = tiny_gpt(), TEXT[:100_000], TEXT[-50_000:]
    kwargs = dict(sizes=(4, 8), seeds=(0, 1), n_test=20, steps=2, batch_size=4)
    curve = labels_curve(gpt, VOCAB, train, test, cache="save", **kwargs)
    assert set(curve) == set(MODES)
    assert all(set(by) == {4, 8} and all(len(a) == 2 for a in by.values()) for by in curve.values())
    assert len(list(tmp_path.glob("labels_curve-*.pt"))) == 1
    assert labels_curve(gpt, VOCAB, train, test, cache="reuse", **kwargs) == curve
    other = tiny_gpt(seed=1)  # other weights: a new file
    labels_curve(other, VOCAB, train, test, cache="reuse", **kwargs)
    assert len(list(tmp_path.glob("labels_curve-*.pt"))) == 2
