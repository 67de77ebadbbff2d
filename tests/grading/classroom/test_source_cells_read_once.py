"""The grader's notes and the metadata clean-up read the source's cells from the gradebook
once per notebook (:func:`~coursepkg.grading.classroom.preprocessors._source_cells`), and say
and do what they did when each read them itself."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import nbformat
import pytest

from coursepkg.grading.classroom import preprocessors
from coursepkg.grading.classroom.preprocessors import (
    NOTE_MARK,
    RELEASE_ENV,
    DropEmptyMetadata,
    GraderNotes,
)

pytestmark = pytest.mark.slow  # nbgrader makes the gradebook with `alembic`, a process

ROOT = Path(__file__).resolve().parents[3]
AID = "ex01_attention"
SOURCE = ROOT / "solutions" / AID / f"{AID}.ipynb"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    """A gradebook holding what nbgrader records of ex01's source: its cells by grade id, which
    are locked (with their text) and which are graded."""
    from nbgrader.api import Gradebook

    db = f"sqlite:///{tmp_path_factory.mktemp('source-once') / 'gradebook.db'}"
    with pytest.MonkeyPatch.context() as patch:  # a new gradebook runs `alembic` from PATH
        patch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        gb = Gradebook(db)
    with gb:
        gb.update_or_create_assignment(AID)
        gb.update_or_create_notebook(AID, AID)
        for cell in nbformat.read(str(SOURCE), as_version=4).cells:
            meta, kind = cell.metadata.get("nbgrader", {}), cell.cell_type
            if meta.get("grade_id"):
                locked = bool(meta.get("locked"))
                args = (meta["grade_id"], AID, AID)
                gb.update_or_create_source_cell(
                    *args, cell_type=kind, locked=locked, source=cell.source
                )
            if meta.get("grade"):
                gb.update_or_create_grade_cell(*args, max_score=meta["points"], cell_type=kind)
    return db


def _grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _handed_in(how: str):
    """The solutions, changed by a student in one way."""
    nb = nbformat.read(str(SOURCE), as_version=4)
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    locked = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("locked")]
    if how == "locked_edited":
        locked[0].source += "\nx = 1"
    elif how == "test_deleted":
        nb.cells.remove([c for c in graded if c in locked][-1])
    elif how == "pasted":
        foreign = copy.deepcopy(graded[0])
        foreign.metadata.nbgrader["grade_id"] = "from_another_notebook"
        nb.cells.append(foreign)
    elif how == "copied":
        nb.cells.append(copy.deepcopy(graded[0]))
    return nb


@pytest.mark.parametrize("how", ["untouched", "locked_edited", "test_deleted", "pasted", "copied"])
def test_one_read_of_the_gradebook_and_the_same_notes(url, how, tmp_path, monkeypatch):
    from nbgrader.api import Gradebook

    monkeypatch.setenv(RELEASE_ENV, str(ROOT / "exercises" / AID))
    nb = _handed_in(how)
    nbformat.write(nb, str(tmp_path / f"{AID}.ipynb"))
    opened = []
    real = Gradebook.__init__

    def counted(self, *args, **kwargs):
        opened.append(args)
        real(self, *args, **kwargs)

    monkeypatch.setattr(Gradebook, "__init__", counted)

    def resources() -> dict:
        return {
            "metadata": {"path": str(tmp_path), "name": AID},
            "nbgrader": {"db_url": url, "notebook": AID, "assignment": AID},
        }

    # As nbconvert runs them: one resources dict handed from one preprocessor to the next.
    shared, kept = copy.deepcopy(nb), resources()
    for step in (GraderNotes(), DropEmptyMetadata()):
        shared, kept = step.preprocess(shared, kept)
    assert len(opened) == 1
    # Each with resources of its own reads the gradebook itself, as both did before.
    alone = copy.deepcopy(nb)
    for step in (GraderNotes(), DropEmptyMetadata()):
        alone, _ = step.preprocess(alone, resources())
    assert len(opened) == 3
    for made in (shared, alone):  # the note cell's id is random
        made.cells[0].pop("id", None)
    assert shared == alone
    noted = shared.cells[0].source.startswith(NOTE_MARK)
    assert noted == (how != "untouched")  # each change the student made is noted
    assert kept[preprocessors._SOURCE_KEY]["names"] >= {_grade_id(c) for c in shared.cells} - {None}
