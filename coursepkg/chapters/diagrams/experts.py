"""Diagrams of the chapter on experts and latent attention: a token routed through a mixture of
experts, and what multi-head latent attention caches.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from coursepkg.chapters.diagrams.primitives import PALETTE, arrow, box, canvas, note, shape

__all__ = ["latent_attention_diagram", "moe_routing_diagram"]


def moe_routing_diagram(n_experts: int = 6, chosen: tuple[int, ...] = (1, 4)) -> Figure:
    """One token through a mixture of experts: the router scores every expert, the top k are
    kept, only those run, and their outputs are summed with the router's weights.

    Args:
        n_experts: E, the experts drawn.
        chosen: the ids of the k experts the token is sent to.

    Returns:
        The figure: E expert boxes (the chosen ones filled, the rest grey), one arrow into and
        one out of each chosen expert (blue), and one weighted-sum box.
    """
    if not chosen or any(not 0 <= e < n_experts for e in chosen):
        raise ValueError(f"chosen must name experts in [0, {n_experts}), got {chosen!r}")
    fig, ax = canvas(
        (7.0, 3.6),
        (-0.4, 15.0),
        (-0.9, 6.6),
        "A mixture of experts: each token runs through its top-k experts only",
    )
    box(ax, 1.3, 5.4, 2.4, 0.7, "token x  (D,)", "tensor")
    box(ax, 1.3, 3.9, 2.4, 0.9, "router\nsoftmax(x W_r)", "attention")
    box(ax, 1.3, 2.2, 2.4, 0.9, f"top-{len(chosen)}\nrenormalise", "norm")
    arrow(ax, (1.3, 5.05), (1.3, 4.35))
    arrow(ax, (1.3, 3.45), (1.3, 2.65))
    shape(ax, 2.6, 3.05, "(E,) probs")
    gap = 1.0
    for e in range(n_experts):
        y = 5.6 - gap * e
        on = e in chosen
        box(
            ax,
            7.6,
            y,
            2.6,
            0.7,
            f"expert {e}" + ("" if on else " (idle)"),
            "ffn" if on else "#eeeeee",
        )
        if on:
            arrow(ax, (2.5, 2.2), (6.3, y), colour=PALETTE["blue"], lw=1.6)
            arrow(ax, (8.9, y), (12.0, 2.6), colour=PALETTE["blue"], lw=1.6)
            ax.text(10.1, y + 0.25, f"w{e}", fontsize=9)
    box(ax, 12.8, 2.2, 2.6, 1.2, "sum of\nw_e FFN_e(x)\n(D,)", "output")
    note(
        ax,
        7.3,
        -0.55,
        f"E = {n_experts} experts stored, k = {len(chosen)} run: the weights of all, "
        f"the arithmetic of {len(chosen)}",
    )
    return fig


def latent_attention_diagram() -> Figure:
    """Multi-head latent attention's cache: each token is compressed to a latent c (Dc numbers)
    and one rotated key part (Dr), which is all that is kept; every head's key and value are
    rebuilt from c when attention needs them.

    Returns:
        The figure: the token, the down-projection, the two cached boxes (one dashed frame
        around them), the up-projection and every head's key and value.
    """
    fig, ax = canvas(
        (7.0, 3.4),
        (-0.4, 15.0),
        (-0.9, 6.2),
        "Latent attention: cache a small latent, rebuild the keys and values",
    )
    box(ax, 1.3, 3.0, 2.4, 0.8, "token x\n(D,)", "tensor")
    box(ax, 4.4, 3.0, 2.4, 0.9, "W_dkv\nD -> Dc + Dr", "attention")
    arrow(ax, (2.5, 3.0), (3.2, 3.0))
    box(ax, 7.6, 4.0, 2.2, 0.8, "latent c (Dc,)", "state")
    box(ax, 7.6, 2.0, 2.2, 0.8, "RoPE(k_r) (Dr,)", "state")
    arrow(ax, (5.6, 3.2), (6.5, 4.0))
    arrow(ax, (5.6, 2.8), (6.5, 2.0))
    ax.add_patch(
        Rectangle((6.3, 1.3), 2.6, 3.4, fill=False, ls="--", ec=PALETTE["vermillion"], lw=1.4)
    )
    ax.text(7.6, 5.0, "the cache", ha="center", fontsize=9, color="#000000")
    box(ax, 10.6, 4.0, 2.2, 0.8, "W_uk, W_uv", "attention")
    arrow(ax, (8.7, 4.0), (9.5, 4.0))
    box(ax, 13.4, 4.6, 2.6, 0.7, "H keys (no RoPE)", "ffn")
    box(ax, 13.4, 3.5, 2.6, 0.7, "H values", "ffn")
    arrow(ax, (11.7, 4.1), (12.1, 4.5))
    arrow(ax, (11.7, 3.9), (12.1, 3.6))
    box(ax, 13.4, 2.0, 2.6, 0.7, "shared by H heads", "ffn")
    arrow(ax, (8.7, 2.0), (12.1, 2.0))
    note(
        ax,
        7.3,
        -0.45,
        "cached per token and layer: Dc + Dr numbers, against 2 H Dk for multi-head attention",
    )
    return fig
