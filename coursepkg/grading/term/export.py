"""``coursepkg export``: the class's grades from nbgrader's gradebook (SQLite or PostgreSQL) as
the CSV file a learning platform imports.

* ``canvas``: Canvas's gradebook layout: ``Student, ID, SIS User ID, SIS Login ID, Section``,
  then one column per assignment (and per graded part), and a ``Points Possible`` row under
  the header, as Canvas's own gradebook export writes it and its import reads it.
* ``gradescope``: Gradescope's layout: ``First Name, Last Name, SID, Email``, then per column
  the score and its ``- Max Points``, as Gradescope's grade download writes it.
* ``csv``: ``student_id`` and the same score columns, for anything else.

The score is nbgrader's: the points (hand grades and answered regrade requests included) less
the late penalty, never below 0; a student with no submission scores 0, as in ``nbgrader
export``. Students are matched to the platform's ids by a mapping file (:func:`read_mapping`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CANVAS_IDENTITY", "GRADESCOPE_IDENTITY", "FORMATS", "Column", "export", "read_mapping"]

#: The identity columns of Canvas's gradebook CSV, in its order.
CANVAS_IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
#: The identity columns of Gradescope's roster and grade CSVs, in its order.
GRADESCOPE_IDENTITY = ("First Name", "Last Name", "SID", "Email")
FORMATS = ("canvas", "gradescope", "csv")


@dataclass
class Column:
    """One score column: an assignment, or one graded part (cell) of it."""

    title: str
    max_points: float
    scores: dict[str, float] = field(default_factory=dict)  # student id -> points


def read_mapping(path: str | Path, id_column: str = "student_id") -> dict[str, dict[str, str]]:
    """The student-id mapping file: a CSV with a header, one row per student.

    Its ``id_column`` holds nbgrader's student id; its other columns are copied under their
    own names, so the platform's columns go in as they are named there (``Student``, ``ID``,
    ``SIS User ID``, ``SIS Login ID``, ``Section`` for Canvas; ``First Name``, ``Last Name``,
    ``SID``, ``Email`` for Gradescope). A roster downloaded from the platform with a
    ``student_id`` column added is such a file.

    Raises:
        ValueError: no such column, an empty or repeated student id.
    """
    path = Path(path)
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if id_column not in (reader.fieldnames or []):
            raise ValueError(
                f"the mapping file {path} has no {id_column!r} column (expected a header with "
                f"{id_column!r}; found: {', '.join(reader.fieldnames or []) or 'no header'})"
            )
        mapping: dict[str, dict[str, str]] = {}
        for line, row in enumerate(reader, start=2):
            sid = (row.get(id_column) or "").strip()
            if not sid:
                raise ValueError(f"the mapping file {path}, line {line}: empty {id_column!r}")
            if sid in mapping:
                raise ValueError(f"the mapping file {path}, line {line}: {sid!r} appears twice")
            mapping[sid] = {k: (v or "").strip() for k, v in row.items() if k != id_column}
    return mapping


def _columns(gb: Any, assignments: list[str], parts: bool) -> list[Column]:
    """One column per assignment (nbgrader's final score), then its parts if asked."""
    from nbgrader.api import MissingEntry

    columns = []
    for name in assignments:
        assignment = gb.find_assignment(name)
        total = Column(name, float(assignment.max_score))
        cells: dict[str, Column] = {}
        for nb in assignment.notebooks:
            for cell in nb.grade_cells:
                cells[f"{nb.name}/{cell.name}"] = Column(
                    f"{name}: {cell.name}" if len(assignment.notebooks) == 1 else
                    f"{name}: {nb.name}/{cell.name}", float(cell.max_score))  # fmt: skip
        for student in gb.students:
            try:
                sub = gb.find_submission(name, student.id)
            except MissingEntry:
                total.scores[student.id] = 0.0
                continue
            total.scores[student.id] = max(0.0, sub.score - (sub.late_submission_penalty or 0.0))
            for nb in sub.notebooks:
                for grade in nb.grades:
                    cells[f"{nb.name}/{grade.name}"].scores[student.id] = float(grade.score)
        columns.append(total)
        if parts:
            columns.extend(cells.values())
    return columns


def _identity(fmt: str, sid: str, known: dict[str, str], student: Any) -> list[str]:
    first = known.get("First Name") or (student.first_name if student else "") or ""
    last = known.get("Last Name") or (student.last_name if student else "") or ""
    if fmt == "canvas":
        name = known.get("Student") or (f"{last}, {first}" if first and last else first or last)
        return [name, *(known.get(k, "") for k in CANVAS_IDENTITY[1:])]
    if fmt == "gradescope":
        email = known.get("Email") or (student.email if student else "") or ""
        return [first, last, known.get("SID", ""), email]
    return [sid]


def _header(fmt: str, columns: list[Column], extra: list[str]) -> list[list[str]]:
    if fmt == "canvas":
        return [
            [*CANVAS_IDENTITY, *(c.title for c in columns)],
            ["Points Possible", "", "", "", "", *(f"{c.max_points:g}" for c in columns)],
        ]
    if fmt == "gradescope":
        titles = [t for c in columns for t in (c.title, f"{c.title} - Max Points")]
        return [[*GRADESCOPE_IDENTITY, *titles]]
    return [["student_id", *extra, *(c.title for c in columns)]]


def _check_mapping(fmt: str, students: list[str], mapping: dict[str, dict[str, str]] | None):
    if fmt == "csv" and mapping is None:
        return
    if mapping is None:
        raise ValueError(
            f"--format {fmt} needs a student-id mapping file (--mapping FILE: a CSV with a "
            "student_id column and the platform's own id columns)"
        )
    missing = sorted(set(students) - set(mapping))
    if missing:
        raise ValueError(
            f"the mapping file has no row for {len(missing)} student(s) in the gradebook: "
            f"{', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''} (expected one row "
            "per student, or the platform would not know whose grade it is)"
        )
    needed = {"canvas": CANVAS_IDENTITY[:4], "gradescope": ("SID", "Email")}[fmt]
    for sid in students:
        if not any(mapping[sid].get(k) for k in needed):
            raise ValueError(
                f"the mapping file gives {sid!r} none of the columns {fmt} matches students by "
                f"(expected one of {', '.join(needed)} to be filled in)"
            )


def export(
    url: str,
    course_id: str,
    assignments: list[str] | None,
    fmt: str,
    to: str | Path,
    *,
    mapping: dict[str, dict[str, str]] | None = None,
    parts: bool = False,
) -> Path:
    """Write the grades of ``assignments`` (None: all, in the gradebook's order) as ``fmt``.

    Args:
        url: the gradebook's SQLAlchemy URL.
        course_id: nbgrader's course id.
        assignments: assignment ids, or None for every assignment in the gradebook.
        fmt: ``canvas``, ``gradescope`` or ``csv``.
        to: the CSV file to write.
        mapping: from :func:`read_mapping`; needed for ``canvas`` and ``gradescope``.
        parts: also one column per graded part (cell).

    Returns:
        The file written.

    Raises:
        ValueError: unknown format or assignment, a student the mapping does not know.
    """
    from nbgrader.api import Gradebook, MissingEntry

    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    with Gradebook(url, course_id) as gb:
        known = [a.name for a in gb.assignments]
        chosen = known if assignments is None else assignments
        unknown = [a for a in chosen if a not in known]
        if unknown or not chosen:
            raise ValueError(
                f"the gradebook has no assignment {', '.join(map(repr, unknown)) or 'at all'} "
                f"(it has: {', '.join(known) or 'none'})"
            )
        students = {s.id: s for s in gb.students}
        _check_mapping(fmt, sorted(students), mapping)
        columns = _columns(gb, chosen, parts)
        extra = sorted({k for row in (mapping or {}).values() for k in row}) if fmt == "csv" else []
        rows = _header(fmt, columns, extra)
        everyone = sorted(set(students) | set(mapping or {}))
        for sid in everyone:
            known_ids = (mapping or {}).get(sid, {})
            try:
                student = gb.find_student(sid)
            except MissingEntry:
                student = None
            cells = []
            for c in columns:
                score = f"{c.scores.get(sid, 0.0):g}"
                cells.extend([score, f"{c.max_points:g}"] if fmt == "gradescope" else [score])
            identity = _identity(fmt, sid, known_ids, student)
            rows.append([*identity, *(known_ids.get(k, "") for k in extra), *cells])
    out = Path(to)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return out
