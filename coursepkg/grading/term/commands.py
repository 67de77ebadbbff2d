"""The command line of the instructor's end of term: ``coursepkg export``, ``coursepkg
regrade`` and ``coursepkg similarity`` (registered by :func:`add_parsers`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_parsers", "open_course"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default=".", help="the nbgrader course directory (default: .)")
    p.add_argument(
        "--db",
        help="gradebook URL: postgresql://USER@HOST:PORT/DB or any SQLAlchemy URL (default: "
        "sqlite gradebook.db in the course)",
    )


def open_course(args: argparse.Namespace) -> Any:
    """The course (:class:`~coursepkg.grading.classroom.gradebook.Course`) that ``--root`` and
    ``--db`` name, its gradebook checked to be reachable."""
    from ..classroom import gradebook

    root = Path(args.root).resolve()
    if not (root / "nbgrader_config.py").is_file():
        raise ValueError(f"{root} is not an nbgrader course directory (no nbgrader_config.py)")
    url = gradebook.database_url(args.db or f"sqlite:///{root / 'gradebook.db'}")
    gradebook.check_gradebook(url)
    return gradebook.Course(root, url)


def _export(args: argparse.Namespace) -> int:
    from .export import export, read_mapping

    if bool(args.assignment) == args.all:
        raise ValueError("give one ASSIGNMENT or --all (got both or neither)")
    course = open_course(args)
    mapping = read_mapping(args.mapping, args.id_column) if args.mapping else None
    out = args.output or course.root / "reports" / f"export-{args.format}.csv"
    written = export(course.url, course.course_id, None if args.all else [args.assignment],
                     args.format, out, mapping=mapping, parts=args.parts)  # fmt: skip
    print(f"wrote {written}")
    return 0


def _add_export(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write the grades as the CSV Canvas or Gradescope imports (instructors)",
        description="Read nbgrader's gradebook (SQLite or PostgreSQL) and write one CSV file "
        "to upload: Canvas's gradebook layout, Gradescope's, or a plain CSV. One column per "
        "assignment (nbgrader's score: points less the late penalty), optionally one per "
        "graded part. Students are matched to the platform's ids by --mapping.",
    )
    p.add_argument("assignment", nargs="?", help="an assignment id (or --all)")
    p.add_argument("--all", action="store_true", help="every assignment in the gradebook")
    p.add_argument("--format", choices=("canvas", "gradescope", "csv"), required=True)
    p.add_argument(
        "--mapping",
        help="CSV with a student_id column (nbgrader's id) and the platform's columns "
        "(Canvas: Student, ID, SIS User ID, SIS Login ID, Section; Gradescope: First Name, "
        "Last Name, SID, Email); needed for canvas and gradescope",
    )
    p.add_argument("--id-column", default="student_id", help="the mapping's column of nbgrader ids")
    p.add_argument("--parts", action="store_true", help="also one column per graded part")
    p.add_argument("--output", help="the file to write (default: reports/export-FORMAT.csv)")
    _common(p)
    p.set_defaults(func=_export)


def add_parsers(sub: Any) -> None:
    """Register the end-of-term subcommands on ``coursepkg``'s subparsers."""
    _add_export(sub)
