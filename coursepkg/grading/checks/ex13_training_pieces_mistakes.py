"""The catalogue of ex13_training_pieces: the known mistakes of AdamW, its parameter groups, the
warm-up + cosine schedule, clipping by global norm and a resumable training state, gathered
from their concept modules in :mod:`.ex13_mistakes` (one per concept: ``optimiser``,
``schedule``, ``clipping``, ``resume``), where each is written and named.

Each item has a correct version written in steps or a plain correct function, and each mistake
overrides the one step it gets wrong or is a wrong function with the stub's signature. The
evidence: the check reruns a variant on the student's inputs (the same gradients, the same
model, the same interrupted run) and names the mistake only when its numbers match the
student's.
"""

from __future__ import annotations

from ..framework import BugVariant
from .ex13_mistakes.clipping import CLIP_BUGS, CLIP_ITEM
from .ex13_mistakes.optimiser import (
    ADAMW_BUGS,
    ADAMW_ITEM,
    PARAM_GROUPS_BUGS,
    PARAM_GROUPS_ITEM,
)
from .ex13_mistakes.resume import RESUME_BUGS, RESUME_ITEM
from .ex13_mistakes.schedule import WARMUP_COSINE_BUGS, WARMUP_COSINE_ITEM

__all__ = ["BUGS", "ITEMS"]

#: Each item the checks grade (what the student writes), with its mistakes.
ITEMS: dict[str, list[BugVariant]] = {
    ADAMW_ITEM: ADAMW_BUGS,
    PARAM_GROUPS_ITEM: PARAM_GROUPS_BUGS,
    WARMUP_COSINE_ITEM: WARMUP_COSINE_BUGS,
    CLIP_ITEM: CLIP_BUGS,
    RESUME_ITEM: RESUME_BUGS,
}

BUGS: list[BugVariant] = [bug for bugs in ITEMS.values() for bug in bugs]
