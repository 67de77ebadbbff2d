"""The share of a book page's visible code lines that are bookkeeping rather than method.

A visible code line is a line of a code cell that is neither hidden (``hide-input``,
``remove-input``, ``remove-cell``) nor blank nor a comment. A top-level statement is
bookkeeping when it glues a figure (``glue``), builds one for the prose (a call of a name in
``BOOKKEEPING``) or defines such a helper; all its lines count. Run::

    python scripts/bookkeeping_share.py book/20_post_training.md
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

#: Calls whose statements are bookkeeping: gluing, and turning numbers into the prose's words.
BOOKKEEPING = {"glue", "percent", "compared", "verdict", "glue_all"}
HIDDEN = ("hide-input", "remove-input", "remove-cell")
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)


def _visible_cells(text: str) -> list[str]:
    cells = []
    for match in CELL.finditer(text):
        body = match.group(1)
        if body.startswith("---\n"):  # the cell's YAML header
            header, _, body = body[4:].partition("\n---\n")
            if any(tag in header for tag in HIDDEN):
                continue
        cells.append(body)
    return cells


def _is_bookkeeping(node: ast.stmt) -> bool:
    if isinstance(node, ast.FunctionDef):
        return node.name in BOOKKEEPING or any(_is_bookkeeping(n) for n in node.body)
    names = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name)}  # fmt: skip
    return bool(names & BOOKKEEPING)


def share(text: str) -> tuple[int, int]:
    """(bookkeeping lines, visible code lines) of a MyST page."""
    total = kept = 0
    for cell in _visible_cells(text):
        lines = cell.splitlines()
        code = {i for i, line in enumerate(lines, 1)
                if line.strip() and not line.strip().startswith("#")}  # fmt: skip
        total += len(code)
        for node in ast.parse(cell).body:
            if _is_bookkeeping(node):
                span = set(range(node.lineno, node.end_lineno + 1))
                if node.decorator_list if isinstance(node, ast.FunctionDef) else False:
                    span |= {d.lineno for d in node.decorator_list}
                kept += len(span & code)
    return kept, total


if __name__ == "__main__":
    for page in sys.argv[1:]:
        kept, total = share(Path(page).read_text())
        print(f"{page}: {kept} of {total} visible code lines are bookkeeping ({kept / total:.0%})")
