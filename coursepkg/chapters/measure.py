"""What the book's pages measure, one call each: best-of timings, peak memory, slopes, verdicts.

A page that times something shows the result and says what it means; the machinery lives here.
The timings take the best of several rounds and visit every candidate in each round, so that a
busy moment on the machine does not fall on one candidate only. A page never asserts a timing
order: it glues the measured ratio with :func:`verdict`'s word for it, and the orderings the book
relies on are checked over several runs in ``scripts/robustness.py`` and ``benchmarks/``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

__all__ = ["best_seconds", "loglog_slope", "peak_bytes", "verdict"]


def _repeats_for(call: Callable[[], object], min_time: float) -> int:
    """How many calls in a row last at least ``min_time`` seconds (1 when it is 0)."""
    if min_time <= 0:
        return 1
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, math.ceil(min_time / once))


def best_seconds(
    calls: Mapping[Hashable, Callable[[], object]], rounds: int = 5, min_time: float = 0.0
) -> dict[Hashable, float]:
    """The best time of each call, over ``rounds`` rounds that each time every call in turn.

    The least disturbed run is the best estimate of what a call costs on an idle machine;
    interleaving the candidates gives each the same share of the machine's busy moments.

    Args:
        calls: name -> a call without arguments (``functools.partial`` binds inputs).
        rounds: how many times each call is timed; the fastest counts.
        min_time: a call shorter than this is repeated in a row until the row lasts about this
            long (seconds), and the row's time is divided by its length: a short call's time
            is then not drowned by the timer's own resolution. 0 times single calls.

    Returns:
        name -> seconds of one call, in the order of ``calls``.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    if min_time < 0:
        raise ValueError(f"min_time must be >= 0 seconds, got {min_time}")
    if not calls:
        raise ValueError("calls must hold at least one call to time, got none")
    repeats = {name: _repeats_for(call, min_time) for name, call in calls.items()}
    best = dict.fromkeys(calls, math.inf)
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(repeats[name]):
                call()
            best[name] = min(best[name], (time.perf_counter() - start) / repeats[name])
    return best


def peak_bytes(fn: Callable[[], object]) -> int:
    """The most bytes the CPU allocator held at once during ``fn()``, beyond what was live before.

    PyTorch's profiler records every allocation and free made during the call; replaying them in
    order gives the largest total alive at one moment. It measures what the allocator really
    handed out, not what a formula predicts, and no other job on the machine can change it.

    Args:
        fn: the call to measure, without arguments.

    Returns:
        The peak, in bytes (0 when the call allocates nothing).
    """
    from torch.profiler import ProfilerActivity, profile

    saved = os.dup(2)  # the profiler's C++ side logs each start and stop on stderr
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    events = prof.profiler.kineto_results.events()
    changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for _, change in changes:
        live += change
        peak = max(peak, live)
    return peak


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The exponent ``p`` of the least-squares fit ``y ~ c * x**p`` on log-log axes.

    Args:
        xs: the sizes (positive), at least two distinct ones.
        ys: what was measured at each size (positive), as many as ``xs``.

    Returns:
        The fitted exponent: 1 for linear growth, 2 for quadratic.
    """
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError(
            f"xs and ys must have the same length with at least two distinct sizes, got "
            f"{len(xs)} sizes ({len(set(xs))} distinct) and {len(ys)} values"
        )
    if min(xs) <= 0 or min(ys) <= 0:
        raise ValueError(
            f"xs and ys must be positive for a log-log fit, got minima {min(xs)} and {min(ys)}"
        )
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def verdict(
    ratio: float,
    tie: float = 1.1,
    words: tuple[str, str, str] = ("faster", "about the same", "slower"),
) -> str:
    """A measured ratio in words: below 1, about 1, or above 1, with a band for a tie.

    For a ratio of times (this one's over the other's), the default words read "faster",
    "about the same", "slower". A page glues the word beside the ratio, so its sentence says what
    this build measured, whichever way it came out.

    Args:
        ratio: the measured ratio (positive).
        tie: ratios within ``[1 / tie, tie]`` count as equal; above 1.
        words: what to say below ``1 / tie``, within the band, and above ``tie``.

    Returns:
        One of ``words``.
    """
    if not ratio > 0:
        raise ValueError(f"ratio must be a positive number, got {ratio}")
    if not tie > 1:
        raise ValueError(f"tie must be above 1 (a band around 1), got {tie}")
    below, same, above = words
    if ratio < 1 / tie:
        return below
    if ratio > tie:
        return above
    return same
