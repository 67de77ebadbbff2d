"""Diagrams of what text becomes before BPE merges anything (chapter 14): the pre-tokens GPT-2's
pattern cuts, and the bytes every character is made of, read off the tokenizer's own functions.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from coursepkg.chapters.diagrams.primitives import box, canvas, note
from coursepkg.tokenizer import bytes_to_unicode, pretokenize

__all__ = [
    "bytes_diagram",
    "pretokens_diagram",
]


def pretokens_diagram(text: str = "Hello world's 2024!") -> Figure:
    """GPT-2's pre-tokenization, by :func:`~coursepkg.tokenizer.pretokenize`: the text is cut
    into chunks (words with their leading space, numbers, punctuation), and merges never cross
    a chunk's edge.

    Args:
        text: the text to cut (at most 30 characters).

    Returns:
        The figure: the text, and each of its pre-tokens as a box (a space drawn as _).
    """
    if not 1 <= len(text) <= 30:
        raise ValueError(f"text must hold 1 to 30 characters, got {len(text)}")
    chunks = pretokenize(text)
    fig, ax = canvas((7.0, 2.4), (-0.2, 14.2), (-0.6, 2.8), "Pre-tokens: merges stay inside each")
    ax.text(7.0, 2.3, repr(text), ha="center", fontsize=10, family="monospace")
    total = sum(len(c) for c in chunks)
    x = 0.2
    for chunk in chunks:
        width = 13.6 * len(chunk) / total
        box(ax, x + width / 2, 1.0, max(width - 0.15, 0.5), 0.8, chunk.replace(" ", "_"), "embed")
        x += width
    note(ax, 7.0, -0.3, f"{len(chunks)} pre-tokens ( _ is a space)")
    return fig


def bytes_diagram(text: str = "café") -> Figure:
    """Byte-level BPE's alphabet: the text as UTF-8 bytes, each byte shown as the printable
    character :func:`~coursepkg.tokenizer.bytes_to_unicode` gives it, so that every string,
    in any language, starts from 256 symbols.

    Args:
        text: the text (1 to 8 characters).

    Returns:
        The figure: each character over its bytes, each byte with its value and its symbol.
    """
    if not 1 <= len(text) <= 8:
        raise ValueError(f"text must hold 1 to 8 characters, got {len(text)}")
    table = bytes_to_unicode()
    data = text.encode("utf-8")
    fig, ax = canvas((7.0, 2.8), (-0.3, 1.5 * len(data) + 0.3), (-0.8, 3.0), "Characters to bytes")
    x = 0.0
    for ch in text:
        raw = ch.encode("utf-8")
        box(
            ax,
            x + 0.75 * len(raw),
            2.2,
            1.5 * len(raw) - 0.2,
            0.6,
            ch if ch.isascii() else f"U+{ord(ch):04X}",
            "embed",
        )
        for b in raw:
            symbol = table[b]
            shown = symbol if symbol.isascii() else f"U+{ord(symbol):04X}"
            label = f"{b}\n{shown}"
            box(ax, x + 0.75, 0.8, 1.3, 0.9, label, "state" if len(raw) > 1 else "stack")
            x += 1.5
    note(ax, 0.75 * len(data), -0.5, f"{len(text)} characters, {len(data)} bytes")
    return fig
