"""Diagrams of the pieces the first six chapters assemble: the recurrence and its gradient path,
additive attention's score and the decoder step it feeds, the projections and matrix products of
self-attention, the heads' split and their parameters, where positions enter and why a shift is
a rotation, the feed-forward network and the encoder layer.

Where a drawing shows numbers, they come from the package (the sinusoidal table, a module's
parameters), so the picture stays what the code does.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.patches import Circle

from coursepkg.attention import MultiHeadAttention
from coursepkg.chapters.diagrams.primitives import PALETTE, arrow, box, canvas, grid, note, shape
from coursepkg.positional import sinusoidal_table

__all__ = [
    "additive_score_diagram",
    "attention_decoder_step_diagram",
    "attention_products_diagram",
    "encoder_layer_diagram",
    "feed_forward_diagram",
    "gradient_path_diagram",
    "head_parameters_diagram",
    "positions_enter_diagram",
    "qkv_projection_diagram",
    "recurrence_diagram",
    "shift_rotation_diagram",
    "split_heads_diagram",
]


def _check_steps(steps: int, low: int = 2, high: int = 8) -> None:
    if not low <= steps <= high:
        raise ValueError(f"steps must be in [{low}, {high}], got {steps}")


def recurrence_diagram(steps: int = 5) -> Figure:
    """An RNN unrolled over time next to self-attention: the recurrence computes its states one
    after the other, attention computes every position from the inputs in one step.

    Args:
        steps: S, the positions drawn (2 to 8).

    Returns:
        The figure: a chain of S states h_1 .. h_S, each fed by its input and the state before;
        below it the same inputs read by one attention step, all positions at once.
    """
    _check_steps(steps)
    fig, ax = canvas(
        (7.0, 3.4),
        (-0.8, 1.5 * steps + 0.6),
        (-1.8, 3.6),
        "A recurrence waits for the previous state; attention does not",
    )
    for t in range(steps):
        x = 1.5 * t + 0.6
        box(ax, x, 1.7, 1.0, 0.55, f"x{t + 1}", "embed")
        box(ax, x, 2.9, 1.0, 0.55, f"h{t + 1}", "state")
        arrow(ax, (x, 1.98), (x, 2.6))
        if t:
            arrow(ax, (x - 1.0, 2.9), (x - 0.5, 2.9), colour=PALETTE["vermillion"], lw=1.6)
        box(ax, x, -0.2, 1.0, 0.55, f"z{t + 1}", "ffn")
    box(
        ax,
        1.5 * (steps - 1) / 2 + 0.6,
        0.75,
        1.5 * steps - 0.6,
        0.5,
        "one attention step over all positions",
        "attention",
    )
    ax.text(-0.7, 2.9, "RNN", ha="left", va="center", fontsize=9, weight="bold")
    note(
        ax,
        1.5 * (steps - 1) / 2 + 0.6,
        -1.2,
        f"RNN: {steps} steps in sequence (red arrows); attention: 1 step, every z from every x",
    )
    return fig


def gradient_path_diagram(steps: int = 6) -> Figure:
    """The path a gradient takes from the last step back to the first input: through S - 1
    Jacobians of the recurrence, against one attention weight.

    Args:
        steps: S (2 to 8).

    Returns:
        The figure: the chain of states with a backward arrow labelled by each Jacobian, and the
        direct path through attention.
    """
    _check_steps(steps)
    fig, ax = canvas(
        (7.0, 3.0),
        (-0.6, 1.5 * steps + 0.4),
        (-1.3, 3.4),
        "From the loss at step S back to x1: S - 1 factors, or one",
    )
    for t in range(steps):
        x = 1.5 * t + 0.6
        box(ax, x, 2.2, 1.0, 0.55, f"h{t + 1}", "state")
        if t:
            arrow(ax, (x - 0.5, 2.2), (x - 1.0, 2.2), colour=PALETTE["vermillion"], lw=1.4)
            ax.text(x - 0.75, 2.75, f"J{t + 1}", ha="center", fontsize=9)
    last = 1.5 * (steps - 1) + 0.6
    box(ax, last, 0.6, 1.0, 0.55, "loss", "output")
    arrow(ax, (last, 0.9), (last, 1.9), colour=PALETTE["vermillion"])
    arrow(ax, (last - 0.5, 0.6), (1.1, 0.6), colour=PALETTE["blue"], lw=1.4)
    ax.text((last + 0.6) / 2, 0.85, "attention: one weight", ha="center", fontsize=9)
    box(ax, 0.6, 0.6, 1.0, 0.55, "x1", "embed")
    note(
        ax,
        (last + 0.6) / 2,
        -0.8,
        f"RNN: J2 J3 ... J{steps}, a product of {steps - 1} matrices: it shrinks or grows "
        "geometrically",
    )
    return fig


def additive_score_diagram() -> Figure:
    """Bahdanau's additive score for one decoder step: the previous decoder state and each
    encoder state are projected, added, passed through tanh and read by a vector v; a softmax
    over the source turns the scores into weights, and the context is the weighted sum.

    Returns:
        The figure: s_{t-1} and h_j through W and U, the sum, tanh, v, the score e_tj, the
        softmax over j and the context c_t.
    """
    fig, ax = canvas((7.0, 3.2), (-0.4, 17.4), (-0.6, 5.2), "Additive attention for one step t")
    box(ax, 1.3, 4.2, 2.2, 0.7, "s(t-1)", "state")
    box(ax, 1.3, 1.6, 2.2, 0.7, "h_j", "embed")
    box(ax, 4.0, 4.2, 1.4, 0.6, "x W", "attention")
    box(ax, 4.0, 1.6, 1.4, 0.6, "x U", "attention")
    box(ax, 5.9, 2.9, 0.8, 0.6, "+", "tensor", size=11)
    box(ax, 7.4, 2.9, 1.4, 0.6, "tanh", "ffn")
    box(ax, 9.1, 2.9, 1.3, 0.6, ". v", "attention")
    box(ax, 10.8, 2.9, 1.3, 0.6, "e_tj", "tensor")
    box(ax, 12.7, 2.9, 1.7, 0.7, "softmax\nover j", "norm")
    box(ax, 15.6, 2.9, 2.9, 0.7, "weights a_tj,\ncontext c_t", "output")
    arrow(ax, (2.4, 4.2), (3.3, 4.2))
    arrow(ax, (2.4, 1.6), (3.3, 1.6))
    arrow(ax, (4.7, 4.0), (5.6, 3.1))
    arrow(ax, (4.7, 1.8), (5.6, 2.7))
    for a, b in ((6.3, 6.7), (8.1, 8.45), (9.75, 10.15), (11.45, 11.85), (13.55, 14.15)):
        arrow(ax, (a, 2.9), (b, 2.9))
    note(
        ax,
        7.5,
        0.1,
        "s(t-1): the decoder's state; h_j: the encoder's, for each source position j;\n"
        "e_tj = v . tanh(s(t-1) W + h_j U);  c_t = sum over j of a_tj h_j",
    )
    return fig


def attention_decoder_step_diagram() -> Figure:
    """One step of the attention decoder: the context it computed joins the previous output
    token, the recurrent cell makes the new state, and the output layer predicts the next token.

    Returns:
        The figure: y_{t-1} and c_t into the cell with s_{t-1}, s_t out, then the output
        layer and p(y_t).
    """
    fig, ax = canvas((7.0, 3.0), (-0.3, 14.5), (-0.5, 4.6), "One decoder step with attention")
    box(ax, 1.4, 3.6, 2.4, 0.7, "y(t-1)\nprevious token", "embed")
    box(ax, 1.4, 2.0, 2.4, 0.7, "c_t\ncontext", "output")
    box(ax, 1.4, 0.4, 2.4, 0.7, "s(t-1)\nprevious state", "state")
    box(ax, 5.6, 2.0, 2.4, 1.2, "recurrent cell\n(GRU)", "attention")
    box(ax, 8.8, 2.0, 1.6, 0.7, "s_t", "state")
    box(ax, 11.2, 2.0, 1.8, 0.7, "output\nlayer", "ffn")
    box(ax, 13.4, 2.0, 1.6, 0.7, "p(y_t)", "tensor")
    arrow(ax, (2.6, 3.5), (4.4, 2.4))
    arrow(ax, (2.6, 2.0), (4.4, 2.0))
    arrow(ax, (2.6, 0.5), (4.4, 1.6))
    arrow(ax, (6.8, 2.0), (8.0, 2.0))
    arrow(ax, (9.6, 2.0), (10.3, 2.0))
    arrow(ax, (12.1, 2.0), (12.6, 2.0))
    arrow(ax, (8.8, 1.65), (8.8, -0.2), ls="--")
    ax.text(9.0, -0.25, "the next step's s(t-1)", fontsize=9)
    return fig


def qkv_projection_diagram() -> Figure:
    """Queries, keys and values from one sequence: X is multiplied by three matrices.

    Returns:
        The figure: X of shape (L, D), the three projections W_Q, W_K, W_V and their outputs
        with their shapes.
    """
    fig, ax = canvas((7.0, 3.0), (-0.4, 14.6), (-0.4, 5.0), "Three projections of the same rows")
    box(ax, 1.6, 2.3, 2.6, 1.2, "X\none row per token", "embed")
    shape(ax, 1.6, 1.35, "(L, D)", ha="center")
    for y, (name, out, size) in zip(
        (4.0, 2.3, 0.6), (("Q", "W_Q", "Dk"), ("K", "W_K", "Dk"), ("V", "W_V", "Dv")), strict=True
    ):
        box(ax, 6.4, y, 2.2, 0.7, f"x {out}\n(D x {size})", "attention")
        box(ax, 10.4, y, 2.6, 0.7, {"Q": "queries", "K": "keys", "V": "values"}[name], "state")
        shape(ax, 12.0, y, f"{name}: (L, {size})")
        arrow(ax, (2.9, 2.3), (5.3, y))
        arrow(ax, (7.5, y), (9.1, y))
    return fig


def attention_products_diagram() -> Figure:
    """Scaled dot-product attention as matrix products: scores, scale, mask, softmax by row,
    then the weighted sum of the values.

    Returns:
        The figure: Q and K to the (L, S) scores, the scale, the mask, the softmax along each
        row, the product with V, and every shape.
    """
    fig, ax = canvas((7.0, 2.8), (-0.3, 17.3), (-0.6, 3.6), "Attention for all queries at once")
    steps = (
        ("Q K^T", "(L, S)", "attention"),
        ("/ sqrt(Dk)", "(L, S)", "norm"),
        ("mask:\nFalse -> -inf", "(L, S)", "stack"),
        ("softmax\nalong S", "(L, S)", "norm"),
        ("x V", "(L, Dv)", "attention"),
    )
    box(ax, 1.0, 1.7, 1.8, 0.9, "Q (L, Dk)\nK (S, Dk)", "state")
    for i, (text, out, role) in enumerate(steps):
        x = 3.4 + 2.7 * i
        box(ax, x, 1.7, 2.2, 0.9, text, role)
        shape(ax, x, 0.8, out, ha="center")
        arrow(ax, (x - 1.6 if i else 1.9, 1.7), (x - 1.1, 1.7))
    box(ax, 16.3, 1.7, 1.5, 0.9, "output", "output")
    arrow(ax, (15.3, 1.7), (15.55, 1.7))
    ax.text(8.5, 3.05, "V: (S, Dv) enters at the last product", ha="center", fontsize=9)
    note(ax, 8.5, -0.3, "each row of weights sums to 1")
    return fig


def split_heads_diagram(d_model: int = 8, n_heads: int = 2) -> Figure:
    """How heads are cut out of one projection: the D columns of a (L, D) projection are H
    slices of Dk columns, each slice one head's queries, reshaped to (H, L, Dk).

    Args:
        d_model: D, the columns drawn (4 to 16).
        n_heads: H, a divisor of ``d_model``.

    Returns:
        The figure: the (L, D) grid coloured by head, and each head's (L, Dk) block beside it.
    """
    if not 4 <= d_model <= 16 or n_heads < 1 or d_model % n_heads:
        raise ValueError(
            f"d_model must be in [4, 16] and a multiple of n_heads, got {d_model}, {n_heads}"
        )
    length, d_k = 4, d_model // n_heads
    fills = [PALETTE[c] for c in ("sky", "orange", "green", "purple")]
    colours = {h: fills[h % len(fills)] for h in range(n_heads)}
    fig, ax = canvas((7.0, 3.0), (-0.6, 13.6), (-3.4, 1.2), "Splitting a projection into heads")
    cells = [[j // d_k for j in range(d_model)] for _ in range(length)]
    grid(ax, cells, 0.0, 0.0, colours, cell=0.5)
    shape(ax, 0.25 * d_model, 0.45, f"(L, D) = ({length}, {d_model})", ha="center")
    x = 0.5 * d_model + 1.6
    arrow(ax, (0.5 * d_model + 0.2, -1.0), (x - 0.3, -1.0))
    for h in range(n_heads):
        grid(ax, [[h] * d_k for _ in range(length)], x, 0.0, colours, cell=0.5)
        ax.text(x + 0.25 * d_k, 0.35, f"head {h}", ha="center", fontsize=9)
        x += 0.5 * d_k + 0.5
    shape(ax, 6.5, -2.9, f"view + transpose: (H, L, Dk) = ({n_heads}, {length}, {d_k})")
    return fig


def head_parameters_diagram(d_model: int = 512, n_heads: int = 8) -> Figure:
    """Where multi-head attention's parameters are: four D x D matrices and four biases,
    whatever the number of heads (read off a real :class:`~coursepkg.MultiHeadAttention`).

    Args:
        d_model: D.
        n_heads: H.

    Returns:
        The figure: one box per projection with its weight's shape and count, and the total.
    """
    module = MultiHeadAttention(d_model, n_heads)
    fig, ax = canvas(
        (7.0, 2.6),
        (-0.3, 14.3),
        (-1.0, 3.2),
        f"Multi-head attention's parameters (D = {d_model}, H = {n_heads})",
    )
    total = 0
    for i, name in enumerate(("q_proj", "k_proj", "v_proj", "out_proj")):
        layer = getattr(module, name)
        count = sum(p.numel() for p in layer.parameters())
        total += count
        rows, cols = layer.weight.shape
        box(
            ax,
            1.7 + 3.6 * i,
            1.6,
            3.0,
            1.1,
            f"{name}\n{cols} x {rows} + {rows}\n{count:,}",
            "attention",
        )
    note(ax, 7.0, -0.5, f"total {total:,} = 4 D^2 + 4 D; the heads only slice these matrices")
    return fig


def positions_enter_diagram() -> Figure:
    """Where the positional table enters the encoder: added to the scaled token embeddings,
    once, before the first layer.

    Returns:
        The figure: token ids, the embedding times sqrt(D), the table's rows 0..L-1, the sum,
        dropout, and the layers.
    """
    fig, ax = canvas((7.0, 2.8), (-0.3, 15.3), (-0.5, 4.3), "Positions enter once, by addition")
    box(ax, 1.3, 3.2, 2.4, 0.8, "token ids\n(B, L)", "tensor")
    box(ax, 4.9, 3.2, 2.8, 0.8, "embedding\nx sqrt(D)", "embed")
    box(ax, 4.9, 1.0, 2.8, 0.8, "table rows\n0 .. L-1", "norm")
    box(ax, 7.9, 2.1, 0.8, 0.7, "+", "tensor", size=11)
    box(ax, 10.0, 2.1, 1.8, 0.7, "dropout", "stack")
    box(ax, 13.3, 2.1, 3.2, 0.8, "encoder layers\n(B, L, D)", "attention")
    arrow(ax, (2.5, 3.2), (3.5, 3.2))
    arrow(ax, (6.3, 3.1), (7.6, 2.4))
    arrow(ax, (6.3, 1.1), (7.6, 1.8))
    arrow(ax, (8.3, 2.1), (9.1, 2.1))
    arrow(ax, (10.9, 2.1), (11.7, 2.1))
    shape(ax, 4.9, 0.2, "(L, D), the same for every batch row", ha="center")
    return fig


def shift_rotation_diagram(d_model: int = 16, pair: int = 0, positions: int = 6, k: int = 2):
    """Moving k positions turns each pair of the sinusoidal table by the same angle: the pair's
    values at positions 0 .. P-1 lie on the unit circle, and p -> p + k is one rotation.

    Read off :func:`~coursepkg.positional.sinusoidal_table`.

    Args:
        d_model: D of the table.
        pair: which (sin, cos) pair of columns to draw (0 .. D/2 - 1).
        positions: how many positions to mark.
        k: the shift to draw.

    Returns:
        The figure: the circle, the marked positions, and the arcs p -> p + k for two p.
    """
    if not 0 <= pair < d_model // 2 or not 1 <= k < positions:
        raise ValueError(
            f"pair must be in [0, {d_model // 2}) and k in [1, {positions}), got pair={pair}, k={k}"
        )
    table = sinusoidal_table(positions, d_model)  # (P, D), interleaved: (sin, cos) pairs
    sin, cos = table[:, 2 * pair], table[:, 2 * pair + 1]
    fig, ax = canvas(
        (7.0, 3.6),
        (-2.2, 5.2),
        (-1.5, 1.5),
        f"Pair {pair} of the table: a shift by k = {k} is one rotation",
    )
    ax.add_patch(Circle((0, 0), 1.0, fill=False, ec="#999999", lw=1.0))
    for p in range(positions):
        ax.plot([cos[p]], [sin[p]], "o", color=PALETTE["blue"], ms=5)
        ax.text(
            1.15 * float(cos[p]), 1.15 * float(sin[p]), str(p), ha="center", va="center", fontsize=9
        )
    for p, colour in ((0, PALETTE["vermillion"]), (positions - 1 - k, PALETTE["green"])):
        arrow(
            ax,
            (float(cos[p]), float(sin[p])),
            (float(cos[p + k]), float(sin[p + k])),
            colour=colour,
            rad=0.3,
            lw=1.5,
        )
    step = math.atan2(float(sin[1]), float(cos[1])) - math.atan2(float(sin[0]), float(cos[0]))
    ax.text(1.8, 0.5, f"p -> p + {k}: the same turn,\n{k} x {step:.3f} rad,", fontsize=9)
    ax.text(1.8, -0.3, "from every p: a fixed\nlinear map of the encoding", fontsize=9)
    return fig


def feed_forward_diagram(positions: int = 3, d_model: int = 512, d_ff: int = 2048) -> Figure:
    """The position-wise feed-forward network: every position goes through the same two
    layers, widening from D to F and back, with no exchange between positions.

    Args:
        positions: the positions drawn (1 to 5).
        d_model: D.
        d_ff: F.

    Returns:
        The figure: a column per position with linear1, ReLU and linear2, one set of weights
        shared by all.
    """
    if not 1 <= positions <= 5:
        raise ValueError(f"positions must be in [1, 5], got {positions}")
    fig, ax = canvas(
        (7.0, 3.4),
        (-0.5, 3.4 * positions + 2.5),
        (-1.2, 5.0),
        "The feed-forward network acts on each position alone",
    )
    for i in range(positions):
        x = 3.4 * i + 1.5
        box(ax, x, 0.0, 2.9, 0.6, f"x at {i} (D = {d_model})", "embed", size=9)
        box(ax, x, 1.2, 2.9, 0.6, f"linear1: D -> {d_ff}", "ffn")
        box(ax, x, 2.3, 2.9, 0.6, "ReLU", "norm")
        box(ax, x, 3.4, 2.9, 0.6, f"linear2: {d_ff} -> D", "ffn")
        for a, b in ((0.3, 0.9), (1.5, 2.0), (2.6, 3.1)):
            arrow(ax, (x, a), (x, b))
        box(ax, x, 4.4, 2.9, 0.5, f"out at {i}", "output")
        arrow(ax, (x, 3.7), (x, 4.15))
    ax.text(
        3.4 * positions + 0.3,
        2.3,
        "same weights\nat every\nposition",
        fontsize=9,
        style="italic",
        va="center",
    )
    return fig


def encoder_layer_diagram(norm_first: bool = False) -> Figure:
    """The encoder layer assembled: self-attention and the feed-forward network, each inside a
    residual connection with its LayerNorm (after the addition in the paper's post-LN, on the
    branch in pre-LN), with the submodule names of :class:`~coursepkg.EncoderLayer`.

    Args:
        norm_first: draw pre-LN instead of post-LN.

    Returns:
        The figure: the two sublayers bottom to top, each with its skip path and norm.
    """
    fig, ax = canvas(
        (7.0, 4.3),
        (-4.0, 8.0),
        (-0.6, 8.2),
        f"The encoder layer ({'pre-LN' if norm_first else 'post-LN, as in the paper'})",
    )
    box(ax, 2.0, 0.0, 3.0, 0.6, "x (B, L, D)", "tensor")
    y = 0.9
    for name, role in (("self_attn", "attention"), ("ffn", "ffn")):
        norm = "norm1" if name == "self_attn" else "norm2"
        start = y
        if norm_first:
            box(ax, 2.0, y + 0.6, 3.3, 0.55, f"{norm} (LayerNorm)", "norm")
            box(ax, 2.0, y + 1.6, 2.6, 0.7, name, role)
            arrow(ax, (2.0, y + 0.9), (2.0, y + 1.25))
            box(ax, 2.0, y + 2.6, 0.7, 0.55, "+", "tensor", size=11)
            arrow(ax, (2.0, y + 1.95), (2.0, y + 2.3))
            top = y + 2.9
        else:
            box(ax, 2.0, y + 0.8, 2.6, 0.7, name, role)
            box(ax, 2.0, y + 1.8, 0.7, 0.55, "+", "tensor", size=11)
            box(ax, 2.0, y + 2.7, 3.3, 0.55, f"{norm} (LayerNorm)", "norm")
            arrow(ax, (2.0, y + 1.15), (2.0, y + 1.5))
            arrow(ax, (2.0, y + 2.1), (2.0, y + 2.4))
            top = y + 3.0
        arrow(ax, (2.0, start - 0.3), (2.0, start + (0.3 if norm_first else 0.45)))
        plus = start + (2.6 if norm_first else 1.8)  # the height of this sublayer's "+"
        ax.plot(
            [2.0, -0.1, -0.1], [start - 0.15, start - 0.15, plus], color=PALETTE["blue"], lw=1.4
        )
        arrow(ax, (-0.1, plus), (1.62, plus), colour=PALETTE["blue"], lw=1.4)
        y = top + 0.3
    box(ax, 2.0, y + 0.2, 3.0, 0.6, "out (B, L, D)", "output")
    arrow(ax, (2.0, y - 0.3), (2.0, y - 0.1))
    ax.text(
        -3.8,
        4.0,
        "blue: the skip\npath of each\nresidual\nconnection",
        fontsize=9,
        va="center",
        color=PALETTE["blue"],
    )
    ax.text(5.0, 4.0, "dropout sits on\neach branch\nbefore the +", fontsize=9, va="center")
    return fig
