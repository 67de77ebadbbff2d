"""Diagrams of post-training (the chapter "From a language model to an assistant"): the loss
mask over a tokenised conversation, which tokens the model is given and which it learns, and a
LoRA adapter beside the weight it changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import nn

from coursepkg.chapters.diagrams.primitives import COLOURS, arrow, box, canvas, note
from coursepkg.posttrain.lora import LoRALinear

__all__ = ["EXAMPLE", "LOSS_MASK_FILLS", "lora_diagram", "loss_mask_diagram"]

#: a token's fill: learned (in the loss) or given (read, never a target)
LOSS_MASK_FILLS = {True: COLOURS["attention"], False: COLOURS["stack"]}


#: a conversation tokenised one character at a time, and its response mask (the default drawing)
EXAMPLE = (
    ("<|user|>", *"reverse abc", "<|end|>", "<|assistant|>", *"cba", "<|end|>"),
    (False,) * 14 + (True,) * 4,
)


def loss_mask_diagram(
    tokens: Sequence[str] = EXAMPLE[0], learned: Sequence[bool] = EXAMPLE[1]
) -> Figure:
    """A conversation's tokens in a row, each coloured by whether the SFT loss learns it.

    Args:
        tokens: the tokens' texts, in order (e.g. each id decoded alone).
        learned: per token, True where the response mask keeps it in the loss.

    Returns:
        The figure, the book's column wide: one bar per token (its text upright), learned
        ones coloured, given ones grey, and a key.
    """
    if len(tokens) != len(learned) or not tokens:
        raise ValueError(
            f"tokens and learned must have the same non-zero length, got {len(tokens)} "
            f"and {len(learned)}"
        )
    n = len(tokens)
    fig, ax = canvas(
        (7.0, 2.6),
        (-0.2, max(n, 12) + 0.2),
        (-1.3, 3.3),
        "The loss mask: the assistant's tokens are learned, the rest are given",
    )
    for x, (text, keep) in enumerate(zip(tokens, learned, strict=True)):
        ax.add_patch(
            Rectangle(
                (x, 0.0),
                0.92,
                3.0,
                facecolor=LOSS_MASK_FILLS[bool(keep)],
                edgecolor="#555555",
                linewidth=0.6,
            )
        )
        label = text.strip() or "space"
        ax.text(x + 0.46, 1.5, label, ha="center", va="center", rotation=90, fontsize=9)
    for x, (label, keep) in enumerate((("learned", True), ("given", False))):
        ax.add_patch(Rectangle((4.0 * x, -1.1), 0.6, 0.6, facecolor=LOSS_MASK_FILLS[keep]))
        ax.text(4.0 * x + 0.8, -0.8, label, va="center", fontsize=9)
    return fig


def lora_diagram(d_in: int = 64, d_out: int = 64, r: int = 4, alpha: float = 8.0) -> Figure:
    """A LoRA adapter beside the frozen weight it changes, with the shapes of a real
    :class:`~coursepkg.posttrain.LoRALinear` built at these sizes (read from its parameters).

    Args:
        d_in: the wrapped layer's input width.
        d_out: its output width.
        r: the adapter's rank.
        alpha: the scale's numerator (the change is scaled by alpha / r).

    Returns:
        The figure: the input, the frozen weight W on one path, A then B then the scale on the
        other, their sum, and the trainable count against the frozen one.
    """
    layer = LoRALinear(nn.Linear(d_in, d_out), r=r, alpha=alpha)
    a_shape = tuple(layer.lora_A.shape)  # (r, in)
    b_shape = tuple(layer.lora_B.shape)  # (out, r)
    frozen = sum(p.numel() for p in layer.base.parameters())
    trained = layer.lora_A.numel() + layer.lora_B.numel()
    fig, ax = canvas(
        (7.0, 3.2),
        (-0.3, 14.3),
        (-1.0, 5.0),
        "LoRA: a frozen weight plus a trained low-rank change",
    )
    box(ax, 1.2, 2.2, 2.0, 0.8, f"x\n(..., {d_in})", "tensor")
    box(ax, 5.6, 3.8, 3.2, 0.9, f"W  frozen\n{d_out} x {d_in}", "stack")
    box(ax, 4.4, 0.7, 2.2, 0.9, f"A  trained\n{a_shape[0]} x {a_shape[1]}", "attention")
    box(ax, 7.2, 0.7, 2.6, 0.9, f"B  trained\n{b_shape[0]} x {b_shape[1]}, zeros", "attention")
    box(ax, 9.9, 0.7, 1.6, 0.8, f"x {alpha / r:g}\n(alpha / r)", "norm")
    box(ax, 11.2, 2.2, 0.8, 0.8, "+", "tensor", size=12)
    box(ax, 13.3, 2.2, 1.6, 0.8, f"y\n(..., {d_out})", "tensor")
    arrow(ax, (2.2, 2.5), (4.0, 3.7))
    arrow(ax, (2.2, 1.9), (3.3, 0.8))
    arrow(ax, (7.2, 3.7), (10.8, 2.5))
    arrow(ax, (5.5, 0.7), (5.9, 0.7))
    arrow(ax, (8.5, 0.7), (9.1, 0.7))
    arrow(ax, (10.7, 0.9), (11.0, 1.8))
    arrow(ax, (11.6, 2.2), (12.5, 2.2))
    note(
        ax,
        7.0,
        -0.65,
        f"trained: {trained} numbers (r (in + out)); frozen: {frozen}. B starts at zero, so "
        "y = x W at step 0",
    )
    return fig
