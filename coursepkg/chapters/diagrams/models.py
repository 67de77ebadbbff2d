"""Diagrams of how the models of chapters 8-20 are fed, stacked, read and trained: a training
step, shifted targets, a greedy trap, BERT's corruption rule, next-character prediction, the GPT
stack, the logit lens, the feed-forward network as a memory, dense against routed compute, and
DPO's pair.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from coursepkg.chapters.diagrams.primitives import PALETTE, arrow, box, canvas, note, shape

__all__ = [
    "dense_vs_routed_diagram",
    "dpo_pair_diagram",
    "ffn_memory_diagram",
    "gpt_stack_diagram",
    "greedy_trap_diagram",
    "logit_lens_diagram",
    "mlm_corruption_diagram",
    "next_token_diagram",
    "shifted_targets_diagram",
    "training_step_diagram",
]


def _chain(ax, labels, y: float, x0: float, width: float, gap: float, roles) -> None:
    """Boxes left to right, each joined to the next by an arrow."""
    for i, (text, role) in enumerate(zip(labels, roles, strict=True)):
        x = x0 + i * (width + gap)
        box(ax, x, y, width, 0.9, text, role)
        if i:
            arrow(ax, (x - width / 2 - gap, y), (x - width / 2, y))


def training_step_diagram() -> Figure:
    """One optimisation step of the translator: forward, loss, backward, clipping, the
    optimiser's update and the schedule's next learning rate.

    Returns:
        The figure: the six stages in a row, with what each hands to the next.
    """
    fig, ax = canvas((7.0, 2.4), (-0.2, 17.2), (-1.0, 2.2), "One training step")
    labels = (
        "batch\n(src, tgt)",
        "forward\nlogits",
        "loss\n(smoothed)",
        "backward\ngradients",
        "clip\nglobal norm",
        "optimiser\nstep",
    )
    roles = ("tensor", "attention", "output", "ffn", "norm", "state")
    _chain(ax, labels, 1.0, 1.2, 2.3, 0.6, roles)
    note(ax, 8.5, -0.6, "then the schedule sets the next step's learning rate")
    return fig


def shifted_targets_diagram(tokens: tuple[str, ...] = ("2024", "-", "03", "-", "07")) -> Figure:
    """Teacher forcing's inputs and labels: the decoder reads <bos> and the target, and must
    predict the target and <eos>, each label one position to the left of where it is read.

    Args:
        tokens: the target's tokens (1 to 8).

    Returns:
        The figure: the input row, the label row below it, and an arrow from each input to the
        label it must predict.
    """
    if not 1 <= len(tokens) <= 8:
        raise ValueError(f"tokens must hold 1 to 8 tokens, got {len(tokens)}")
    inputs = ("<bos>", *tokens)
    labels = (*tokens, "<eos>")
    n = len(inputs)
    fig, ax = canvas(
        (7.0, 2.6), (-2.2, 1.6 * n), (-0.4, 3.0), "Decoder inputs and labels: shifted by one"
    )
    for i in range(n):
        x = 1.6 * i + 0.8
        box(ax, x, 2.2, 1.3, 0.6, inputs[i], "embed")
        box(ax, x, 0.4, 1.3, 0.6, labels[i], "output")
        arrow(ax, (x, 1.88), (x, 0.72))
    ax.text(-0.1, 2.2, "input", ha="right", va="center", fontsize=9)
    ax.text(-0.1, 0.4, "label", ha="right", va="center", fontsize=9)
    ax.text(-0.1, 1.3, "predicts", ha="right", va="center", fontsize=9, style="italic")
    return fig


def greedy_trap_diagram(first=(0.6, 0.4), second=((0.4, 0.3), (0.9, 0.1))) -> Figure:
    """Why greedy decoding can miss the most probable sequence: the best first token leads to
    weaker continuations than the second best.

    Args:
        first: the probabilities of tokens A and B at step 1.
        second: for each of A and B, the probabilities of its two continuations.

    Returns:
        The figure: the two-level tree with each sequence's probability (the products), the
        greedy path and the best path marked.
    """
    products = [first[i] * second[i][j] for i in range(2) for j in range(2)]
    best = max(range(4), key=products.__getitem__)
    greedy = max(range(2), key=lambda i: first[i]) * 2
    greedy += max(range(2), key=lambda j: second[greedy // 2][j])
    fig, ax = canvas((7.0, 3.4), (-0.5, 14.5), (-1.2, 5.0), "Greedy takes the best next token")
    box(ax, 1.0, 2.3, 1.4, 0.7, "<bos>", "tensor")
    for i, name in enumerate("AB"):
        y = 3.8 - 3.0 * i
        box(ax, 4.6, y, 1.8, 0.7, f"{name}  {first[i]:.1f}", "embed")
        on_greedy = greedy // 2 == i
        arrow(ax, (1.7, 2.3), (3.7, y), colour=PALETTE["vermillion"] if on_greedy else "#333333")
        for j in range(2):
            k = 2 * i + j
            yy = y + 0.7 - 1.4 * j
            label = f"{name}{j + 1}  {second[i][j]:.1f}  -> {products[k]:.2f}"
            box(ax, 9.8, yy, 4.6, 0.6, label, "state" if k == best else "stack")
            colour = (
                PALETTE["vermillion"]
                if k == greedy
                else (PALETTE["blue"] if k == best else "#333333")
            )
            arrow(ax, (5.5, y), (7.5, yy), colour=colour)
    note(
        ax,
        7.0,
        -0.9,
        f"red: greedy ({products[greedy]:.2f}); green box, blue arrow: the best "
        f"sequence ({products[best]:.2f})",
    )
    return fig


def mlm_corruption_diagram(chosen: float = 0.15, mask: float = 0.8, random: float = 0.1) -> Figure:
    """BERT's corruption rule: a share of the positions is chosen for prediction; of those,
    most become [MASK], some a random token, the rest stay as they are.

    Args:
        chosen: the share of positions chosen (BERT: 0.15).
        mask: of the chosen, the share replaced by [MASK] (0.8).
        random: of the chosen, the share replaced by a random token (0.1); the rest is kept.

    Returns:
        The figure: a bar split into the unchosen and the chosen positions, the chosen split
        into its three fates with their shares of all positions.
    """
    keep = 1.0 - mask - random
    if not (0 < chosen < 1 and mask >= 0 and random >= 0 and keep >= -1e-9):
        raise ValueError(f"shares must lie in [0, 1] and mask + random <= 1, got {mask}, {random}")
    fig, ax = canvas((7.0, 2.6), (-0.2, 14.2), (-0.6, 3.6), "Which positions BERT learns from")
    box(ax, 7.0, 2.8, 14.0, 0.6, f"all positions: {1 - chosen:.0%} not predicted", "stack")
    start = 14.0 * (1 - chosen)
    box(ax, start + 7.0 * chosen, 2.8, 14.0 * chosen, 0.6, f"{chosen:.0%}", "attention")
    fates = (("[MASK]", mask, "attention"), ("random token", random, "ffn"), ("kept", keep, "norm"))
    for i, (name, share, role) in enumerate(fates):
        label = f"{name}: {share:.0%} of those\n= {chosen * share:.1%} of all"
        box(ax, 2.4 + 4.6 * i, 1.2, 4.4, 0.8, label, role)
    arrow(ax, (start + 7.0 * chosen, 2.45), (7.0, 1.65))
    note(ax, 7.0, 0.1, "the loss is taken at the chosen positions only")
    return fig


def next_token_diagram(text: str = "to be or") -> Figure:
    """A causal language model's training: every position predicts the next character, reading
    only what came before it.

    Args:
        text: the characters drawn (2 to 10).

    Returns:
        The figure: the characters in a row, each with an arrow to the next one it predicts.
    """
    if not 2 <= len(text) <= 10:
        raise ValueError(f"text must hold 2 to 10 characters, got {len(text)}")
    shown = [c if c != " " else "space" for c in text]
    n = len(text)
    fig, ax = canvas((7.0, 2.4), (-0.3, 1.4 * n), (-0.6, 2.8), "Every position predicts the next")
    for i in range(n - 1):
        x = 1.4 * i + 0.7
        box(ax, x, 2.0, 1.2, 0.6, shown[i], "embed")
        box(ax, x, 0.4, 1.2, 0.6, shown[i + 1], "output")
        arrow(ax, (x, 1.68), (x, 0.72))
    note(ax, 0.7 * n, -0.35, f"{n - 1} predictions from one window of {n} characters")
    return fig


def gpt_stack_diagram(n_layers: int = 4) -> Figure:
    """The decoder-only model: token and position embeddings, N pre-LN blocks of causal
    attention and MLP, a final norm and the head tied to the token embedding.

    Args:
        n_layers: N (1 to 12), written on the stack.

    Returns:
        The figure: the path from ids to logits, bottom to top, with shapes and the tie.
    """
    fig, ax = canvas((7.0, 3.6), (-4.0, 10.0), (-0.5, 7.4), "The GPT stack")
    box(ax, 3.0, 0.0, 3.6, 0.6, "token ids (B, L)", "tensor")
    box(ax, 1.4, 1.2, 2.8, 0.7, "token embedding", "embed")
    box(ax, 4.8, 1.2, 2.6, 0.7, "positions", "norm")
    box(
        ax,
        3.0,
        3.0,
        5.0,
        1.4,
        f"{n_layers} x block: norm, causal\nattention, +, norm, MLP, +",
        "attention",
    )
    box(ax, 3.0, 4.6, 3.0, 0.6, "final norm", "norm")
    box(ax, 3.0, 5.7, 3.0, 0.7, "head", "output")
    box(ax, 3.0, 6.8, 3.6, 0.6, "logits (B, L, V)", "tensor")
    arrow(ax, (3.0, 0.3), (1.6, 0.85))
    arrow(ax, (1.4, 1.55), (2.5, 2.3))
    arrow(ax, (4.8, 1.55), (3.5, 2.3))
    arrow(ax, (3.0, 3.7), (3.0, 4.3))
    arrow(ax, (3.0, 4.9), (3.0, 5.35))
    arrow(ax, (3.0, 6.05), (3.0, 6.5))
    arrow(ax, (0.0, 1.2), (1.5, 5.7), colour=PALETTE["blue"], rad=-0.4, ls="--")
    ax.text(
        -3.9,
        3.5,
        "the head's weight\nis the token\nembedding's (tied)",
        fontsize=9,
        color=PALETTE["blue"],
    )
    shape(ax, 5.8, 3.0, "(B, L, D)")
    return fig


def logit_lens_diagram(n_layers: int = 4) -> Figure:
    """The logit lens: the residual stream after each layer read through the final norm and
    the head, as if the model stopped there.

    Args:
        n_layers: the layers drawn (1 to 6).

    Returns:
        The figure: the stream's states bottom to top, each with an arrow through the same
        norm-and-head box to a distribution over the next token.
    """
    if not 1 <= n_layers <= 6:
        raise ValueError(f"n_layers must be in [1, 6], got {n_layers}")
    fig, ax = canvas(
        (7.0, 3.6), (-0.5, 12.5), (-0.6, 1.1 * n_layers + 1.6), "The logit lens: read every depth"
    )
    for k in range(n_layers + 1):
        y = 1.1 * k
        name = "embedding" if k == 0 else f"after layer {k}"
        box(ax, 2.0, y, 3.4, 0.7, name, "state")
        box(ax, 6.4, y, 3.0, 0.7, "final norm + head", "output")
        box(ax, 10.4, y, 3.2, 0.7, f"next-token guess {k}", "tensor")
        arrow(ax, (3.7, y), (4.9, y))
        arrow(ax, (7.9, y), (8.8, y))
        if k:
            arrow(ax, (2.0, y - 0.75), (2.0, y - 0.35))
    note(ax, 6.0, 1.1 * n_layers + 0.9, "the last row is the model's own output")
    return fig


def ffn_memory_diagram(d_model: int = 4, d_ff: int = 6, fired: int = 2) -> Figure:
    """The feed-forward network read as a memory: each of the F hidden units has a key (a
    column of W1) matched against the token and a value (a row of W2) written back, weighted
    by how strongly its key fired.

    Args:
        d_model: D, the token's width drawn.
        d_ff: F, the hidden units drawn (2 to 8).
        fired: the unit drawn as firing strongly.

    Returns:
        The figure: the token, the F key boxes, their activations, the F value boxes and the
        sum written back.
    """
    if not 2 <= d_ff <= 8 or not 0 <= fired < d_ff:
        raise ValueError(f"d_ff must be in [2, 8] and fired in [0, d_ff), got {d_ff}, {fired}")
    fig, ax = canvas(
        (7.0, 3.6), (-0.4, 14.4), (-0.6, 2.0 * 1.0 + 3.2), "The FFN as keys and values"
    )
    box(ax, 1.3, 2.4, 2.2, 0.9, f"token x\n(D = {d_model})", "embed")
    step = 4.4 / d_ff
    for u in range(d_ff):
        y = 4.6 - step * (u + 0.5) * 1.0
        strong = u == fired
        box(ax, 5.2, y, 1.8, step * 0.8, f"key {u}", "attention" if strong else "stack", size=9)
        box(ax, 9.0, y, 1.8, step * 0.8, f"value {u}", "ffn" if strong else "stack", size=9)
        arrow(ax, (2.4, 2.4), (4.3, y), lw=1.8 if strong else 0.6)
        arrow(ax, (6.1, y), (8.1, y), lw=1.8 if strong else 0.6)
        arrow(ax, (9.9, y), (12.0, 2.4), lw=1.8 if strong else 0.6)
    box(ax, 13.1, 2.4, 2.0, 0.9, "written\nback", "output")
    note(ax, 7.1, -0.35, "key u: column u of W1;  value u: row u of W2;  weight: ReLU(x . key u)")
    return fig


def dense_vs_routed_diagram(n_experts: int = 8, top_k: int = 2) -> Figure:
    """Dense against routed feed-forward: a mixture holds E experts but runs only k of them for
    each token, so its parameters grow with E and its compute with k.

    Args:
        n_experts: E (2 to 12).
        top_k: k (1 to E).

    Returns:
        The figure: one dense FFN, and E expert boxes of which k are lit, with the counts.
    """
    if not 2 <= n_experts <= 12 or not 1 <= top_k <= n_experts:
        raise ValueError(f"need 2 <= E <= 12 and 1 <= k <= E, got E={n_experts}, k={top_k}")
    fig, ax = canvas(
        (7.0, 2.8), (-0.4, 14.4), (-0.8, 3.4), "Parameters grow with E, compute with k"
    )
    box(ax, 1.6, 1.6, 2.6, 1.0, "dense FFN\n1 x params\n1 x compute", "ffn")
    step = 9.6 / n_experts
    for e in range(n_experts):
        lit = e < top_k
        box(ax, 4.6 + step * (e + 0.5), 1.6, step * 0.85, 1.0, f"e{e}", "ffn" if lit else "stack")
    ax.text(
        9.4,
        2.6,
        f"mixture: {n_experts} x params, {top_k} x compute per token",
        ha="center",
        fontsize=9,
    )
    note(ax, 7.0, -0.4, "lit: the experts the router picked for one token")
    return fig


def dpo_pair_diagram() -> Figure:
    """DPO's loss for one preference pair: the chosen and the rejected answer each scored by
    the policy and by the frozen reference; the loss pushes up the chosen answer's log-ratio
    against the rejected one's.

    Returns:
        The figure: the prompt with its two answers, the four log-probabilities, the margin and
        the loss.
    """
    fig, ax = canvas((7.0, 3.2), (-0.4, 14.4), (-0.8, 4.4), "DPO: one pair, two models")
    box(ax, 1.4, 3.4, 2.4, 0.7, "prompt", "tensor")
    box(ax, 1.4, 2.2, 2.4, 0.7, "chosen y_w", "state")
    box(ax, 1.4, 1.0, 2.4, 0.7, "rejected y_l", "attention")
    box(ax, 5.6, 2.2, 3.4, 0.8, "policy:\nlog p(y_w), log p(y_l)", "ffn")
    box(ax, 5.6, 0.8, 3.0, 0.8, "reference (frozen):\nthe same two", "stack")
    box(ax, 10.0, 1.5, 3.6, 1.0, "margin = beta x\n(ratio_w - ratio_l)", "norm")
    box(ax, 13.3, 1.5, 1.8, 0.8, "-log\nsigmoid", "output")
    for y in (2.2, 1.0):
        arrow(ax, (2.6, y), (4.1, 2.2 if y > 2 else 0.9))
    arrow(ax, (7.1, 2.1), (8.2, 1.7))
    arrow(ax, (7.1, 0.9), (8.2, 1.3))
    arrow(ax, (11.8, 1.5), (12.4, 1.5))
    note(
        ax,
        7.0,
        -0.5,
        "ratio: an answer's log-probability under the policy minus under the reference",
    )
    return fig
