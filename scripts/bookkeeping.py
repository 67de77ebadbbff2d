"""The share of each page's visible code that is bookkeeping rather than method.

Run: ``python scripts/bookkeeping.py [book/NN_page.md ...]`` (default: every numbered chapter).
For each page it reads the code cells a reader sees (not tagged ``hide-input``, ``remove-input``
or ``remove-cell``), parses them, and counts the lines of the statements that only record or
phrase a result:

* a call of ``glue``, ``print``, ``display`` or of a helper defined on the page whose body is itself
  bookkeeping (``percent``, ``compared``, ...), as a statement;
* an assignment whose value is text (a string, an f-string, or a choice between texts), the
  verdicts pages glue into their prose;
* an ``if``/``elif``/``else`` chain whose branches hold nothing but such statements;
* the definition of such a helper.

Everything else counts as method (building, training, measuring, checking with ``assert``).
Blank lines and comments count for neither. Prints one row per page: visible lines, bookkeeping
lines, the share, and ``over`` where the share is above ``--limit`` (default 25%).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

CELL = re.compile(
    r"^```\{code-cell\}[^\n]*\n(?:---\n(?P<options>.*?)\n---\n)?(?P<code>.*?)^```$", re.M | re.S
)
HIDDEN = ("hide-input", "remove-input", "remove-cell")
RECORDERS = {"glue", "print", "display"}


def _is_text(node: ast.AST) -> bool:
    """A string, an f-string, a choice between texts, or text joined with text."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.IfExp):
        return _is_text(node.body) and _is_text(node.orelse)
    if isinstance(node, ast.BinOp):
        return _is_text(node.left) or _is_text(node.right)
    return False


def _is_bookkeeping(stmt: ast.stmt, recorders: set[str]) -> bool:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return name in recorders
    if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign) and stmt.value is not None:
        return _is_text(stmt.value)
    if isinstance(stmt, ast.If):
        return all(_is_bookkeeping(s, recorders) for s in stmt.body + stmt.orelse)
    if isinstance(stmt, ast.For):
        return all(_is_bookkeeping(s, recorders) for s in stmt.body)
    return False


def _helpers(tree: ast.Module) -> set[str]:
    """Functions defined on the page whose body only records or phrases (besides docstrings)."""
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name not in found:
                body = [
                    s
                    for s in node.body
                    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
                ]
                returns_text = [
                    s for s in body if isinstance(s, ast.Return) and s.value is not None
                ]
                rest = [s for s in body if not isinstance(s, ast.Return)]
                if (
                    body
                    and all(_is_bookkeeping(s, RECORDERS | found) for s in rest)
                    and all(_is_text(s.value) for s in returns_text)
                ):
                    found.add(node.name)
                    changed = True
    return found


def _lines(code: str) -> set[int]:
    """Line numbers (1-based) that hold code: not blank, not only a comment."""
    return {
        i
        for i, line in enumerate(code.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#")
    }


def page_share(text: str) -> tuple[int, int]:
    """(visible code lines, bookkeeping lines) of one page's MyST text."""
    visible = bookkeeping = 0
    cells = []
    for cell in CELL.finditer(text):
        options, code = cell["options"] or "", cell["code"]
        short = re.match(r"(?:^:[\w-]+:.*\n)+", code)  # MyST's short form, ``:tags: [...]``
        if short:
            options, code = options + short.group(0), code[short.end() :]
        if not any(tag in options for tag in HIDDEN):
            cells.append(code)
    trees = []
    for code in cells:
        try:
            trees.append((code, ast.parse(code)))
        except SyntaxError:  # a cell with magics: counted as method
            trees.append((code, None))
    recorders = set(RECORDERS)
    for _, tree in trees:
        if tree is not None:
            recorders |= _helpers(tree)
    for code, tree in trees:
        lines = _lines(code)
        visible += len(lines)
        if tree is None:
            continue
        marked: set[int] = set()
        for stmt in tree.body:
            helper = isinstance(stmt, ast.FunctionDef) and stmt.name in recorders
            if helper or _is_bookkeeping(stmt, recorders):
                first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
                marked |= set(range(first, stmt.end_lineno + 1))
        bookkeeping += len(marked & lines)
    return visible, bookkeeping


def main() -> None:
    """Print the table, one row per page."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=Path)
    parser.add_argument("--limit", type=float, default=25.0, help="percent")
    args = parser.parse_args()
    pages = args.pages or sorted(Path("book").glob("[0-9][0-9]_*.md"))
    total_visible = total_kept = 0
    print(f"{'page':34} {'visible':>7} {'bookkeeping':>11} {'share':>6}")
    for page in pages:
        visible, kept = page_share(page.read_text(encoding="utf-8"))
        total_visible, total_kept = total_visible + visible, total_kept + kept
        share = 100 * kept / visible if visible else 0.0
        flag = "  over" if share > args.limit else ""
        print(f"{page.stem:34} {visible:7d} {kept:11d} {share:5.1f}%{flag}")
    if total_visible:
        share = 100 * total_kept / total_visible
        print(f"{'all':34} {total_visible:7d} {total_kept:11d} {share:5.1f}%")


if __name__ == "__main__":
    main()
