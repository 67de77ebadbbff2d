"""Diagrams of serving (chapter 18): speculative decoding's rounds of proposals, acceptances and
rejections, the paged cache's block tables over one shared pool of blocks, and the mask of a packed
step.

Both draw a real structure: the rounds of a :class:`~coursepkg.serving.SpeculativeResult`'s
``trace``, and the blocks :class:`~coursepkg.serving.PagedKVCache` hands out when sequences
grow one token at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from coursepkg.chapters.diagrams.primitives import COLOURS, canvas, centred_text, grid, note
from coursepkg.masks import PackedMask
from coursepkg.serving.paged import BlockTable, PagedKVCache

__all__ = [
    "SPECULATIVE_FILLS",
    "block_table_diagram",
    "packed_mask_diagram",
    "paged_tables",
    "speculative_diagram",
]

# a square's fill by what happened to its token (each square also carries a letter)
SPECULATIVE_FILLS = {
    "kept": COLOURS["state"],
    "rejected": COLOURS["attention"],
    "discarded": COLOURS["stack"],
    "target": COLOURS["ffn"],
}
_LETTERS = {"kept": "ok", "rejected": "x", "discarded": "-", "target": "T"}


def speculative_diagram(
    trace: Sequence[tuple[int, int]] = ((4, 4), (4, 1), (4, 0), (4, 3)), max_rounds: int = 6
) -> Figure:
    """Speculative decoding round by round: the draft proposes, the target keeps a prefix,
    rejects the first disagreement (the rest is discarded unread) and adds one token of its own.

    Args:
        trace: per round, (draft tokens proposed, of those kept), as
            :attr:`~coursepkg.serving.SpeculativeResult.trace` records them.
        max_rounds: the first rounds drawn.

    Returns:
        The figure: one row per round, one square per proposed token and one for the target's.
    """
    rounds = list(trace)[:max_rounds]
    if not rounds or any(not 0 <= kept <= proposed for proposed, kept in rounds):
        raise ValueError(
            f"trace must be (proposed, kept) pairs with 0 <= kept <= proposed: {trace}"
        )
    k = max(proposed for proposed, _ in rounds)
    cell = 0.7
    fig, ax = canvas(
        (7.0, 0.42 * len(rounds) + 1.2),
        (-2.6, 12.0),
        (-1.3, len(rounds) * cell + 0.7),
        "Speculative decoding: each round, a kept prefix and one token of the target's",
    )
    ax.text(0.0, len(rounds) * cell + 0.3, "draft's proposals", fontsize=9, weight="bold")
    ax.text((k + 0.6) * cell, len(rounds) * cell + 0.3, "target", fontsize=9, weight="bold")
    for r, (proposed, kept) in enumerate(rounds):
        top = (len(rounds) - r) * cell
        kinds = ["kept"] * kept
        if kept < proposed:
            kinds += ["rejected"] + ["discarded"] * (proposed - kept - 1)
        grid(ax, [kinds], 0.0, top, SPECULATIVE_FILLS, cell)
        grid(ax, [["target"]], (k + 0.6) * cell, top, SPECULATIVE_FILLS, cell)
        for j, kind in enumerate([*kinds, None]):
            x = (j if kind else k + 0.6) * cell + cell / 2
            ax.text(x, top - cell / 2, _LETTERS[kind or "target"], ha="center", va="center")
        ax.text(-0.3, top - cell / 2, f"round {r + 1}", ha="right", va="center", fontsize=9)
        note = f"{kept} of {proposed} kept, {kept + 1} emitted"
        ax.text((k + 2.0) * cell, top - cell / 2, note, va="center", fontsize=9)
    ax.text(
        -2.4,
        -0.5,
        "ok: kept   x: rejected (replaced by the target's token T)   -: discarded unread\n"
        "one forward pass of the target checks a whole row",
        fontsize=9,
        va="center",
    )
    return fig


def paged_tables(
    lengths: Sequence[int], block_size: int, n_blocks: int
) -> tuple[list[BlockTable], PagedKVCache]:
    """Grow one block table per sequence a token at a time, all sequences in turn (as decode
    steps do), until each holds its length; return the tables and the pool they drew from."""
    pool = PagedKVCache(1, n_blocks, block_size)
    tables = [BlockTable() for _ in lengths]
    for step in range(1, max(lengths) + 1):
        for table, length in zip(tables, lengths, strict=True):
            if step <= length:
                pool.grow(table, step)
                table.length = step
    return tables, pool


def block_table_diagram(
    lengths: Sequence[int] = (10, 5, 7), block_size: int = 4, n_blocks: int = 10
) -> Figure:
    """The paged cache: each sequence's block table lists pool blocks in order; the blocks lie
    wherever the free list had them, and only a sequence's last block is partly filled.

    Args:
        lengths: positions held by each sequence.
        block_size: positions per block.
        n_blocks: blocks in the pool.

    Returns:
        The figure: per sequence a row of its table's block ids; below, the pool's blocks, each
        with its owner and how many positions it holds.
    """
    tables, pool = paged_tables(lengths, block_size, n_blocks)
    fills = ["#f7d9a0", "#b5dcf5", "#9fd9c5", "#e6c3d9", "#f7f2a8"]
    owner = {b: s for s, t in enumerate(tables) for b in t.blocks}
    cell = 0.8
    fig, ax = canvas(
        (7.0, 0.45 * len(tables) + 2.4),
        (-2.8, n_blocks * cell + 0.6),
        (-2.7, len(tables) * cell + 0.9),
        f"A paged cache: block tables into one pool (blocks of {block_size} positions)",
    )
    ax.text(0.0, len(tables) * cell + 0.35, "block tables", fontsize=9, weight="bold")
    for s, table in enumerate(tables):
        top = (len(tables) - s) * cell
        colours = {"own": fills[s % len(fills)]}
        grid(ax, [["own"] * len(table.blocks)], 0.0, top, colours, cell)
        for j, block in enumerate(table.blocks):
            ax.text((j + 0.5) * cell, top - cell / 2, str(block), ha="center", va="center")
        ax.text(-0.3, top - cell / 2, f"seq {s}: {lengths[s]} pos", ha="right", va="center")
    top = -0.9
    ax.text(0.0, top + 0.35, "the pool", fontsize=9, weight="bold")
    colours = {"free": "#ffffff", **{s: fills[s % len(fills)] for s in range(len(tables))}}
    grid(ax, [[owner.get(b, "free") for b in range(n_blocks)]], 0.0, top, colours, cell)
    for b in range(n_blocks):
        s = owner.get(b)
        if s is None:
            label = "free"
        else:
            table = tables[s]
            held = min(block_size, lengths[s] - table.blocks.index(b) * block_size)
            label = f"s{s}\n{held}/{block_size}"
        centred_text(ax, (b + 0.5) * cell, top - cell / 2, label)
        ax.text((b + 0.5) * cell, top - cell - 0.25, str(b), ha="center", va="center")
    ax.text(-0.3, top - cell / 2, "owner, held", ha="right", va="center")
    ax.text(-0.3, top - cell - 0.25, "block id", ha="right", va="center")
    return fig


def packed_mask_diagram(
    n_new: Sequence[int] = (1, 1, 3), n_keys: Sequence[int] = (5, 3, 3)
) -> Figure:
    """The mask of one packed serving step, read off the :class:`~coursepkg.masks.PackedMask`
    the packed cache builds: requests laid end to end, each one's new tokens seeing only its
    own keys (causally), the block-diagonal pattern that attending by request computes alone.

    Args:
        n_new: each request's new tokens (1 while it is decoded, its prompt's length when it is
            admitted).
        n_keys: each request's keys, past and new (at least its ``n_new``).

    Returns:
        The figure: an L x S grid, True squares coloured by request, with the count of scores
        kept against the dense mask's.
    """
    mask = PackedMask(list(n_new), list(n_keys))
    dense = mask.dense  # (L, S) bool: the dense mask itself
    request = mask.key_request  # (S,): which request each key belongs to
    rows, cols = dense.shape
    cell = min(0.45, 6.0 / cols)
    fig, ax = canvas(
        (7.0, 1.2 + 0.45 * rows),
        (-2.0, cols * cell + 0.3),
        (-(rows * cell) - 0.8, 0.8),
        "One packed step: each request's new tokens see only its own keys",
    )
    fills = {-1: "#ffffff", 0: COLOURS["attention"], 1: COLOURS["ffn"], 2: COLOURS["state"]}
    fills.update({i: COLOURS["embed"] for i in range(3, 16)})
    cells = [
        [int(request[j]) if bool(dense[i, j]) else -1 for j in range(cols)] for i in range(rows)
    ]
    grid(ax, cells, 0.0, 0.0, fills, cell=cell)
    ax.text(-0.2, -rows * cell / 2, "new\ntokens\n(L)", ha="right", va="center", fontsize=9)
    ax.text(cols * cell / 2, 0.35, "keys (S), request after request", ha="center", fontsize=9)
    kept = int(dense.sum())
    note(
        ax,
        cols * cell / 2,
        -rows * cell - 0.45,
        f"{kept} of {rows * cols} scores are kept; attending by request computes little more",
    )
    return fig
