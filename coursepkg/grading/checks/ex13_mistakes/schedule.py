"""ex13's schedule mistakes: the warm-up + cosine learning rate, each mistake a wrong function
with the stub's signature.
"""

from __future__ import annotations

import math

from ...framework import BugVariant

__all__ = [
    "WARMUP_COSINE_BUGS",
    "WARMUP_COSINE_ITEM",
]

WARMUP_COSINE_ITEM = "warmup_cosine_lr"


# ---------------------------------------------------------------------------------------------
# Warm-up + cosine
# ---------------------------------------------------------------------------------------------


def _cosine(step, max_lr, warmup_steps, total_steps, min_lr):
    r = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * r))


def warmup_cosine_lr_warmup_off_by_one(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * step / warmup_steps  # 0 at the first update
    if step > total_steps:
        return min_lr
    return _cosine(step, max_lr, warmup_steps, total_steps, min_lr)


def warmup_cosine_lr_warmup_inclusive(step, max_lr, warmup_steps, total_steps, min_lr):
    if step <= warmup_steps:  # one step too many: step warmup_steps overshoots max_lr
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps:
        return min_lr
    return _cosine(step, max_lr, warmup_steps, total_steps, min_lr)


def warmup_cosine_lr_cosine_past_the_end(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    return _cosine(step, max_lr, warmup_steps, total_steps, min_lr)  # climbs again after the end


def warmup_cosine_lr_floor_ignored(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    r = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return max_lr * 0.5 * (1.0 + math.cos(math.pi * r))  # down to 0, not to min_lr


def warmup_cosine_lr_decay_from_zero(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps:
        return min_lr
    return _cosine(step, max_lr, 0, total_steps, min_lr)  # r counted from step 0


def warmup_cosine_lr_decay_over_all_steps(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps:
        return min_lr
    r = (step - warmup_steps) / total_steps  # the warm-up's steps counted in: ends above min_lr
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * r))


def warmup_cosine_lr_linear_decay(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps:
        return min_lr
    r = (step - warmup_steps) / (total_steps - warmup_steps)
    return max_lr - (max_lr - min_lr) * r  # a straight line, not half a cosine


WARMUP_COSINE_BUGS = [
    BugVariant(
        "warmup_cosine.warmup_off_by_one",
        WARMUP_COSINE_ITEM,
        "the warm-up is max_lr * step / warmup_steps: the first update gets learning rate 0 "
        "and max_lr comes one step late",
        "Use max_lr * (step + 1) / warmup_steps while step < warmup_steps.",
        warmup_cosine_lr_warmup_off_by_one,
    ),
    BugVariant(
        "warmup_cosine.warmup_inclusive",
        WARMUP_COSINE_ITEM,
        "the warm-up includes step warmup_steps (step <= warmup_steps), so that step gets "
        "max_lr * (warmup_steps + 1) / warmup_steps, above the peak, before the cosine starts",
        "Warm up while step < warmup_steps; at step warmup_steps the cosine starts, at max_lr.",
        warmup_cosine_lr_warmup_inclusive,
    ),
    BugVariant(
        "warmup_cosine.cosine_past_the_end",
        WARMUP_COSINE_ITEM,
        "after total_steps the cosine goes on, so the learning rate climbs back up from min_lr "
        "instead of staying there",
        "Return min_lr for every step > total_steps.",
        warmup_cosine_lr_cosine_past_the_end,
    ),
    BugVariant(
        "warmup_cosine.floor_ignored",
        WARMUP_COSINE_ITEM,
        "the cosine decays to 0 instead of to the floor min_lr",
        "Decay from max_lr to min_lr: min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2.",
        warmup_cosine_lr_floor_ignored,
    ),
    BugVariant(
        "warmup_cosine.decay_from_zero",
        WARMUP_COSINE_ITEM,
        "the cosine's progress r is counted from step 0 instead of from the end of the warm-up, "
        "so the decay starts below max_lr",
        "Use r = (step - warmup_steps) / (total_steps - warmup_steps).",
        warmup_cosine_lr_decay_from_zero,
    ),
    BugVariant(
        "warmup_cosine.decay_over_all_steps",
        WARMUP_COSINE_ITEM,
        "the cosine's progress r is divided by total_steps instead of by the number of decay "
        "steps (total_steps - warmup_steps), so at total_steps the cosine has not reached "
        "min_lr and the learning rate then drops to it in one step",
        "Use r = (step - warmup_steps) / (total_steps - warmup_steps): r goes from 0 at the end "
        "of the warm-up to 1 at total_steps.",
        warmup_cosine_lr_decay_over_all_steps,
    ),
    BugVariant(
        "warmup_cosine.linear_decay",
        WARMUP_COSINE_ITEM,
        "the learning rate falls along a straight line from max_lr to min_lr instead of along "
        "half a cosine (which stays near max_lr longer and flattens out near min_lr)",
        "Use min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2 with r = (step - warmup_steps) "
        "/ (total_steps - warmup_steps).",
        warmup_cosine_lr_linear_decay,
    ),
]
