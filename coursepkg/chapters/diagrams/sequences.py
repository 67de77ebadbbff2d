"""Diagrams of the first chapters' ideas: the RNN's bottleneck and attention's direct paths, the
soft lookup, the positional clocks, the decoder's three masks, teacher forcing, label smoothing.

Each function returns a new figure about 7 inches wide (the book's column) with 9 pt text or
larger; the tests count what is drawn against the structure it stands for.
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Rectangle

from coursepkg.chapters.diagrams.primitives import PALETTE, arrow, box, canvas, grid, note
from coursepkg.masks import causal_mask

__all__ = [
    "bottleneck_diagram",
    "label_smoothing_diagram",
    "masks_diagram",
    "positional_clocks_diagram",
    "qkv_lookup_diagram",
    "teacher_forcing_diagram",
]


def bottleneck_diagram(attention: bool = False, source_len: int = 4, target_len: int = 3) -> Figure:
    """An RNN encoder-decoder: one context vector between the two (the bottleneck), or, with
    ``attention``, a direct path from every encoder state to every decoder step.

    Args:
        attention: draw Bahdanau's direct paths instead of the single context vector.
        source_len: encoder states S.
        target_len: decoder steps L.

    Returns:
        The figure: S + L state boxes; S + L - 2 recurrent arrows; then 2 arrows through the
        context vector, or S x L attention arrows.
    """
    title = (
        "With attention: every decoder step reads every encoder state"
        if attention
        else "Without attention: the whole source squeezed into one vector"
    )
    fig, ax = canvas((7.0, 3.0), (-0.3, 14.3), (0.1, 6.1), title)
    enc_x = [0.9 + 1.45 * j for j in range(source_len)]
    dec_x = [14.3 - 0.9 - 1.45 * (target_len - 1 - i) for i in range(target_len)]
    enc_y, dec_y = 1.6, 4.6
    for j, x in enumerate(enc_x):
        box(ax, x, enc_y, 1.05, 0.7, f"h{j + 1}", "state")
        ax.text(x, 0.5, f"x{j + 1}", ha="center", fontsize=9)
        arrow(ax, (x, 0.75), (x, enc_y - 0.35))
    for i, x in enumerate(dec_x):
        box(ax, x, dec_y, 1.05, 0.7, f"s{i + 1}", "output")
        ax.text(x, 5.75, f"y{i + 1}", ha="center", fontsize=9)
        arrow(ax, (x, dec_y + 0.35), (x, 5.55))
    for xs, y in ((enc_x, enc_y), (dec_x, dec_y)):
        for a, b in zip(xs, xs[1:], strict=False):
            arrow(ax, (a + 0.52, y), (b - 0.52, y))
    ax.text(enc_x[0] - 0.55, enc_y + 0.75, "encoder", fontsize=9, weight="bold")
    ax.text(dec_x[0] - 0.7, dec_y, "decoder", ha="right", va="center", fontsize=9, weight="bold")
    if attention:
        for xd in dec_x:
            for xe in enc_x:
                arrow(ax, (xe, enc_y + 0.35), (xd, dec_y - 0.35), colour=PALETTE["blue"], lw=0.8)
        ax.text(1.0, 4.6, f"S x L = {source_len * target_len} direct paths", fontsize=9)
    else:
        cx, cy = (enc_x[-1] + dec_x[0]) / 2, (enc_y + dec_y) / 2
        box(ax, cx, cy, 1.5, 0.7, f"c = h{source_len}", PALETTE["vermillion"])
        arrow(ax, (enc_x[-1] + 0.52, enc_y + 0.2), (cx - 0.75, cy))
        arrow(ax, (cx + 0.75, cy), (dec_x[0] - 0.52, dec_y - 0.2))
        ax.text(
            cx - 0.2,
            cy - 0.55,
            "one vector of width D,\nwhatever the length S",
            ha="left",
            va="top",
            fontsize=9,
        )
    return fig


def qkv_lookup_diagram(scores=(0.3, 2.0, 0.8, -0.6)) -> Figure:
    """Attention as a soft dictionary lookup: a query scores every key, the softmax turns the
    scores into weights, and the output is the weighted sum of the values.

    Args:
        scores: the query's dot product with each key (one row per key).

    Returns:
        The figure: one row per key with its score, a weight bar as long as its softmax weight,
        and an arrow from its value into the sum.
    """
    weights = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0).tolist()
    n = len(scores)
    fig, ax = canvas((7.0, 3.0), (-0.2, 14.2), (-0.6, n + 0.9), "Attention as a soft lookup")
    top = n - 0.5
    box(ax, 0.9, top - (n - 1) / 2, 1.5, 0.8, "query q", "attention")
    for header, x in (
        ("key", 3.4),
        ("score s", 5.6),
        ("softmax weight", 8.3),
        ("value", 11.0),
    ):
        ax.text(x, n + 0.3, header, ha="center", fontsize=9, weight="bold")
    for r, (s, w) in enumerate(zip(scores, weights, strict=True)):
        y = top - r
        arrow(ax, (1.65, top - (n - 1) / 2), (2.7, y), colour=PALETTE["grey"], lw=0.8)
        box(ax, 3.4, y, 1.3, 0.6, f"k{r + 1}", "embed")
        ax.text(5.6, y, f"{s:+.1f}", ha="center", va="center", fontsize=9, family="monospace")
        ax.add_patch(Rectangle((7.0, y - 0.22), 2.6 * w, 0.44, color=PALETTE["blue"], zorder=2))
        ax.text(7.1 + 2.6 * w, y, f"{w:.2f}", va="center", fontsize=9)
        box(ax, 11.0, y, 1.3, 0.6, f"v{r + 1}", "ffn")
        arrow(ax, (11.65, y), (12.6, top - (n - 1) / 2), colour=PALETTE["grey"], lw=0.8)
    box(ax, 13.3, top - (n - 1) / 2, 1.4, 0.9, "sum of\nw x v", "output")
    note(
        ax,
        7.0,
        -0.45,
        "s = q.k / sqrt(Dk); a hard lookup returns one value, attention blends them all",
    )
    return fig


def positional_clocks_diagram(positions: int = 6, d_model: int = 6) -> Figure:
    """The sinusoidal encoding as clocks: pair i of columns is a hand turned by the angle
    p / 10000^(2i/D) at position p, fast for the first pair and slower for each next one.

    Args:
        positions: positions drawn (columns).
        d_model: the width D; D / 2 pairs are drawn (rows).

    Returns:
        The figure: one clock per (pair, position), each with one hand at its angle.
    """
    pairs = d_model // 2
    fig, ax = canvas(
        (7.0, 0.8 * pairs + 0.6),
        (-1.9, 1.25 * positions),
        (-0.8, 1.25 * pairs),
        "Each pair of columns is a clock hand; the pairs turn at different speeds",
    )
    for i in range(pairs):
        omega = 10000 ** (-2 * i / d_model)
        y = 1.25 * (pairs - 1 - i) + 0.6
        ax.text(-0.45, y, f"pair {i}\nomega = {omega:.3g}", ha="right", va="center", fontsize=9)
        for p in range(positions):
            x = 1.25 * p + 0.5
            ax.add_patch(Circle((x, y), 0.5, fill=False, edgecolor="#555555", lw=0.8))
            angle = p * omega  # (sin, cos) of this angle are the pair's two columns
            ax.plot(
                [x, x + 0.45 * math.sin(angle)],
                [y, y + 0.45 * math.cos(angle)],
                color=PALETTE["vermillion"],
                lw=2.0,
                solid_capstyle="round",
            )
    for p in range(positions):
        ax.text(1.25 * p + 0.5, -0.4, f"p = {p}", ha="center", fontsize=9)
    return fig


def masks_diagram(source_len: int = 5, target_len: int = 4, source_pad: int = 2) -> Figure:
    """The three masks of the encoder-decoder: the encoder's padding mask, the decoder's causal
    mask and cross-attention's padding mask, built with :func:`coursepkg.masks.causal_mask`.

    Args:
        source_len: source positions S, the last ``source_pad`` of them padding.
        target_len: target positions L.
        source_pad: padding positions at the end of the source.

    Returns:
        The figure: three grids (queries as rows, keys as columns), a filled square where the
        query may attend the key.
    """
    real = torch.arange(source_len) < source_len - source_pad  # (S,) True = real token
    panels = [
        ("encoder self-attention\n(padding)", real.expand(source_len, source_len)),
        ("decoder self-attention\n(causal)", causal_mask(target_len)),
        ("cross-attention\n(source padding)", real.expand(target_len, source_len)),
    ]
    fig, ax = canvas((7.0, 3.0), (-0.6, 12.2), (-0.9, 4.2))
    colours = {True: PALETTE["blue"], False: "#f2f2f2"}
    x0, cell = 0.2, 0.55
    for title, mask in panels:  # (rows, columns) = (queries, keys)
        grid(ax, mask.tolist(), x0, 3.0, colours, cell)
        ax.text(x0 + cell * mask.shape[1] / 2, 3.2, title, ha="center", va="bottom", fontsize=9)
        ax.text(
            x0 + cell * mask.shape[1] / 2,
            3.0 - cell * mask.shape[0] - 0.3,
            f"keys ({mask.shape[1]})",
            ha="center",
            va="top",
            fontsize=9,
        )
        ax.text(
            x0 - 0.12,
            3.0 - cell * mask.shape[0] / 2,
            "queries",
            rotation=90,
            ha="right",
            va="center",
            fontsize=9,
        )
        x0 += cell * mask.shape[1] + 1.3
    ax.add_patch(Rectangle((0.2, -0.75), 0.3, 0.3, color=PALETTE["blue"]))
    ax.text(0.6, -0.6, "may attend (True)", va="center", fontsize=9)
    ax.add_patch(Rectangle((4.2, -0.75), 0.3, 0.3, facecolor="#f2f2f2", edgecolor="#555555"))
    ax.text(
        4.6,
        -0.6,
        f"masked: the last {source_pad} source tokens are padding, or the future",
        va="center",
        fontsize=9,
    )
    return fig


def teacher_forcing_diagram(length: int = 4) -> Figure:
    """Training with teacher forcing against decoding: in training the decoder reads the true
    target shifted right and predicts every position in one pass; at inference it reads its own
    previous output, one step at a time.

    Args:
        length: target positions L.

    Returns:
        The figure: two rows of L decoder steps; the inference row has L - 1 feedback arrows.
    """
    fig, ax = canvas((7.0, 3.4), (-2.6, 2.0 * length + 0.4), (-0.3, 7.0))
    rows = (("training:\nteacher forcing", 4.3, True), ("inference:\nfree-running", 0.5, False))
    for label, y, forced in rows:
        ax.text(-0.6, y + 1.0, label, ha="right", va="center", fontsize=9, weight="bold")
        for t in range(length):
            x = 2.0 * t + 0.8
            read = "<bos>" if t == 0 else (f"y{t}" if forced else f"y^{t}")
            ax.text(
                x,
                y,
                read,
                ha="center",
                va="center",
                fontsize=9,
                family="monospace",
                color=PALETTE["blue"] if forced or t == 0 else PALETTE["vermillion"],
            )
            arrow(ax, (x, y + 0.25), (x, y + 0.7))
            box(ax, x, y + 1.0, 1.65, 0.6, "decoder", "attention")
            arrow(ax, (x, y + 1.3), (x, y + 1.75))
            ax.text(
                x,
                y + 2.0,
                f"y^{t + 1}",
                ha="center",
                va="center",
                fontsize=9,
                family="monospace",
                color=PALETTE["vermillion"],
            )
            if not forced and t + 1 < length:
                arrow(
                    ax,
                    (x + 0.35, y + 2.0),
                    (x + 2.0 - 0.4, y),
                    colour=PALETTE["vermillion"],
                    rad=-0.25,
                    ls="--",
                )
    note(ax, 2.0 * length / 2, 3.35, "all L positions in one pass, each reads the true prefix")
    note(ax, 2.0 * length / 2, -0.15, "L passes, each reads the model's own previous guess")
    return fig


def label_smoothing_diagram(vocab: int = 8, smoothing: float = 0.1, true: int = 2) -> Figure:
    """The training target with and without label smoothing: one-hot puts all the mass on the
    true token; the smoothed target keeps 1 - eps there and spreads eps evenly over all V
    tokens, the true one included (the convention of ``F.cross_entropy(label_smoothing=eps)``).

    Args:
        vocab: tokens V.
        smoothing: eps.
        true: the index of the true token.

    Returns:
        The figure: two panels of V bars each, the bars of each panel summing to 1.
    """
    one_hot = torch.nn.functional.one_hot(torch.tensor(true), vocab).double()  # (V,)
    smoothed = (1 - smoothing) * one_hot + smoothing / vocab  # (V,)
    fig, ax = canvas((7.0, 2.8), (-1.0, 2 * vocab + 3.0), (-1.2, 5.4))
    for x0, title, target in (
        (0.0, "one-hot target", one_hot),
        (vocab + 2.0, f"smoothed, eps = {smoothing}", smoothed),
    ):
        ax.text(x0 + vocab / 2, 5.0, title, ha="center", fontsize=9, weight="bold")
        ax.plot([x0 - 0.2, x0 + vocab], [0, 0], color="#555555", lw=0.8)
        for i, q in enumerate(target.tolist()):
            colour = PALETTE["vermillion"] if i == true else PALETTE["blue"]
            ax.add_patch(Rectangle((x0 + i + 0.1, 0.0), 0.8, 4.0 * q, color=colour))
            ax.text(x0 + i + 0.5, -0.5, "y" if i == true else str(i), ha="center", fontsize=9)
        top = float(target[true])
        ax.text(x0 + true + 1.0, 4.0 * top - 0.2, f"{top:.4g}", va="center", fontsize=9)
        if smoothing and target is smoothed:
            ax.text(
                x0 + vocab - 0.5, 0.6, f"eps / V = {smoothing / vocab:.4g}", ha="right", fontsize=9
            )
    return fig
