"""Pages show the method: at most a quarter of each page's visible code only records or phrases
a result (scripts/bookkeeping.py says what counts), and the measure itself tells bookkeeping
from method on cells written for the purpose."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))


def _measure():
    spec = importlib.util.spec_from_file_location(
        "bookkeeping", ROOT / "scripts" / "bookkeeping.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page(*cells: str, hidden: str = "") -> str:
    out = [f"```{{code-cell}} ipython3\n{cell}\n```\n" for cell in cells]
    if hidden:
        out.append(f"```{{code-cell}} ipython3\n:tags: [hide-input]\n\n{hidden}\n```\n")
    return "\n".join(out)


def test_the_measure_counts_recording_and_phrasing_not_method():
    measure = _measure()
    method = "model = build()\nloss = train(model)\nassert loss < 1"
    recorded = 'glue("loss", loss, display=False)\nprint(f"loss {loss:.3f}")'
    phrased = 'if loss < 0.5:\n    word = "low"\nelse:\n    word = "high"'
    assert measure.page_share(_page(method)) == (3, 0)
    assert measure.page_share(_page(method + "\n" + recorded)) == (5, 2)
    assert measure.page_share(_page(method, phrased)) == (7, 4)
    # a hidden cell is not visible code, whatever it holds
    assert measure.page_share(_page(method, hidden=recorded + "\n" + phrased)) == (3, 0)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_at_most_a_quarter_of_a_pages_visible_code_is_bookkeeping(page):
    visible, bookkeeping = _measure().page_share(page.read_text(encoding="utf-8"))
    assert visible > 0, page.stem
    assert bookkeeping <= 0.25 * visible, (
        f"{page.stem}: {bookkeeping} of {visible} visible code lines only record or phrase a "
        "result; move them into coursepkg.chapters or a hide-input cell after the method"
    )
