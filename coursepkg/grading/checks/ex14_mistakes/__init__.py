"""The catalogue of ex14_post_training, one module per concept: the SFT loss, the LoRA layer,
the DPO loss, and GRPO with its per-token pieces. :mod:`..ex14_post_training_mistakes` gathers
their ``BUGS``."""

from __future__ import annotations

from ...framework import BugVariant

__all__ = ["mistakes"]


def mistakes(item: str, *rows: tuple) -> list[BugVariant]:
    """One item's :class:`BugVariant` s, from ``(id, description, advice, impl)`` rows (a
    catalogue read as a table)."""
    return [BugVariant(bug_id, item, *rest) for bug_id, *rest in rows]
