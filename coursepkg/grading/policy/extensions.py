"""Extensions kept out of the repository: ``extensions.csv`` in the course folder.

An extension is often an accommodation, which is private: it does not belong in
``nbgrader_config.py``, a tracked project file that every clone (and every fork) carries. The
course's ``.gitignore`` ignores ``extensions.csv``, the student kit never holds it, and
``coursepkg extension grant`` writes it (readable by its owner only)::

    student,assignment,hours,note
    dave,ex12_tiled_attention,24,
    alice,,48,for every assignment

An empty ``assignment`` (or ``*``) is an extension for every assignment; ``note`` is for the
instructor alone. :class:`~coursepkg.grading.policy.late.LatePolicy` reads the file (its
``extensions_file``, relative to the course folder) on top of its ``extensions`` setting: an entry
of the file wins over the setting's for the same student and assignment, and an assignment's own
entry over one for every assignment.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

__all__ = ["EXTENSIONS_FILE", "FIELDS", "extensions_path", "grant_extension", "read_extensions"]

#: The file's name in the course folder (the course's ``.gitignore`` ignores it).
EXTENSIONS_FILE = "extensions.csv"
#: Its columns, in its order.
FIELDS = ("student", "assignment", "hours", "note")


def extensions_path(config: Any, name: str = EXTENSIONS_FILE) -> Path:
    """The extensions file of the course ``config`` describes: ``name`` in its
    ``CourseDirectory.root`` (the folder of ``nbgrader_config.py``), else in the current folder.

    Args:
        config: the course's traitlets configuration.
        name: the file's name, or a path (absolute, or relative to the course folder).

    Returns:
        The file's path (which may not exist).
    """
    root = config.get("CourseDirectory", {}).get("root") if config is not None else None
    return Path(root or os.getcwd()) / name


def _rows(path: Path) -> list[dict[str, str]]:
    """The file's rows, checked: a student, and hours that are a number >= 0."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [k for k in ("student", "hours") if k not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(
                f"{path} has no {', '.join(missing)} column (expected the header "
                f"{','.join(FIELDS)})"
            )
        rows = []
        for line, row in enumerate(reader, start=2):
            row = {k: (row.get(k) or "").strip() for k in FIELDS}
            try:
                hours = float(row["hours"])
            except ValueError:
                hours = -1.0
            if not row["student"] or not hours >= 0:
                raise ValueError(
                    f"{path}, line {line}: expected a student and hours >= 0, got "
                    f"{row['student']!r} and {row['hours']!r}"
                )
            rows.append(row)
    return rows


def read_extensions(path: str | Path) -> dict[str, Any]:
    """The extensions of ``path`` in the shape of ``LatePolicy.extensions``.

    Args:
        path: an extensions file (:data:`FIELDS`); a missing file has none.

    Returns:
        ``{student: hours}`` for the extensions of every assignment and ``{assignment:
        {student: hours}}`` for one assignment's.

    Raises:
        ValueError: a missing column, an empty student, hours that are not a number >= 0.
    """
    path = Path(path)
    found: dict[str, Any] = {}
    if not path.is_file():
        return found
    for row in _rows(path):
        hours = float(row["hours"])
        if row["assignment"] in ("", "*"):
            found[row["student"]] = hours
        else:
            found.setdefault(row["assignment"], {})[row["student"]] = hours
    return found


def grant_extension(
    path: str | Path, student: str, hours: float, assignment: str | None = None, note: str = ""
) -> list[dict[str, str]]:
    """Write (or replace, or with 0 hours remove) one extension in the file ``path``.

    The file is created readable and writable by its owner only (it may say why).

    Args:
        path: the course's extensions file.
        student: nbgrader's student id.
        hours: the extension in hours (0 removes it).
        assignment: the assignment, or None for every assignment.
        note: the instructor's own note (an accommodation, a reason).

    Returns:
        The file's rows after the change.

    Raises:
        ValueError: an empty student, negative hours, or an unreadable file.
    """
    path = Path(path)
    if not student.strip() or not hours >= 0:
        raise ValueError(
            f"an extension needs a student and hours >= 0, got {student!r} and {hours!r}"
        )
    rows = _rows(path) if path.is_file() else []
    which = (student.strip(), (assignment or "").strip())
    rows = [r for r in rows if (r["student"], r["assignment"].replace("*", "")) != which]
    if hours > 0:
        rows.append(
            {
                "student": which[0],
                "assignment": which[1],
                "hours": f"{hours:g}",
                "note": note.strip(),
            }
        )
    rows.sort(key=lambda r: (r["student"], r["assignment"]))
    text = io.StringIO()
    writer = csv.DictWriter(text, FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text.getvalue())
    return rows
