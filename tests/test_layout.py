"""The package's size rules (DEVELOPING.md, "Conventions"), anywhere in ``coursepkg``: no module
over 600 lines, no function over 80 lines (counted from ``def`` to the end of its body, as
``scripts/code_size.py`` does)."""

from __future__ import annotations

import ast
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
