"""Diagrams of the data chapter ("Data and scale"): locality-sensitive hashing's bands, two
MinHash signatures cut into b bands of r rows, a pair becoming a candidate when every row of one
band agrees.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from coursepkg.chapters.diagrams.primitives import COLOURS, box, canvas, centred_text, grid

__all__ = ["LSH_EXAMPLE", "LSH_FILLS", "lsh_bands_diagram"]

#: a position's fill: the two signatures agree there, or differ
LSH_FILLS = {True: COLOURS["state"], False: COLOURS["stack"]}

#: two signatures of 16 values (shown as their last two digits), agreeing in 12 positions and in
#: every row of the third band (the default drawing)
LSH_EXAMPLE = (
    (17, 42, 8, 93, 55, 21, 70, 4, 36, 61, 12, 88, 29, 47, 3, 75),
    (17, 58, 8, 93, 55, 21, 66, 4, 36, 61, 12, 88, 29, 14, 3, 30),
)


def lsh_bands_diagram(
    sig_a: Sequence[int] = LSH_EXAMPLE[0], sig_b: Sequence[int] = LSH_EXAMPLE[1], bands: int = 4
) -> Figure:
    """Two MinHash signatures side by side, cut into ``bands`` bands of K / ``bands`` rows.

    Args:
        sig_a, sig_b: the two signatures (K values each; each is shown by its last two digits).
        bands: b, which must divide K.

    Shape:
        sig_a, sig_b: (K,), K <= 24 so that the squares fit the column.

    Returns:
        The figure, the book's column wide: one square per position and signature (agreeing
        positions coloured), and under each band a box saying whether all its rows agree
        ("candidate") or not ("no match").
    """
    k = len(sig_a)
    if k != len(sig_b) or not 0 < k <= 24:
        raise ValueError(f"need two signatures of one length K <= 24, got {k} and {len(sig_b)}")
    if bands < 1 or k % bands:
        raise ValueError(f"bands must divide K = {k}, got {bands}")
    rows = k // bands
    agree = [a == b for a, b in zip(sig_a, sig_b, strict=True)]
    cell = 0.6
    fig, ax = canvas(
        (7.0, 2.9),
        (-2.2, k * cell + 0.2),
        (-2.1, 1.6),
        f"LSH: {bands} bands of {rows} rows; a band whose rows all agree makes a candidate",
    )
    grid(ax, [agree, agree], 0.0, 1.2, LSH_FILLS, cell=cell)
    for y, (name, sig) in enumerate((("A", sig_a), ("B", sig_b))):
        ax.text(-0.2, 1.2 - (y + 0.5) * cell, f"signature {name}", ha="right", va="center")
        for j, value in enumerate(sig):
            centred_text(ax, (j + 0.5) * cell, 1.2 - (y + 0.5) * cell, f"{value % 100:02d}")
    for band in range(bands):
        left = band * rows * cell
        ax.add_patch(
            Rectangle((left, -0.05), rows * cell, 1.3, fill=False, edgecolor="#222222", lw=1.6)
        )
        hit = all(agree[band * rows : (band + 1) * rows])
        label = f"band {band + 1}\ncandidate" if hit else f"band {band + 1}\nno match"
        box(
            ax,
            left + rows * cell / 2,
            -1.2,
            rows * cell - 0.3,
            0.9,
            label,
            "attention" if hit else "tensor",
        )
    return fig
