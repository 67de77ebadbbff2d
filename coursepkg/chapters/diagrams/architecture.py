"""Architecture diagrams for the book, drawn with matplotlib (no files, no network).

* :func:`encoder_decoder_diagram`: the paper's Figure 1 redrawn with the book's shape letters.
* :func:`multi_head_diagram`: the Q/K/V projections, the split into heads and the concatenation.
* :func:`gqa_grouping_diagram`: which key/value head each query head reads under grouped-query
  attention.

Each returns a new figure made of labelled boxes and arrows; every label is plain text (no glyph
outside the DejaVu fonts that matplotlib ships), so the drawing looks the same on any machine.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from coursepkg.chapters.diagrams.primitives import COLOURS, PALETTE, arrow, box, canvas, note, shape

__all__ = ["encoder_decoder_diagram", "gqa_grouping_diagram", "multi_head_diagram"]


def _box(ax: Axes, x: float, y: float, w: float, h: float, text: str, role: str, size=8.5):
    """:func:`~coursepkg.chapters.diagrams.primitives.box` at these two wide figures' text size."""
    return box(ax, x, y, w, h, text, role, size)


def _shape(ax: Axes, x: float, y: float, text: str, ha: str = "left") -> None:
    """:func:`~coursepkg.chapters.diagrams.primitives.shape` at these two wide figures' text
    size."""
    shape(ax, x, y, text, ha, size=7.5)


def _column(ax: Axes, x: float, y0: float, items, width: float, gap: float) -> list[float]:
    """Boxes stacked upwards from y0 with arrows between them; returns each box's centre y."""
    centres, y = [], y0
    for text, role in items:
        centres.append(y)
        _box(ax, x, y, width, 0.5, text, role)
        y += gap
    for lower, upper in zip(centres, centres[1:], strict=False):
        arrow(ax, (x, lower + 0.25), (x, upper - 0.25))
    return centres


def _residual(ax: Axes, x: float, width: float, y_from: float, y_to: float, side: int) -> None:
    """A skip connection: from below a sublayer round its side into the add & norm box."""
    edge = x + side * (width / 2 + 0.25)
    ax.plot([x, edge, edge], [y_from, y_from, y_to], color="#777777", lw=1.0, zorder=1)
    arrow(ax, (edge, y_to), (x + side * width / 2, y_to), colour="#777777", lw=1.0)


def encoder_decoder_diagram() -> Figure:
    """The Transformer of the paper's Figure 1, with the tensor shape on every arrow.

    Letters: B batch, S source length, L target length, D model width, F feed-forward width,
    V vocabulary, N layers per stack.

    Returns:
        The figure.
    """
    fig, ax = plt.subplots(figsize=(9.5, 9.2))
    width, gap = 3.1, 0.78
    enc_x, dec_x = 2.4, 7.4

    enc_layer = _stack(
        ax,
        enc_x,
        ("source tokens", "(B, S) ids", "(B, S, D)"),
        [
            ("multi-head self-attention\n(padding mask)", "attention"),
            ("add & norm", "norm"),
            ("feed-forward  D -> F -> D", "ffn"),
            ("add & norm", "norm"),
        ],
        "N x encoder layer",
        side=-1,
        size=(width, gap),
    )
    memory_y = enc_layer[-1] + 1.15
    arrow(ax, (enc_x, enc_layer[-1] + 0.25), (enc_x, memory_y - 0.22))
    _box(ax, enc_x, memory_y, 2.2, 0.42, "memory", "tensor")
    _shape(ax, enc_x, memory_y + 0.42, "(B, S, D)", ha="center")

    dec_layer = _stack(
        ax,
        dec_x,
        ("target tokens, shifted right", "(B, L) ids: <bos> y1 ... y(L-1)", "(B, L, D)"),
        [
            ("masked multi-head\nself-attention (causal)", "attention"),
            ("add & norm", "norm"),
            ("multi-head cross-attention\nQ: decoder   K, V: memory", "attention"),
            ("add & norm", "norm"),
            ("feed-forward  D -> F -> D", "ffn"),
            ("add & norm", "norm"),
        ],
        "N x decoder layer",
        side=1,
        size=(width, gap),
    )
    # the memory feeds every decoder layer's cross-attention
    arrow(ax, (enc_x + 1.1, memory_y), (dec_x - width / 2, dec_layer[2]), rad=-0.25)
    _shape(ax, (enc_x + dec_x) / 2 + 0.1, memory_y + 0.2, "K, V: (B, S, D)", ha="center")
    top = _output_head(ax, dec_x, dec_layer[-1], width, gap)

    ax.set_xlim(-0.6, 10.4)
    ax.set_ylim(-0.9, top + 1.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("The Transformer (the paper's Figure 1) with the book's shapes", fontsize=11)
    return fig


def _stack(
    ax: Axes,
    x: float,
    labels: tuple[str, str, str],
    layer: list[tuple[str, str]],
    frame: str,
    side: int,
    size: tuple[float, float],
) -> list[float]:
    """One side of the figure: tokens, embedding and positions, then one layer of sub-layers
    (each followed by its add & norm, a residual around each pair) in a frame "N x ...".

    Args:
        ax: the axes.
        x: the centre of the column.
        labels: the title under the column, the shape of the ids, the shape after embedding.
        layer: the layer's boxes, (text, role), a sub-layer then its add & norm each time.
        frame: the frame's label.
        side: where the residuals and the frame's label go (-1 left, 1 right).
        size: the boxes' width and the gap between their centres.

    Returns:
        The centres of the layer's boxes.
    """
    (title, ids, embedded), (width, gap) = labels, size
    ax.text(x, -0.55, title, ha="center", fontsize=9, weight="bold")
    _shape(ax, x + 0.1, -0.1, ids)
    arrow(ax, (x, -0.3), (x, 0.25))
    embed = [("token embedding  x sqrt(D)", "embed"), ("+ positional encoding", "embed")]
    inputs = _column(ax, x, 0.5, embed, width, gap)
    centres = _column(ax, x, inputs[-1] + 1.35, layer, width, gap)
    arrow(ax, (x, inputs[-1] + 0.25), (x, centres[0] - 0.25))
    _shape(ax, x + 0.1, inputs[-1] + 0.55, embedded)
    for sub in range(0, len(layer), 2):
        _residual(ax, x, width, centres[sub] - 0.4, centres[sub + 1], side=side)
    _stack_frame(ax, x, centres, width, frame, side=side)
    return centres


def _output_head(ax: Axes, x: float, below: float, width: float, gap: float) -> float:
    """The linear layer and softmax above the decoder (whose last box is centred at
    ``below``); returns the centre of the softmax box."""
    head = _column(
        ax,
        x,
        below + 1.3,
        [("linear D -> V\n(weights tied to the embedding)", "output"), ("softmax", "output")],
        width,
        gap + 0.1,
    )
    arrow(ax, (x, below + 0.25), (x, head[0] - 0.25))
    _shape(ax, x + 0.1, below + 0.7, "(B, L, D)")
    arrow(ax, (x, head[-1] + 0.25), (x, head[-1] + 0.75))
    ax.text(x, head[-1] + 0.95, "next-token probabilities", ha="center", fontsize=9, weight="bold")
    _shape(ax, x + 0.1, head[-1] + 0.5, "(B, L, V)")
    _shape(ax, x + 0.1, (head[0] + head[1]) / 2, "(B, L, V) logits")
    return head[-1]


def _stack_frame(ax: Axes, x: float, centres: list[float], width: float, label: str, side: int):
    """A grey frame round one layer's boxes, labelled with the repeat count N."""
    pad_x, pad_y = 0.55, 0.5
    bottom, top = centres[0] - pad_y, centres[-1] + pad_y
    ax.add_patch(
        FancyBboxPatch(
            (x - width / 2 - pad_x, bottom),
            width + 2 * pad_x,
            top - bottom,
            boxstyle="round,pad=0.02,rounding_size=0.15",
            facecolor=COLOURS["stack"],
            edgecolor="#999999",
            linewidth=1.0,
            zorder=0,
        )
    )
    label_x = x + side * (width / 2 + pad_x + 0.15)
    ax.text(
        label_x,
        (bottom + top) / 2,
        label,
        rotation=90,
        ha="center",
        va="center",
        fontsize=9,
        weight="bold",
    )


def multi_head_diagram() -> Figure:
    """Multi-head attention's data flow: project, split into heads, attend, concatenate, project.

    Letters: B batch, L query length, S key length, D model width, H heads, Dk = D / H.

    Returns:
        The figure.
    """
    fig, ax = plt.subplots(figsize=(12.5, 5.2))
    w, row = 2.2, {"q": 4.3, "k": 2.6, "v": 0.9}
    col = [2.6, 6.1, 10.7, 15.4, 18.7]
    heads_y, panel = 2.6, 4.2
    ax.text(0.0, row["q"], "queries from\n(B, L, D)", ha="center", va="center", fontsize=8.5)
    ax.text(0.0, 1.75, "keys and values\nfrom (B, S, D)", ha="center", va="center", fontsize=8.5)
    for name, y in row.items():
        letter = name.upper()
        source_y = row["q"] if name == "q" else 1.75
        seq = "L" if name == "q" else "S"
        arrow(ax, (0.9, source_y), (col[0] - w / 2, y))
        _box(ax, col[0], y, w, 0.6, f"x W{letter}   (D x D)", "attention")
        arrow(ax, (col[0] + w / 2, y), (col[1] - w / 2, y))
        _shape(ax, (col[0] + col[1]) / 2, y + 0.3, f"(B, {seq}, D)", ha="center")
        _box(ax, col[1], y, w, 0.7, "split into heads\nview, transpose", "tensor", size=8)
        end = (col[2] - panel / 2, heads_y + (y - heads_y) * 0.45)
        arrow(ax, (col[1] + w / 2, y), end)
        _shape(ax, col[1], y - 0.55, f"(B, H, {seq}, Dk)", ha="center")
    ax.add_patch(
        FancyBboxPatch(
            (col[2] - panel / 2, heads_y - panel / 2),
            panel,
            panel,
            boxstyle="round,pad=0.02,rounding_size=0.1",
            facecolor=COLOURS["stack"],
            edgecolor="#999999",
            zorder=0,
        )
    )
    for k in (2, 1, 0):  # the heads as a stack of cards, the front one labelled
        _box(ax, col[2] + 0.12 * k, heads_y + 0.12 * k, 3.7, 1.3, "", "attention")
    ax.text(
        col[2],
        heads_y,
        "H heads, each on its own Dk:\nsoftmax(Q K^T / sqrt(Dk)) V",
        ha="center",
        va="center",
        fontsize=8,
        zorder=4,
    )
    ax.text(col[2], heads_y - 1.6, "weights (B, H, L, S)", ha="center", fontsize=7.5)
    arrow(ax, (col[2] + panel / 2, heads_y), (col[3] - w / 2, heads_y))
    _shape(
        ax, (col[2] + panel / 2 + col[3] - w / 2) / 2, heads_y + 0.45, "(B, H, L, Dk)", ha="center"
    )
    _box(ax, col[3], heads_y, w, 0.7, "concatenate heads\ntranspose, reshape", "tensor", size=8)
    arrow(ax, (col[3] + w / 2, heads_y), (col[4] - w / 2, heads_y))
    _shape(ax, (col[3] + col[4]) / 2, heads_y + 0.3, "(B, L, D)", ha="center")
    _box(ax, col[4], heads_y, w, 0.6, "x WO   (D x D)", "ffn")
    arrow(ax, (col[4], heads_y - 0.3), (col[4], heads_y - 1.1))
    _shape(ax, col[4], heads_y - 1.3, "output (B, L, D)", ha="center")
    note(
        ax,
        col[2],
        -0.35,
        "H x Dk = D: the heads split the width, so together they cost about one full-width head",
        size=8.5,
    )
    ax.set_xlim(-1.0, 20.0)
    ax.set_ylim(-0.6, 5.0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("Multi-head attention: projections, head split and concatenation", fontsize=11)
    return fig


def gqa_grouping_diagram(n_heads: int = 8, n_kv_heads: int = 2) -> Figure:
    """Grouped-query attention's head grouping: which key/value head each query head reads.

    The grouping is computed with the model's own rule (:class:`~coursepkg.MultiHeadAttention`
    repeats each key/value head ``n_heads // n_kv_heads`` times along the head axis with
    ``repeat_interleave``), so the picture is the layout the code uses.

    Args:
        n_heads: H, the query heads (2 to 16).
        n_kv_heads: Hkv, the key/value heads; it must divide ``n_heads``.

    Returns:
        The figure: H query-head boxes on top, Hkv key/value boxes below, one arrow from each
        query head to the key/value head it reads, the boxes of a group in one colour.
    """
    if not 2 <= n_heads <= 16 or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(
            f"n_heads must be in [2, 16] and a multiple of n_kv_heads, got n_heads={n_heads}, "
            f"n_kv_heads={n_kv_heads}"
        )
    group = n_heads // n_kv_heads
    reads = torch.arange(n_kv_heads).repeat_interleave(group)  # (H,): the model's own rule
    fills = [PALETTE[c] for c in ("sky", "orange", "green", "purple", "yellow", "vermillion")]
    width = max(n_heads, 8) * 1.0
    fig, ax = canvas(
        (7.0, 3.0),
        (-0.6, width + 0.6),
        (-0.9, 3.6),
        f"Grouped-query attention: H = {n_heads} query heads share Hkv = {n_kv_heads} "
        "key/value heads",
    )
    step = width / n_heads
    kv_step = width / n_kv_heads
    for h in range(n_heads):
        x = step * (h + 0.5)
        box(ax, x, 2.8, step * 0.8, 0.6, f"q{h}", fills[int(reads[h]) % len(fills)], size=9)
        target = kv_step * (int(reads[h]) + 0.5)
        arrow(ax, (x, 2.45), (target, 0.75))
    for j in range(n_kv_heads):
        box(
            ax,
            kv_step * (j + 0.5),
            0.4,
            min(kv_step * 0.7, 3.0),
            0.6,
            f"k{j}, v{j}",
            fills[j % len(fills)],
            size=9,
        )
    note(
        ax,
        width / 2,
        -0.6,
        f"the cache keeps Hkv = {n_kv_heads} heads of keys and values: "
        f"{group} times smaller than with H",
    )
    return fig
