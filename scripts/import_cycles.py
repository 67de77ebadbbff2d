"""Import cycles among a package's modules, counting every import wherever it is written.

Run: ``python scripts/import_cycles.py coursepkg``. Reads every ``.py`` file under the folder
with ``ast`` (nothing is imported or run) and keeps every import it finds: at module level,
inside functions and methods, and under ``if TYPE_CHECKING:``. An import inside a function runs
late, so Python itself would not fail on a ring made of them; but two modules that import each
other, however late, are one idea split in two, and the package's layers are meant to run one
way. It prints each group of modules that import each other in a ring, or ``no import cycle``,
and exits 1 when there is a cycle. ``tests/test_layout.py`` asserts there is none.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    """``coursepkg/grading/__init__.py`` -> ``coursepkg.grading``."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.Import | ast.ImportFrom, package: str, known: set[str]) -> list[str]:
    """The modules one import statement names (before they are resolved to known modules)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = package
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    stem = f"{base}.{node.module}" if node.level and node.module else base
    stem = node.module if not node.level else stem
    submodules = [f"{stem}.{alias.name}" for alias in node.names]
    # ``from . import sub`` imports the submodule; the package itself is already initialised
    # before any of its modules runs, so it is an edge only when a name comes from the
    # package's own namespace.
    if all(sub in known for sub in submodules):
        return submodules
    return [stem, *submodules]


def imports(root: Path, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in the file."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for target in _targets(node, package, known):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(root: Path) -> dict[str, set[str]]:
    """Every module under ``root`` (a package folder) and the package's modules it imports."""
    paths = sorted(root.rglob("*.py"))
    known = {module_name(root, p) for p in paths}
    return {module_name(root, p): imports(root, p, known) for p in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    result: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                result.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def main() -> None:
    """Print the cycles of the package named on the command line."""
    found = cycles(graph(Path(sys.argv[1]).resolve()))
    for group in found:
        print("import cycle: " + " <-> ".join(group))
    print("no import cycle" if not found else f"{len(found)} import cycle(s)")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    sys.setrecursionlimit(10_000)
    main()
