"""Format (or check) the Python code cells of the book's pages with ruff.

The pages are MyST notebooks (``book/*.md``), which ruff does not read. This script hands each
``{code-cell}`` to ``ruff format`` as if it were a file in ``book/``, so that ``book/ruff.toml``
applies: a line length that fits the text column of the built book, where a longer line would
need a horizontal scrollbar.

Usage::

    python scripts/format_book.py            # rewrite the cells in place
    python scripts/format_book.py --check    # list the cells that are not formatted; exit 1 if any
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
_FENCE = re.compile(r"^(`{3,})\{code-cell\}")


@dataclass
class Cell:
    """One code cell: ``lines[start:end]`` of its page hold its code (options excluded)."""

    page: Path
    start: int
    end: int
    code: str


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        raise SystemExit("format_book: ruff is not installed (run `make install`)")
    return found


def code_cells(page: Path) -> list[Cell]:
    """The code cells of a page, with the line range of their code."""
    lines = page.read_text().splitlines(keepends=True)
    cells, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        close, j = fence.group(1), i + 1
        if j < len(lines) and lines[j].strip() == "---":  # a YAML block of cell options
            j = next(k for k in range(j + 1, len(lines)) if lines[k].strip() == "---") + 1
        while j < len(lines) and lines[j].startswith(":"):  # short-form cell options
            j += 1
        if j > i + 1 and j < len(lines) and not lines[j].strip():  # the blank line after them
            j += 1
        end = next(k for k in range(j, len(lines)) if lines[k].rstrip() == close)
        cells.append(Cell(page, j, end, "".join(lines[j:end])))
        i = end + 1
    return cells


def ruff_format(code: str, page: Path) -> str:
    """The cell formatted by ruff with the settings that apply in ``book/``."""
    result = subprocess.run(
        [_ruff(), "format", "--stdin-filename", str(page.with_suffix(".py")), "-"],
        input=code,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if result.returncode != 0:
        raise ValueError(f"{page.name}: ruff could not format a cell:\n{result.stderr}")
    return result.stdout


def pages() -> list[Path]:
    return sorted(BOOK.glob("*.md"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report, do not rewrite")
    parser.add_argument("files", nargs="*", type=Path, help="pages (default: book/*.md)")
    args = parser.parse_args(argv)
    unformatted = []
    for page in args.files or pages():
        page = page.resolve()
        lines = page.read_text().splitlines(keepends=True)
        changed = False
        for cell in reversed(code_cells(page)):  # from the end, so line numbers stay valid
            new = ruff_format(cell.code, page) if cell.code.strip() else cell.code
            if new != cell.code:
                unformatted.append(f"{page.relative_to(ROOT)}:{cell.start + 1}")
                lines[cell.start : cell.end] = [new]
                changed = True
        if changed and not args.check:
            page.write_text("".join(lines))
    if unformatted:
        verb = "would reformat" if args.check else "reformatted"
        print(f"{verb} {len(unformatted)} cells:", *sorted(unformatted), sep="\n  ")
    return 1 if (args.check and unformatted) else 0


if __name__ == "__main__":
    sys.exit(main())
