"""Print the book as one PDF: the single-page HTML build, printed by headless Chromium, offline.

``make pdf`` first builds the book as one HTML page (``jupyter-book build . --builder
singlehtml``, from the same executed pages as ``make book``), then runs this script, which prints
that page with the system's Chromium (Debian's ``chromium``) into ``_build/pdf/book.pdf``. The
PDF has an outline (its bookmarks: one per heading) and is tagged, so each figure keeps its alt
text. Chromium is kept off the network (every host name resolves to nothing): the page needs
only its own files, MathJax included.

The reader functions (``outline_titles``, ``alt_texts``, ``image_count``) read what the test of
the PDF checks, without a PDF library: Chromium writes these as plain objects.

Usage::

    python scripts/book_pdf.py                                  # _build/singlehtml -> _build/pdf
    python scripts/book_pdf.py --html some/index.html --out book.pdf
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _root_page() -> str:
    """The table of contents' root page (``book/index``): the single page's own path."""
    toc = (ROOT / "_toc.yml").read_text()
    return re.search(r"^root:\s*(\S+)", toc, flags=re.M).group(1)


#: Jupyter Book's single-page build: the whole book in its root page (``index.html`` beside it
#: only redirects there)
HTML = ROOT / "_build" / "singlehtml" / f"{_root_page()}.html"
PDF = ROOT / "_build" / "pdf" / "book.pdf"


def find_chromium() -> str | None:
    """The system's Chromium (or Chrome), if one is installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _with_base(html: Path, folder: Path) -> Path:
    """A copy of ``html`` in ``folder`` whose relative links resolve where the build put them.

    Jupyter Book's single-page build writes the root page in a subfolder (``book/index.html``)
    but links its images and styles as if it were at the build's top (``_images/``,
    ``_static/``); opened where it lies, the page shows no figure. The copy gets a ``<base>``:
    the nearest folder above the page that holds ``_static`` (the page's own folder if none).
    """
    top = next((p for p in (html.parent, *html.parents) if (p / "_static").is_dir()), html.parent)
    text = html.read_text(encoding="utf-8")
    base = f'<base href="{top.resolve().as_uri()}/">'
    text = re.sub(r"<head(\s[^>]*)?>", lambda m: m.group(0) + base, text, count=1)
    copy = folder / html.name
    copy.write_text(text, encoding="utf-8")
    return copy


def print_pdf(html: Path, out: Path, chromium: str, timeout: float = 900.0) -> Path:
    """Print ``html`` (a local file) to the PDF ``out`` with headless Chromium.

    The page's scripts (MathJax typesetting the equations) get up to two minutes of the
    browser's virtual time before the page is printed; no header or footer is added.

    Returns:
        ``out``, once Chromium has written it.

    Raises:
        RuntimeError: when Chromium fails or writes no PDF, with the end of its output.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="chromium-pdf-") as profile,
        tempfile.TemporaryDirectory(prefix="book-page-") as scratch,
    ):
        html = _with_base(html, Path(scratch))
        command = [
            chromium,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: no host resolves
            f"--user-data-dir={profile}",
            "--run-all-compositor-stages-before-draw",
            "--virtual-time-budget=120000",
            "--no-pdf-header-footer",
            "--generate-pdf-document-outline",
            f"--print-to-pdf={out}",
            html.resolve().as_uri(),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not out.exists() or out.stat().st_size == 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise RuntimeError(f"chromium wrote no PDF from {html} (status {done.returncode}):\n{tail}")
    return out


_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"b": b"\b", b"f": b"\f"}
# a literal string (balanced parentheses are not needed: Chromium escapes every parenthesis)
_LITERAL = rb"\((?:\\.|[^\\)])*\)"
_HEX = rb"<[0-9A-Fa-f\s]*>"


def _decode(token: bytes) -> str:
    """A PDF string object (``(literal)`` or ``<hex>``) as text."""
    if token.startswith(b"<"):
        raw = bytes.fromhex(re.sub(rb"\s", b"", token[1:-1]).decode())
    else:
        raw = re.sub(
            rb"\\([0-7]{1,3}|.)",
            lambda m: (
                bytes([int(m.group(1), 8)])
                if m.group(1)[:1].isdigit()
                else _ESCAPES.get(m.group(1), m.group(1))
            ),
            token[1:-1],
            flags=re.DOTALL,
        )
    if raw.startswith(b"\xfe\xff"):
        return raw[2:].decode("utf-16-be")
    return raw.decode("latin-1")


def _strings(data: bytes, key: str) -> list[str]:
    pattern = rb"/" + key.encode() + rb"\s*(" + _LITERAL + rb"|" + _HEX + rb")"
    return [_decode(m.group(1)) for m in re.finditer(pattern, data, flags=re.DOTALL)]


def outline_titles(data: bytes) -> list[str]:
    """The titles of the PDF's outline (its bookmarks) and of the document itself."""
    return _strings(data, "Title")


def alt_texts(data: bytes) -> list[str]:
    """The alternative texts of the tagged PDF's figures."""
    return _strings(data, "Alt")


def image_count(data: bytes) -> int:
    """How many images the PDF holds (their transparency masks apart)."""
    images = len(re.findall(rb"/Subtype\s*/Image", data))
    return images - len(re.findall(rb"/SMask\s+\d+\s+\d+\s+R", data))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, default=HTML, help=f"default: {HTML}")
    parser.add_argument("--out", type=Path, default=PDF, help=f"default: {PDF}")
    args = parser.parse_args(argv)
    if not args.html.exists():
        parser.error(f"{args.html} does not exist: build it with `make pdf` (singlehtml first)")
    chromium = find_chromium()
    if chromium is None:
        parser.error("chromium is not installed (Debian: apt-get install chromium)")
    out = print_pdf(args.html, args.out, chromium)
    data = out.read_bytes()
    print(
        f"{out}: {len(data) / 2**20:.1f} MiB, {len(outline_titles(data))} outline entries, "
        f"{image_count(data)} images, {len(alt_texts(data))} alt texts"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
