"""Diagrams of generation and of what a trained model is made of: the beam, the KV cache,
BERT's input embeddings, BERT's and GPT's attention patterns, the residual stream, BPE merges as a
tree (chapters 9-13).
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Circle

from coursepkg.chapters.diagrams.primitives import PALETTE, arrow, box, canvas, grid, note
from coursepkg.masks import causal_mask

__all__ = [
    "BERT_INPUT",
    "attention_patterns_diagram",
    "bert_embeddings_diagram",
    "beam_diagram",
    "bpe_merge_tree_diagram",
    "kv_cache_diagram",
    "residual_stream_diagram",
]

KEPT, PRUNED = PALETTE["sky"], "#eeeeee"


def beam_steps(beam: int, steps: int, vocab: tuple[str, ...], seed: int = 0) -> list[list]:
    """A beam search over made-up next-token log-probabilities (drawn from a seeded generator).

    Args:
        beam: hypotheses kept after each step.
        steps: tokens generated.
        vocab: the tokens each hypothesis can be extended with.
        seed: the seed of the made-up distributions.

    Returns:
        One list per step of candidates ``(parent index, token, total log-prob, kept)``, the
        parent index pointing into the previous step's kept candidates.
    """
    gen = torch.Generator().manual_seed(seed)
    alive, out = [0.0], []
    for _ in range(steps):
        candidates = []
        for parent, total in enumerate(alive):
            logp = torch.log_softmax(2 * torch.randn(len(vocab), generator=gen), dim=0)  # (V,)
            candidates += [
                (parent, tok, total + lp, False)
                for tok, lp in zip(vocab, logp.tolist(), strict=True)
            ]
        best = sorted(range(len(candidates)), key=lambda c: -candidates[c][2])[:beam]
        candidates = [(p, t, s, c in best) for c, (p, t, s, _) in enumerate(candidates)]
        out.append(candidates)
        alive = [s for _, _, s, kept in candidates if kept]
    return out


def beam_diagram(beam: int = 2, steps: int = 3, vocab: tuple[str, ...] = ("a", "b", "c")) -> Figure:
    """Beam search as a tree: each kept hypothesis is extended by every token, and only the
    ``beam`` best totals (sums of log-probabilities) survive to the next step.

    Args:
        beam: the beam width k.
        steps: tokens generated.
        vocab: the tokens.

    Returns:
        The figure: one node per candidate, k of each step's filled (kept), the rest grey.
    """
    history = beam_steps(beam, steps, vocab)
    rows = max(len(c) for c in history)
    fig, ax = canvas(
        (7.0, 3.4),
        (-0.8, 3.4 * steps + 1.0),
        (-0.9, rows * 0.62 + 0.1),
        f"Beam search, k = {beam}: extend every kept hypothesis, keep the k best",
    )
    parents = [(0.0, rows * 0.62 / 2)]
    box(ax, *parents[0], 0.9, 0.45, "<bos>", KEPT)
    for step, candidates in enumerate(history):
        x = 3.4 * (step + 1)
        top = (rows - len(candidates)) * 0.31 + 0.31
        kept_at = []
        for r, (parent, tok, total, kept) in enumerate(candidates):
            y = top + (len(candidates) - 1 - r) * 0.62
            px, py = parents[parent]
            arrow(
                ax,
                (px + 0.55, py),
                (x - 0.95, y),
                colour="#333333" if kept else "#bbbbbb",
                lw=1.0 if kept else 0.6,
            )
            box(ax, x, y, 1.8, 0.44, f"{tok}   {total:+.2f}", KEPT if kept else PRUNED, size=9)
            if kept:
                kept_at.append((x + 0.35, y))
        parents = kept_at
    ax.text(
        1.7,
        -0.6,
        "each node: the new token and the total log-probability so far; grey = pruned",
        ha="left",
        fontsize=9,
    )
    return fig


def kv_cache_diagram(steps: int = 4) -> Figure:
    """The KV cache during decoding: at step t only the new token's query, key and value are
    computed; the t - 1 earlier keys and values are read from the cache.

    Args:
        steps: decoding steps drawn (one row each).

    Returns:
        The figure: per step one query square and t key and t value squares, the newest of each
        highlighted.
    """
    fig, ax = canvas(
        (7.0, 0.62 * steps + 1.0),
        (-1.9, 2 * steps + 4.6),
        (-0.9, steps + 0.7),
        "The KV cache grows by one key and one value per generated token",
    )
    colours = {"new": PALETTE["orange"], "old": "#cfe3f2"}
    cell = 0.7
    for header, x in (
        ("query", 0.35),
        ("keys (cache)", 2.0 + steps * cell / 2),
        ("values (cache)", 2.9 + steps * cell * 1.5),
    ):
        ax.text(x, steps + 0.35, header, ha="center", fontsize=9, weight="bold")
    for t in range(1, steps + 1):
        y = steps - t + 1.0
        ax.text(-0.3, y - cell / 2, f"step {t}", ha="right", va="center", fontsize=9)
        row = [["old"] * (t - 1) + ["new"]]
        grid(ax, [["new"]], 0.0, y, colours, cell)
        grid(ax, row, 2.0, y, colours, cell)
        grid(ax, row, 2.9 + steps * cell, y, colours, cell)
    ax.text(
        0.0,
        -0.55,
        "orange: computed at this step; blue: read from the cache, never recomputed",
        fontsize=9,
    )
    return fig


def attention_patterns_diagram(tokens=("the", "cat", "[MASK]", "on", "the", "[MASK]")) -> Figure:
    """Which positions see which: BERT's full (bidirectional) attention, where a masked token is
    predicted from both sides, against GPT's causal attention, where position i sees 0..i.

    Args:
        tokens: the sequence (BERT's side shows it with its masks; GPT's without them).

    Returns:
        The figure: two L x L grids (queries as rows), L^2 and L(L + 1) / 2 squares filled.
    """
    n, cell = len(tokens), 0.5
    fig, ax = canvas((7.0, 3.3), (-1.6, 2 * n * cell + 3.7), (-0.9, n * cell + 2.1))
    colours = {True: PALETTE["blue"], False: "#f2f2f2"}
    panels = (
        ("BERT: every position\nsees all", torch.ones(n, n, dtype=torch.bool), tokens),
        ("GPT: each position sees\nitself and the past", causal_mask(n), None),
    )
    x0 = 0.0
    for title, mask, shown in panels:
        grid(ax, mask.tolist(), x0, n * cell, colours, cell)  # (L, L): queries x keys
        ax.text(x0 + n * cell / 2, n * cell + 1.75, title, ha="center", fontsize=9, weight="bold")
        labels = shown or ("the", "cat", "sat", "on", "the", "mat")[:n]
        for j, tok in enumerate(labels):
            ax.text(
                x0 + (j + 0.5) * cell,
                n * cell + 0.1,
                tok,
                rotation=60,
                ha="left",
                va="bottom",
                fontsize=9,
                color="#000000",
            )
        ax.text(x0 + n * cell / 2, -0.3, "keys", ha="center", va="top", fontsize=9)
        ax.text(
            x0 - 0.15, n * cell / 2, "queries", rotation=90, ha="right", va="center", fontsize=9
        )
        x0 += n * cell + 3.5
    return fig


def residual_stream_diagram(layers: int = 2) -> Figure:
    """The residual stream: one vector per position runs from the embedding to the unembedding;
    every attention and feed-forward sublayer reads it and adds its output back.

    Args:
        layers: blocks drawn (each an attention and a feed-forward sublayer).

    Returns:
        The figure: 2 x ``layers`` sublayer boxes, each with a read arrow and an addition.
    """
    subs = [(f"attention {k + 1}", "attention") for k in range(layers)]
    subs = [s for k in range(layers) for s in (subs[k], (f"feed-forward {k + 1}", "ffn"))]
    width = 1.6 * len(subs) + 4.2
    fig, ax = canvas(
        (7.0, 2.7),
        (-0.2, width),
        (-0.3, 3.6),
        "The residual stream: every sublayer reads it and adds to it",
    )
    y = 0.7
    box(ax, 0.9, y, 1.5, 0.6, "embedding", "embed")
    ax.plot(
        [1.65, width - 1.8], [y, y], color=PALETTE["grey"], lw=5, solid_capstyle="butt", zorder=0
    )
    for k, (name, role) in enumerate(subs):
        x = 2.6 + 1.6 * k
        box(ax, x + 0.35, 2.3, 1.45, 0.7, name.replace(" ", "\n"), role, size=9)
        arrow(ax, (x - 0.15, y + 0.1), (x + 0.1, 1.95))
        ax.add_patch(Circle((x + 0.7, y), 0.2, facecolor="white", edgecolor="#333333", zorder=3))
        ax.text(x + 0.7, y, "+", ha="center", va="center", fontsize=10, zorder=4)
        arrow(ax, (x + 0.6, 1.95), (x + 0.7, y + 0.2))
    box(ax, width - 1.0, y, 1.6, 0.6, "unembedding", "output")
    note(ax, width / 2, -0.1, "the stream: (B, T, D), the same width from first layer to last")
    return fig


def bpe_merge_tree_diagram(word: str = "lower", merges=None) -> Figure:
    """Byte-pair encoding of one word as a tree: the characters are the leaves, and each merge,
    applied in the order it was learned, joins two adjacent symbols into their parent.

    Args:
        word: the word to encode.
        merges: the learned merges, in order, as pairs of symbols, ``str`` or ``bytes`` (as
            :func:`coursepkg.tokenizer.train_bpe` returns them); default: four merges that
            build "lower".

    Returns:
        The figure: one leaf per character and one node per merge that applies, each level
        labelled with the merge's rank (counted from 0, as the list is).
    """
    merges = merges or [("l", "o"), ("e", "r"), ("lo", "w"), ("low", "er")]
    merges = [tuple(m.decode() if isinstance(m, bytes) else m for m in pair) for pair in merges]
    nodes = [(c, 0.9 * i + 0.6, 0) for i, c in enumerate(word)]  # (symbol, x, level)
    used = _merges_applied(word, merges)
    applied = [(r, a, b) for r, (a, b) in enumerate(merges) if r in used]
    fig, ax = canvas(
        (7.0, 3.0),
        (-0.6, 0.9 * len(word) + 5.0),
        (-0.6, len(applied) + 0.8),
        f'BPE merges applied to "{word}", in the order they were learned',
    )
    for sym, x, _ in nodes:
        box(ax, x, 0.0, 0.7, 0.5, sym, "embed")
    for level, (rank, a, b) in enumerate(applied, start=1):
        i = 0
        while i < len(nodes) - 1:
            if (nodes[i][0], nodes[i + 1][0]) == (a, b):
                (_, xa, la), (_, xb, lb) = nodes[i], nodes[i + 1]
                x = (xa + xb) / 2
                for cx, cl in ((xa, la), (xb, lb)):
                    ax.plot([cx, x], [cl + 0.25, level - 0.25], color="#555555", lw=1.0, zorder=1)
                box(ax, x, level, 0.5 + 0.22 * len(a + b), 0.5, a + b, "ffn")
                nodes[i : i + 2] = [(a + b, x, level)]
            i += 1
        ax.text(0.9 * len(word) + 0.7, level, f"merge {rank}: {a} + {b}", va="center", fontsize=9)
    ax.text(0.9 * len(word) + 0.7, 0.0, "the characters", va="center", fontsize=9)
    return fig


def _merges_applied(word: str, merges: list[tuple[str, str]]) -> set[int]:
    """The ranks of the merges that change ``word`` when all are applied in order."""
    symbols, made = list(word), set()
    for rank, (a, b) in enumerate(merges):
        i = 0
        while i < len(symbols) - 1:
            if (symbols[i], symbols[i + 1]) == (a, b):
                symbols[i : i + 2] = [a + b]
                made.add(rank)
            i += 1
    return made


#: a two-segment input as BERT reads it (the default drawing)
BERT_INPUT = ("[CLS]", "a", "king", "sleeps", "[SEP]", "guards", "wake", "[SEP]")


def bert_embeddings_diagram(tokens: tuple[str, ...] = BERT_INPUT) -> Figure:
    """BERT's input: for each token, its token embedding, the embedding of its segment (A up to
    and including the first [SEP], B after it) and of its position, summed, then LayerNorm.
    The names are :class:`~coursepkg.EncoderOnlyLM`'s submodules.

    Args:
        tokens: the input's tokens, starting with [CLS] and holding at least one [SEP] (2 to
            10 tokens).

    Returns:
        The figure: one column per token with its three embeddings and a plus, and the norm
        the sums go through.
    """
    if not 2 <= len(tokens) <= 10 or tokens[0] != "[CLS]" or "[SEP]" not in tokens:
        raise ValueError(
            f"tokens must start with [CLS], hold a [SEP] and number 2 to 10, got {tokens!r}"
        )
    first_sep = tokens.index("[SEP]")
    segments = ["A" if i <= first_sep else "B" for i in range(len(tokens))]
    n = len(tokens)
    step = 1.3
    fig, ax = canvas(
        (7.0, 3.6),
        (-2.6, n * step + 0.2),
        (-1.4, 4.6),
        "BERT's input: token + segment + position, summed, then normalised",
    )
    rows = (
        (3.1, "embed", lambda i: f"E[{tokens[i]}]", "embed"),
        (2.2, "token_types", lambda i: f"seg {segments[i]}", "state"),
        (1.3, "positions", lambda i: f"pos {i}", "norm"),
    )
    for y, name, label, role in rows:
        ax.text(-0.2, y, name, ha="right", va="center", fontsize=9, family="monospace")
        for i in range(n):
            box(ax, i * step + 0.65, y, step * 0.85, 0.6, label(i), role, size=9)
    for i in range(n):
        x = i * step + 0.65
        ax.text(x, 4.05, tokens[i], ha="center", va="center", fontsize=9)
        ax.text(x, 0.6, "+", ha="center", va="center", fontsize=12)
        arrow(ax, (x, 0.35), (x, -0.45))
    box(
        ax,
        n * step / 2,
        -0.85,
        n * step - 0.2,
        0.55,
        "embed_norm (LayerNorm), then the encoder",
        "stack",
        size=9,
    )
    return fig
