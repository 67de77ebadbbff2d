"""``coursepkg export``: the class's grades from nbgrader's gradebook (SQLite or PostgreSQL) as
the CSV file a learning platform imports.

* ``canvas``: Canvas's gradebook layout: ``Student, ID, SIS User ID, SIS Login ID, Section``,
  then one column per assignment (and per graded part), and a ``Points Possible`` row under
  the header, as Canvas's own gradebook export writes it and its import reads it.
* ``gradescope``: Gradescope's layout: ``First Name, Last Name, SID, Email``, then per
  assignment the score, ``- Max Points``, ``- Submission Time`` and ``- Lateness (H:M:S)``
  (after the extensions), and ``Total Lateness (H:M:S)`` last, as Gradescope's grade download
  writes it (a part has its score and ``- Max Points`` only). Gradescope itself imports no grades
  from a file; this is for what reads its downloads.
* ``csv``: ``student_id`` and the same score columns, for anything else.

The score is nbgrader's: the points (hand grades and answered regrade requests included) less
the late penalty, never below 0; a student with no submission scores 0, as in ``nbgrader
export``. With the parts, a ``<assignment>: late penalty`` column (0 points possible) holds the
points the penalty took off, negative, so that the parts and it add up to the score. Students
are matched to the platform's ids by a mapping file (:func:`read_mapping`).

Without named assignments, only those with at least one submission are written (an assignment
released into the gradebook but never handed in would be a column of zeros, which a platform's
import turns into a zero-score assignment or writes over a real one); the :class:`Exported`
result says what was written and what was skipped.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..policy.late import final_score, seconds_late

__all__ = [
    "CANVAS_IDENTITY",
    "GRADESCOPE_IDENTITY",
    "FORMATS",
    "Column",
    "Exported",
    "export",
    "read_mapping",
]

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
    # an assignment's own column: student id -> (handed in, UTC; seconds late after extensions)
    handed_in: dict[str, tuple[Any, float]] | None = None


@dataclass
class Exported:
    """What :func:`export` wrote.

    Attributes:
        path: the CSV file.
        assignments: the assignments written, in the file's order.
        skipped: the gradebook's assignments left out because nobody handed them in.
        students: the rows written (one per student).
        unmapped: students of the gradebook left out, missing from the mapping.
        warnings: columns the format expects that the mapping lacks.
    """

    path: Path
    assignments: list[str]
    skipped: list[str] = field(default_factory=list)
    students: int = 0
    unmapped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The report a person reads after the export."""
        lines = [
            f"wrote {self.path}: {self.students} student(s), {len(self.assignments)} "
            f"assignment(s): {', '.join(self.assignments)}"
        ]
        if self.skipped:
            lines.append(
                f"skipped {len(self.skipped)} assignment(s) nobody has handed in: "
                f"{', '.join(self.skipped)} (--include-empty writes them, as zeros)"
            )
        if self.unmapped:
            lines.append(
                f"left out {len(self.unmapped)} student(s) missing from the mapping "
                f"(--skip-unmapped): {', '.join(self.unmapped)}"
            )
        lines.extend(f"WARNING: {w}" for w in self.warnings)
        return lines


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


def _columns(gb: Any, assignments: list[str], parts: bool, config: Any = None) -> list[Column]:
    """One column per assignment (nbgrader's final score, with when each student handed it
    in), then its parts and the late penalty if asked."""
    from nbgrader.api import MissingEntry

    columns = []
    for name in assignments:
        assignment = gb.find_assignment(name)
        total = Column(name, float(assignment.max_score), handed_in={})
        penalty = Column(f"{name}: late penalty", 0.0)
        cells: dict[str, Column] = {}
        for nb in assignment.notebooks:
            for cell in nb.grade_cells:
                cells[f"{nb.name}/{cell.name}"] = Column(
                    f"{name}: {cell.name}"
                    if len(assignment.notebooks) == 1
                    else f"{name}: {nb.name}/{cell.name}",
                    float(cell.max_score),
                )
        for student in gb.students:
            try:
                sub = gb.find_submission(name, student.id)
            except MissingEntry:
                total.scores[student.id] = 0.0
                continue
            total.scores[student.id] = final_score(sub)
            total.handed_in[student.id] = (sub.timestamp, seconds_late(config, sub))
            penalty.scores[student.id] = final_score(sub) - float(sub.score)  # <= 0
            for nb in sub.notebooks:
                for grade in nb.grades:
                    cells[f"{nb.name}/{grade.name}"].scores[student.id] = float(grade.score)
        columns.append(total)
        if parts:
            columns.extend([*cells.values(), penalty])
    return columns


def _hms(seconds: float) -> str:
    """Gradescope's lateness: hours (any number), minutes, seconds."""
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


def _cells(fmt: str, columns: list[Column], sid: str) -> list[str]:
    """A student's score cells (Gradescope's: with the maximum, and for an assignment when it
    was handed in and how late, then the total lateness)."""
    cells: list[str] = []
    total = 0.0
    for c in columns:
        score = f"{c.scores.get(sid, 0.0):g}"
        if fmt != "gradescope":
            cells.append(score)
            continue
        cells.extend([score, f"{c.max_points:g}"])
        if c.handed_in is not None:
            when, late = c.handed_in.get(sid, (None, 0.0))
            total += late
            stamp = f"{when:%Y-%m-%d %H:%M:%S} +0000" if when is not None else ""
            cells.extend([stamp, _hms(late) if when is not None else ""])
    return [*cells, _hms(total)] if fmt == "gradescope" else cells


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
        titles = [
            t
            for c in columns
            for t in (c.title, f"{c.title} - Max Points")
            + (
                (f"{c.title} - Submission Time", f"{c.title} - Lateness (H:M:S)")
                if c.handed_in is not None
                else ()
            )
        ]
        return [[*GRADESCOPE_IDENTITY, *titles, "Total Lateness (H:M:S)"]]
    return [["student_id", *extra, *(c.title for c in columns)]]


def _check_mapping(
    fmt: str, students: list[str], mapping: dict[str, dict[str, str]] | None, skip: bool
) -> list[str]:
    """Check the mapping against the gradebook's students; the columns it lacks, as warnings."""
    if fmt == "csv" and mapping is None:
        return []
    if mapping is None:
        raise ValueError(
            f"--format {fmt} needs a student-id mapping file (--mapping FILE: a CSV with a "
            "student_id column and the platform's own id columns)"
        )
    missing = sorted(set(students) - set(mapping))
    if missing and not skip:
        raise ValueError(
            f"the mapping file has no row for {len(missing)} student(s) in the gradebook: "
            f"{', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''} (expected one row "
            "per student, or the platform would not know whose grade it is; for a student "
            "who dropped the course, --skip-unmapped leaves them out and lists them, or "
            "`nbgrader db student remove ID` removes them from the gradebook)"
        )
    if fmt == "csv":
        return []
    needed = {"canvas": CANVAS_IDENTITY[:4], "gradescope": ("SID", "Email")}[fmt]
    expected = CANVAS_IDENTITY if fmt == "canvas" else GRADESCOPE_IDENTITY
    header = {k for row in mapping.values() for k in row}
    absent = [k for k in expected if k not in header]
    warnings = (
        [
            f"the mapping has no column {', '.join(map(repr, absent))} (a {fmt} column; "
            f"its columns: {', '.join(sorted(header)) or 'none'}): left empty in the file"
        ]
        if absent
        else []
    )
    for sid in sorted(set(students) & set(mapping)):
        if not any(mapping[sid].get(k) for k in needed):
            raise ValueError(
                f"the mapping file gives {sid!r} none of the columns {fmt} matches students by "
                f"(expected one of {', '.join(needed)} to be filled in)"
            )
    return warnings


def _choose(gb: Any, assignments: list[str] | None, include_empty: bool):
    """The assignments to write (named ones as given; else those handed in, by name) and the
    ones left out for having no submission."""
    known = [a.name for a in gb.assignments]
    unknown = [a for a in assignments or [] if a not in known]
    if unknown or not known:
        raise ValueError(
            f"the gradebook has no assignment {', '.join(map(repr, unknown)) or 'at all'} "
            f"(it has: {', '.join(known) or 'none'})"
        )
    if assignments:
        return list(dict.fromkeys(assignments)), []
    handed_in = {a.name for a in gb.assignments if a.num_submissions > 0}
    chosen = sorted(known) if include_empty else sorted(handed_in)
    if not chosen:
        raise ValueError(
            f"nobody has handed in any of the gradebook's {len(known)} assignment(s) yet "
            "(expected a graded submission; --include-empty writes them anyway, as zeros)"
        )
    return chosen, sorted(set(known) - set(chosen))


def export(
    url: str,
    course_id: str,
    assignments: list[str] | None,
    fmt: str,
    to: str | Path,
    *,
    mapping: dict[str, dict[str, str]] | None = None,
    parts: bool = False,
    include_empty: bool = False,
    skip_unmapped: bool = False,
    config: Any = None,
) -> Exported:
    """Write the grades of ``assignments`` as ``fmt``.

    Args:
        url: the gradebook's SQLAlchemy URL.
        course_id: nbgrader's course id.
        assignments: assignment ids in the file's order, or None for every assignment of the
            gradebook with at least one submission, by name.
        fmt: ``canvas``, ``gradescope`` or ``csv``.
        to: the CSV file to write.
        mapping: from :func:`read_mapping`; needed for ``canvas`` and ``gradescope``.
        parts: also one column per graded part (cell).
        include_empty: with ``assignments=None``, also the assignments nobody handed in.
        skip_unmapped: leave out (and list) the gradebook's students the mapping lacks,
            instead of an error (a student who dropped the course).
        config: the course's configuration, whose late policy's extensions (the extensions
            file's too) the lateness columns count (None: the gradebook's extensions only).

    Returns:
        What was written and what was left out (:class:`Exported`).

    Raises:
        ValueError: unknown format or assignment, nothing handed in, a student the mapping
            does not know (without ``skip_unmapped``).
    """
    from nbgrader.api import Gradebook, MissingEntry

    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    with Gradebook(url, course_id) as gb:
        chosen, skipped = _choose(gb, assignments, include_empty)
        students = {s.id: s for s in gb.students}
        warnings = _check_mapping(fmt, sorted(students), mapping, skip_unmapped)
        unmapped = sorted(set(students) - set(mapping)) if mapping is not None else []
        columns = _columns(gb, chosen, parts, config)
        extra = sorted({k for row in (mapping or {}).values() for k in row}) if fmt == "csv" else []
        rows = _header(fmt, columns, extra)
        everyone = sorted((set(students) - set(unmapped)) | set(mapping or {}))
        for sid in everyone:
            known_ids = (mapping or {}).get(sid, {})
            try:
                student = gb.find_student(sid)
            except MissingEntry:
                student = None
            cells = _cells(fmt, columns, sid)
            identity = _identity(fmt, sid, known_ids, student)
            rows.append([*identity, *(known_ids.get(k, "") for k in extra), *cells])
    out = Path(to)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return Exported(out, chosen, skipped, len(everyone), unmapped, warnings)
