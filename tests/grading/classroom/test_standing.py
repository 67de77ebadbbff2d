"""Feedback is made once, on the worker, from the student's standing in the gradebook.

The client never makes a feedback while grading (evidence: the calls in the class grader's
code); what the course's gradebook holds about a student (the time handed in, an extension, a
hand grade, an answered regrade request) reaches the worker's private gradebook whole, so that
the worker's feedback shows it. The graded runs are in ``e2e/test_cluster.py`` (a hand grade
kept by a rerun, and the feedback equal to nbgrader's own) and ``grading/term/test_course.py``
(late penalties, regrade answers surviving a rerun).
"""

from __future__ import annotations

import ast
import datetime
import json
import pickle
from pathlib import Path

import pytest

from coursepkg.grading.classroom import gradebook
from coursepkg.grading.classroom.standing import forget, hand_grades, restore, settle, standing
from coursepkg.grading.policy.regrade import add_requests, record_answer, request_file, requests

CLASSROOM = Path(gradebook.__file__).parent
DUE = datetime.datetime(2026, 11, 20, 17, 0)


def _calls(path: Path) -> set[str]:
    return {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
    }


def test_only_the_worker_makes_feedback_while_grading():
    makers = {p.name for p in CLASSROOM.glob("*.py") if "generate_feedback" in _calls(p)}
    assert makers == {"worker.py"}  # a regrade answer's is in term/regrade.py
    assert "generate_feedback" in _calls(CLASSROOM.parent / "term" / "regrade.py")


class _Course:
    """A gradebook and a course folder, as :mod:`.standing` sees them."""

    def __init__(self, root: Path) -> None:
        from traitlets.config import Config

        self.root, self.url = root, f"sqlite:///{root / 'gradebook.db'}"
        self.config = Config()  # nbgrader's default late policy (no penalty)

    def gradebook(self):
        from nbgrader.api import Gradebook

        return Gradebook(self.url, "transformers")


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> _Course:
    """bob handed in 30 h late with a 48 h extension; the written answer was graded by hand
    (3 of 4) and a regrade request on the test cell was answered with 5 of 6."""
    course = _Course(tmp_path_factory.mktemp("course"))
    folder = course.root / "submitted" / "bob" / "ex01"
    folder.mkdir(parents=True)
    handed_in = DUE + datetime.timedelta(hours=30)
    (folder / "timestamp.txt").write_text(f"{handed_in:%Y-%m-%d %H:%M:%S.%f} UTC")
    with course.gradebook() as gb:
        gb.add_assignment("ex01", duedate=DUE)
        gb.add_notebook("nb", "ex01")
        gb.add_grade_cell("test", "nb", "ex01", max_score=6, cell_type="code")
        gb.add_grade_cell("written", "nb", "ex01", max_score=4, cell_type="markdown")
        gb.add_student("bob")
        gb.add_submission(
            "ex01", "bob", timestamp=handed_in, extension=datetime.timedelta(hours=48)
        )
        test = gb.find_grade("test", "nb", "ex01", "bob")
        test.auto_score = 0.0
        written = gb.find_grade("written", "nb", "ex01", "bob")
        written.manual_score, written.needs_manual_grade = 3.0, False
        gb.db.commit()
    request = course.root / "request.json"
    request.write_text(json.dumps(request_file("ex01", "bob", "test", "please")))
    (rid,) = add_requests(course, [request])
    record_answer(course, rid, why="right idea", who="Dr. T", score=5.0)
    return course


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_the_standing_reaches_the_private_gradebook_whole(course, tmp_path):
    state = pickle.loads(pickle.dumps(standing(course, "ex01", "bob")))  # as Dask ships it
    assert state.grades == {
        ("nb", "test"): (5.0, False, 0.0),
        ("nb", "written"): (3.0, False, None),
    }
    assert state.extension == datetime.timedelta(hours=48)
    assert state.timestamp == state.prior_timestamp == DUE + datetime.timedelta(hours=30)
    private = _Course(tmp_path)
    with course.gradebook() as src, private.gradebook() as dst:
        gradebook.copy_assignment(src, dst, "ex01")
    kept = restore(private, "ex01", "bob", state)
    with course.gradebook() as gb:
        assert kept == hand_grades(gb, "ex01", "bob")
    settle(private, "ex01", "bob", kept)
    for where in (course, private):
        with where.gradebook() as gb:
            submission = gb.find_submission("ex01", "bob")
            scores = {g.name: g.score for nb in submission.notebooks for g in nb.grades}
            late = submission.total_seconds_late
        assert scores == {"test": 5.0, "written": 3.0} and late == 0  # within the extension
    mine, theirs = requests(private.url, "ex01", "bob"), requests(course.url, "ex01", "bob")
    assert [r.as_dict() for r in mine] == [r.as_dict() for r in theirs]
    restore(private, "ex01", "bob", state)  # a second job of the same student: no duplicate
    assert len(requests(private.url, "ex01", "bob")) == 1
    forget(private, "ex01", "bob")  # the job done: the next student finds no trace of bob
    with private.gradebook() as gb:
        assert [s.student.id for s in gb.find_assignment("ex01").submissions] == []
    assert requests(private.url, "ex01", "bob") == []
