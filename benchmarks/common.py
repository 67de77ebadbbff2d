"""Shared helpers of the benchmarks: thread setup, timing, and a measured matmul peak."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

#: The clocks a benchmark may time by: wall time, or the calling thread's CPU time (with one
#: intra-op thread, where torch computes on the calling thread, it leaves out the time spent
#: waiting for a core on a loaded machine).
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def setup_threads(n: int = 2) -> None:
    """Pin intra-op threads so the numbers compare across machines with the same cores."""
    torch.set_num_threads(n)


def time_once(fn: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> float:
    """Time of one call by ``clock``, in seconds (wall time by default)."""
    start = clock()
    fn()
    return clock() - start


def alternate(
    fns: dict[str, Callable[[], object]],
    rounds: int,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> dict:
    """Time several functions alternately (A B A B ...) so machine noise hits them alike.

    ``clock`` is wall time by default; ``time.thread_time`` counts only the CPU time of the
    calling thread, which on a shared machine leaves out the time spent waiting for a core
    (meaningful with one intra-op thread, where torch computes on the calling thread).

    Returns, per name, the list of per-call seconds (after ``warmup`` untimed rounds).
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_once(fn, clock))
    return times


def greedy_pair(lm, hf, prompt: torch.Tensor, new: int, out: dict) -> dict:
    """Two timed functions: coursepkg's ``lm.generate`` and transformers' greedy
    ``hf.generate`` of ``new`` tokens after ``prompt`` (no early stop, every token real); each
    leaves its tokens in ``out["ours"]`` / ``out["theirs"]`` so the caller can compare them."""

    def ours():
        out["ours"] = lm.generate(prompt, new)

    def theirs():
        with torch.no_grad():
            out["theirs"] = hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new,
                do_sample=False,
                num_beams=1,
            )

    return {"ours": ours, "theirs": theirs}


def median(xs: list[float]) -> float:
    return statistics.median(xs)
