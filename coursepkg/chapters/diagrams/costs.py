"""Diagrams of what training and long contexts cost: FLOPs per weight and token, bytes per
parameter, gradient accumulation's micro-batches, and linear attention's fixed-size state
(chapters 10, 15 and 17).
"""

from __future__ import annotations

from matplotlib.figure import Figure

from coursepkg.chapters.diagrams.primitives import arrow, box, canvas, note

__all__ = [
    "flops_per_weight_diagram",
    "grad_accumulation_diagram",
    "linear_attention_state_diagram",
    "memory_per_parameter_diagram",
]


def flops_per_weight_diagram() -> Figure:
    """Why compute is counted as 2 FLOPs per weight per token forward and about 4 more
    backward: each weight multiplies once and adds once in the forward product, and the
    backward pass computes two products of the same size (the input's and the weight's
    gradients).

    Returns:
        The figure: one weight's multiply-add in the forward pass and its two in backward,
        and the 6 N total per token.
    """
    fig, ax = canvas((7.0, 2.8), (-0.2, 14.2), (-0.8, 3.6), "FLOPs per weight and token")
    box(ax, 2.2, 2.6, 4.0, 0.8, "forward: y += w x\n1 multiply + 1 add = 2", "attention")
    box(ax, 7.0, 2.6, 4.4, 0.8, "backward, input's gradient:\ndx += w dy = 2", "ffn")
    box(ax, 11.9, 2.6, 4.2, 0.8, "backward, weight's gradient:\ndw += x dy = 2", "ffn")
    box(
        ax,
        7.0,
        0.7,
        9.0,
        0.8,
        "2 + 2 + 2 = 6 FLOPs per weight per token: training ~ 6 N tokens",
        "output",
    )
    arrow(ax, (2.2, 2.2), (5.0, 1.1))
    arrow(ax, (7.0, 2.2), (7.0, 1.1))
    arrow(ax, (11.9, 2.2), (9.0, 1.1))
    note(
        ax,
        7.0,
        -0.5,
        "N: the weights a token multiplies (embeddings are looked up, not multiplied)",
    )
    return fig


def memory_per_parameter_diagram(n_params: int = 124_439_808) -> Figure:
    """What a parameter costs in memory: 4 bytes in float32, 2 in bfloat16 to run the model, and
    16 to train it in float32 with AdamW (the weight, its gradient, Adam's two moments).

    Args:
        n_params: the model's parameter count (default: GPT-2 small's checkpoint).

    Returns:
        The figure: one bar per use, as long as its bytes per parameter, with the total for
        ``n_params``.
    """
    uses = (
        ("run, bfloat16", (("w", 2),)),
        ("run, float32", (("w", 4),)),
        ("train, float32 + AdamW", (("w", 4), ("g", 4), ("m+v", 8))),
    )
    roles = {"w": "attention", "g": "ffn", "m+v": "state"}
    fig, ax = canvas((7.0, 2.8), (-4.6, 13.4), (-0.8, 3.6), "Bytes per parameter")
    for row, (name, parts) in enumerate(uses):
        y = 2.8 - 1.1 * row
        ax.text(-0.2, y, name, ha="right", va="center", fontsize=9)
        x = 0.0
        for part, size in parts:
            box(ax, x + 0.3 * size, y, 0.6 * size - 0.08, 0.7, f"{part} {size}", roles[part])
            x += 0.6 * size
        total = sum(size for _, size in parts)
        ax.text(x + 0.3, y, f"{total} B: {total * n_params / 1e9:.2f} GB", va="center", fontsize=9)
    note(
        ax,
        4.4,
        -0.6,
        f"w: weight, g: gradient, m+v: Adam's moments; {n_params:,} parameters, no activations",
    )
    return fig


def grad_accumulation_diagram(micro: int = 4) -> Figure:
    """Gradient accumulation: micro-batches each add their (scaled) gradient into .grad, and
    the optimiser steps once, as if on one large batch.

    Args:
        micro: the micro-batches drawn (2 to 6).

    Returns:
        The figure: the micro-batches' backward passes feeding one accumulated gradient and
        one step.
    """
    if not 2 <= micro <= 6:
        raise ValueError(f"micro must be in [2, 6], got {micro}")
    fig, ax = canvas((7.0, 2.8), (-0.4, 14.4), (-0.8, 3.6), "Several backward passes, one step")
    for m in range(micro):
        x = 1.0 + 2.2 * m
        box(ax, x, 2.7, 1.9, 0.7, f"micro {m + 1}\nloss / {micro}", "tensor")
        arrow(ax, (x, 2.33), (6.0, 1.45))
    box(ax, 6.0, 1.0, 4.4, 0.8, ".grad += each backward", "ffn")
    box(ax, 11.6, 1.0, 3.0, 0.8, "one optimiser\nstep, zero_grad", "state")
    arrow(ax, (8.2, 1.0), (10.1, 1.0))
    note(
        ax,
        6.5,
        -0.5,
        f"dividing each loss by {micro} makes the sum the mean over all micro-batches",
    )
    return fig


def linear_attention_state_diagram() -> Figure:
    """Causal linear attention as a recurrence: the state adds phi(k_j)^T v_j for each token,
    a D_k x D_v matrix whatever the length, and each query reads it.

    Returns:
        The figure: tokens left to right, the state updated after each, a query reading it.
    """
    fig, ax = canvas((7.0, 2.8), (-0.4, 14.4), (-0.6, 3.6), "Linear attention keeps one matrix")
    for j in range(4):
        x = 1.2 + 3.3 * j
        box(ax, x, 2.7, 2.0, 0.6, f"k{j}, v{j}", "embed")
        box(ax, x, 1.2, 2.4, 0.9, f"state {j}\n(Dk x Dv)", "state")
        arrow(ax, (x, 2.38), (x, 1.68))
        if j:
            arrow(ax, (x - 2.1, 1.2), (x - 1.2, 1.2))
    note(
        ax,
        7.0,
        -0.3,
        "state j = state j-1 + phi(k_j)^T v_j;  out_j = phi(q_j) state j / normaliser",
    )
    return fig
