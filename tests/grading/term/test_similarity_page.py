"""The page of ``coursepkg similarity`` without Dolos (``similarity_page``): only the columns
of a shared region are marked, the given code is greyed and never marked, and the groups of
similar students are the connected components above the threshold."""

from __future__ import annotations

import re

from coursepkg.grading.term.similarity import Pair, clusters
from coursepkg.grading.term.similarity_page import bare, marked

CODE = "def f(a, b):  # noqa: N803\n    s = a + b\n    return s * 2\n"


def _lines(page: str) -> list[str]:
    return re.findall(r"<span class='line[^']*'>.*?</span>\n", page)


def test_only_the_columns_of_a_shared_region_are_marked():
    # row 1 from column 8 ("a + b") to row 2 column 12 ("return s", end excluded)
    lines = _lines(marked(CODE, [(1, 8, 2, 12)], set()))
    assert "<span class='shared'>" not in lines[0]
    assert "s = <span class='shared'>a + b</span>" in lines[1]
    assert "    <span class='shared'>return s</span> * 2" in lines[2]


def test_the_given_code_is_greyed_and_never_marked():
    given = {bare("def f(a, b):")}  # the stub's line, without the student's comment
    lines = _lines(marked(CODE, [(0, 0, 2, 20)], given))
    assert lines[0].startswith("<span class='line given'>") and "shared" not in lines[0]
    assert all("<span class='shared'>" in line for line in lines[1:])


def test_groups_are_the_connected_components_above_the_threshold():
    pairs = [
        Pair("a", "b", 0.9),
        Pair("b", "c", 0.75),
        Pair("a", "c", 0.2),
        Pair("d", "e", 0.71),
        Pair("e", "f", 0.69),
        Pair("g", "h", 0.1),
    ]
    assert clusters(pairs, 0.7) == [["a", "b", "c"], ["d", "e"]]
    assert clusters(pairs, 0.95) == []
