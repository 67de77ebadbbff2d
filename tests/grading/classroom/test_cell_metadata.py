"""``coursepkg grade``'s check of the cells' nbgrader metadata gives nbgrader's verdicts.

:class:`~coursepkg.grading.classroom.preprocessors.CheckCellMetadataSchemaOnce` replaces
nbgrader's ``CheckCellMetadata`` while autograding; it checks the metadata's schema once per
process instead of once per cell. On valid notebooks and on each kind of broken metadata, its
validator must raise what nbgrader's raises (the same error, the same message), and its
preprocessor must accept and refuse the same notebooks.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest
from nbgrader.nbgraderformat import MetadataValidator
from nbgrader.preprocessors import CheckCellMetadata

from coursepkg.grading.classroom import preprocessors
from coursepkg.grading.classroom.preprocessors import CheckCellMetadataSchemaOnce

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOKS = [
    ROOT / "solutions" / "ex01_attention" / "ex01_attention.ipynb",
    ROOT / "exercises" / "ex01_attention" / "ex01_attention.ipynb",
]


def _graded(nb):
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]


def _broken(nb, how: str):
    """A copy of ``nb`` whose nbgrader metadata is broken in one way."""
    nb = copy.deepcopy(nb)
    cell = _graded(nb)[0]
    meta = cell.metadata.nbgrader
    if how == "points_text":
        meta["points"] = "three"
    elif how == "points_negative":
        meta["points"] = -1
    elif how == "no_grade_id":
        del meta["grade_id"]
    elif how == "grade_id_number":
        meta["grade_id"] = 7
    elif how == "extra_key":
        meta["colour"] = "red"
    elif how == "schema_old":
        meta["schema_version"] = 2
    elif how == "schema_new":
        meta["schema_version"] = 4
    elif how == "schema_missing":
        del meta["schema_version"]
    elif how == "duplicate_id":
        _graded(nb)[1].metadata.nbgrader["grade_id"] = meta["grade_id"]
    elif how == "locked_text":
        meta["locked"] = "yes"
    elif how == "null":
        cell.metadata["nbgrader"] = None
    elif how == "task_in_code":
        meta.update(task=True, grade=False, solution=False)
    return nb


BREAKS = [
    None,
    "points_text",
    "points_negative",
    "no_grade_id",
    "grade_id_number",
    "extra_key",
    "schema_old",
    "schema_new",
    "schema_missing",
    "duplicate_id",
    "locked_text",
    "null",
    "task_in_code",
]


def _outcome(call):
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the outcome compared is the error itself
        return type(err), str(err)
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.parent.parent.name)
@pytest.mark.parametrize("how", BREAKS)
def test_the_same_verdict_as_nbgraders_check(path, how):
    nb = nbformat.read(str(path), as_version=4)
    assert _graded(nb), "the notebook has graded cells to break"
    broken = _broken(nb, how) if how else nb
    theirs = _outcome(lambda: MetadataValidator().validate_nb(copy.deepcopy(broken)))
    ours = _outcome(lambda: preprocessors._MetadataValidator().validate_nb(copy.deepcopy(broken)))
    assert ours == theirs
    if how is None:
        assert theirs is None  # the course's notebooks are valid
    own = _outcome(lambda: CheckCellMetadataSchemaOnce().preprocess(copy.deepcopy(broken), {}))
    nbgrader = _outcome(lambda: CheckCellMetadata().preprocess(copy.deepcopy(broken), {}))
    assert own == nbgrader
    # every broken kind is refused (a verdict both could reach by accepting all proves nothing)
    assert (own is None) == (how is None)


def test_the_schema_is_checked_once_per_process(monkeypatch):
    from jsonschema import validators

    schema = MetadataValidator().schema
    cls = validators.validator_for(schema)
    checks = []
    real = cls.check_schema
    monkeypatch.setattr(cls, "check_schema", classmethod(lambda c, s: checks.append(1) or real(s)))
    monkeypatch.setattr(preprocessors, "_SCHEMA_VALIDATORS", {})
    cells = 0
    for path in NOTEBOOKS * 2:
        nb = nbformat.read(str(path), as_version=4)
        cells += sum("nbgrader" in c.metadata for c in nb.cells)
        CheckCellMetadataSchemaOnce().preprocess(nb, {})
    assert cells > 10 and len(checks) == 1
    # nbgrader's own check, for comparison, checks the schema at every cell
    CheckCellMetadata().preprocess(nbformat.read(str(NOTEBOOKS[0]), as_version=4), {})
    assert len(checks) > 2
