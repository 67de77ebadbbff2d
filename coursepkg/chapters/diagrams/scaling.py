"""Diagrams of the later chapters: where the parameters live, tiled attention's running
statistics, the sliding window's receptive field, pre- and post-norm, RoPE's rotation, data
parallelism's all-reduce and a checkpoint's contents (chapters 6, 10, 14-16).
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Rectangle

from coursepkg.chapters.diagrams.primitives import PALETTE, arrow, box, canvas, grid, note
from coursepkg.config import TransformerConfig
from coursepkg.masks import causal_mask
from coursepkg.params import layer_breakdown, parameter_breakdown

__all__ = [
    "norm_placement_diagram",
    "parameter_map_diagram",
    "receptive_field",
    "rope_rotation_diagram",
    "sliding_window_diagram",
    "tiled_attention_diagram",
]

# light enough for black text on every one
SHADES = [PALETTE[k] for k in ("orange", "sky", "green", "yellow", "purple")]


def _bar(ax, parts: dict[str, int], y: float, length: float, label: str) -> int:
    """One horizontal bar cut into the non-zero parts, each as long as its share."""
    total, x, drawn = sum(parts.values()), 0.0, 0
    ax.text(0.0, y + 0.75, label, fontsize=9, weight="bold")
    for k, (name, n) in enumerate(p for p in parts.items() if p[1]):
        w = length * n / total
        ax.add_patch(
            Rectangle(
                (x, y - 0.4), w, 0.8, facecolor=SHADES[k % len(SHADES)], edgecolor="white", lw=1.5
            )
        )
        text = f"{name}\n{100 * n / total:.0f}%" if w > 1.4 else f"{100 * n / total:.0f}%"
        ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=9)
        x, drawn = x + w, drawn + 1
    return drawn


def parameter_map_diagram(config: TransformerConfig | None = None) -> Figure:
    """Where the parameters live: the whole model cut by part, and one encoder and one decoder
    layer cut by sublayer, each piece as long as its share (from :mod:`coursepkg.params`).

    Args:
        config: the model (default: the paper's base model).

    Returns:
        The figure: one bar segment per non-zero part.
    """
    config = config or TransformerConfig.base()
    fig, ax = canvas(
        (7.0, 2.6), (-0.2, 14.2), (-0.6, 4.6), "Where the parameters are (shares of each bar)"
    )
    _bar(ax, parameter_breakdown(config), 2.8, 14.0, "the whole model")
    short = {"self_attn": "attn", "cross_attn": "cross", "ffn": "FFN"}
    layer = {
        f"{k[:3]} {short[k.split('.')[1]]}": n
        for k, n in layer_breakdown(config).items()
        if not k.endswith("norms")
    }
    _bar(ax, layer, 0.5, 14.0, "one encoder layer + one decoder layer (norms under 0.1%)")
    return fig


def tiled_attention_diagram(blocks: int = 4, row: int = 1, done: int = 2) -> Figure:
    """Tiled (FlashAttention-style) attention: the score matrix is never stored; one block of
    queries walks over the key blocks, keeping per query a running maximum m, a running sum l
    and an unnormalised output O, rescaled whenever m grows.

    Args:
        blocks: query blocks and key blocks (the matrix has blocks x blocks tiles).
        row: the query block drawn at work.
        done: key blocks it has already processed.

    Returns:
        The figure: blocks^2 tiles and one statistics box per key block of the working row.
    """
    fig, ax = canvas(
        (7.0, 3.2),
        (-1.4, 15.0),
        (-2.0, blocks + 1.3),
        "Tiled attention: one tile at a time, running statistics per query",
    )
    state = [["wait"] * blocks for _ in range(blocks)]
    state[row] = ["done"] * done + ["now"] + ["wait"] * (blocks - done - 1)
    colours = {"done": PALETTE["sky"], "now": PALETTE["orange"], "wait": "#f2f2f2"}
    grid(ax, state, 0.0, blocks, colours, 1.0)
    ax.text(blocks / 2, blocks + 0.3, "key blocks", ha="center", fontsize=9)
    ax.text(-0.2, blocks / 2, "query blocks", rotation=90, ha="right", va="center", fontsize=9)
    ax.text(blocks + 0.2, blocks - row - 0.5, "<- working", va="center", fontsize=9)
    for j in range(blocks):
        y = blocks - 0.5 - 1.15 * j
        tag = "seen" if j < done else ("this tile" if j == done else "to come")
        box(
            ax,
            10.4,
            y,
            4.9,
            0.8,
            f"key block {j + 1}: {tag}",
            colours["done" if j < done else "now" if j == done else "wait"],
            size=9,
        )
    arrow(ax, (done + 0.5, blocks - row - 0.5), (7.9, blocks - 0.5 - 1.15 * done), rad=0.15)
    note(
        ax,
        7.0,
        -1.3,
        "per tile: m grows to the new max, l and O are rescaled by exp(m_old - m)\n"
        "and the tile's terms added; at the end O / l is the exact output",
    )
    return fig


def receptive_field(length: int, window: int, layers: int) -> list[torch.Tensor]:
    """Which positions the last position's output depends on, layer by layer, under
    :func:`coursepkg.masks.causal_mask` with a sliding window.

    Args:
        length: positions L.
        window: positions a query sees, itself included (W).
        layers: attention layers stacked.

    Returns:
        ``layers + 1`` boolean vectors of shape (L,), from the top output down to the input.
    """
    mask = causal_mask(length, window=window)  # (L, L) True = may attend
    reach = [torch.arange(length) == length - 1]  # (L,)
    for _ in range(layers):
        reach.append((mask & reach[-1][:, None]).any(dim=0))  # keys seen by reached queries
    return reach


def sliding_window_diagram(length: int = 12, window: int = 3, layers: int = 3) -> Figure:
    """The receptive field of a sliding window: each layer lets a position see W - 1 positions
    further back, so after N layers the last position depends on 1 + N (W - 1) inputs.

    Args:
        length: positions L.
        window: the window W (itself included).
        layers: layers N.

    Returns:
        The figure: (N + 1) x L dots, the reached ones filled, with the attention edges used.
    """
    reach = receptive_field(length, window, layers)
    mask = causal_mask(length, window=window)  # (L, L)
    fig, ax = canvas(
        (7.0, 2.9),
        (-2.6, length + 0.2),
        (-0.9, layers + 0.9),
        f"Sliding window W = {window}: each layer reaches W - 1 positions further",
    )
    for level, reached in enumerate(reach):
        y = layers - level
        name = (
            "input" if level == layers else ("output" if level == 0 else f"layer {layers - level}")
        )
        ax.text(-0.6, y, name, ha="right", va="center", fontsize=9)
        for p in range(length):
            if level < layers and reached[p]:
                for k in mask[p].nonzero().flatten().tolist():
                    ax.plot([p, k], [y, y - 1], color=PALETTE["blue"], lw=0.9, zorder=1)
            ax.add_patch(
                Circle(
                    (p, y),
                    0.2,
                    zorder=2,
                    edgecolor="#444444",
                    facecolor=PALETTE["vermillion"] if reached[p] else "white",
                )
            )
    ax.text(
        length / 2,
        -0.7,
        f"the last output depends on {int(reach[-1].sum())} inputs = 1 + {layers} x ({window} - 1)",
        ha="center",
        fontsize=9,
    )
    return fig


def norm_placement_diagram() -> Figure:
    """Post-norm (the 2017 paper) against pre-norm (GPT-2 onwards): where the LayerNorm sits
    relative to the residual addition, and so whether the skip path is left untouched.

    Returns:
        The figure: two columns, each with a sublayer, an addition and a norm; the pre-norm
        column's skip path runs from input to output without passing through a norm.
    """
    fig, ax = canvas((7.0, 3.6), (-0.5, 14.5), (-0.8, 7.0))
    panels = (
        ("post-norm: x = Norm(x + F(x))", 3.2, ["sublayer F", "+", "LayerNorm"]),
        ("pre-norm: x = x + F(Norm(x))", 10.6, ["LayerNorm", "sublayer F", "+"]),
    )
    for title, x, order in panels:
        ax.text(x, 6.5, title, ha="center", fontsize=9, weight="bold")
        ax.text(x, 0.0, "x in", ha="center", va="center", fontsize=9)
        ys = [1.4, 2.9, 4.4]
        for y, name in zip(ys, order, strict=True):
            if name == "+":
                ax.add_patch(Circle((x, y), 0.3, facecolor="white", edgecolor="#333333", zorder=2))
                ax.text(x, y, "+", ha="center", va="center", fontsize=11, zorder=3)
            else:
                box(ax, x, y, 2.6, 0.7, name, "norm" if name == "LayerNorm" else "attention")
        for lo, hi in zip([0.25, *ys], [*ys, 5.6], strict=False):
            arrow(ax, (x, lo + 0.35 if lo > 0.3 else lo), (x, hi - 0.35 if hi < 5.6 else hi))
        plus = ys[order.index("+")]
        skip = PALETTE["green"]
        ax.plot([x, x - 2.0, x - 2.0], [0.55, 0.55, plus], color=skip, lw=2.5, zorder=1)
        arrow(ax, (x - 2.0, plus), (x - 0.3, plus), colour=skip, lw=2.5)
        ax.text(x, 5.75, "x out", ha="center", va="bottom", fontsize=9)
    note(ax, 7.0, -0.5, "green: the skip path; pre-norm leaves it free of any norm, end to end")
    return fig


def rope_rotation_diagram(m: int = 3, n: int = 1, omega: float = 0.35) -> Figure:
    """Rotary position embedding on one pair of columns: the query at position m is turned by
    m omega, the key at position n by n omega, so their dot product depends on m - n only.

    Args:
        m: the query's position.
        n: the key's position.
        omega: the pair's angle per position (its frequency).

    Returns:
        The figure: two unit circles with the vectors before (dashed) and after rotation.
    """
    fig, ax = canvas(
        (7.0, 3.0),
        (-1.6, 8.6),
        (-2.4, 1.9),
        "RoPE turns each pair by position x omega; only m - n survives the dot product",
    )
    q0, k0 = 0.3, 1.1  # the vectors' angles before rotation
    for cx, (name, base, pos) in ((0.0, ("query q", q0, m)), (4.8, ("key k", k0, n))):
        ax.add_patch(Circle((cx, 0.0), 1.2, fill=False, edgecolor="#999999", lw=0.8))
        for angle, style in ((base, "--"), (base + pos * omega, "-")):
            arrow(
                ax,
                (cx, 0.0),
                (cx + 1.2 * math.cos(angle), 1.2 * math.sin(angle)),
                colour=PALETTE["blue"] if style == "-" else PALETTE["grey"],
                ls=style,
                lw=1.6,
            )
        ax.text(
            cx,
            -1.35,
            f"{name} at position {pos}:\nturned by {pos} x omega",
            ha="center",
            va="top",
            fontsize=9,
        )
    ax.text(6.3, 0.8, f"angle between them:\n(k0 - q0) + ({n} - {m}) x omega", fontsize=9)
    ax.text(
        6.3,
        -0.3,
        "shift both positions\nby the same amount:\nthe angle stays\n\n"
        "dashed: before,\nsolid: after rotation",
        va="top",
        fontsize=9,
    )
    return fig
