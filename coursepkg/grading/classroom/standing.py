"""A student's standing in the gradebook beyond the autograder's scores, so that the feedback is
made once, on the worker that grades them, and shows what the gradebook will hold.

The course's gradebook may already hold, for a submission being graded again: the time it was
handed in, an extension granted in the formgrader, hand grades (nbgrader's manual scores) and
answered regrade requests. The worker's private gradebook holds only the assignment's
definition. So the client reads the student's :class:`~.protocol.Standing` from its gradebook
(:func:`standing`) and ships it with the job; the worker writes it into its private copy
(:func:`restore`) before autograding. Both sides then run the same steps on their gradebook:
:func:`hand_grades` before nbgrader's ``SaveAutoGrades`` and ``AssignLatePenalties``,
:func:`settle` after; the worker makes the feedback from its copy, and the client records the
same grades in the course's gradebook without making the feedback again.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Any

from ..policy.regrade import reapply, requests, store_requests
from .protocol import Standing

__all__ = ["forget", "hand_grades", "restore", "settle", "standing", "submitted_at"]

log = logging.getLogger(__name__)


def submitted_at(root: Path, assignment: str, student: str) -> datetime.datetime | None:
    """The time in ``submitted/<student>/<assignment>/timestamp.txt`` (UTC, without a zone), as
    nbgrader reads it; None without the file or when it cannot be read."""
    from nbgrader.utils import parse_utc

    stamp = root / "submitted" / student / assignment / "timestamp.txt"
    if not stamp.is_file():
        return None
    try:
        return parse_utc(stamp.read_text().strip())
    except ValueError:
        log.warning("%s: unreadable timestamp.txt, recorded without a time", student)
        return None


def standing(course: Any, assignment: str, student: str) -> Standing:
    """The student's standing in the course's gradebook (``course``: its ``root``, ``url`` and
    ``gradebook()``), read on the client before the job is shipped."""
    from nbgrader.api import MissingEntry

    grades: dict[tuple[str, str], tuple[float, bool, float | None]] = {}
    extension = None
    with course.gradebook() as gb:
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:
            submission = None
        if submission is not None:
            extension = submission.extension
            for nb in submission.notebooks:
                for g in nb.grades:
                    if g.manual_score is not None:
                        grades[nb.name, g.name] = (
                            g.manual_score,
                            g.needs_manual_grade,
                            g.auto_score,
                        )
    return Standing(
        timestamp=submitted_at(course.root, assignment, student),
        extension=extension,
        grades=grades,
        requests=tuple(requests(course.url, assignment, student)),
        prior_timestamp=None if submission is None else submission.timestamp,
    )


def restore(
    course: Any, assignment: str, student: str, state: Standing
) -> dict[tuple[str, str], tuple]:
    """Write ``state`` into the worker's private gradebook (``course``: its ``url`` and
    ``gradebook()``), replacing what an earlier job left there for this student.

    Returns:
        The hand grades settled before this grading (:func:`hand_grades`), for :func:`settle`.
    """
    from nbgrader.api import MissingEntry

    # One gradebook for the whole restore (each opening costs an engine and a schema check).
    with course.gradebook() as gb:
        try:
            gb.remove_submission(assignment, student)
        except MissingEntry:
            pass
        gb.update_or_create_student(student)
        known = {"timestamp": state.prior_timestamp, "extension": state.extension}
        # A field the course's gradebook has no value for is left to nbgrader, as there.
        submission = gb.update_or_create_submission(
            assignment, student, **{k: v for k, v in known.items() if v is not None}
        )
        for nb in submission.notebooks:
            for g in nb.grades:
                if (nb.name, g.name) in state.grades:
                    g.manual_score, g.needs_manual_grade, g.auto_score = state.grades[
                        nb.name, g.name
                    ]
        gb.db.commit()
        kept = hand_grades(gb, assignment, student)
        if state.timestamp is not None:  # what the client records, whatever the job's files
            gb.update_or_create_submission(assignment, student, timestamp=state.timestamp)
    store_requests(course.url, assignment, student, list(state.requests))
    return kept


def forget(course: Any, assignment: str, student: str) -> None:
    """Remove what :func:`restore` and nbgrader wrote about ``student`` into the worker's
    private gradebook: the next job there (another student's) finds no trace of them."""
    from nbgrader.api import MissingEntry

    with course.gradebook() as gb:
        try:
            gb.remove_submission(assignment, student)
        except MissingEntry:
            pass
    store_requests(course.url, assignment, student, [])


def hand_grades(gb: Any, assignment: str, student: str) -> dict[tuple[str, str], tuple]:
    """The grades of ``student`` a grader has settled by hand (in the formgrader), keyed by
    (notebook, cell), with the submission's timestamp and the autograder's score then
    (``gb``: an open nbgrader ``Gradebook``)."""
    from nbgrader.api import MissingEntry

    kept: dict[tuple[str, str], tuple] = {}
    try:
        submission = gb.find_submission(assignment, student)
    except MissingEntry:
        return kept
    for nb in submission.notebooks:
        for grade in nb.grades:
            if grade.manual_score is not None and not grade.needs_manual_grade:
                kept[nb.name, grade.name] = (submission.timestamp, grade.auto_score)
    return kept


def settle(course: Any, assignment: str, student: str, kept: dict[tuple[str, str], tuple]) -> None:
    """After the autograder: a hand grade given to this same submission stays settled (nbgrader
    flags every hand-graded cell for manual grading again on each autograde; that is right for
    a new submission or a changed autograder score, not for a rerun), and each answered
    regrade request's last score is put back (:func:`~coursepkg.grading.policy.regrade.
    reapply`)."""
    if kept:
        with course.gradebook() as gb:
            submission = gb.find_submission(assignment, student)
            for nb in submission.notebooks:
                for grade in nb.grades:
                    before = kept.get((nb.name, grade.name))
                    if before is not None and before == (submission.timestamp, grade.auto_score):
                        grade.needs_manual_grade = False
            gb.db.commit()
    reapply(course, assignment, student)
