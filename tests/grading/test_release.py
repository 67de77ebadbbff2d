"""What keeps the hidden tests hidden, on notebooks: the feedback's outputs of a hidden-test
cell (:func:`~coursepkg.grading.release.hide_hidden_test_outputs`) and the seeds salted with the
course's secret (:func:`~coursepkg.grading.release.salt_hidden_seeds`).

The graded notebooks whose answers raise, do not parse or rename the function are in
``term/test_course.py`` (their feedback, made by ``coursepkg grade``); the kit is built in
``term/test_course_folder.py``.
"""

from __future__ import annotations

import re

import nbformat
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg.grading.classroom.preprocessors import HideHiddenTestOutputs
from coursepkg.grading.release import (
    course_secret,
    hide_hidden_test_outputs,
    salt_hidden_seeds,
    salted_seed,
)

HIDDEN = (
    "# Hidden tests: run when your notebook is graded.\n### BEGIN HIDDEN TESTS\n"
    "check_additive_score(additive_score, thorough=True, seed=13)\n"
    "check_additive_score(additive_score, thorough=True, seed=14)\n### END HIDDEN TESTS"
)
TRACEBACK = [
    "\x1b[0;31mNameError\x1b[0m   Traceback (most recent call last)",
    "      2 ### BEGIN HIDDEN TESTS\n----> 3 check_additive_score(additive_score, thorough=True,"
    " seed=13)\n      4 ### END HIDDEN TESTS",
    "\x1b[0;31mNameError\x1b[0m: name 'additive_score' is not defined",
]


def _cell(source: str, outputs: list) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "t_hidden",
                                 "points": 2, "locked": True}  # fmt: skip
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return cell


def test_a_hidden_cells_error_keeps_its_name_and_message_only():
    error = {"output_type": "error", "ename": "NameError",
             "evalue": "name 'additive_score' is not defined", "traceback": TRACEBACK}  # fmt: skip
    warning = {"output_type": "stream", "name": "stderr",
               "text": "<ipython-input-3>:3: UserWarning: slow\n  check_additive_score("
               "additive_score, thorough=True, seed=13)\nsomething else\n"}  # fmt: skip
    visible = nbformat.v4.new_code_cell("check_additive_score(additive_score)")
    visible.outputs = [nbformat.from_dict({**error, "traceback": ["visible frame"]})]
    nb = nbformat.v4.new_notebook(cells=[visible, _cell(HIDDEN, [error, warning])])
    assert hide_hidden_test_outputs(nb) == 2
    shown = str(nb.cells[1].outputs)  # its source goes next, in nbgrader's ClearHiddenTests
    assert "thorough=True" not in shown and "seed=13" not in shown and "BEGIN" not in shown
    assert nb.cells[1].outputs[0].traceback == ["NameError: name 'additive_score' is not defined"]
    assert "something else" in nb.cells[1].outputs[1].text  # the rest of the output stays
    assert nb.cells[0].outputs[0].traceback == ["visible frame"]  # its source is the student's
    assert hide_hidden_test_outputs(nb) == 0  # once is enough


def test_the_feedback_step_clears_the_hidden_tests_outputs_and_source():
    error = {"output_type": "error", "ename": "NameError", "evalue": "x", "traceback": TRACEBACK}
    nb = nbformat.v4.new_notebook(cells=[_cell(HIDDEN, [error])])
    HideHiddenTestOutputs().preprocess(nb, {})  # in place of nbgrader's ClearHiddenTests
    assert "seed=" not in nbformat.writes(nb) and nb.cells[0].outputs[0].traceback == [
        "NameError: x"
    ]


@settings(max_examples=25, deadline=None)
@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_salted_seeds_change_with_the_secret_only_inside_hidden_regions(one, other):
    source = "check(f, seed=5)\n" + HIDDEN
    salted = salt_hidden_seeds(source, one, "t_hidden")
    assert salted.startswith("check(f, seed=5)\n")  # outside the region: as written
    seeds = [int(s) for s in re.findall(r"seed=(\d+)", salted)[1:]]
    assert seeds == [salted_seed(one, "t_hidden", 13), salted_seed(one, "t_hidden", 14)]
    assert all(0 <= s < 2**31 for s in seeds) and seeds[0] != seeds[1]
    assert salted == salt_hidden_seeds(source, one, "t_hidden")  # the same every run
    if one != other:
        assert salted != salt_hidden_seeds(source, other, "t_hidden")


def test_the_course_secret_is_made_once_and_kept(tmp_path):
    assert course_secret(tmp_path) == ""
    made = course_secret(tmp_path, create=True)
    assert len(made) == 32 and course_secret(tmp_path, create=True) == made
    assert (tmp_path / "course_secret.txt").stat().st_mode & 0o077 == 0  # the owner's only
