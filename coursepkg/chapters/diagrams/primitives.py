"""The drawing pieces every diagram shares: a canvas, boxes, centred text, arrows, shape notes,
italic notes and grids.

Colours come from the Okabe-Ito palette, which stays distinguishable under the common colour
vision deficiencies; every box also carries a text label, so no meaning rests on colour alone.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

__all__ = [
    "COLOURS",
    "PALETTE",
    "arrow",
    "box",
    "canvas",
    "centred_text",
    "grid",
    "note",
    "shape",
]

# Okabe-Ito, by name: the strong colours for lines and marks.
PALETTE = {
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "grey": "#777777",
}

# Box fills by role: light tints of the palette, dark text reads on every one.
COLOURS = {
    "embed": "#f7d9a0",
    "attention": "#f2c0a0",
    "norm": "#f7f2a8",
    "ffn": "#b5dcf5",
    "output": "#e6c3d9",
    "state": "#9fd9c5",
    "tensor": "#ffffff",
    "stack": "#eeeeee",
}


def canvas(size: tuple[float, float], xlim, ylim, title: str = "") -> tuple[Figure, Axes]:
    """A new figure with one frameless axes in data units, equal aspect.

    Args:
        size: the figure size in inches (the book's column is about 7 inches wide).
        xlim: the x range (left, right) in drawing units.
        ylim: the y range (bottom, top).
        title: the axes title (11 pt), or none.

    Returns:
        The figure and its axes.
    """
    fig, ax = plt.subplots(figsize=size)
    # the drawing fills the figure: matplotlib's default margins would shrink it by a quarter
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.02, top=0.9 if title else 0.98)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11)
    return fig, ax


def box(ax: Axes, x: float, y: float, w: float, h: float, text: str, role: str, size=9.0):
    """A rounded box centred on (x, y) with centred text; returns its (bottom, top) y.

    ``role`` is a key of :data:`COLOURS` or a colour itself.
    """
    ax.add_patch(
        FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            facecolor=COLOURS.get(role, role),
            edgecolor="#444444",
            linewidth=1.0,
            zorder=2,
        )
    )
    centred_text(ax, x, y, text, size)
    return y - h / 2, y + h / 2


def centred_text(ax: Axes, x: float, y: float, text: str, size: float = 9.0) -> None:
    """Text centred on (x, y), over any fill (a box's label, a cell's value, a panel's caption).

    Args:
        ax: the axes.
        x: the text's horizontal centre, in drawing units.
        y: its vertical centre, in drawing units.
        text: the text (``\\n`` between lines).
        size: the font size in points.
    """
    ax.text(x, y, text, ha="center", va="center", fontsize=size, zorder=3)


def arrow(ax: Axes, start, end, style="-|>", colour="#333333", rad=0.0, lw=1.1, ls="-"):
    """An arrow from ``start`` to ``end`` (data coordinates), curved by ``rad``."""
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle=style,
            mutation_scale=10,
            color=colour,
            linewidth=lw,
            linestyle=ls,
            connectionstyle=f"arc3,rad={rad}",
            zorder=1,
        )
    )


def shape(ax: Axes, x: float, y: float, text: str, ha: str = "left", size: float = 9.0) -> None:
    """A shape annotation such as ``(B, S, D)`` in monospace, next to an arrow."""
    ax.text(x, y, text, ha=ha, va="center", fontsize=size, family="monospace", color="#1f4e8c")


def note(ax: Axes, x: float, y: float, text: str, size: float = 9.0) -> None:
    """An italic note centred on (x, y): what the reader should see in the drawing.

    Args:
        ax: the axes.
        x: the note's horizontal centre, in drawing units.
        y: its text baseline (matplotlib's default vertical alignment), in drawing units.
        text: the note (``\n`` between lines).
        size: the font size in points.
    """
    ax.text(x, y, text, ha="center", fontsize=size, style="italic")


def grid(ax: Axes, cells, x0: float, y0: float, colours: dict, cell: float = 0.4) -> int:
    """A matrix of squares, row 0 at the top, ``cells[i][j]`` a key of ``colours``.

    Args:
        ax: the axes.
        cells: rows of keys (e.g. booleans or names) picking each square's fill.
        x0: the left edge.
        y0: the top edge.
        colours: key -> fill colour.
        cell: the side of a square.

    Returns:
        The number of squares drawn.
    """
    drawn = 0
    for i, row in enumerate(cells):
        for j, key in enumerate(row):
            ax.add_patch(
                Rectangle(
                    (x0 + j * cell, y0 - (i + 1) * cell),
                    cell,
                    cell,
                    facecolor=colours[key],
                    edgecolor="#555555",
                    linewidth=0.6,
                    zorder=2,
                )
            )
            drawn += 1
    return drawn
