"""Student data stays out of git: a term run in a fresh course folder that is a git repository
(``docs/instructors.md``, "Setting up a term": the course's ``.gitignore`` and
``nbgrader_config.py`` copied beside ``solutions/``) leaves nothing of a student's for git to
commit.

The commands are the guide's, in its order: ``coursepkg release``, a submission as ``nbgrader
collect`` leaves it, ``coursepkg grade``, a regrade request recorded and answered (``grades.csv``
follows at once), a roster and ``coursepkg export`` for Canvas, an extension (``coursepkg
extension``, often an accommodation), and the student kit
(``coursepkg kit``), which holds the package and the release but nothing of ``solutions/``.
Every file they write that holds a student's name, work or grade (``gradebook.db``,
``submitted/``, ``autograded/``, ``feedback/``, ``reports/``, the roster, the request, the
export, the extensions) must be ignored; ``git status`` may list only the course's own files.
"""

from __future__ import annotations

import csv
import os
import shutil
import sys
import zipfile
from pathlib import Path

import nbformat
import processes
import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
AID = "ex01_attention"
PART = "test_scaled_dot_product_attention_hidden"
ROSTER = 'student_id,Student,ID,SIS User ID,SIS Login ID,Section\nada,"Lovelace, Ada",7,A7,al,S1\n'
# What a course folder may commit: its settings, the source notebooks and their release.
COURSE_FILES = (".gitignore", "nbgrader_config.py", "solutions/", "exercises/")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _run(course: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = processes.run([*args], cwd=course, env=env, idle=600)
    assert run.returncode == 0, f"{args}:\n{run.stdout}\n{run.stderr}"
    return run.stdout


def _score(course: Path) -> float:
    with open(course / "reports" / AID / "grades.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    return float(row["score"])


def test_a_term_in_a_fresh_course_folder_leaves_no_student_file_for_git(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    _run(course, "git", "init", "-q")
    for name in (".gitignore", "nbgrader_config.py"):
        shutil.copy(ROOT / name, course / name)
    shutil.copytree(ROOT / "solutions" / AID, course / "solutions" / AID)
    _run(course, "coursepkg", "release", AID, "--root", ".")
    submitted = course / "submitted" / "ada" / AID  # as `nbgrader collect` leaves it
    submitted.mkdir(parents=True)
    source = nbformat.read(str(course / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    nbformat.write(source, str(submitted / f"{AID}.ipynb"))
    (submitted / "timestamp.txt").write_text("2026-11-20 12:00:00.000000 UTC")
    _run(course, "coursepkg", "grade", AID, "--root", ".", "--workers", "1", "--no-progress")
    _run(course, "coursepkg", "regrade", "request", AID, PART, "--student", "ada", "--reason", "x")
    added = _run(course, "coursepkg", "regrade", "add", f"regrade-ada-{AID}-{PART}.json")
    assert f"request 1: ada, {AID} {PART} (open)" in added
    before = _score(course)
    _run(course, "coursepkg", "regrade", "answer", "1", "--score", "1", "--why", "x", "--by", "T")
    assert _score(course) == before - 5  # grades.csv made again at once: 6 points down to 1
    assert "no open requests (1 answered" in _run(course, "coursepkg", "regrade", "list")
    (course / "roster.csv").write_text(ROSTER, encoding="utf-8")
    _run(course, "coursepkg", "export", "--all", "--format", "canvas", "--mapping", "roster.csv")
    # an extension, often an accommodation, is the instructor's alone (issue 62, Q4)
    said = _run(
        course,
        "coursepkg",
        "extension",
        "grant",
        "ada",
        "24",
        "--assignment",
        AID,
        "--note",
        "accommodation",
    )
    assert f"ada: 24 hours for {AID}" in said
    # the release wrote the course's secret (which salted the hidden seeds: the solution still
    # earned every point), for the instructor alone; the student kit holds none of it
    assert oct((course / "course_secret.txt").stat().st_mode & 0o777) == "0o600"
    said = _run(course, "coursepkg", "kit", "--root", ".")
    assert "1 released notebook(s); no solutions/" in said
    with zipfile.ZipFile(course / "dist" / "coursepkg-student-kit.zip") as kit:
        names = [n.split("/", 1)[1] for n in kit.namelist()]
        text = b"".join(kit.read(n) for n in kit.namelist() if n.endswith(".ipynb"))
    assert f"exercises/{AID}/{AID}.ipynb" in names and "coursepkg/grading/__init__.py" in names
    assert {"pyproject.toml", "STUDENTS.md", "jupyter/student/nbgrader_config.py"} <= set(names)
    assert not [
        n
        for n in names
        if n.startswith("solutions/")
        or "secret" in n
        or n.startswith(("gradebook", "submitted/", "autograded/", "feedback/", "reports/"))
    ]
    assert b"BEGIN HIDDEN TESTS" not in text and b"thorough=True, seed=" not in text
    assert b"## AI-use policy for this assignment" in text  # the default, stated (issue 62)
    with zipfile.ZipFile(course / "dist" / "coursepkg-student-kit.zip") as kit:
        students = kit.read("coursepkg-student-kit/STUDENTS.md").decode()
    assert "## AI-use policy" in students and "extensions.csv" not in names

    written = [
        "gradebook.db",
        "submitted/ada",
        "autograded/ada",
        "feedback/ada",
        f"reports/{AID}/ada.json",
        f"reports/{AID}/grades.csv",
        "reports/dashboard.html",
        "reports/export-canvas.csv",
        "roster.csv",
        f"regrade-ada-{AID}-{PART}.json",
        "course_secret.txt",
        "dist/coursepkg-student-kit.zip",
        "extensions.csv",
    ]
    assert [p for p in written if not (course / p).exists()] == []  # the term did write them
    status = _run(course, "git", "status", "--porcelain", "--untracked-files=all")
    listed = [line[3:] for line in status.splitlines()]
    assert listed, "git status lists nothing at all: the course's own files should show"
    assert [p for p in listed if not p.startswith(COURSE_FILES)] == []


@pytest.mark.parametrize(
    ("due", "reason"),
    [
        ("01/12/2026 17:00", "year, month, day"),  # meant 1 December; once read as 12 January
        ("2026-12-01 17:00 CET", "abbreviation"),  # once read as UTC
        ("2026-11-31 17:00 UTC", "day is out of range for month"),
    ],
)
def test_a_due_date_it_cannot_read_stops_grading_before_it_starts(tmp_path, due, reason):
    course = tmp_path / "course"
    course.mkdir()
    policy = (
        '\nc.AssignLatePenalties.plugin_class = "coursepkg.grading.term.late.LatePolicy"\n'
        f'c.LatePolicy.due_dates = {{"{AID}": "{due}"}}\n'
    )
    config = (ROOT / "nbgrader_config.py").read_text(encoding="utf-8")
    (course / "nbgrader_config.py").write_text(config + policy, encoding="utf-8")
    (course / "submitted" / "ada" / AID).mkdir(parents=True)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = processes.run(
        [str(BIN / "coursepkg"), "grade", AID, "--root", str(course)], env=env, idle=300
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"LatePolicy.due_dates['{AID}']" in run.stderr and reason in run.stderr
    assert "2026-12-01 17:00 Europe/Berlin" in run.stderr  # what to write instead
    assert not (course / "autograded").exists() and "graded" not in run.stdout


def test_a_missing_release_says_what_to_run_before_grading_starts(tmp_path):
    course = tmp_path / "course"
    (course / "submitted" / "ada" / AID).mkdir(parents=True)
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = processes.run(
        [str(BIN / "coursepkg"), "grade", AID, "--root", str(course)], env=env, idle=300
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"run `coursepkg release {AID} --root {course}` first" in run.stderr
    assert f"{course / 'exercises' / AID}" in run.stderr  # the config's release_directory
