"""``make pdf``: the book as one PDF (the single-page HTML build printed by headless Chromium).

The reader of ``scripts/book_pdf.py`` is checked on a PDF Chromium prints from a small page; the
built book's PDF is checked for every chapter's title in its outline and every chapter's
diagrams (by their alt text): ``make pdf``'s ``_build/pdf/book.pdf`` when it is newer than the
single-page build, else one printed afresh from ``_build/singlehtml`` (``make pdf`` builds it).
Without Chromium these skip, unless ``COURSE_REQUIRE_BROWSER`` is set (as in CI); without the
single-page build the book's check skips, unless ``COURSE_REQUIRE_BOOK`` is set.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
from browser import chromium_or_skip
from processes import budget

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("book_pdf", ROOT / "scripts" / "book_pdf.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_pdf_strings_are_decoded_from_both_forms():
    book_pdf = _script()
    data = rb"<< /Title (Self\(-\)attention \\ \351t\351) /Alt <FEFF00E9006C0061006E> >>"
    assert book_pdf.outline_titles(data) == ["Self(-)attention \\ \xe9t\xe9"]
    assert book_pdf.alt_texts(data) == ["\xe9lan"]


def test_a_printed_page_keeps_its_headings_and_its_figure(tmp_path):
    chromium = chromium_or_skip()
    book_pdf = _script()
    dot = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAA"
    dot += "AABJRU5ErkJggg=="  # a 1x1 PNG
    page = tmp_path / "page.html"
    page.write_text(
        "<html><body><h1>Chapter one (attention)</h1><p>text</p>"
        f'<img src="data:image/png;base64,{dot}" width="80" alt="one red dot">'
        "<h2>A section</h2></body></html>"
    )
    data = book_pdf.print_pdf(
        page, tmp_path / "page.pdf", chromium, timeout=budget(300)
    ).read_bytes()
    assert data.startswith(b"%PDF")
    titles = book_pdf.outline_titles(data)
    assert "Chapter one (attention)" in titles and "A section" in titles
    assert book_pdf.alt_texts(data) == ["one red dot"]
    assert book_pdf.image_count(data) == 1


def _chapters() -> dict[str, str]:
    """Chapter file -> its title (the page's first heading), for every numbered chapter."""
    found = {}
    for path in sorted((ROOT / "book").glob("[0-9][0-9]_*.md")):
        title = next(line[2:] for line in path.read_text().splitlines() if line.startswith("# "))
        found[path.stem] = title
    return found


def _alts(chapter: str) -> list[str]:
    text = (ROOT / "book" / f"{chapter}.md").read_text()
    return [a.replace('\\"', '"') for a in re.findall(r'^\s+alt: "(.*)"\s*$', text, re.M)]


def _plain(text: str) -> str:
    """Sphinx's smart quotes and dashes back to ASCII, spaces collapsed."""
    for fancy, plain in (("\u2019", "'"), ("\u2018", "'"), ("\u201c", '"'), ("\u201d", '"')):
        text = text.replace(fancy, plain)
    text = text.replace("\u2014", "---").replace("\u2013", "--")
    return " ".join(text.split())


@pytest.mark.slow
def test_the_books_pdf_holds_every_chapter_and_its_diagrams(tmp_path):
    chromium = chromium_or_skip()
    book_pdf = _script()
    if not book_pdf.HTML.exists():
        if os.environ.get("COURSE_REQUIRE_BOOK"):
            pytest.fail("COURSE_REQUIRE_BOOK is set but _build/singlehtml is missing: `make pdf`")
        pytest.skip("the single-page book is not built (run `make pdf`)")
    made = book_pdf.PDF  # `make pdf`'s own output, when it was printed from this build
    if made.exists() and made.stat().st_mtime >= book_pdf.HTML.stat().st_mtime:
        data = made.read_bytes()
    else:
        data = book_pdf.print_pdf(book_pdf.HTML, tmp_path / "book.pdf", chromium).read_bytes()
    # Chromium's outline drops the space where a heading wraps ("RNNs,and"): compare without spaces.
    titles = "".join(_plain(" | ".join(book_pdf.outline_titles(data))).split())
    alts = {_plain(a) for a in book_pdf.alt_texts(data)}
    chapters = _chapters()
    assert len(chapters) >= 17
    for chapter, title in chapters.items():
        assert "".join(_plain(title).split()) in titles, (
            f"{chapter}: its title {title!r} is not in the PDF's outline"
        )
        wanted = _alts(chapter)
        assert wanted, f"{chapter} has no diagram with alt text"
        for alt in wanted:
            assert _plain(alt) in alts, f"{chapter}: the figure {alt[:60]!r}... is not in the PDF"
    assert book_pdf.image_count(data) >= 2 * len(chapters)  # diagrams and plotted figures
