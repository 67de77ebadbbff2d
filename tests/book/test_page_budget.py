"""The book's pages against their time budget (``tests/budget.toml``'s ``[pages]``): a page the
last ``make book`` executed (``_build/page_times.json``, written by ``scripts/build_book.py``)
that took more than twice its budget times the machine factor while it ran fails, naming the
page and the numbers. Skipped when the last build executed no page (everything came from the
cache) or the book is not built; ``COURSE_REQUIRE_BOOK=1`` (``.ci/run``, after a cold build)
makes the record mandatory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import budgets
import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMES = ROOT / "_build" / "page_times.json"


def _times() -> dict[str, dict[str, float]]:
    if not TIMES.is_file():
        if os.environ.get("COURSE_REQUIRE_BOOK"):
            pytest.fail(f"COURSE_REQUIRE_BOOK is set but {TIMES} does not exist: run `make book`")
        pytest.skip("no page times: the last `make book` executed no page, or it did not run")
    return json.loads(TIMES.read_text(encoding="utf-8"))["pages"]


def test_no_page_took_more_than_twice_its_budget():
    pages = budgets.load()["pages"]
    verdicts = [
        budgets.Verdict(name, row["seconds"], row["factor"], pages.get(name))
        for name, row in _times().items()
    ]
    over = [v.message() for v in verdicts if v.over]
    assert not over, "pages over their time budget (tests/budget.toml):\n" + "\n".join(over)


def test_every_page_budget_names_a_page_of_the_book():
    # A page renamed or removed would leave its budget behind and the new name unbudgeted.
    stale = [name for name in budgets.load()["pages"] if not (ROOT / name).is_file()]
    assert not stale, f"tests/budget.toml budgets pages that do not exist: {stale}"
