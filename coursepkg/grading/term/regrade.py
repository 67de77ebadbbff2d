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
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from ..classroom.dashboard import build_dashboard
from ..classroom.gradebook import export_csv
from ..classroom.reports import StudentResult, student_report
from ..policy import regrade as store
from ..policy.late import final_score, reassess_penalties
from ..policy.regrade import RegradeNote

__all__ = ["RegradeNote", "add_requests", "answer", "refresh_pages", "write_snapshot"]

log = logging.getLogger(__name__)


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
    _feedback_again(course, assignment, student)
    refresh_pages(course, assignment, [student])


def refresh_pages(course: Any, assignment: str, students: list[str] | None = None) -> list[str]:
    """Bring what ``coursepkg grade`` wrote from the gradebook up to date with it:
    ``grades.csv``, the JSON reports of ``students`` (None: of every student whose report's
    score, penalty or final score is not the gradebook's now, after a hand score saved in the
    formgrader) and the dashboard. The late penalties are computed again first
    (:func:`~coursepkg.grading.policy.late.reassess_penalties`). The feedback is not made
    here: ``nbgrader generate_feedback`` makes it from the same gradebook.

    Returns:
        The students whose report was rewritten, sorted.
    """
    from nbgrader.api import MissingEntry

    reports = course.root / "reports" / assignment
    with course.gradebook() as gb:
        reassess_penalties(course.config, gb, assignment)
        if students is None:
            students = []
            for path in sorted(reports.glob("*.json")):
                old = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(old, dict) or old.get("assignment") != assignment:
                    continue
                try:
                    sub = gb.find_submission(assignment, old["student"])
                except MissingEntry:
                    continue
                now = (sub.score, sub.late_submission_penalty or 0.0, final_score(sub))
                if now != (old["score"], old["late_penalty"], old["final_score"]):
                    students.append(old["student"])
    if (reports / "grades.csv").is_file():  # what coursepkg grade wrote, with the new scores
        export_csv(course, assignment, reports / "grades.csv")
    for student in students:
        _rewrite_report(course, assignment, student, reports / f"{student}.json")
    if students or (reports / "grades.csv").is_file():
        write_snapshot(course)
    return sorted(students)


def _rewrite_report(course: Any, assignment: str, student: str, path: Path) -> None:
    """The student's JSON report made again from the gradebook (if ``coursepkg grade`` wrote
    one): its scores change with the answer; how the run went (graded, reason, seconds,
    attempts) is the run's, kept from the old report."""
    if not path.is_file():
        return
    old = json.loads(path.read_text(encoding="utf-8"))
    result = StudentResult(
        student,
        graded=old["graded"],
        reason=old["reason"],
        seconds=old["seconds"],
        attempts=old["attempts"],
    )
    report = student_report(
        course.root, assignment, course.url, result, course.notebooks(assignment)
    )
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


def _feedback_again(course: Any, assignment: str, student: str) -> None:
    """nbgrader's feedback of ``student`` made again from the course's own gradebook (with the
    grader's preprocessors, as on the workers), swapped in for the one ``coursepkg grade``
    wrote: the answer changed a score after grading. (``coursepkg grade`` makes the feedback on
    its workers only.)"""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.apps.nbgraderapp import NbGraderApp
    from traitlets.config import Config

    from ..classroom.preprocessors import feedback_preprocessors

    here = os.getcwd()
    os.chdir(course.root)
    try:
        app = NbGraderApp()
        app.initialize([])  # the course's nbgrader_config.py, as `nbgrader` reads it
        config = Config()
        config.CourseDirectory.root = str(course.root)
        config.CourseDirectory.db_url = course.url
        config.CourseDirectory.source_directory = course.source
        config.CourseDirectory.release_directory = course.release
        config.CourseDirectory.submitted_directory = "submitted"
        config.CourseDirectory.autograded_directory = "autograded"
        config.CourseDirectory.feedback_directory = "feedback.coursepkg"
        config.GenerateFeedback.preprocessors = feedback_preprocessors(app.config)
        app.update_config(config)
        out = NbGraderAPI(parent=app).generate_feedback(assignment, student, True)
    finally:
        os.chdir(here)
    made = course.root / "feedback.coursepkg" / student / assignment
    if out.get("success") and made.is_dir():
        target = course.root / "feedback" / student / assignment
        shutil.rmtree(target, ignore_errors=True)
        made.rename(target)
    else:
        log.warning(
            "%s: the feedback with the regrade answer could not be made (it shows the old "
            "score; `nbgrader generate_feedback` makes it): %s",
            student,
            (out.get("error") or out.get("log") or "")[-500:],
        )
    shutil.rmtree(course.root / "feedback.coursepkg", ignore_errors=True)
