"""The package's size rules (DEVELOPING.md, "Conventions"), anywhere in ``coursepkg``: no module
over 600 lines, no function over 80 lines (counted from ``def`` to the end of its body, as
``scripts/code_size.py`` does)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "coursepkg"
FILES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_are_small_and_their_functions_short(path):
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 600
    long = [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 80
    ]
    assert not long, long


ROOT = PACKAGE.parent
GUIDE = ROOT / "DEVELOPING.md"


def test_the_guide_states_these_limits():
    text = GUIDE.read_text(encoding="utf-8")
    assert "over 600 lines" in text and "over 80 lines" in text


def _map_rows() -> list[list[str]]:
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split("## The map", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows[1:]]  # without the header


def test_every_path_in_the_guides_map_exists():
    """The map's modules and checks are under coursepkg/ (or the repository root: book/,
    scripts/), its tests under tests/; a renamed or moved file shows here."""
    rows = _map_rows()
    assert len(rows) >= 20
    missing = []
    for concept, module, test, _chapter, check, check_test in rows:
        for cell, base in ((module, PACKAGE), (check, PACKAGE), (test, ROOT / "tests")):
            for name in re.findall(r"`([\w./]+(?:\.py|/))`", cell):
                if not ((base / name).exists() or (ROOT / name).exists()):
                    missing.append((concept, name))
        for name in re.findall(r"`([\w./]+(?:\.py|/))`", check_test):
            if not (ROOT / "tests" / name).exists():
                missing.append((concept, name))
    assert not missing, missing


def _map_names() -> set[str]:
    """Every path the map names (``attention.py``, ``grading/term/``, ``model/test_rnn.py``)."""
    return {
        name
        for row in _map_rows()
        for cell in row
        for name in re.findall(r"`([\w./]+(?:\.py|/))`", cell)
    }


def _listed(path: str, names: set[str]) -> bool:
    return path in names or any(n.endswith("/") and path.startswith(n) for n in names)


def test_the_map_lists_every_module_and_every_test_file():
    """Each module of coursepkg (a check's catalogue goes with its check, the stubs with their
    checks) and each test file is in the map, itself or through its folder."""
    names = _map_names()
    modules = [
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and "stubs" not in p.parts
    ]
    unlisted = [m for m in modules if not _listed(m.replace("_mistakes.py", ".py"), names)]
    tests = [
        p.relative_to(ROOT / "tests").as_posix()
        for p in (ROOT / "tests").rglob("test_*.py")
        if p.name != "test_layout.py"
    ]
    unlisted += [t for t in tests if not _listed(t, names)]
    assert modules and tests
    assert not unlisted, f"not in DEVELOPING.md's map: {sorted(unlisted)}"
