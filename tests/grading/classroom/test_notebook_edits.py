"""Edits a student's editor or hands make to a notebook, through the grader's sanitizing step.

Real notebooks (ex01's solutions as handed in, its release) go through the very preprocessors
``coursepkg grade`` gives nbgrader before it runs a notebook (``sanitize_preprocessors``), with a
gradebook that holds ex01's source cells, as ``nbgrader generate_assignment`` records them:

* a cell pasted from another assignment's notebook with its nbgrader marks becomes an ordinary
  cell (nbgrader 0.9's ``OverwriteCells`` stopped the whole notebook on it), and the note says so;
* cell ids an editor repeated, with no graded cell copied, get no note about copies;
* CRLF line endings are not "edited locked cells", while a real edit still is;
* "mentions coursepkg in an answer cell" looks at what the student wrote, not the release's text.

The whole journey of a pasted cell (graded, full marks) is ``h_foreign_cell`` in
``fixtures/grading_hostile.py``, graded by ``test_classroom.py``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from grading_hostile import FOREIGN_TEST_CELL
from traitlets.utils.importstring import import_item

from coursepkg.grading.classroom import review_flags
from coursepkg.grading.classroom.preprocessors import (
    NOTE_MARK,
    RELEASE_ENV,
    sanitize_preprocessors,
)

# The gradebook is made by nbgrader, which runs `alembic` in a process of its own.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
AID = "ex01_attention"
SOURCE = ROOT / "solutions" / AID / f"{AID}.ipynb"
RELEASE = ROOT / "exercises" / AID


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    """A gradebook holding ex01's source cells, saved by nbgrader's own preprocessors."""
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import ClearSolutions, ComputeChecksums, SaveCells

    url = f"sqlite:///{tmp_path_factory.mktemp('gradebook') / 'gradebook.db'}"
    with pytest.MonkeyPatch.context() as patch:  # a new gradebook runs `alembic` from PATH
        patch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        with Gradebook(url) as gb:
            gb.update_or_create_assignment(AID)
    nb = nbformat.read(str(SOURCE), as_version=4)
    resources = {"nbgrader": {"db_url": url, "notebook": AID, "assignment": AID}}
    for preprocessor in (ClearSolutions(), ComputeChecksums(), SaveCells()):
        nb, resources = preprocessor.preprocess(nb, resources)
    return url


def _sanitize(gradebook: str, folder: Path, data: bytes, monkeypatch) -> tuple:
    """The submission ``data`` through ``coursepkg grade``'s sanitizing preprocessors: the
    notebook nbgrader would run, and the grader's notes (one string per note)."""
    from nbgrader.preprocessors import OverwriteCells

    monkeypatch.setenv(RELEASE_ENV, str(RELEASE))
    path = folder / f"{AID}.ipynb"
    path.write_bytes(data)
    nb = nbformat.reads(data.decode("utf-8"), as_version=4)
    resources = {
        "metadata": {"path": str(folder), "name": AID},
        "nbgrader": {"db_url": gradebook, "notebook": AID, "assignment": AID},
    }
    for name in sanitize_preprocessors():
        cls = import_item(name)
        preprocessor = cls(add_missing_cells=True) if cls is OverwriteCells else cls()
        nb, resources = preprocessor.preprocess(nb, resources)
    first = nb.cells[0]
    notes = first.source.split("\n- ")[1:] if first.source.startswith(NOTE_MARK) else []
    return nb, notes


def _solved() -> nbformat.NotebookNode:
    return nbformat.read(str(SOURCE), as_version=4)


def _bytes(nb) -> bytes:
    return json.dumps(nb, indent=1).encode("utf-8")  # as written: nbformat would renumber ids


def _graded(nb) -> list[str]:
    return [_meta(c)["grade_id"] for c in nb.cells if _meta(c).get("grade")]


def test_the_handed_in_solutions_get_no_note(gradebook, tmp_path, monkeypatch):
    nb, notes = _sanitize(gradebook, tmp_path, _bytes(_solved()), monkeypatch)
    assert notes == []
    assert _graded(nb) == _graded(_solved())


def test_a_cell_pasted_from_another_notebook_runs_as_an_ordinary_cell(
    gradebook, tmp_path, monkeypatch
):
    solved = _solved()
    pasted = nbformat.v4.new_code_cell("check_noam_lr(noam_lr)")
    pasted.metadata["nbgrader"] = dict(FOREIGN_TEST_CELL)
    solved.cells.insert(4, pasted)
    nb, notes = _sanitize(gradebook, tmp_path, _bytes(solved), monkeypatch)
    (kept,) = [c for c in nb.cells if c.source == "check_noam_lr(noam_lr)"]
    assert "nbgrader" not in kept.metadata  # an ordinary cell: nothing for nbgrader to grade
    assert _graded(nb) == _graded(_solved())  # this notebook's test cells are all there
    assert notes == [
        "Cells from another notebook (test_noam_lr_visible) ran as ordinary cells: their "
        "nbgrader marks were dropped, and they score nothing."
    ]


def test_repeated_cell_ids_without_a_copy_get_no_note_about_copies(
    gradebook, tmp_path, monkeypatch
):
    solved = _solved()
    for cell in solved.cells[1:4]:
        cell["id"] = solved.cells[0]["id"]  # an editor's save that repeats ids
    nb, notes = _sanitize(gradebook, tmp_path, _bytes(solved), monkeypatch)
    assert notes == [] and _graded(nb) == _graded(_solved())

    copied = _solved()
    visible = next(c for c in copied.cells if _meta(c).get("grade_id", "").endswith("_visible"))
    copied.cells.insert(0, nbformat.from_dict(visible))  # a graded cell really copied
    _, notes = _sanitize(gradebook, tmp_path, _bytes(copied), monkeypatch)
    assert len(notes) == 1 and notes[0].startswith(
        f"Graded cells copied ({_meta(visible)['grade_id']})"
    )


def test_crlf_line_endings_are_no_edit_of_a_locked_cell(gradebook, tmp_path, monkeypatch):
    solved = _solved()
    for cell in solved.cells:
        cell.source = cell.source.replace("\n", "\r\n")
    _, notes = _sanitize(gradebook, tmp_path, _bytes(solved), monkeypatch)
    assert notes == []

    test_cell = next(c for c in solved.cells if _meta(c).get("locked") and _meta(c).get("grade"))
    test_cell.source += "\r\nprint('changed')"
    _, notes = _sanitize(gradebook, tmp_path, _bytes(solved), monkeypatch)
    assert notes == [
        f"The locked cell `{_meta(test_cell)['grade_id']}` had been edited; it was put back to "
        "the original before grading."
    ]


def test_mentions_coursepkg_looks_only_at_what_the_student_wrote():
    aid = "ex11_modern_block"  # a stub's docstring there names coursepkg
    release = nbformat.read(str(ROOT / "exercises" / aid / f"{aid}.ipynb"), as_version=4)
    assert any("coursepkg" in c.source for c in release.cells if not _meta(c).get("locked"))
    assert review_flags(release, release) == []  # untouched: only the given text names it

    answered = nbformat.from_dict(release)
    answer = next(c for c in answered.cells if _meta(c).get("solution"))
    answer.source += "\nfrom coursepkg.attention import scaled_dot_product_attention as ref"
    assert review_flags(answered, release) == ["mentions coursepkg in an answer cell"]
