"""A small quality classifier: logistic regression on hashed words and a few text statistics.

Large pipelines train a classifier to tell pages like a reference set (Wikipedia's references,
books) from random web pages, and keep what it scores high. The course's version is the same idea
at the size of its shipped examples (``quality_examples.jsonl``, written for the course; see
``PROVENANCE.md``): features a reader can list, and gradient descent written out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

__all__ = ["QualityClassifier", "default_quality_classifier", "load_quality_examples"]

_BUCKETS = 512  # hashed word features
_STOP = frozenset("the a an of and to in is was it that for on with as by at from his her".split())


def _hash_bucket(word: str) -> int:
    """A stable bucket for a word (Python's ``hash`` changes between processes)."""
    value = 2166136261  # FNV-1a, 32 bits
    for byte in word.encode("utf-8"):
        value = ((value ^ byte) * 16777619) & 0xFFFFFFFF
    return value % _BUCKETS


def features(text: str) -> np.ndarray:
    """The feature vector of a text: word-bucket frequencies, then five statistics.

    Shape:
        returns (512 + 5,) float64.
    """
    words = text.split()
    n = max(len(words), 1)
    vector = np.zeros(_BUCKETS + 5)
    for word in words:
        vector[_hash_bucket(re.sub(r"\W", "", word.lower()))] += 1.0 / n
    letters = sum(char.isalpha() for char in text)
    vector[_BUCKETS:] = [
        sum(word.lower() in _STOP for word in words) / n,  # function words: prose has many
        sum(any(c.isalpha() for c in word) for word in words) / n,
        sum(word[-1] in ".,;:" for word in words) / n,  # sentence punctuation
        sum(word in {"|", ">>", ">>>", "#"} or word.startswith("#") for word in words) / n,
        sum(char.isupper() for char in text) / max(letters, 1),
    ]
    return vector


@dataclass
class QualityClassifier:
    """Logistic regression: p(good | text) = sigmoid(w . features(text) + b)."""

    weights: np.ndarray
    bias: float

    @classmethod
    def train(
        cls, texts: list[str], labels: list[int], *, steps: int = 500, lr: float = 2.0
    ) -> QualityClassifier:
        """Fit by full-batch gradient descent on the mean cross-entropy plus an L2 penalty.

        Args:
            texts: the examples.
            labels: 1 (good) or 0 (bad), one per text.
            steps: gradient steps (from zero weights: the fit is deterministic).
            lr: the step size.

        Returns:
            The trained classifier.
        """
        if len(texts) != len(labels) or not texts:
            raise ValueError(f"need as many labels as texts (>0), got {len(texts)}, {len(labels)}")
        if set(labels) - {0, 1}:
            raise ValueError(f"labels must be 0 or 1, got {sorted(set(labels))}")
        x = np.stack([features(t) for t in texts])  # (N, F)
        y = np.asarray(labels, dtype=np.float64)  # (N,)
        w, b = np.zeros(x.shape[1]), 0.0
        for _ in range(steps):
            p = 1.0 / (1.0 + np.exp(-(x @ w + b)))  # (N,)
            w -= lr * (x.T @ (p - y) / len(y) + 1e-3 * w)
            b -= lr * float(np.mean(p - y))
        return cls(w, b)

    def probability(self, text: str) -> float:
        """The classifier's probability that ``text`` is good text, in [0, 1]."""
        return float(1.0 / (1.0 + np.exp(-(features(text) @ self.weights + self.bias))))


def load_quality_examples() -> tuple[list[str], list[int]]:
    """The shipped examples: texts and labels (1 good, 0 bad)."""
    source = resources.files("coursepkg.curation") / "quality_examples.jsonl"
    rows = [json.loads(line) for line in source.read_text("utf-8").splitlines() if line.strip()]
    return [row["text"] for row in rows], [int(row["label"]) for row in rows]


@lru_cache(maxsize=1)
def default_quality_classifier() -> QualityClassifier:
    """The classifier trained on all the shipped examples (once per process)."""
    return QualityClassifier.train(*load_quality_examples())
