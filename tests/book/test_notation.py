"""The book keeps one notation: the legend of book/index.md, row vectors, and its own sources.

Each retired use below was in the book once (a letter with two meanings, a column-vector formula,
a pointer to lecture notes that readers do not have). The test greps every page for it, so that
the letter cannot drift back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
PAGES = sorted(BOOK.glob("*.md"))

# (pattern, what it was, what the book writes instead)
RETIRED = [
    (r"O\(N\^2|O\(N D|\$N\$ (?:positions|tokens|vectors)|N \\times N", "N as a length", "L"),
    (r"\((?:1, )?B, (?:S, )?H\)|\b[23]H\b|\(3H, H\)", "H as a hidden size", "D"),
    (r"\bM W\^[KV]|\*memory\* \$M|\(h_1, m, m", "M as the encoder memory", "Z"),
    (r"\\epsilon = 0\.1\b", "plain epsilon for label smoothing", "\\epsilon_{\\text{ls}}"),
    (r"temperature\*\* \$T\$|\$T = 0\.|\$T \\to 0|\$T > 1\$|p_v\(T\)", "T as temperature", "tau"),
    (r"\$K = \d|the \$K\$ best|\$2K\$|K \\cdot V|beam \(K=", "K as the beam size", "k"),
    (r"6\\?,? ?P\\?,? ?T\b|6 P T\b", "T as training tokens", "n_tok"),
    (
        r"v\^\\top \\tanh|\bW s_\{i-1\}|W_o \[s_i|PE\(p\)\^\\top W",
        "a column-vector formula",
        "rows: xW",
    ),
    (r"\blecture notes\b|\bthe notes\b|\bnotes'", "a pointer to the seed notes", "a citation"),
    (
        r"s\^\\top h_j|s\^\\top W h_j|\\phi\(q_i\)\^\\top"
        r"|W_2\\?,?\s?\\mathrm\{ReLU\}\(W_1 x|W_2\\bigl",
        "a column-vector formula (2026-11-26 review)",
        "rows: xW",
    ),
    (r"\$G\$ key|\$H/G\$|\$G = \d|\bG = \{g", "G as the number of key/value heads", "Hkv"),
    (r"W_[KV]\^\{\(\\ell\)\}", "a key projection written W_K", "W^K"),
    (r"4ND\^2|2N\^2D", "N as a length in a legend", "L"),
    (r"\bM_k\b|M_\{-1\}", "M as the shift rotation", "R_k"),
    (r"\bF_\\ell\b|\bF_k\(", "F as a layer's branch", "f_ell"),
]


def _hits(pattern: str) -> list[str]:
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if re.search(pattern, line):
                found.append(f"{page.name}:{number}: {line.strip()[:90]}")
    return found


@pytest.mark.parametrize(("pattern", "what", "instead"), RETIRED, ids=[r[1] for r in RETIRED])
def test_the_book_no_longer_uses(pattern: str, what: str, instead: str) -> None:
    hits = _hits(pattern)
    assert not hits, f"{what} is retired (write {instead}, see book/index.md):\n" + "\n".join(hits)


def test_the_patterns_still_catch_what_they_retired() -> None:
    """Each pattern matches the retired use it was written for (a pattern that cannot match
    would make the test above pass vacuously)."""
    examples = [
        "self-attention costs $O(N^2 D)$",
        "h = torch.zeros(3, 64)  # (B, H)  h_0",
        "K = M W^K \\in",
        "label smoothing with $\\epsilon = 0.1$",
        "The **temperature** $T$ divides",
        "beam search with $K = 2$ keeps",
        "$6 P T$ with",
        "e_{ij} = v^\\top \\tanh(W s_{i-1} + U h_j)",
        "and the lecture notes repeat it",
        "the plain dot product $s^\\top h_j$",
        "$G$ key and value heads",
        "h_i W_K^{(\\ell)}",
        '"projections, $4ND^2$"',
        "a block-diagonal matrix $M_k = $",
        "Write $F_\\ell$ for the branch",
    ]
    for (pattern, what, _), example in zip(RETIRED, examples, strict=True):
        assert re.search(pattern, example), f"the pattern for {what} misses {example!r}"


def test_the_legend_defines_the_letters_that_replace_them() -> None:
    legend = (BOOK / "index.md").read_text()
    for row in ("| N | number of layers", "| T | number of tokens generated", "| L | query length"):
        assert row in legend, row
    for symbol in ("$Z$", "$k$", "$\\tau$", "$\\epsilon_{\\text{ls}}$", "$n_{\\text{tok}}$"):
        assert symbol in legend, symbol
    assert "Vectors are **rows**" in legend


def test_every_chapter_cites_and_ends_with_a_summary() -> None:
    chapters = [p for p in PAGES if re.match(r"\d\d_", p.name)]
    assert len(chapters) >= 13
    for page in chapters:
        text = page.read_text()
        assert "{cite" in text, f"{page.name} cites nothing"
        assert re.search(r"^## Summary", text, re.M), f"{page.name} has no Summary"


def test_every_citation_is_in_the_bibliography() -> None:
    keys = set(re.findall(r"^@\w+\{([^,]+),", (BOOK / "references.bib").read_text(), re.M))
    cited = {
        key.strip()
        for page in PAGES
        for group in re.findall(r"\{cite(?::[tp])?\}`([^`]+)`", page.read_text())
        for key in group.split(",")
    }
    assert cited, "no citations found"
    assert not cited - keys, f"cited but not in references.bib: {sorted(cited - keys)}"


def test_the_bibliography_parses_whole() -> None:
    """references.bib is read as the build reads it (pybtex, strict): an entry left open, e.g. by
    a merge, stops the book's build at the bibliography, before any page."""
    from pybtex.database.input.bibtex import Parser

    text = (BOOK / "references.bib").read_text()
    entries = Parser().parse_string(text).entries  # raises on a syntax error
    assert len(entries) == len(re.findall(r"^@\w+\{", text, re.M)), "an entry swallowed another"
