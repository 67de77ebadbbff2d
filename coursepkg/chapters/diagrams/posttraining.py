"""Diagrams of post-training (the chapter "From a language model to an assistant"): the loss
mask over a tokenised conversation, which tokens the model is given and which it learns.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from coursepkg.chapters.diagrams.primitives import COLOURS, canvas

__all__ = ["EXAMPLE", "LOSS_MASK_FILLS", "loss_mask_diagram"]

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
                (x, 0.0), 0.92, 3.0, facecolor=LOSS_MASK_FILLS[bool(keep)],
                edgecolor="#555555", linewidth=0.6,
            )
        )  # fmt: skip
        label = text.strip() or "space"
        ax.text(x + 0.46, 1.5, label, ha="center", va="center", rotation=90, fontsize=9)
    for x, (label, keep) in enumerate((("learned", True), ("given", False))):
        ax.add_patch(Rectangle((4.0 * x, -1.1), 0.6, 0.6, facecolor=LOSS_MASK_FILLS[keep]))
        ax.text(4.0 * x + 0.8, -0.8, label, va="center", fontsize=9)
    return fig
