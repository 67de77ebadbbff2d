"""Lines per file and the largest functions of a Python package folder.

Run: ``python scripts/code_size.py coursepkg/grading [--top 10]``. Prints every ``.py`` file
under the folder with its line count (largest first), then the ``--top`` longest functions
and methods (counted from the ``def`` line, decorators excluded, to the last line of the body).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def functions(path: Path) -> list[tuple[int, str]]:
    """(lines, "file:qualified.name") for every function and method defined in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                found.append((child.end_lineno - child.lineno + 1, f"{path}:{name}"))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def main() -> None:
    """Print the table of files and the table of functions."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    files = sorted(args.folder.rglob("*.py"))
    sizes = sorted(
        ((len(f.read_text(encoding="utf-8").splitlines()), f) for f in files), reverse=True
    )
    total = sum(n for n, _ in sizes)
    print(f"{total:6d} lines in {len(sizes)} files")
    for n, f in sizes:
        print(f"{n:6d}  {f}")
    print(f"\nthe {args.top} longest functions")
    everything = [fn for f in files for fn in functions(f)]
    for n, name in sorted(everything, reverse=True)[: args.top]:
        print(f"{n:6d}  {name}")


if __name__ == "__main__":
    main()
