"""Decoding against the memory wall: the roofline of the serving chapter, one call to measure it.

A decoding step of one sequence multiplies one vector by every weight matrix: it reads each
weight once and does one multiply-add (2 FLOPs) with it, 0.5 FLOP per byte in float32. A CPU or
GPU can do tens of FLOPs in the time it reads one byte, so batch-1 decoding waits on memory: its
speed limit is the memory bandwidth, not the arithmetic. The roofline model (Williams et al.,
2009) draws this: attainable FLOP/s = min(peak FLOP/s, bandwidth x intensity), where the
arithmetic intensity is FLOPs per byte read. Decoding B sequences together reads the weights
once for all B rows, so the intensity grows with B and the step climbs towards the flat roof.

- :func:`stream_copy_bandwidth`: the machine's memory bandwidth, as STREAM's copy measures it;
  :func:`matmul_peak_flops`: the float32 matmul's measured FLOP/s, the flat roof.
- :func:`decode_step_bytes` and :func:`decode_step_flops`: what one decoding step must read and
  compute, counted from the model (the tied output layer once, the key/value cache per row).
- :func:`decode_points` times decoding steps at several batch sizes; :func:`measure_roofline`
  does all of it in one call (the page's and ``benchmarks/decode_roofline.py``'s), the copy
  timed beside the steps in the same rounds, and :func:`draw_roofline` draws the result.

Timings are wall-clock seconds on whatever machine runs them (a bandwidth needs the wall
clock); nothing here asserts an order or a share.

Dimension legend: B batch, S cached positions, D ``d_model``, V vocabulary.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from matplotlib.axes import Axes
from torch import nn

from ..config import TransformerConfig
from ..decoder_only import DecoderOnlyLM
from .measure import best_seconds

__all__ = [
    "Roofline",
    "RooflinePoint",
    "decode_points",
    "decode_step_bytes",
    "decode_step_flops",
    "draw_roofline",
    "gpt2_small_config",
    "matmul_peak_flops",
    "measure_roofline",
    "stream_copy_bandwidth",
]


def gpt2_small_config(**changes) -> TransformerConfig:
    """GPT-2 small's shape (Radford et al., 2019): 12 layers, D=768, 12 heads, F=3072,
    V=50,257, 1,024 learned positions, pre-norm, tied output layer (124 M parameters).

    Args:
        changes: fields to change (``n_layers=2`` for a shallower model of the same width).
    """
    # Read as a paragraph, as the paper's table gives it (one a line would be 13 lines).
    shape = dict(
        vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=1024,
        dropout=0.0, norm_first=True, final_norm=True, positional="learned",
        tie_embeddings=True, activation="gelu_tanh", scale_embeddings=False,
    )  # fmt: skip
    return TransformerConfig(**{**shape, **changes})


def stream_copy_bandwidth(mib: int = 512, rounds: int = 5) -> float:
    """Bytes per second of ``dst.copy_(src)`` for two ``mib`` MiB float32 tensors, counted as
    read + write, best of ``rounds`` (STREAM's copy, McCalpin 1995). Take ``mib`` larger than
    the last-level cache, so the copy runs from main memory.

    Returns:
        The measured bandwidth in bytes per second.
    """
    copy, moved = _copy_call(mib)
    return moved / best_seconds({"copy": copy}, rounds)["copy"]


def _copy_call(mib: int) -> tuple[Callable[[], object], int]:
    # STREAM's copy of two mib MiB float32 tensors, and the bytes it moves (read + write).
    src = torch.randn(mib * 2**18)  # mib MiB of float32
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page once, so the timed copies do not fault them in
    return (lambda: dst.copy_(src)), 2 * src.numel() * src.element_size()


def matmul_peak_flops(size: int = 1024, rounds: int = 10) -> float:
    """The best measured float32 FLOP/s of a square ``size`` x ``size`` matmul (2 n^3 FLOPs)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # the first call sets the library's threads and buffers up
    return 2 * size**3 / best_seconds({"mm": lambda: a @ b}, rounds)["mm"]


def _lookup_tables(lm: DecoderOnlyLM) -> list[nn.Parameter]:
    # The tables a step reads a few rows of: the token embedding, unless the output layer
    # reads all of it (tied), and a learned position table.
    tables = [] if lm.lm_head.weight is lm.embed.weight else [lm.embed.weight]
    weight = getattr(lm.positions, "weight", None)  # sinusoidal: a buffer, not a parameter
    return tables + ([weight] if isinstance(weight, nn.Parameter) else [])


def _check_countable(lm: DecoderOnlyLM) -> None:
    # The counts below read every expert and a plain key/value cache.
    cfg = lm.config
    if cfg.moe is not None or cfg.latent is not None:
        raise ValueError(
            "decode_step_bytes and decode_step_flops count dense models with a key/value "
            f"cache; got moe={cfg.moe}, latent={cfg.latent}"
        )


def _keys(cfg: TransformerConfig, context: int) -> int:
    # The keys a step reads: a sliding window's cache holds only its last W positions.
    return context if cfg.sliding_window is None else min(context, cfg.sliding_window)


def decode_step_bytes(lm: DecoderOnlyLM, batch: int, context: int) -> int:
    """The bytes one decoding step of ``batch`` sequences must read from memory.

    Every parameter once (``lm.parameters()`` yields a tied weight once: the output layer and
    the embedding are one matrix, read whole by the output layer), except the lookup tables, of
    which a step reads only rows: one token row per sequence (an untied embedding) and one
    position row (every sequence is at the same position). And each sequence's keys and values
    in every layer's cache: 2 x layers x S x Hkv x Dk (Dv) elements. Activations are left out:
    a few vectors of D or F elements a layer, against D^2-sized matrices.

    Args:
        lm: the model, in the dtype it decodes in.
        batch: sequences decoded together (B).
        context: positions in each sequence's cache after the step (S, the keys it attends).

    Returns:
        Bytes, for the parameters' element size.
    """
    _check_countable(lm)
    cfg = lm.config
    size = next(lm.parameters()).element_size()
    tables = _lookup_tables(lm)
    weights = sum(p.numel() for p in lm.parameters() if all(p is not t for t in tables))
    rows = sum(cfg.d_model * (batch if t is lm.embed.weight else 1) for t in tables)
    kv = cfg.kv_heads * (cfg.head_dim_k + cfg.head_dim_v)  # one position of one layer
    cache = batch * cfg.n_layers * _keys(cfg, context) * kv
    return (weights + rows + cache) * size


def decode_step_flops(lm: DecoderOnlyLM, batch: int, context: int) -> int:
    """The FLOPs of one decoding step of ``batch`` sequences: 2 per weight of every matrix a
    matmul reads (the linear layers and the output layer; not the lookup tables) and row, and
    attention's 2 x S x H x (Dk + Dv) per layer and row (scores, then the weighted values).
    Norms, activations and the softmax are left out (a few FLOPs per element of a vector).

    Args:
        lm: the model.
        batch: sequences decoded together (B).
        context: positions in each sequence's cache after the step (S).
    """
    _check_countable(lm)
    cfg = lm.config
    tables = _lookup_tables(lm)
    matrices = sum(
        p.numel() for p in lm.parameters() if p.dim() == 2 and all(p is not t for t in tables)
    )
    attention = cfg.n_layers * _keys(cfg, context) * cfg.n_heads * (cfg.head_dim_k + cfg.head_dim_v)
    return 2 * batch * (matrices + attention)


@dataclass(frozen=True)
class RooflinePoint:
    """One measured decoding step.

    Attributes:
        label: what was measured ("fp32, batch 4").
        batch: sequences decoded together.
        seconds: the best time of one step.
        bytes: what the step must read (:func:`decode_step_bytes`).
        flops: what it computes (:func:`decode_step_flops`).
    """

    label: str
    batch: int
    seconds: float
    bytes: int
    flops: int

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte read."""
        return self.flops / self.bytes

    @property
    def flops_per_s(self) -> float:
        """Attained FLOP/s."""
        return self.flops / self.seconds

    @property
    def bytes_per_s(self) -> float:
        """Attained bytes read per second."""
        return self.bytes / self.seconds

    def share(self, bandwidth: float) -> float:
        """The attained bytes per second as a share of ``bandwidth`` (bytes per second)."""
        return self.bytes_per_s / bandwidth


@dataclass(frozen=True)
class Roofline:
    """A machine's two roofs and the decoding steps measured under them.

    Attributes:
        bandwidth: memory bandwidth, bytes per second (:func:`stream_copy_bandwidth`).
        peak_flops: the flat roof, FLOP/s (:func:`matmul_peak_flops`).
        points: the measured steps.
    """

    bandwidth: float
    peak_flops: float
    points: tuple[RooflinePoint, ...]

    @property
    def ridge(self) -> float:
        """The intensity where the roofs meet (FLOP per byte): below it memory bounds a step."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The roofline: min(peak FLOP/s, bandwidth x intensity)."""
        return min(self.peak_flops, self.bandwidth * intensity)


def decode_points(
    lm: DecoderOnlyLM,
    batches: Sequence[int],
    context: int = 128,
    steps: int = 8,
    rounds: int = 3,
    label: str = "fp32",
) -> list[RooflinePoint]:
    """Time greedy decoding steps of ``lm`` at each batch size, from a cache of ``context``.

    Each batch size gets its own preallocated cache: one ``context``-token prompt is prefilled
    once and its cache copied to every row (the step's cost does not depend on what the cache
    holds), then one untimed step. Then ``rounds`` x ``steps`` steps are timed one by one,
    every batch size in turn (:func:`~coursepkg.chapters.measure.best_seconds`), and the best
    is a step's time: on a shared machine a single step is more often left undisturbed than a
    run of several (the copy is timed alike, one copy at a time). The bytes and FLOPs are
    counted at the middle of the timed steps' context (the cache grows by one a step).

    Args:
        lm: the model, in eval mode and the dtype to measure.
        batches: the batch sizes.
        context: the prompt's length.
        steps: with ``rounds``, how many steps are timed per batch size (``rounds * steps``).
        rounds: see ``steps``.
        label: the points' label, before ", batch B".

    Returns:
        One :class:`RooflinePoint` per batch size, in order.
    """
    with torch.inference_mode():
        seconds = best_seconds(_step_calls(lm, batches, context, rounds * steps), rounds * steps)
    return _points(lm, batches, seconds, context + 1 + (rounds * steps + 1) // 2, label)


def _step_calls(
    lm: DecoderOnlyLM, batches: Sequence[int], context: int, n_steps: int
) -> dict[Hashable, Callable[[], object]]:
    # batch -> one decoding step of that batch, from its own cache of a prefilled prompt (after
    # one untimed step), with room for n_steps more; call under inference_mode.
    prompt = torch.randint(0, lm.config.vocab_size, (1, context))  # (1, S)
    capacity = context + 1 + n_steps

    def stepper(batch: int):
        cache = lm.new_cache(capacity=capacity)
        logits = lm(prompt, cache=cache)  # (1, S, V)
        cache.reorder(torch.zeros(batch, dtype=torch.long))  # (B, ...): the prompt's rows
        token = logits[:, -1:].argmax(-1).expand(batch, 1)  # (B, 1)
        state = [lm(token, cache=cache)[:, -1:].argmax(-1)]  # (B, 1): the untimed step

        def run() -> None:
            state[0] = lm(state[0], cache=cache)[:, -1:].argmax(-1)  # (B, 1)

        return run

    return {b: stepper(b) for b in batches}


def _points(
    lm: DecoderOnlyLM, batches: Sequence[int], seconds: dict, middle: int, label: str
) -> list[RooflinePoint]:
    # The measured steps as points, their bytes and FLOPs counted at context ``middle``.
    return [
        RooflinePoint(
            f"{label}, batch {b}",
            b,
            seconds[b],
            decode_step_bytes(lm, b, middle),
            decode_step_flops(lm, b, middle),
        )
        for b in batches
    ]


def measure_roofline(
    lm: DecoderOnlyLM,
    batches: Sequence[int] = (1, 4, 16),
    context: int = 128,
    steps: int = 8,
    rounds: int = 3,
    mib: int = 512,
) -> Roofline:
    """The machine's roofs and ``lm``'s decoding steps at ``batches`` (see
    :func:`decode_points`; ``mib`` is the copy's size, :func:`stream_copy_bandwidth`).

    The copy is timed in the same rounds as the steps, one copy beside each step of every
    batch size: on a shared machine the bandwidth and the steps then meet the same load.
    """
    peak = matmul_peak_flops()
    n = rounds * steps
    copy, moved = _copy_call(mib)
    with torch.inference_mode():
        calls = {"copy": copy, **_step_calls(lm, batches, context, n)}
        seconds = best_seconds(calls, n)
    points = _points(lm, batches, seconds, context + 1 + (n + 1) // 2, "fp32")
    return Roofline(moved / seconds["copy"], peak, tuple(points))


def draw_roofline(ax: Axes, roofline: Roofline, extra: Sequence[RooflinePoint] = ()) -> None:
    """Draw the roofline (log-log: intensity against attained FLOP/s) and its points.

    Args:
        ax: where to draw.
        roofline: the roofs and the points (filled circles).
        extra: more points to mark (squares), e.g. another dtype's.
    """
    ridge = roofline.ridge
    lowest = min(p.intensity for p in (*roofline.points, *extra))
    xs = [lowest / 4, ridge, 16 * ridge]
    ax.loglog(xs, [roofline.attainable(x) for x in xs], color="black", lw=1.5)
    middle = ridge / 2  # near the top of the slope
    ax.annotate(  # left of the slope, in the empty corner above it
        f"memory: {roofline.bandwidth / 1e9:.1f} GB/s x intensity",
        (middle, roofline.attainable(middle)),
        textcoords="offset points",
        xytext=(-8, 0),
        ha="right",
        va="bottom",
        fontsize=9,
    )
    ax.annotate(
        f"matmul peak: {roofline.peak_flops / 1e9:.0f} GFLOP/s",
        (ridge, roofline.peak_flops),
        textcoords="offset points",
        xytext=(4, 6),
        fontsize=9,
    )
    colours = ("#0072B2", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#D55E00")
    marked = [(p, "o") for p in roofline.points] + [(p, "s") for p in extra]
    for (point, marker), colour in zip(marked, itertools.cycle(colours)):
        ax.loglog(point.intensity, point.flops_per_s, marker, color=colour, ms=8, label=point.label)
    ax.set_ylim(top=2 * roofline.peak_flops)  # room for the flat roof's label
    ax.set_xlabel("arithmetic intensity (FLOP per byte read)")
    ax.set_ylabel("attained FLOP/s")
    ax.legend(fontsize=9, loc="lower right")
