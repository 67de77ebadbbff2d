"""The instructor's side of regrade requests: record the files students send, answer one, and
bring every page that shows a grade up to date.

The requests, their trail and the scores they set live in the gradebook
(:mod:`coursepkg.grading.policy.regrade`, which ``coursepkg grade`` also uses to put the scores
back after a rerun). Answering one (:func:`answer`) records it there, then makes again what
``coursepkg grade`` wrote from the old score: the student's feedback, ``grades.csv``, the
student's JSON report and the dashboard (with its list of requests, :func:`write_snapshot`).

``RegradeNote`` is kept here as an alias: a course's ``nbgrader_config.py`` written before the
store moved names ``coursepkg.grading.term.regrade.RegradeNote`` in
``c.GenerateFeedback.preprocessors``, and that name is the policy's class itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..classroom.dashboard import build_dashboard
from ..classroom.gradebook import export_csv, feedback_from_gradebook
from ..classroom.reports import StudentResult, student_report
from ..policy import regrade as store
from ..policy.regrade import RegradeNote

__all__ = ["RegradeNote", "add_requests", "answer", "write_snapshot"]


def add_requests(course: Any, files: list[Path]) -> list[int]:
    """Record the request files in the gradebook (:func:`~coursepkg.grading.policy.regrade.
    add_requests`) and show them in the dashboard.

    Returns:
        The ids of the requests (new or already there), in the files' order.
    """
    ids = store.add_requests(course, files)
    write_snapshot(course)
    return ids


def answer(course: Any, request_id: int, *, why: str, who: str, score: float | None = None):
    """Answer a request: a new score for its part (None: a comment only), recorded with who,
    when, the old and new scores and why; then the student's feedback, ``grades.csv``, their
    JSON report and the dashboard are made again with it.

    Raises:
        ValueError: no such request, no reason given, a score outside the part's range.
    """
    assignment, student = store.record_answer(course, request_id, why=why, who=who, score=score)
    feedback_from_gradebook(course, assignment, student)
    reports = course.root / "reports" / assignment
    if (reports / "grades.csv").is_file():  # what coursepkg grade wrote, with the new score
        export_csv(course, assignment, reports / "grades.csv")
    _rewrite_report(course, assignment, student, reports / f"{student}.json")
    write_snapshot(course)


def _rewrite_report(course: Any, assignment: str, student: str, path: Path) -> None:
    """The student's JSON report made again from the gradebook (if ``coursepkg grade`` wrote
    one): its scores change with the answer; how the run went (graded, reason, seconds,
    attempts) is the run's, kept from the old report."""
    if not path.is_file():
        return
    old = json.loads(path.read_text(encoding="utf-8"))
    result = StudentResult(student, graded=old["graded"], reason=old["reason"],
                           seconds=old["seconds"], attempts=old["attempts"])  # fmt: skip
    report = student_report(course.root, assignment, course.url, result,
                            course.notebooks(assignment))  # fmt: skip
    path.write_text(json.dumps(report, indent=1), encoding="utf-8")


def write_snapshot(course: Any) -> Path:
    """``reports/regrades.json``: every request with its trail, for the dashboard; and the
    dashboard made again."""
    out = course.root / "reports" / "regrades.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [r.as_dict() for r in store.requests(course.url)]
    out.write_text(json.dumps(rows, indent=1, default=str), encoding="utf-8")
    build_dashboard(course.root)
    return out
