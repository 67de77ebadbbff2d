"""The book's pages against their time budget (``tests/budget.toml``'s ``[pages]``): a page the
last ``make book`` executed (``_build/page_times.json``, written by ``scripts/build_book.py``)
that took more than twice its budget times the machine factor while it ran fails, naming the
page and the numbers. Skipped when the last build executed no page (everything came from the
cache) or the book is not built; ``COURSE_REQUIRE_BOOK=1`` (``.ci/run``, after a cold build)
makes the record mandatory."""

from __future__ import annotations

import importlib.util
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


def _build_book_module():
    spec = importlib.util.spec_from_file_location("build_book", ROOT / "scripts" / "build_book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_attempt_the_watchdog_gave_up_is_not_the_pages_cost(tmp_path, monkeypatch):
    # A stall costs its window and a second run: the build's watchdog pays it, not the page.
    build_book = _build_book_module()
    runs = tmp_path / "page_runs.jsonl"
    stalled = {"seconds": 155.0, "why": "book/05.md: cell 2 made no progress for 150 s"}
    rows = [
        {
            "page": str(tmp_path / "book/05.md"),
            "seconds": 185.9,
            "end": 1000.0,
            "succeeded": True,
            "given_up": [stalled],
        },
        {
            "page": str(tmp_path / "book/06.md"),
            "seconds": 12.5,
            "end": 1000.0,
            "succeeded": True,
            "given_up": [],
        },
        {"page": str(tmp_path / "book/07.md"), "seconds": 8.0, "end": 1000.0, "succeeded": True},
    ]
    runs.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setattr(build_book, "RUNS", runs)
    monkeypatch.setattr(build_book, "BOOK", tmp_path)
    pages = build_book.page_times([(990.0, 1.5)])
    assert pages["book/05.md"]["seconds"] == 30.9
    assert pages["book/05.md"]["given_up"] == [stalled]
    assert pages["book/06.md"] == {"seconds": 12.5, "factor": 1.5}
    assert pages["book/07.md"] == {"seconds": 8.0, "factor": 1.5}  # a line of an older build
