"""The HTML page of ``coursepkg similarity`` (``reports/<assignment>/similarity.html``): the
clusters of similar students, the ranked pairs, and the most similar pairs side by side, in
which only the code a student wrote that Dolos matched is marked and the code every student
was given (the release's stubs) is greyed.

The page's size is bounded whatever the class's size: at most :data:`TABLE_ROWS` rows in the
table (the CSV lists every pair) and ``top`` pairs side by side.
"""

from __future__ import annotations

import html
import re
from typing import Any

# The page is drawn from :class:`.similarity.Pair` and :class:`.similarity.Similarity`, which
# import this module to write it: named here by alias only, so the imports run one way.
Pair = Any
Similarity = Any

__all__ = ["TABLE_ROWS", "bare", "marked", "page"]

#: The most pairs the page's table lists (the CSV lists them all).
TABLE_ROWS = 300
Region = tuple[int, int, int, int]  # start row, start column, end row, end column (exclusive)

_STYLE = (
    "body{font-family:sans-serif;max-width:1400px;margin:auto}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}.sides{display:flex;gap:12px}"
    ".sides>div{flex:1;min-width:0}pre{background:#f7f7f7;padding:6px;overflow-x:auto;"
    "font-size:12px}.shared{background:#ffe08a}.line{display:block}.given{color:#aaa}"
    ".legend span{padding:0 4px}"
)


def _columns(regions: list[Region], lines: list[str]) -> dict[int, list[tuple[int, int]]]:
    """Per row, the column spans the regions cover."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for start_row, start_col, end_row, end_col in regions:
        for row in range(start_row, min(end_row, len(lines) - 1) + 1):
            first = start_col if row == start_row else 0
            last = end_col if row == end_row else len(lines[row])
            if last > first:
                spans.setdefault(row, []).append((first, last))
    return spans


def _line(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` as HTML, the characters inside ``spans`` marked (leading spaces never)."""
    covered = [False] * len(text)
    for first, last in spans:
        for i in range(first, min(last, len(text))):
            covered[i] = not text[: i + 1].isspace()
    out, i = [], 0
    while i < len(text):
        j = i
        while j < len(text) and covered[j] == covered[i]:
            j += 1
        piece = html.escape(text[i:j])
        out.append(f"<span class='shared'>{piece}</span>" if covered[i] else piece)
        i = j
    return "".join(out)


def bare(line: str) -> str:
    """``line`` without its end-of-line comment and the spaces around it."""
    return _COMMENT.sub("", line).strip()


_COMMENT = re.compile(r"\s+#[^'\"]*$")


def marked(code: str, regions: list[Region], given: set[str]) -> str:
    """``code`` as numbered HTML lines: the characters inside Dolos's shared ``regions``
    marked, the lines that are the given code (their :func:`bare` text in ``given``) greyed
    and never marked."""
    lines = code.splitlines()
    spans = _columns(regions, lines)
    out = []
    for i, text in enumerate(lines):
        if bare(text) and bare(text) in given:
            out.append(f"<span class='line given'>{i + 1:>4}  {html.escape(text)}</span>\n")
        else:
            out.append(f"<span class='line'>{i + 1:>4}  {_line(text, spans.get(i, []))}</span>\n")
    return "".join(out)


def _score(p: Pair, found: Similarity) -> str:
    same = " (identical answers)" if (p.left, p.right) in found.identical else ""
    return f"{p.similarity:.3f}{same}"


def _side_by_side(
    i: int, p: Pair, found: Similarity, sources: dict[str, str], given: set[str]
) -> str:
    sides = "".join(
        f"<div><h4>{html.escape(who)}</h4><pre>"
        f"{marked(sources[who], [f[k] for f in p.fragments], given)}</pre></div>"
        for k, who in enumerate((p.left, p.right))
    )
    how = f"Dolos {p.dolos:.3f}, normal form {p.normal:.3f}"
    return (
        f"<section id='pair-{i}' class='side-by-side'><h3>{i}. {html.escape(p.left)} and "
        f"{html.escape(p.right)}: similarity {_score(p, found)} ({how})</h3>"
        f"<div class='sides'>{sides}</div></section>"
    )


def _clusters(found: Similarity, threshold: float) -> str:
    if not found.clusters:
        return ""
    items = "".join(
        f"<li>{' ~ '.join(html.escape(s) for s in group)} ({len(group)} students)</li>"
        for group in found.clusters
    )
    return (
        f"<h2>Groups of similar students</h2><p>Students linked by pairs at or above "
        f"{threshold:g} (A ~ B ~ C: A is like B and B like C, not always A like C).</p>"
        f"<ul class='clusters'>{items}</ul>"
    )


def page(
    assignment: str,
    found: Similarity,
    sources: dict[str, str],
    template: str,
    threshold: float,
    top: int,
) -> str:
    """The whole page (see the module's docstring)."""
    pairs = found.pairs
    above = [p for p in pairs if p.similarity >= threshold]
    shown = above[:top]
    given = {bare(line) for line in template.splitlines() if bare(line)}
    rank = {id(p): i for i, p in enumerate(pairs, start=1)}
    rows = "".join(
        f"<tr class='pair{' above' if p.similarity >= threshold else ''}'><td>{i}</td>"
        f"<td>{html.escape(p.left)}</td><td>{html.escape(p.right)}</td>"
        f"<td>{_score(p, found)}</td><td>{p.dolos:.3f}</td><td>{p.normal:.3f}</td>"
        + (f"<td><a href='#pair-{i}'>side by side</a></td>" if i <= len(shown) else "<td></td>")
        + "</tr>"
        for i, p in enumerate(pairs[:TABLE_ROWS], start=1)
    )
    more = (
        f"<p>The {TABLE_ROWS} most similar of {len(pairs)} pairs; similarity.csv lists them "
        "all.</p>"
        if len(pairs) > TABLE_ROWS
        else ""
    )
    details = "".join(_side_by_side(rank[id(p)], p, found, sources, given) for p in shown)
    items = "".join(
        f"<li>{html.escape(sid)}: {html.escape(why)}</li>" for sid, why in found.unreadable.items()
    )
    unread = f"<p>Not compared (could not be read):</p><ul class='unreadable'>{items}</ul>"
    capped = (
        f" The {top} most similar of them are shown side by side (--top)."
        if len(above) > top
        else ""
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Similar submissions: "
        f"{html.escape(assignment)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Similar submissions: {html.escape(assignment)}</h1>"
        f"<p>{len(sources)} submissions, {len(pairs)} pairs sharing some code, "
        f"{len(above)} at or above the threshold {threshold:g}.{capped} Only what each student "
        "wrote is compared (answer cells and added cells; the stubs and given code are left "
        "out). The similarity is the higher of two: Dolos's (the share of the two answers' "
        "fingerprints they have in common) and the normal form's (the same share once the "
        "code is put in a normal form: names, order, spelling of the same computation and code "
        "that does nothing set aside). A pair high on this list is worth reading side by side; "
        "short exercises have few ways to be written, so two independent answers can be "
        "alike.</p><p class='legend'><span class='shared'>code Dolos found in both</span>"
        "<span class='given'>code every student was given</span></p>"
        f"{_clusters(found, threshold)}{unread if items else ''}"
        "<h2>Pairs</h2><table><tr><th>rank</th><th>student</th><th>student</th>"
        "<th>similarity</th><th>Dolos</th><th>normal form</th><th></th></tr>"
        f"{rows}</table>{more}{details}</body></html>"
    )
