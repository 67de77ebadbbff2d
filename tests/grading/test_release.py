"""What keeps the hidden tests hidden, on notebooks: the feedback's outputs of a hidden-test
cell (:func:`~coursepkg.grading.release.hide_hidden_test_outputs`) and the seeds salted with the
course's secret (:func:`~coursepkg.grading.release.salt_hidden_seeds`), and the AI-use policy
every release states (:func:`~coursepkg.grading.release.ai_policy`), in the notebook and the kit.

The graded notebooks whose answers raise, do not parse or rename the function are in
``term/test_course.py`` (their feedback, made by ``coursepkg grade``); the kit is built in
``term/test_course_folder.py``.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import nbformat
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg.grading.classroom.preprocessors import HideHiddenTestOutputs
from coursepkg.grading.release import (
    DEFAULT_AI_POLICY,
    FeedbackExporter,
    build_student_kit,
    course_secret,
    generate_release,
    hide_hidden_test_outputs,
    salt_hidden_seeds,
    salted_seed,
)

ROOT = Path(__file__).resolve().parents[2]
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
    cell.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "grade_id": "t_hidden",
        "points": 2,
        "locked": True,
    }
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return cell


def test_feedback_pages_are_the_same_with_templates_compiled_once(monkeypatch):
    # Each student's feedback gets a new exporter; its templates are compiled once a process.
    import jinja2

    nb = nbformat.read(ROOT / "solutions" / "ex01_attention" / "ex01_attention.ipynb", 4)
    compiled = []
    compile_ = jinja2.Environment.compile

    def counting(self, *args, **kwargs):
        compiled.append(args[1] if len(args) > 1 else kwargs.get("name"))
        return compile_(self, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    fresh = FeedbackExporter()
    fresh.environment.bytecode_cache = None  # compiles every template itself
    expected, _ = fresh.from_notebook_node(nbformat.from_dict(nb))
    assert len(compiled) >= 5  # nbconvert's template and those it extends
    first, _ = FeedbackExporter().from_notebook_node(nbformat.from_dict(nb))
    n_compiled = len(compiled)
    second, _ = FeedbackExporter().from_notebook_node(nbformat.from_dict(nb))
    assert len(compiled) == n_compiled  # the second exporter compiled nothing
    assert first == second == expected


def test_a_hidden_cells_error_keeps_its_name_and_message_only():
    error = {
        "output_type": "error",
        "ename": "NameError",
        "evalue": "name 'additive_score' is not defined",
        "traceback": TRACEBACK,
    }
    warning = {
        "output_type": "stream",
        "name": "stderr",
        "text": "<ipython-input-3>:3: UserWarning: slow\n  check_additive_score("
        "additive_score, thorough=True, seed=13)\nsomething else\n",
    }
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


# ---------------------------------------------------------------- the AI-use policy (issue 62)

AID = "ex01_attention"


def _release_one(root: Path) -> nbformat.NotebookNode:
    if not (root / "solutions").is_dir():
        shutil.copytree(ROOT / "solutions" / AID, root / "solutions" / AID)
    (notebook,) = generate_release(root, AID)
    return nbformat.read(str(notebook), as_version=4)


def _policy_cells(nb: nbformat.NotebookNode) -> list:
    return [c for c in nb.cells if "ai_policy" in c.metadata.get("coursepkg", {})]


def test_every_release_states_the_default_ai_policy_under_its_title(tmp_path):
    nb = _release_one(tmp_path)
    (cell,) = _policy_cells(nb)
    assert nb.cells.index(cell) == 1 and nb.cells[0].source.startswith("# Assignment ex01")
    assert cell.source.startswith("## AI-use policy for this assignment")
    assert DEFAULT_AI_POLICY in cell.source and "the course's default policy" in cell.source
    assert cell.metadata["editable"] is False and cell.metadata["deletable"] is False
    committed = nbformat.read(str(ROOT / "exercises" / AID / f"{AID}.ipynb"), as_version=4)
    assert [c.source for c in _policy_cells(committed)] == [cell.source]


def test_the_courses_own_ai_policy_replaces_the_default_in_the_release_and_the_kit(tmp_path):
    (tmp_path / "ai_policy.md").write_text("No AI tools at all in this course.\n")
    (cell,) = _policy_cells(_release_one(tmp_path))
    assert "No AI tools at all in this course." in cell.source
    assert DEFAULT_AI_POLICY not in cell.source and "default" not in cell.source
    (tmp_path / "ai_policy").mkdir()
    (tmp_path / "ai_policy" / f"{AID}.md").write_text("Any tool, cited, for this one.")
    (cell,) = _policy_cells(_release_one(tmp_path))  # released again: one cell, the new text
    assert "Any tool, cited, for this one." in cell.source and "No AI" not in cell.source
    (tmp_path / "extensions.csv").write_text("student,assignment,hours,note\ndave,,24,private\n")
    kit = build_student_kit(tmp_path, tmp_path / "dist" / "kit.zip")
    with zipfile.ZipFile(kit["path"]) as z:
        names = [n.split("/", 1)[1] for n in z.namelist()]
        students = z.read("kit/STUDENTS.md").decode()
        released = z.read(f"kit/exercises/{AID}/{AID}.ipynb").decode()
    assert "## AI-use policy\n\nNo AI tools at all in this course." in students
    assert "Any tool, cited, for this one." in released
    assert not [n for n in names if n.endswith("extensions.csv") or n.startswith("solutions/")]


def test_the_instructors_guide_states_the_default_ai_policy_word_for_word():
    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    section = guide.split("### The AI-use policy", 1)[1].split("\n#", 1)[0]
    quoted = " ".join(line[2:] for line in section.splitlines() if line.startswith("> "))
    assert quoted == DEFAULT_AI_POLICY
