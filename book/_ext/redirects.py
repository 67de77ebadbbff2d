"""A local Sphinx extension that keeps the published URLs of renamed pages working.

The third edition named each chapter's file for the number the build gives it, so six pages
moved (``book/11_decoder_only.html`` is now ``book/12_decoder_only.html``, ...). Links to the old
addresses live on outside the book: bookmarks, the released notebooks' "Read first" links, other
sites. After an HTML build this writes, at each old address, a small page that sends the reader to
the new one:

* a script that replaces the location with the new page plus the old URL's ``#anchor`` (a meta
  refresh alone would drop the section the link pointed at);
* ``<meta http-equiv="refresh">`` for readers without scripts, and ``<link rel="canonical">`` so
  that search engines index the new address;
* a plain link, for readers whose browser follows neither.

Every URL is relative, so the redirects work in the offline book and under any site prefix. The
table below is the one list of renamed pages; ``tests/book/test_redirects.py`` checks that each new
name is a page of the book and no old name is one again.
"""

from __future__ import annotations

import html
import json
import posixpath
from pathlib import Path

#: old page -> the page it became (docnames: paths from the book's root, without a suffix)
RENAMED = {
    "book/11_decoder_only": "book/12_decoder_only",
    "book/12_inside_the_model": "book/13_inside_the_model",
    "book/13_tokens": "book/14_tokens",
    "book/14_attention_at_length": "book/15_attention_at_length",
    "book/15_modern_decoder": "book/16_modern_decoder",
    "book/16_training_for_real": "book/17_training_for_real",
    "book/23_capstone": "book/24_capstone",
}

#: what marks a file as a redirect this extension wrote (so a rebuild may replace it)
MARK = '<meta name="generator" content="book/_ext/redirects.py">'


def relative_url(old: str, new: str, suffix: str = ".html") -> str:
    """The URL of page ``new`` as written in page ``old`` (``book/a``, ``book/b`` -> ``b.html``)."""
    return posixpath.relpath(new + suffix, posixpath.dirname(old) or ".")


def redirect_page(old: str, new: str, suffix: str = ".html") -> str:
    """The HTML written at ``old``'s address: it sends the reader to ``new``, keeping the anchor.

    Args:
        old: the page's former docname (``book/11_decoder_only``).
        new: its docname now (``book/12_decoder_only``).
        suffix: the builder's file suffix.

    Returns:
        A whole HTML document.
    """
    url = relative_url(old, new, suffix)
    attr = html.escape(url, quote=True)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"{MARK}\n"
        f"<title>Moved to {html.escape(posixpath.basename(new))}</title>\n"
        f'<link rel="canonical" href="{attr}">\n'
        f"<script>location.replace({json.dumps(url)} + location.hash);</script>\n"
        f'<meta http-equiv="refresh" content="0; url={attr}">\n'
        "</head>\n<body>\n"
        f'<p>This page has moved to <a href="{attr}">{html.escape(url)}</a>.</p>\n'
        "</body>\n</html>\n"
    )


def write_redirects(
    outdir: str | Path,
    table: dict[str, str] | None = None,
    suffix: str = ".html",
    pages: set[str] | None = None,
) -> list[Path]:
    """Write a redirect page at each old address of ``table`` under ``outdir``.

    Args:
        outdir: the HTML build's output folder (``_build/html``).
        table: old docname -> new docname (default: :data:`RENAMED`).
        suffix: the builder's file suffix.
        pages: the docnames of the build that wrote ``outdir``, when known: a file at an old
            address that is none of them is what an earlier build left of the page before it
            moved (an incremental build after a rename), and is replaced. Without them, any
            file that is not an earlier redirect counts as a page.

    Returns:
        The files written, in the table's order.

    Raises:
        FileExistsError: a page of the book (not an earlier redirect, nor a page an earlier
            build left behind) holds an old address.
    """
    written = []
    for old, new in (RENAMED if table is None else table).items():
        path = Path(outdir) / f"{old}{suffix}"
        if pages is not None:
            is_page = old in pages
        else:
            text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else MARK
            is_page = MARK not in text
        if is_page:
            raise FileExistsError(
                f"redirects: {path} is a page of the book, so the old address {old!r} cannot "
                f"redirect to {new!r}; remove the entry from RENAMED or rename the page"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(redirect_page(old, new, suffix), encoding="utf-8")
        written.append(path)
    return written


def _write_after_html_build(app, exception) -> None:
    if exception is not None or app.builder.name != "html":
        return  # the single-page and LaTeX builds have no per-page addresses to keep
    docs = set(app.env.found_docs)
    missing = {old: new for old, new in RENAMED.items() if new not in docs}
    if missing:
        raise ValueError(f"redirects: RENAMED points to pages the book does not have: {missing}")
    write_redirects(app.outdir, RENAMED, app.builder.out_suffix, pages=docs)


def setup(app):
    app.connect("build-finished", _write_after_html_build)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
