"""The Gopher quality rules (Rae et al., 2021, "Scaling Language Models: Methods, Analysis and
Insights from Training Gopher", appendix A.1.1): cheap tests on a document's *words* that remove
most machine-made text before any model looks at it.

A word here is a whitespace-separated piece of the text (``text.split()``), punctuation
included, as in the paper: not a tokenizer's token, and not a regular expression's ``\\w+``
run. Each rule is a small function so that the book can show it whole; :func:`gopher_failures`
names the ones a document breaks.
"""

from __future__ import annotations

__all__ = ["GOPHER_RULES", "gopher_failures", "passes_gopher"]

#: The stop words of which a document must hold at least two (Gopher keeps English text).
STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})


def _too_few_or_many_words(words: list[str], lines: list[str]) -> bool:
    """Fewer than 50 or more than 100,000 words."""
    return not 50 <= len(words) <= 100_000


def _mean_word_length_out_of_range(words: list[str], lines: list[str]) -> bool:
    """A mean word length outside 3 to 10 characters."""
    if not words:
        return True
    mean = sum(len(word) for word in words) / len(words)
    return not 3 <= mean <= 10


def _many_symbols(words: list[str], lines: list[str]) -> bool:
    """More than one hash mark or ellipsis for every ten words."""
    symbols = sum(word.count("#") + word.count("...") + word.count("\u2026") for word in words)
    return symbols > 0.1 * max(len(words), 1)


def _many_bullet_lines(words: list[str], lines: list[str]) -> bool:
    """More than 90% of the non-empty lines start with a bullet."""
    lines = [line.strip() for line in lines if line.strip()]
    bullets = sum(line.startswith(("*", "-", "\u2022")) for line in lines)
    return bool(lines) and bullets > 0.9 * len(lines)


def _many_ellipsis_lines(words: list[str], lines: list[str]) -> bool:
    """More than 30% of the non-empty lines end with an ellipsis."""
    lines = [line.strip() for line in lines if line.strip()]
    ellipses = sum(line.endswith(("...", "\u2026")) for line in lines)
    return bool(lines) and ellipses > 0.3 * len(lines)


def _few_alphabetic_words(words: list[str], lines: list[str]) -> bool:
    """Fewer than 80% of the words contain at least one letter."""
    alphabetic = sum(any(char.isalpha() for char in word) for word in words)
    return alphabetic < 0.8 * len(words)


def _few_stop_words(words: list[str], lines: list[str]) -> bool:
    """Fewer than two of the stop words :data:`STOP_WORDS` (counted with repeats)."""
    return sum(word.lower().strip(".,;:!?\"'()") in STOP_WORDS for word in words) < 2


#: Each rule's name (what the summary counts) and its test (True = the document fails it).
GOPHER_RULES = {
    "word_count": _too_few_or_many_words,
    "mean_word_length": _mean_word_length_out_of_range,
    "symbol_ratio": _many_symbols,
    "bullet_lines": _many_bullet_lines,
    "ellipsis_lines": _many_ellipsis_lines,
    "alphabetic_words": _few_alphabetic_words,
    "stop_words": _few_stop_words,
}


def gopher_failures(text: str) -> list[str]:
    """The Gopher rules ``text`` breaks.

    Args:
        text: a document.

    Returns:
        The names (keys of :data:`GOPHER_RULES`) of the rules it fails, in table order; an empty
        list means the document passes.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    words = text.split()  # words, not tokens: whitespace-separated, punctuation included
    lines = text.splitlines()
    return [name for name, fails in GOPHER_RULES.items() if fails(words, lines)]


def passes_gopher(text: str) -> bool:
    """True when ``text`` breaks none of the Gopher rules."""
    return not gopher_failures(text)
