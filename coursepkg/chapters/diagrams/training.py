"""Diagrams of training at scale and of the language-model head: weight tying, data
parallelism's all-reduce, and what a checkpoint holds (chapters 11 and 16).
"""

from __future__ import annotations

from matplotlib.figure import Figure

from coursepkg.chapters.diagrams.primitives import PALETTE, arrow, box, canvas, note

__all__ = ["CHECKPOINT_PARTS", "checkpoint_diagram", "ddp_diagram", "weight_tying_diagram"]

# The payload `coursepkg train` and `finetune` save (training/lifecycle.py), in its order, with
# what each entry is for on resume; the tests hold the two lists together.
CHECKPOINT_PARTS = {
    "identity": "settings, config and data digest: refuse a different run",
    "model": "every weight (state_dict)",
    "optimizer": "AdamW's m and v per weight, and its step",
    "optimizer_layout": "the scheme that sharded them: refuse another",
    "data_rng": "where the batch sampler is",
    "rng": "each rank's CPU random state",
    "cuda_rng": "each rank's GPU random state (or None)",
    "step": "the optimiser steps done",
    "rows": "the log so far (loss, lr, ...)",
}


def weight_tying_diagram() -> Figure:
    """Weight tying in a language model: one (V, D) matrix E looks up a token's input vector
    (a row of E) and scores every token at the output (the hidden state times E transposed).

    Returns:
        The figure: E drawn once, with one arrow to each of its two uses.
    """
    fig, ax = canvas((7.0, 2.8), (-0.4, 14.4), (-0.6, 5.0), "Weight tying: one matrix, two uses")
    box(ax, 7.0, 2.2, 3.4, 1.6, "E\n(V, D)\none row per token", PALETTE["yellow"])
    box(ax, 1.8, 0.6, 3.0, 0.8, "input: token id t", "tensor")
    box(ax, 1.8, 3.8, 3.0, 0.8, "x = E[t]  (D,)", "embed")
    arrow(ax, (1.8, 1.0), (1.8, 3.4))
    ax.text(2.0, 2.2, "look up row t", fontsize=9)
    box(ax, 12.2, 0.6, 3.4, 0.8, "last hidden h  (D,)", "attention")
    box(ax, 12.2, 3.8, 3.4, 0.8, "logits = h E^T  (V,)", "output")
    arrow(ax, (12.2, 1.0), (12.2, 3.4))
    ax.text(12.0, 2.2, "score every token", ha="right", fontsize=9)
    arrow(ax, (5.3, 2.6), (3.3, 3.6), colour=PALETTE["blue"], lw=1.6)
    arrow(ax, (8.7, 2.6), (10.5, 3.6), colour=PALETTE["blue"], lw=1.6)
    note(
        ax,
        7.0,
        -0.4,
        "V x D parameters stored once; a token's input and output vectors are the same row",
    )
    return fig


def ddp_diagram(workers: int = 4) -> Figure:
    """Distributed data parallel: every rank holds the same model, computes gradients on its own
    shard of the batch, and an all-reduce averages them so every rank takes the same step.

    Args:
        workers: ranks drawn.

    Returns:
        The figure: per rank a shard, a model copy and a local gradient; one all-reduce bar;
        per rank the same update.
    """
    fig, ax = canvas(
        (7.0, 3.4),
        (-2.6, 3.4 * workers - 0.6),
        (-0.5, 6.6),
        "Data parallelism: same model, different data, averaged gradients",
    )
    for r in range(workers):
        x = 3.4 * r + 1.0
        box(ax, x, 5.7, 2.9, 0.6, f"batch shard {r}", "embed")
        box(ax, x, 4.5, 2.9, 0.8, f"rank {r}\nmodel copy", "attention")
        box(ax, x, 3.2, 2.9, 0.6, f"local grad g{r}", "ffn")
        box(ax, x, 0.4, 2.9, 0.6, "same update", "state")
        arrow(ax, (x, 5.4), (x, 4.9))
        arrow(ax, (x, 4.1), (x, 3.5))
        arrow(ax, (x, 2.9), (x, 2.25), colour=PALETTE["blue"])
        arrow(ax, (x, 1.55), (x, 0.7), colour=PALETTE["blue"])
    box(
        ax,
        3.4 * (workers - 1) / 2 + 1.0,
        1.9,
        3.4 * workers - 1.0,
        0.6,
        f"all-reduce: every rank receives g = (g0 + ... + g{workers - 1}) / {workers}",
        PALETTE["sky"],
    )
    ax.text(-0.6, 3.2, "backward", ha="right", va="center", fontsize=9)
    ax.text(-0.6, 0.4, "update", ha="right", va="center", fontsize=9)
    return fig


def checkpoint_diagram() -> Figure:
    """What `coursepkg train` saves in a checkpoint: everything needed to resume as if never
    stopped, from the weights to the random states (:data:`CHECKPOINT_PARTS`).

    Returns:
        The figure: one labelled row per entry of the saved dictionary.
    """
    n = len(CHECKPOINT_PARTS)
    fig, ax = canvas(
        (7.0, 0.36 * n + 0.9),
        (-0.2, 14.2),
        (-0.4, 0.8 * n + 0.5),
        "A checkpoint: everything a resumed run needs",
    )
    fills = ["embed", "attention", "ffn", "norm", "state", "output", "embed", "attention"]
    for k, (key, what) in enumerate(CHECKPOINT_PARTS.items()):
        y = 0.8 * (n - 1 - k) + 0.2
        box(ax, 1.7, y, 3.2, 0.62, key, fills[k % len(fills)])
        ax.text(3.6, y, what, va="center", fontsize=9)
    return fig
