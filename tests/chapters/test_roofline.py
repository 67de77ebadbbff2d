"""The decoding roofline (issue 67): the bytes a step reads are the model's parameters once (a
tied output layer once), the rows it looks up and the cache it really holds; the FLOPs and the
intensity follow the closed form; the roofline's arithmetic; the measurements return consistent
numbers (no timing order or share asserted)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
import torch

from coursepkg import DecoderOnlyLM
from coursepkg.chapters.roofline import (
    Roofline,
    RooflinePoint,
    decode_points,
    decode_step_bytes,
    decode_step_flops,
    draw_roofline,
    gpt2_small_config,
    matmul_peak_flops,
    measure_roofline,
    stream_copy_bandwidth,
)
from coursepkg.config_groups import MoEConfig

SMALL = dict(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=101, max_len=64)


def small_lm(dtype: torch.dtype = torch.float32, **changes) -> DecoderOnlyLM:
    torch.manual_seed(0)
    return DecoderOnlyLM(gpt2_small_config(**{**SMALL, **changes})).to(dtype).eval()


def held_cache_bytes(lm: DecoderOnlyLM, batch: int, context: int) -> int:
    """The bytes of keys and values the model's own cache holds after a step at ``context``."""
    tokens = torch.randint(0, lm.config.vocab_size, (batch, context))
    cache = lm.new_cache()
    with torch.inference_mode():
        lm(tokens[:, :-1], cache=cache)
        lm(tokens[:, -1:], cache=cache)  # the decoding step
    return sum((c.k.numel() + c.v.numel()) * c.k.element_size() for c in cache.self_attn)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"tie_embeddings": False},
        {"positional": "rope"},
        {"n_kv_heads": 2, "positional": "rope", "tie_embeddings": False},
        {"positional": "sinusoidal"},
    ],
)
@pytest.mark.parametrize(("batch", "context"), [(1, 5), (3, 9)])
def test_bytes_are_the_parameters_once_the_rows_looked_up_and_the_cache_held(
    dtype, changes, batch, context
):
    lm = small_lm(dtype, **changes)
    d, size = lm.config.d_model, lm.embed.weight.element_size()
    tied = lm.lm_head.weight is lm.embed.weight
    learned = lm.config.positional == "learned"
    unique = {id(p): p for p in lm.parameters()}.values()  # a tied matrix once
    tables = (0 if tied else lm.embed.weight.numel()) + (
        lm.positions.weight.numel() if learned else 0
    )
    rows = (0 if tied else batch * d) + (d if learned else 0)
    weights = sum(p.numel() for p in unique) - tables + rows
    expected = weights * size + held_cache_bytes(lm, batch, context)
    assert decode_step_bytes(lm, batch, context) == expected


@pytest.mark.parametrize("batch", [1, 4])
def test_a_tied_output_layer_is_read_once(batch):
    tied, untied = small_lm(), small_lm(tie_embeddings=False)
    v, d = SMALL["vocab_size"], SMALL["d_model"]
    # Untied: the head's V x D matrix plus B looked-up embedding rows; tied: V x D once.
    difference = decode_step_bytes(untied, batch, 7) - decode_step_bytes(tied, batch, 7)
    assert difference == 4 * batch * d
    every_use = sum(p.numel() for _, p in tied.named_parameters(remove_duplicate=False))
    once = sum(p.numel() for p in tied.parameters())
    assert every_use - once == v * d  # the tied matrix appears twice in the model


def test_gpt2_small_bytes_and_flops_follow_the_closed_form():
    # Pre-norm GPT-2: per layer 4 D^2 + 4 D (attention), 2 D F + F + D (feed-forward),
    # 4 D (two norms); the tied V x D matrix, one position row, the final norm's 2 D.
    cfg = gpt2_small_config(**SMALL)
    lm = small_lm()
    n, d, f, v = cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.vocab_size
    per_layer = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
    for batch, s in [(1, 1), (2, 10), (5, 33)]:
        weights = n * per_layer + v * d + d + 2 * d
        assert decode_step_bytes(lm, batch, s) == 4 * (weights + batch * n * s * 2 * d)
        matmuls = n * (4 * d * d + 2 * d * f) + v * d
        assert decode_step_flops(lm, batch, s) == 2 * batch * (matmuls + n * s * 2 * d)


def test_flops_grow_with_the_batch_and_the_intensity_with_it():
    lm = small_lm()
    flops = [decode_step_flops(lm, b, 12) for b in (1, 4, 16)]
    assert flops == [flops[0], 4 * flops[0], 16 * flops[0]]
    intensity = [decode_step_flops(lm, b, 12) / decode_step_bytes(lm, b, 12) for b in (1, 4, 16)]
    assert intensity[0] < intensity[1] < intensity[2]
    # Batch 1 in float32: at most one multiply-add (2 FLOPs) per 4-byte element read; less, as
    # the norms' and biases' bytes carry no matmul FLOPs.
    assert 0.4 < intensity[0] <= 0.5
    half = small_lm(torch.bfloat16)
    assert decode_step_bytes(half, 1, 12) * 2 == decode_step_bytes(lm, 1, 12)
    assert decode_step_flops(half, 1, 12) == flops[0]


def test_a_sliding_window_reads_only_its_window():
    lm = small_lm(positional="rope", sliding_window=8)
    assert decode_step_bytes(lm, 2, 30) == decode_step_bytes(lm, 2, 8)
    assert decode_step_bytes(lm, 2, 30) == held_bytes_of(lm, 2, 30)


def held_bytes_of(lm: DecoderOnlyLM, batch: int, context: int) -> int:
    weights = sum(p.numel() for p in lm.parameters()) * 4  # rope, tied: no table
    return weights + held_cache_bytes(lm, batch, context)


def test_a_mixture_of_experts_is_refused_by_name():
    lm = small_lm(positional="rope", moe=MoEConfig(n_experts=4, top_k=2))
    with pytest.raises(ValueError, match="moe="):
        decode_step_bytes(lm, 1, 4)
    with pytest.raises(ValueError, match="moe="):
        decode_step_flops(lm, 1, 4)


def test_the_roofline_arithmetic():
    point = RooflinePoint("fp32, batch 1", 1, seconds=0.5, bytes=1000, flops=500)
    assert point.intensity == 0.5
    assert point.flops_per_s == 1000
    assert point.bytes_per_s == 2000
    assert point.share(4000) == 0.5
    roof = Roofline(bandwidth=100.0, peak_flops=1000.0, points=(point,))
    assert roof.ridge == 10.0
    assert roof.attainable(0.5) == 50.0  # below the ridge: bandwidth x intensity
    assert roof.attainable(10.0) == 1000.0 == 100.0 * 10.0  # the roofs meet
    assert roof.attainable(40.0) == 1000.0  # above: the flat roof


def test_the_measurements_are_consistent_with_the_counts():
    lm = small_lm()
    points = decode_points(lm, (1, 3), context=6, steps=2, rounds=2, label="tiny")
    assert [p.label for p in points] == ["tiny, batch 1", "tiny, batch 3"]
    middle = 6 + 1 + (2 * 2 + 1) // 2  # the middle of the timed steps' context
    for p in points:
        assert p.seconds > 0
        assert p.bytes == decode_step_bytes(lm, p.batch, middle)
        assert p.flops == decode_step_flops(lm, p.batch, middle)
    assert stream_copy_bandwidth(mib=4, rounds=2) > 0
    assert matmul_peak_flops(size=64, rounds=2) > 0
    roof = measure_roofline(lm, (1, 2), context=4, steps=1, rounds=1, mib=4)
    assert [p.batch for p in roof.points] == [1, 2]
    assert roof.bandwidth > 0 and roof.peak_flops > 0


def test_the_drawing_has_the_roof_and_one_marker_a_point():
    points = tuple(RooflinePoint(f"b{b}", b, 1.0, 100, 50 * b) for b in (1, 4, 16))
    roof = Roofline(bandwidth=100.0, peak_flops=1e4, points=points)
    extra = (RooflinePoint("bf16", 1, 1.0, 50, 50),)
    fig, ax = plt.subplots()
    draw_roofline(ax, roof, extra)
    assert len(ax.lines) == 1 + len(points) + len(extra)
    roof_line = ax.lines[0]
    ys = [roof.attainable(x) for x in roof_line.get_xdata()]
    assert list(roof_line.get_ydata()) == ys
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["b1", "b4", "b16", "bf16"]
    plt.close(fig)
