"""Tests of the ex10 checks (BPE training, Tokenizer): the reference and independent solutions in
other styles pass, a mistake planted in another style is named by its own id only (each catalogued
one's rerun: test_check_protocol.py), calling the reference is named."""

from __future__ import annotations

import grading_impls_tokenizer as impls
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg.grading import (
    CheckFailure,
    catalogue,
    check_tokenizer,
    check_train_bpe,
)
from coursepkg.grading.checks import ex10_tokenizer as grading
from coursepkg.grading.checks import ex10_tokenizer_mistakes as mistakes
from coursepkg.grading.checks.ex10_tokenizer_mistakes import (
    plain_train_bpe,
)
from coursepkg.tokenizer import Tokenizer, train_bpe

# ---------------------------------------------------------------------------------------------
# train_bpe
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "impl",
    [train_bpe, plain_train_bpe, impls.train_recount, impls.train_incremental],
    ids=lambda f: f.__name__,
)
def test_train_accepts_correct_implementations(impl) -> None:
    assert check_train_bpe(impl).passed


@pytest.mark.slow
@pytest.mark.parametrize("impl", [train_bpe, impls.train_recount], ids=lambda f: f.__name__)
def test_train_thorough_accepts_a_careful_naive_implementation(impl) -> None:
    result = check_train_bpe(impl, thorough=True, seed=3)
    assert result.passed and any("budget" in m for m in result.messages)


def test_the_training_budget_counts_lines_run_not_seconds() -> None:
    """The larger corpus's budget is a count: the same trainer runs the same number of lines
    every time (whatever the machine's speed), and one over the budget is stopped there."""
    corpus = ("tied pairs", "ab ba abc cba aab baa " * 20, 270, [])
    student, lines = grading._count_train(impls.train_recount, corpus, 10**9)
    assert student == train_bpe(corpus[1], corpus[2], corpus[3])
    assert grading._count_train(impls.train_recount, corpus, 10**9)[1] == lines > 100
    stopped, counted = grading._count_train(impls.train_recount, corpus, lines // 2)
    assert stopped is None and counted == lines // 2 + 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from(list("ab é'\n") + ["<s>", "<s></s>", "  "]), max_size=60).map("".join),
    st.integers(0, 40),
    st.sampled_from([[], ["<s>"], ["<s>", "<s></s>"]]),
)
def test_plain_trainer_of_the_catalogue_equals_the_reference(text, extra, specials) -> None:
    """With every switch off the catalogue's trainer is right, so each switch is one mistake."""
    size = 256 + len(specials) + extra
    assert plain_train_bpe(text, size, specials) == train_bpe(text, size, specials)


@pytest.mark.parametrize(
    "impl, bug_id",
    [
        (impls.train_across_pretokens, "bpe.merges_across_pretokens"),
        (impls.train_smaller_ties, "bpe.ties_reversed"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_train_mistake_in_another_style_is_named(impl, bug_id) -> None:
    with pytest.raises(CheckFailure) as info:
        check_train_bpe(impl)
    assert info.value.diagnosis == bug_id


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_train_unknown_mistake_is_reported_without_a_name() -> None:
    with pytest.raises(CheckFailure, match="your merges differ") as info:
        check_train_bpe(impls.train_first_seen_ties)
    assert info.value.diagnosis is None


def test_train_calling_the_reference_is_named() -> None:
    with pytest.raises(CheckFailure, match="coursepkg.tokenizer.train_bpe"):
        check_train_bpe(lambda text, size, specials=None: train_bpe(text, size, specials))


def test_train_wrong_return_types_are_explained() -> None:
    with pytest.raises(CheckFailure, match=r"pair \(vocab, merges\)"):
        check_train_bpe(lambda text, size, specials=None: [])

    def str_merges(text, size, specials=None):
        vocab, merges = train_bpe(text, size, specials)
        return vocab, [(a.decode("latin-1"), b.decode("latin-1")) for a, b in merges]

    with pytest.raises(CheckFailure, match="should be a pair of bytes"):
        check_train_bpe(grading_free(str_merges))


def grading_free(fn):
    """``fn`` computed outside the checked call (the reference's output, for type tests)."""
    cache = {}

    def wrapped(text, size, specials=None):
        key = (text, size, tuple(specials or []))
        if key not in cache:
            cache[key] = fn(text, size, specials)
        return cache[key]

    for corpus in grading._corpora(False, None):
        wrapped(corpus[1], corpus[2], corpus[3])
    return wrapped


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_train_vocab_in_the_wrong_order_is_explained() -> None:
    def specials_first(text, size, specials=None):
        vocab, merges = impls.train_recount(text, size, specials)
        order = [vocab[i] for i in range(256)] + [s.encode() for s in specials or []]
        order += [a + b for a, b in merges]
        return dict(enumerate(order)), merges

    with pytest.raises(CheckFailure, match="your merges are right but your vocab differs"):
        check_train_bpe(specials_first)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls",
    [Tokenizer, impls.GPT2StyleTokenizer, impls.SequentialMergesTokenizer],
    ids=lambda c: c.__name__,
)
@pytest.mark.parametrize("thorough", [False, True])
def test_tokenizer_accepts_correct_implementations(cls, thorough) -> None:
    assert check_tokenizer(cls, thorough=thorough, seed=5).passed


@pytest.mark.parametrize(
    "cls, bug_id",
    [
        (impls.GPT2StylePerTokenDecode, "tokenizer.decode_per_token"),
        (impls.SequentialLostWhitespace, "tokenizer.lost_whitespace"),
        (impls.SequentialNoSpecials, "tokenizer.special_tokens_split"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_tokenizer_mistake_in_another_style_is_named(cls, bug_id) -> None:
    with pytest.raises(CheckFailure) as info:
        check_tokenizer(cls)
    assert info.value.diagnosis == bug_id


def test_tokenizer_wrapping_the_reference_is_named() -> None:
    class Wrapper:
        def __init__(self, vocab, merges, special_tokens=None):
            self.inner = Tokenizer(vocab, merges, special_tokens)

        def encode(self, text):
            return self.inner.encode(text)

        def decode(self, ids):
            return self.inner.decode(ids)

    with pytest.raises(CheckFailure, match="coursepkg.tokenizer.Tokenizer"):
        check_tokenizer(Wrapper)


def test_tokenizer_built_on_tiktoken_is_named() -> None:
    tiktoken = pytest.importorskip("tiktoken")
    from coursepkg.tokenizer import GPT2_PATTERN

    class OnTiktoken(impls.GPT2StyleTokenizer):
        def __init__(self, vocab, merges, special_tokens=None):
            super().__init__(vocab, merges, special_tokens)
            specials = {t: self.encoder[t.encode()] for t in special_tokens or []}
            ranks = {b: i for i, b in vocab.items() if i not in specials.values()}
            self.enc = tiktoken.Encoding(
                "x", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials
            )

        def encode(self, text):
            return self.enc.encode(text, allowed_special="all")

    with pytest.raises(CheckFailure, match="tiktoken.Encoding"):
        check_tokenizer(OnTiktoken)


def test_tokenizer_returning_a_string_is_explained() -> None:
    class Strings(impls.GPT2StyleTokenizer):
        def encode(self, text):
            return " ".join(map(str, super().encode(text)))

    with pytest.raises(CheckFailure, match="encode should return a list of ints"):
        check_tokenizer(Strings)


# ---------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------


def test_catalogue_lists_every_ex10_mistake_once() -> None:
    ids = [b.id for b in catalogue()]
    for bug in mistakes.BUGS:
        assert ids.count(bug.id) == 1
    assert {b.id for b in mistakes.BUGS} == {
        "bpe.merges_across_pretokens",
        "bpe.special_tokens_merged",
        "bpe.ties_reversed",
        "bpe.stale_pair_counts",
        "tokenizer.frequency_order",
        "tokenizer.special_tokens_split",
        "tokenizer.lost_whitespace",
        "tokenizer.decode_per_token",
        "bpe.special_shorter_wins",
        "bpe.ties_by_ids",
        "bpe.specials_not_counted",
        "bpe.specials_before_merges",
        "tokenizer.special_shorter_wins",
        "tokenizer.decode_drops_bad_bytes",
    }
