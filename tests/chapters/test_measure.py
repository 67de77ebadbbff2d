"""coursepkg.chapters.measure: the book's timings, peak memory, slopes and verdicts (no timing
asserted)."""

import functools

import pytest
import torch

from coursepkg.chapters.measure import best_seconds, loglog_slope, peak_bytes, verdict


def test_best_seconds_times_every_call_once_per_round_and_keeps_the_order():
    seen = []
    calls = {name: functools.partial(seen.append, name) for name in ("b", "a", "c")}
    best = best_seconds(calls, rounds=3)
    assert list(best) == ["b", "a", "c"]
    assert seen == ["b", "a", "c"] * 3  # interleaved: each round visits every call
    assert all(s >= 0 for s in best.values())


def test_best_seconds_repeats_a_short_call_to_fill_min_time():
    count = []
    best_seconds({"x": functools.partial(count.append, 1)}, rounds=2, min_time=1e-2)
    # one calibration call, then two rows of the same length, longer than one call each
    rows = (len(count) - 1) / 2
    assert rows == int(rows) and rows > 1


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"rounds": 0}, "rounds"),
        ({"min_time": -1.0}, "min_time"),
    ],
)
def test_best_seconds_rejects_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        best_seconds({"x": lambda: None}, **kwargs)
    with pytest.raises(ValueError, match="calls"):
        best_seconds({})


def test_peak_bytes_sees_a_tensor_allocated_inside_the_call():
    n = 256 * 1024  # floats: 1 MiB
    peak = peak_bytes(lambda: torch.empty(n))
    assert n * 4 <= peak < 2 * n * 4
    two_alive = peak_bytes(lambda: (torch.empty(n), torch.empty(n)))
    assert 2 * n * 4 <= two_alive < 3 * n * 4


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0])
def test_loglog_slope_recovers_a_power_law(p):
    xs = [16, 32, 64, 128, 256]
    assert loglog_slope(xs, [7.0 * x**p for x in xs]) == pytest.approx(p)


def test_loglog_slope_rejects_what_cannot_be_fitted():
    with pytest.raises(ValueError, match="two distinct"):
        loglog_slope([4, 4], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        loglog_slope([1, 2], [0.0, 1.0])


@pytest.mark.parametrize(
    ("ratio", "word"),
    [
        (0.5, "faster"),
        (0.95, "about the same"),
        (1.0, "about the same"),
        (1.05, "about the same"),
        (1.2, "slower"),
        (4.0, "slower"),
    ],
)
def test_verdict_reads_a_ratio_with_a_band_for_a_tie(ratio, word):
    assert verdict(ratio) == word
    assert verdict(1 / ratio, words=("slower", "about the same", "faster")) == word


def test_verdict_uses_the_given_band_and_words():
    assert verdict(1.3, tie=1.5, words=("less", "same", "more")) == "same"
    assert verdict(1.6, tie=1.5, words=("less", "same", "more")) == "more"
    with pytest.raises(ValueError, match="tie"):
        verdict(1.0, tie=1.0)
    with pytest.raises(ValueError, match="ratio"):
        verdict(float("nan"))
