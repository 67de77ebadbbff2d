"""Shared helpers of the benchmarks: thread setup, timing, and a measured matmul peak."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def setup_threads(n: int = 2) -> None:
    """Pin intra-op threads so the numbers compare across machines with the same cores."""
    torch.set_num_threads(n)


def time_once(fn: Callable[[], object]) -> float:
    """Wall time of one call, in seconds."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 2) -> dict:
    """Time several functions alternately (A B A B ...) so machine noise hits them alike.

    Returns, per name, the list of per-call seconds (after ``warmup`` untimed rounds).
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_once(fn))
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def matmul_peak_flops(size: int = 1024, repeats: int = 10) -> float:
    """Best measured fp32 FLOP/s of a square matmul (2 n^3 FLOPs) on this machine."""
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    for _ in range(2):
        a @ b
    best = min(time_once(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best
