"""Assignment ex19_capstone: a training recipe for a byte-level language model, re-run by the
grader under a fixed CPU budget and ranked by held-out bits per byte
(:mod:`coursepkg.grading.classroom.capstone`; ``docs/instructors.md``, "The capstone").

A recipe chooses a configuration of the course's :class:`~coursepkg.DecoderOnlyLM` and how to
train it; the grader builds the model from the configuration with the course's code, calls
``train`` with a budget in seconds, and scores the weights on text the recipe never sees.

Dimension legend: B batch, L sequence length, V vocabulary (256: the model reads bytes).
"""

from __future__ import annotations

import math  # noqa: F401  (you will need it)
import time  # noqa: F401  (you will need it)

import torch  # noqa: F401  (you will need it)
import torch.nn.functional as F  # noqa: F401, N812  (you will need it)
from torch import nn

from coursepkg import TransformerConfig


def config(seed: int) -> TransformerConfig:
    """The configuration of your model: a byte-level decoder-only Transformer.

    The grader builds ``DecoderOnlyLM(config(seed))`` itself, after ``torch.manual_seed(seed)``.
    ``vocab_size`` must be 256 (the model reads and predicts bytes); the model must stay within
    the parameter limit the notebook states. ``max_len`` bounds the context your ``train``
    feeds, and the held-out text is scored in windows of ``min(max_len, 256)`` bytes.

    Args:
        seed: the run's seed (the grader runs several); most recipes ignore it here.

    Returns:
        A :class:`~coursepkg.TransformerConfig` with ``vocab_size=256``.
    """
    raise NotImplementedError


def train(model: nn.Module, data: bytes, budget_s: float, seed: int) -> None:
    """Train ``model`` in place on ``data`` within ``budget_s`` seconds of wall time.

    The model's forward maps byte ids to next-byte scores. Two runs with one seed must give
    the same weights (the grader runs the first seed twice): draw every random number from
    generators seeded by ``seed`` and decide how many steps to take from ``budget_s``, never
    from a clock reading. At the budget the grader saves the weights as they stand and marks
    the run over budget.

    Args:
        model: the course's ``DecoderOnlyLM`` built from your ``config(seed)``, in train mode.
        data: the training split's bytes (all of the corpus you may read).
        budget_s: the training budget in seconds.
        seed: the run's seed.

    Shape:
        model(ids (B, L) int64) -> scores (B, L, V).

    Returns:
        Nothing: the grader saves ``model``'s weights when ``train`` returns.
    """
    raise NotImplementedError
