"""The nbgrader preprocessors ``coursepkg grade`` adds to autograding and feedback: the grader's
notes at the top of a graded notebook, and two workarounds for nbgrader failures one student's
notebook could otherwise cause. They run on the grading workers, inside nbgrader.
"""

from __future__ import annotations

import json
import os
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import nbformat
from nbgrader.nbgraderformat import MetadataValidator, ValidationError
from nbgrader.nbgraderformat.common import BaseMetadataValidator
from nbgrader.preprocessors import CheckCellMetadata, ClearHiddenTests, NbGraderPreprocessor
from traitlets import List, Unicode

from ..kernel.sandbox import NOT_GRADED_ENV
from ..release import HIDDEN_MARK, hide_hidden_test_outputs, salt_hidden_seeds

__all__ = [
    "NOTE_MARK",
    "RELEASE_ENV",
    "CheckCellMetadataSchemaOnce",
    "DefuseHiddenMarkers",
    "DropEmptyMetadata",
    "GraderNotes",
    "HideHiddenTestOutputs",
    "SaltHiddenSeeds",
    "feedback_preprocessors",
    "sanitize_preprocessors",
]

#: The first line of the grader's note cell.
NOTE_MARK = "**Notes from the grader** (coursepkg grade)"
#: Tells :class:`GraderNotes` where the release notebooks are.
RELEASE_ENV = "COURSEPKG_RELEASE_DIR"
#: The notes every feedback gets after the course's own preprocessors (the late policy's and
#: the regrade requests').
_FEEDBACK_NOTES = (
    "coursepkg.grading.policy.late.LateNote",
    "coursepkg.grading.policy.regrade.RegradeNote",
)


def sanitize_preprocessors() -> list[str]:
    """nbgrader's ``Autograde.sanitize_preprocessors`` for ``coursepkg grade``: nbgrader's own,
    with :class:`GraderNotes` first (it sees the submission as handed in),
    :class:`DropEmptyMetadata` before ``OverwriteCells`` and :class:`SaltHiddenSeeds` after it."""
    return [
        f"{__name__}.GraderNotes",
        "nbgrader.preprocessors.ClearOutput",
        "nbgrader.preprocessors.DeduplicateIds",
        f"{__name__}.DropEmptyMetadata",
        "nbgrader.preprocessors.OverwriteKernelspec",
        "nbgrader.preprocessors.OverwriteCells",
        f"{__name__}.SaltHiddenSeeds",  # after the hidden tests are put back
        f"{__name__}.CheckCellMetadataSchemaOnce",  # nbgrader's CheckCellMetadata, faster
    ]


def _grade_id(cell: Any) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _lines(text: str) -> str:
    """A cell's text as compared with the original: line endings made ``\n`` (an editor's
    CRLF is no edit), the ends stripped."""
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


# Where :func:`_source_cells` keeps what it read, in the resources nbconvert hands from one
# preprocessor to the next while it converts one notebook.
_SOURCE_KEY = "coursepkg_source_cells"


def _source_cells(resources: dict) -> dict | None:
    """This notebook's cells in nbgrader's source, as the gradebook records them: ``names``
    (every cell's grade id), ``locked`` (a locked cell's grade id -> its source) and ``graded``
    (the grade cells' ids); None when not known. Read once per notebook being converted (kept
    in ``resources``): :class:`GraderNotes` and :class:`DropEmptyMetadata` opened the
    gradebook three times a student for it."""
    if _SOURCE_KEY not in resources:
        from nbgrader.api import Gradebook, MissingEntry

        info = resources.get("nbgrader", {})
        try:
            with Gradebook(info["db_url"]) as gb:
                source = gb.find_notebook(info["notebook"], info["assignment"])
                resources[_SOURCE_KEY] = {
                    "names": {cell.name for cell in source.source_cells},
                    "locked": {c.name: c.source for c in source.source_cells if c.locked},
                    "graded": [cell.name for cell in source.grade_cells],
                }
        except (KeyError, MissingEntry):
            resources[_SOURCE_KEY] = None
    return resources[_SOURCE_KEY]


class GraderNotes(NbGraderPreprocessor):
    """Put a note cell at the top of the notebook being autograded, listing what the grader
    changed or noticed: edited locked cells (nbgrader restores them), a graded cell copied
    (the same grade id twice), a cell pasted from another notebook (a grade id this notebook
    lacks: it runs as an ordinary cell), deleted test cells (nbgrader adds them back), the
    reason a notebook was not graded. Each note says only what happened: cell ids an editor
    repeated without a copied graded cell, and CRLF line endings, change nothing and get none.

    Runs first in nbgrader's sanitizing step, so it sees the submission as handed in.
    """

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        notes: list[str] = []
        reason = os.environ.get(NOT_GRADED_ENV, "")
        if reason:
            notes.append(f"Your notebook was not graded: {reason}. Every test scores 0.")
        meta = resources.get("metadata", {})
        raw_path = Path(meta.get("path", ".")) / f"{meta.get('name', '')}.ipynb"
        try:
            raw = json.loads(raw_path.read_text(encoding="utf-8"))
            grade_ids = Counter(_grade_id(c) for c in raw.get("cells", []) if _grade_id(c))
        except (OSError, ValueError, AttributeError):
            grade_ids = Counter()
        info = resources.get("nbgrader", {})
        source = _source_cells(resources)
        known = None if source is None else source["names"]
        dup = sorted(k for k, n in grade_ids.items() if n > 1 and (known is None or k in known))
        if dup and not reason:
            notes.append(
                f"Graded cells copied ({', '.join(dup)}): a copied graded cell counts once; only "
                "its last copy keeps nbgrader's marks, the others run as ordinary cells."
            )
        foreign = sorted(k for k in grade_ids if known is not None and k not in known)
        if foreign and not reason:
            notes.append(
                f"Cells from another notebook ({', '.join(foreign)}) ran as ordinary cells: "
                "their nbgrader marks were dropped, and they score nothing."
            )
        present: set[str] = set()
        # The release is what the student was given (hidden tests already stripped out).
        release_file = Path(os.environ.get(RELEASE_ENV, "")) / f"{info.get('notebook')}.ipynb"
        try:
            release = nbformat.read(str(release_file), as_version=4)
            originals = {_grade_id(c): c.source for c in release.cells if _grade_id(c)}
        except (OSError, ValueError, KeyError):
            originals = {}
        missing: list[str] = []
        if source is not None:
            # A locked cell is as handed out if it reads like the release (hidden tests
            # stripped) or like nbgrader's source (hidden tests in).
            locked = {name: {_lines(text)} for name, text in source["locked"].items()}
            for grade_id, text in originals.items():
                locked.get(grade_id, set()).add(_lines(text))
            for cell in nb.cells:
                grade_id = _grade_id(cell)
                if not grade_id:
                    continue
                present.add(grade_id)
                if grade_id in locked and _lines(cell.source) not in locked[grade_id]:
                    if not reason:
                        notes.append(
                            f"The locked cell `{grade_id}` had been edited; it was put back "
                            "to the original before grading."
                        )
            missing = sorted(
                name for name in source["graded"] if name not in present and name in locked
            )
        if missing and not reason:
            notes.append(
                f"Test cells missing from your notebook were added back: {', '.join(missing)}."
            )
        if notes:
            text = NOTE_MARK + "\n\n" + "\n".join(f"- {n}" for n in notes)
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(text))
        return nb, resources


class DropEmptyMetadata(NbGraderPreprocessor):
    """Remove the ``nbgrader`` metadata of cells that are no cell of this notebook: the empty
    metadata nbgrader's ``DeduplicateIds`` leaves on the extra copies of a duplicated cell, and
    the marks of a cell pasted from another notebook (a grade id this notebook's source lacks,
    as copying a cell between notebooks in JupyterLab keeps).

    nbgrader 0.9's ``OverwriteCells`` drops an unknown ``grade_id`` but keeps the rest of the
    metadata, and its ``add_missing_task_cells`` then reads ``grade_id`` from every cell that
    has ``nbgrader`` metadata: a ``KeyError`` that stops the whole notebook, so a student who
    pasted or copied a cell would score 0. Without the metadata the cell is an ordinary cell.
    """

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        source = _source_cells(resources)
        known = None if source is None else source["names"]
        for cell in nb.cells:
            if "nbgrader" not in cell.get("metadata", {}):
                continue
            grade_id = cell.metadata.nbgrader.get("grade_id")
            if not grade_id or (known is not None and grade_id not in known):
                del cell.metadata["nbgrader"]
        return nb, resources


# Per schema version, a validator of cells' nbgrader metadata, its schema checked once.
_SCHEMA_VALIDATORS: dict[int, Any] = {}


class _SchemaCheckedOnce(BaseMetadataValidator):
    """Validates a cell's nbgrader metadata as nbgrader's ``BaseMetadataValidator`` does
    (``jsonschema.validate``), with a validator made once per process: ``jsonschema.validate``
    first checks the schema itself against its meta-schema, on every call, so once per cell of
    every notebook (about 6 % of a grading worker's CPU a student). The verdict is the same:
    ``jsonschema.validate`` without that check, on the same schema."""

    def validate_cell(self, cell: Any) -> None:
        meta = cell.metadata.get("nbgrader") if "metadata" in cell else None
        if meta is None or meta.get("schema_version", 0) != self.schema_version:
            super().validate_cell(cell)  # no metadata, or nbgrader's error for its version
            return
        from jsonschema import validators
        from jsonschema.exceptions import best_match

        validator = _SCHEMA_VALIDATORS.get(self.schema_version)
        if validator is None:
            cls = validators.validator_for(self.schema)
            cls.check_schema(self.schema)
            validator = _SCHEMA_VALIDATORS[self.schema_version] = cls(self.schema)
        error = best_match(validator.iter_errors(meta))
        if error is not None:
            raise error


class _MetadataValidator(MetadataValidator, _SchemaCheckedOnce):
    """nbgrader's ``MetadataValidator`` (its checks of grade ids, cell types, points), whose
    call to its base's ``validate_cell`` reaches :class:`_SchemaCheckedOnce` first."""


class CheckCellMetadataSchemaOnce(CheckCellMetadata):
    """nbgrader's ``CheckCellMetadata`` (the cells' nbgrader metadata valid, grade ids unique),
    the same checks and messages, with the metadata's schema checked once per process
    (:class:`_SchemaCheckedOnce`). Listed in its place by :func:`sanitize_preprocessors`."""

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        try:
            _MetadataValidator().validate_nb(nb)
        except ValidationError as err:
            self.log.error(traceback.format_exc())
            msg = "Notebook failed to validate; the nbgrader metadata may be corrupted."
            self.log.error(msg)
            raise ValidationError(msg) from err
        return nb, resources


class DefuseHiddenMarkers(NbGraderPreprocessor):
    """Before feedback: drop hidden-test regions from cells that are not test cells.

    nbgrader's ``ClearHiddenTests`` refuses to make feedback at all when a student's own cell
    contains its ``BEGIN HIDDEN TESTS`` marker (a copied test cell, or the text typed in an
    answer), so that student would get no feedback. Here such a region is replaced by a comment
    (as ``ClearHiddenTests`` would do to a test cell), an unterminated one up to the cell's end.
    The autograded notebook and its grades are not touched; this is the feedback's copy.
    """

    def preprocess_cell(self, cell: Any, resources: dict, index: int) -> tuple[Any, dict]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade") or (
            "BEGIN HIDDEN TESTS" not in cell.source and "END HIDDEN TESTS" not in cell.source
        ):
            return cell, resources
        kept, inside = [], False
        for line in cell.source.split("\n"):
            if "BEGIN HIDDEN TESTS" in line:
                if not inside:
                    kept.append("# (a hidden-test region here was removed by the grader)")
                inside = True
            elif "END HIDDEN TESTS" in line:
                inside = False
            elif not inside:
                kept.append(line)
        cell.source = "\n".join(kept)
        return cell, resources


class HideHiddenTestOutputs(ClearHiddenTests):
    """Before feedback: nbgrader's ``ClearHiddenTests`` (the hidden tests' source removed), with
    the outputs first: no output of a hidden-test cell shows its code (a traceback keeps only
    ``ename: evalue``; :func:`~coursepkg.grading.release.hide_hidden_test_outputs`), which
    nbgrader's leaves. Listed in its place in ``nbgrader_config.py``."""

    # nbconvert hands every preprocessor its display_data_priority setting; declared as a
    # setting here (nbgrader's base has it as a plain trait), it is taken without a warning.
    display_data_priority = List(NbGraderPreprocessor().display_data_priority).tag(config=True)

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        hide_hidden_test_outputs(nb)
        return super().preprocess(nb, resources)


class SaltHiddenSeeds(NbGraderPreprocessor):
    """While autograding: the seeds of the hidden tests salted with the course's secret
    (:func:`~coursepkg.grading.release.salt_hidden_seeds`), so that the hidden tests in a
    public copy of ``solutions/`` are not the inputs that grade. Runs after nbgrader's
    ``OverwriteCells`` has put the hidden tests back, before any cell runs."""

    salt = Unicode("", help="the course's secret (course_secret.txt); empty: no salt").tag(
        config=True
    )

    def preprocess_cell(self, cell: Any, resources: dict, index: int) -> tuple[Any, dict]:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if self.salt and grade_id and HIDDEN_MARK in cell.source:
            cell.source = salt_hidden_seeds(cell.source, self.salt, grade_id)
        return cell, resources


def feedback_preprocessors(config: Any) -> list:
    """nbgrader's ``GenerateFeedback`` preprocessors for ``coursepkg grade``: the course's own
    (``config``, an nbgrader app's configuration) or nbgrader's defaults, after
    :class:`DefuseHiddenMarkers`, then the note on a late submission and the regrade requests
    (:class:`~coursepkg.grading.policy.late.LateNote`,
    :class:`~coursepkg.grading.policy.regrade.RegradeNote`), unless the course lists them
    already (by any name: a course configured before they moved names them under
    ``coursepkg.grading.term``, the same classes)."""
    from nbgrader.converters import GenerateFeedback

    own = config.GenerateFeedback.get("preprocessors") or list(
        GenerateFeedback.class_traits()["preprocessors"].default()
    )
    from ..policy.late import ReassessPenalty

    listed = {_resolved(p) for p in own}
    return [
        *([] if ReassessPenalty in listed else ["coursepkg.grading.policy.late.ReassessPenalty"]),
        f"{__name__}.DefuseHiddenMarkers",
        *([] if HideHiddenTestOutputs in listed else [f"{__name__}.HideHiddenTestOutputs"]),
        *own,
        *(n for n in _FEEDBACK_NOTES if _resolved(n) not in listed),
    ]


def _resolved(name: Any) -> Any:
    """The preprocessor class a configuration names (its dotted path, or the class itself);
    a name that cannot be imported stays the name (nbgrader reports it when it runs)."""
    from traitlets.utils.importstring import import_item

    if not isinstance(name, str):
        return name
    try:
        return import_item(name)
    except (ImportError, AttributeError, ValueError):
        return name
