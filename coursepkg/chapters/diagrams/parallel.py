"""Diagrams of the chapter on training across machines: who holds what under DDP, sharded
optimizer state (ZeRO-1) and FSDP, what tensor and pipeline parallelism split instead, and the
ring all-reduce under all of them.
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from coursepkg.chapters.diagrams.primitives import (
    COLOURS,
    PALETTE,
    arrow,
    box,
    canvas,
    centred_text,
    note,
)

__all__ = [
    "SHARDED",
    "model_parallel_diagram",
    "pipeline_schedule",
    "ring_allreduce_diagram",
    "ring_schedule",
    "sharding_diagram",
]

#: What each scheme keeps only a 1/N shard of, of (parameters, gradients, optimizer state).
SHARDED = {
    "DDP": (False, False, False),
    "ZeRO-1": (False, False, True),
    "FSDP": (True, True, True),
}

_KINDS = (("P", "attention"), ("G", "ffn"), ("O", "state"))

_COLLECTIVES = {
    "DDP": "after backward:\nall-reduce G",
    "ZeRO-1": "all-reduce G, step own O,\nall-gather P",
    "FSDP": "per layer: all-gather P\n(fwd, bwd), reduce-scatter G",
}


def sharding_diagram(ranks: int = 2) -> Figure:
    """Who holds what: for each scheme and each rank, a bar per kind of tensor, as long as the
    share of it the rank keeps (the whole, or its 1/N shard, at the rank's place in the flat
    vector), and the collectives each step calls.

    Args:
        ranks: N, the ranks drawn (2 to 4).

    Returns:
        The figure: 3 schemes x N ranks x 3 bars (P parameters, G gradients, O optimizer
        state), a shard's bar 1/N as long as a whole one.
    """
    if not 2 <= ranks <= 4:
        raise ValueError(f"ranks must be 2, 3 or 4 (what fits the column), got {ranks!r}")
    length, row = 4.6, 0.55
    bottom = 9.0 - ranks * (3 * row + 0.7)  # below the last rank's bars
    fig, ax = canvas(
        (7.0, 0.31 * (13.4 - bottom) + 0.4),
        (-1.6, 21.2),
        (bottom - 2.4, 11.0),
        "Who holds what on each rank (a short bar: a 1/N shard)",
    )
    for column, (scheme, sharded) in enumerate(SHARDED.items()):
        x0 = 1.0 + 6.9 * column
        box(ax, x0 + length / 2, 10.1, length + 0.6, 0.7, scheme, "stack", size=10)
        for r in range(ranks):
            y_top = 9.0 - r * (3 * row + 0.7)
            if column == 0:
                ax.text(-0.3, y_top - 1.5 * row, f"rank {r}", ha="right", va="center", fontsize=9)
            for k, ((name, role), shard) in enumerate(zip(_KINDS, sharded, strict=True)):
                width = length / ranks if shard else length
                left = x0 + (r * width if shard else 0.0)
                y = y_top - (k + 1) * row
                ax.add_patch(
                    Rectangle(
                        (left, y),
                        width,
                        row * 0.9,
                        facecolor=COLOURS[role],
                        edgecolor="#444444",
                        linewidth=0.8,
                        zorder=2,
                    )
                )
                label = f"{name}/{ranks}" if shard else name
                centred_text(ax, left + width / 2, y + row * 0.45, label)
        centred_text(ax, x0 + length / 2, bottom - 0.6, _COLLECTIVES[scheme])
    note(ax, 9.8, bottom - 1.9, "P parameters, G gradients, O optimizer state (Adam's m and v)")
    return fig


def pipeline_schedule(stages: int, micro: int) -> list[list[str]]:
    """GPipe's schedule: stage s runs micro-batch m's forward at slot s + m and, once the last
    stage has run every forward, the backwards in the mirror order.

    Args:
        stages: S, the pipeline's stages (one per device).
        micro: M, the micro-batches of one step.

    Returns:
        S rows of 2 (M + S - 1) slots, each ``"F<m>"``, ``"B<m>"`` (1-based) or ``""`` (idle).
    """
    if stages < 1 or micro < 1:
        raise ValueError(f"stages and micro must be >= 1, got {stages!r} and {micro!r}")
    slots = 2 * (micro + stages - 1)
    table = [[""] * slots for _ in range(stages)]
    for s in range(stages):
        for m in range(micro):
            table[s][s + m] = f"F{m + 1}"
            table[s][micro + stages - 1 + (stages - 1 - s) + m] = f"B{m + 1}"
    return table


def model_parallel_diagram(stages: int = 3, micro: int = 4) -> Figure:
    """Splitting the model instead of the batch. Left, tensor parallelism: the first matrix of
    the feed-forward network cut by columns, the second by rows, one all-reduce adds the two
    halves. Right, pipeline parallelism: a schedule of micro-batches over the stages, the
    idle slots (the bubble) blank.

    Args:
        stages: S, the pipeline's stages.
        micro: M, the micro-batches.

    Returns:
        The figure: 2 ranks' matrix halves and one all-reduce box; an S x 2(M + S - 1) grid of
        slots, 2 S M of them filled.
    """
    fig, ax = canvas(
        (7.0, 3.8),
        (-0.4, 22.0),
        (-1.6, 9.4),
        "Splitting the model: tensor and pipeline parallelism",
    )
    _tensor_parallel_panel(ax)
    _pipeline_panel(ax, stages, micro)
    return fig


def _tensor_parallel_panel(ax) -> None:
    # The left panel: one feed-forward network's two matrices split over 2 ranks.
    ax.text(3.9, 8.6, "tensor parallel (one FFN, 2 ranks)", ha="center", fontsize=9)
    box(ax, 3.9, 7.6, 3.2, 0.7, "x  (B, L, D)", "tensor")
    for r, x in enumerate((1.9, 5.9)):
        centred_text(ax, x, 6.75, f"rank {r}")
        box(ax, x, 5.8, 3.2, 0.9, f"x W1[:, {'ab'[r]}]\n(D, F/2)", "ffn")
        box(ax, x, 4.0, 3.2, 0.9, f"h{r} W2[{'ab'[r]}, :]\n(F/2, D)", "ffn")
        arrow(ax, (3.9, 7.25), (x, 6.25))
        arrow(ax, (x, 5.45), (x, 4.45))
        arrow(ax, (x, 3.55), (3.9, 2.45), colour=PALETTE["blue"])
    box(ax, 3.9, 2.0, 6.6, 0.8, "all-reduce: y = y0 + y1", PALETTE["sky"])
    centred_text(ax, 3.9, 0.6, "each rank: half of W1, W2\nand of the hidden layer")


def _pipeline_panel(ax, stages: int, micro: int) -> None:
    # The right panel: the schedule of micro-batches over the stages, the bubble blank.
    table = pipeline_schedule(stages, micro)
    ax.text(
        15.6, 8.6, f"pipeline ({stages} stages, {micro} micro-batches)", ha="center", fontsize=9
    )
    cell, x0, y0 = 0.8, 10.0 - 0.3, 7.9
    for s, slots in enumerate(table):
        ax.text(
            x0 - 0.2, y0 - (s + 0.5) * cell * 1.4, f"stage {s}", ha="right", va="center", fontsize=9
        )
        for t, job in enumerate(slots):
            fill = COLOURS["attention"] if job.startswith("F") else COLOURS["ffn"]
            y = y0 - (s + 1) * cell * 1.4
            ax.add_patch(
                Rectangle(
                    (x0 + t * cell, y),
                    cell,
                    cell * 1.3,
                    facecolor=fill if job else "white",
                    edgecolor="#555555",
                    linewidth=0.6,
                    zorder=2,
                )
            )
            if job:
                centred_text(ax, x0 + (t + 0.5) * cell, y + cell * 0.65, job)
    bubble = (stages - 1) / (micro + stages - 1)
    centred_text(
        ax,
        15.6,
        y0 - stages * cell * 1.4 - 1.2,
        f"F forward, B backward, blank: idle\n"
        f"the bubble: (Spp-1)/(m+Spp-1) = {bubble:.0%} of each stage",
    )


def ring_schedule(ranks: int) -> list[list[int]]:
    """Which chunk each rank sends at each step of a ring all-reduce, checked by running it.

    The tensor is cut into ``ranks`` chunks. In the reduce-scatter's ``ranks - 1`` steps rank r
    sends chunk (r - t) mod N to rank r + 1, which adds it to its own; rank r then holds the
    full sum of chunk (r + 1) mod N. In the all-gather's ``ranks - 1`` steps it passes the summed
    chunks on around the ring. The schedule is run on random numbers here, and the function
    raises if any rank ends without the sum of every chunk.

    Args:
        ranks: N, at least 2.

    Returns:
        ``sends[r][t]``: the chunk rank r sends at step t, for t in 0 .. 2 (N - 1) - 1.
    """
    if ranks < 2:
        raise ValueError(f"ranks must be at least 2, got {ranks}")
    data = torch.randn(ranks, ranks, dtype=torch.float64)  # (rank, chunk)
    held = data.clone()
    sends = [[] for _ in range(ranks)]
    for phase in ("reduce-scatter", "all-gather"):
        for t in range(ranks - 1):
            offset = t if phase == "reduce-scatter" else t - 1
            outgoing = []
            for r in range(ranks):
                chunk = (r - offset) % ranks
                sends[r].append(chunk)
                outgoing.append((chunk, held[r, chunk].clone()))
            for r, (chunk, value) in enumerate(outgoing):
                dest = (r + 1) % ranks
                if phase == "reduce-scatter":
                    held[dest, chunk] += value
                else:
                    held[dest, chunk] = value
    if not torch.allclose(held, data.sum(0).expand(ranks, ranks)):
        raise AssertionError("the ring schedule did not leave the sum on every rank")
    return sends


def ring_allreduce_diagram(ranks: int = 4) -> Figure:
    """A ring all-reduce: the ranks in a ring, each sending to the next, and which chunk each
    rank sends at each step (:func:`ring_schedule`, which runs the schedule and checks the sum).

    Args:
        ranks: N, the ranks drawn (2 to 6).

    Returns:
        The figure: the ring on the left; on the right a grid of N rows (ranks) by 2 (N - 1)
        columns (steps), each square naming the chunk sent, reduce-scatter then all-gather.
    """
    if not 2 <= ranks <= 6:
        raise ValueError(f"ranks must be in [2, 6], got {ranks}")
    sends = ring_schedule(ranks)
    steps = 2 * (ranks - 1)
    fig, ax = canvas(
        (7.0, 3.2),
        (-2.2, 3.4 + steps * 0.75),
        (-2.0, 2.2),
        f"Ring all-reduce on {ranks} ranks: every rank sends 2 (N - 1) / N of the tensor",
    )
    for r in range(ranks):
        angle = math.pi / 2 - 2 * math.pi * r / ranks
        nxt = math.pi / 2 - 2 * math.pi * (r + 1) / ranks
        x, y = 1.3 * math.cos(angle), 1.3 * math.sin(angle)
        box(ax, x, y, 0.8, 0.5, f"rank {r}", COLOURS["stack"], size=9)
        start = (1.3 * math.cos(angle - 0.35), 1.3 * math.sin(angle - 0.35))
        end = (1.3 * math.cos(nxt + 0.35), 1.3 * math.sin(nxt + 0.35))
        arrow(ax, start, end, colour=PALETTE["blue"], rad=-0.3)
    fills = [PALETTE[c] for c in ("sky", "orange", "green", "purple", "yellow", "vermillion")]
    x0 = 2.6
    for r in range(ranks):
        ax.text(x0 - 0.1, 1.3 - r * 0.6, f"rank {r}", ha="right", va="center", fontsize=9)
        for t in range(steps):
            chunk = sends[r][t]
            ax.add_patch(
                Rectangle(
                    (x0 + t * 0.75, 1.05 - r * 0.6),
                    0.7,
                    0.5,
                    facecolor=fills[chunk % len(fills)],
                    edgecolor="#555555",
                    linewidth=0.6,
                )
            )
            centred_text(ax, x0 + t * 0.75 + 0.35, 1.3 - r * 0.6, f"c{chunk}")
    base = 1.05 - (ranks - 1) * 0.6 - 0.3
    half = (ranks - 1) * 0.75
    ax.plot([x0 + half - 0.025] * 2, [1.65, base + 0.1], ls="--", color="#333333", lw=1.0)
    ax.text(
        x0 + half / 2, base, "reduce-scatter:\nadd what arrives", ha="center", va="top", fontsize=9
    )
    ax.text(
        x0 + half * 1.5, base, "all-gather:\npass the sums on", ha="center", va="top", fontsize=9
    )
    return fig
