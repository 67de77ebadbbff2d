"""The Gopher rules: a clean document passes, and each rule alone removes what it names."""

import random

import pytest

from coursepkg.curation.gopher import GOPHER_RULES, gopher_failures, passes_gopher

_WORDS = "the river ran past mill and town with water of green stone to sea that have be".split()


def _prose(n_words: int, seed: int = 0) -> str:
    """``n_words`` words of plain prose-like text in lines of ten, ending with full stops."""
    rng = random.Random(seed)
    words = [rng.choice(_WORDS) for _ in range(n_words)]
    lines = [" ".join(words[i : i + 10]) + "." for i in range(0, n_words, 10)]
    return "\n".join(lines)


@pytest.mark.parametrize("seed", range(5))
def test_plain_prose_passes(seed):
    assert gopher_failures(_prose(200, seed)) == []


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        (_prose(30), "word_count"),
        ("\n".join(["an it is of to be at"] * 20), "mean_word_length"),
        (_prose(200) + " #tag" * 30, "symbol_ratio"),
        ("\n".join(f"- {_prose(10, i)}" for i in range(20)), "bullet_lines"),
        ("\n".join(f"{_prose(10, i)}..." for i in range(20)), "ellipsis_lines"),
        (_prose(100) + " 12 34 56 78" * 10, "alphabetic_words"),
        (" ".join(["river", "stone", "water", "green"] * 20), "stop_words"),
    ],
)
def test_each_rule_removes_what_it_names(text, rule):
    assert rule in gopher_failures(text)
    assert not passes_gopher(text)


def test_rules_count_whitespace_words_not_tokens():
    # 60 words of 11 characters: the mean length breaks the rule. A \w+ tokenizer would see
    # "state-of-the-art," as four short tokens and let the document through.
    text = " ".join(["the", "state-of-the-art,", "and", "well-known."] * 15)
    assert "mean_word_length" not in gopher_failures(text)  # mean over words is (3+17+3+11)/4
    long_words = " ".join(["the", "state-of-the-art-ish,", "and", "well-known-ish."] * 15)
    assert "mean_word_length" in gopher_failures(long_words)  # (3+21+3+15)/4 = 10.5 > 10


def test_the_rules_table_names_every_rule_once():
    assert len(GOPHER_RULES) == 7
    assert gopher_failures("") == ["word_count", "mean_word_length", "stop_words"]


def test_a_non_string_is_refused_by_name():
    with pytest.raises(TypeError, match="text must be a str"):
        gopher_failures(b"bytes")
