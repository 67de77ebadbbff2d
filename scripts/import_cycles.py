"""Import cycles among a package's modules, from their module-level imports.

Run: ``python scripts/import_cycles.py coursepkg [--typing]``. Reads every ``.py`` file under
the folder with ``ast`` (nothing is imported or run), keeps the imports at module level (those
inside functions run late and cannot make an import cycle; with ``--typing`` also those under
``if TYPE_CHECKING:``, which a type checker follows), and prints each group of modules that
import each other in a ring, or ``no import cycle``. Exits 1 when there is a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    """``coursepkg/grading/__init__.py`` -> ``coursepkg.grading``."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path, path: Path, known: set[str], typing: bool = False) -> set[str]:
    """The package's modules that ``path`` imports at module level."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    body = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks never run
            if typing and "TYPE_CHECKING" in ast.unparse(node.test):
                body.extend(node.body)
            continue
        body.append(node)
    for node in body:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            stem = f"{base}.{node.module}" if node.level and node.module else base
            stem = node.module if not node.level else stem
            submodules = [f"{stem}.{alias.name}" for alias in node.names]
            # ``from . import sub`` imports the submodule; the package itself is already
            # initialised before any of its modules runs, so it is an edge only when a name
            # comes from the package's own namespace.
            if all(sub in known for sub in submodules):
                targets = submodules
            else:
                targets = [stem, *submodules]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    result: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
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
    root = Path(sys.argv[1]).resolve()
    typing = "--typing" in sys.argv[2:]
    paths = sorted(root.rglob("*.py"))
    known = {module_name(root, p) for p in paths}
    graph = {module_name(root, p): imports(root, p, known, typing) for p in paths}
    found = cycles(graph)
    for group in found:
        print("import cycle: " + " <-> ".join(group))
    print("no import cycle" if not found else f"{len(found)} import cycle(s)")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    sys.setrecursionlimit(10_000)
    main()
