"""Extensions kept out of git (issue 62, Q4): ``extensions.csv`` in the course folder, written by
``coursepkg extension``, read by the late policy, and followed at once by the penalties already in
the gradebook (a real nbgrader gradebook, the command run in-process).

The file in a term run in a fresh course folder (ignored by git, not in the student kit) is in
``term/test_course_folder.py``.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import real_parts
from traitlets.config import Config

from coursepkg.cli import main
from coursepkg.grading.policy.extensions import grant_extension, read_extensions
from coursepkg.grading.policy.late import LatePolicy

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
AID = "ex12_tiled_attention"
POLICY = """
c.AssignLatePenalties.plugin_class = "coursepkg.grading.policy.late.LatePolicy"
c.LatePolicy.due_dates = {"ex12_tiled_attention": "2026-11-29 18:00 Europe/Berlin"}
c.LatePolicy.grace_minutes = 15
c.LatePolicy.percent_per_day = 10
c.LatePolicy.max_percent = 50
"""


def _policy(root: Path, **fields) -> LatePolicy:
    config = Config()
    config.CourseDirectory.root = str(root)
    for name, value in fields.items():
        setattr(config.LatePolicy, name, value)
    return LatePolicy(config=config)


def test_the_file_is_written_read_and_private(tmp_path):
    path = tmp_path / "extensions.csv"
    grant_extension(path, "dave", 24, "ex12", note="accommodation, letter of 2 Nov")
    grant_extension(path, "alice", 48)
    grant_extension(path, "dave", 30, "ex12")  # replaces his first one
    assert read_extensions(path) == {"alice": 48.0, "ex12": {"dave": 30.0}}
    assert path.stat().st_mode & 0o077 == 0  # the owner's only
    assert "accommodation" not in path.read_text()  # the replaced row's note went with it
    grant_extension(path, "alice", 0)  # 0 hours removes it
    assert read_extensions(path) == {"ex12": {"dave": 30.0}}
    path.write_text("student,assignment,hours\nbob,ex01,soon\n")
    with pytest.raises(ValueError, match="line 2: expected a student and hours >= 0"):
        read_extensions(path)
    assert read_extensions(tmp_path / "none.csv") == {}


def test_the_policy_reads_the_file_before_its_setting(tmp_path):
    grant_extension(tmp_path / "extensions.csv", "dave", 24, AID)
    grant_extension(tmp_path / "extensions.csv", "erin", 12)
    policy = _policy(tmp_path, percent_per_day=10, extensions={AID: {"dave": 2}, "erin": 1})
    assert policy.extension_hours(AID, "dave") == 24  # the file's wins over the setting's
    assert policy.extension_hours("ex01", "dave") == 0
    assert policy.extension_hours("ex01", "erin") == 12
    assert policy.percent(AID, "dave", 30 * 3600) == 10  # 6 h late after 24 h: one started day
    assert _policy(tmp_path / "elsewhere", percent_per_day=10).percent(AID, "dave", 30 * 3600) == 20


def _course(tmp_path: Path) -> tuple[Path, str]:
    """A course folder (the repository's config and the policy above) whose gradebook holds
    dave's ex12, 12 points, handed in 30 h after the due date."""
    from nbgrader.api import Gradebook

    course = tmp_path / "course"
    course.mkdir()
    config = (ROOT / "nbgrader_config.py").read_text(encoding="utf-8") + POLICY
    (course / "nbgrader_config.py").write_text(config, encoding="utf-8")
    url = real_parts.new_sqlite_gradebook(course / "gradebook.db")
    due = datetime.datetime(2026, 11, 29, 17, 0)  # 18:00 in Berlin, in UTC
    with Gradebook(url, "transformers") as gb:
        gb.update_or_create_assignment(AID, duedate=due)
        gb.update_or_create_notebook(AID, AID)
        gb.update_or_create_grade_cell("t", AID, AID, max_score=12.0, cell_type="code")
        gb.update_or_create_student("dave")
        sub = gb.update_or_create_submission(
            AID, "dave", timestamp=due + datetime.timedelta(hours=30)
        )
        (nb,) = sub.notebooks
        nb.grades[0].auto_score = 12.0
        gb.db.commit()
    return course, url


def _coursepkg(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(args)) == 0
    return out.getvalue()


def _penalty(url: str) -> float:
    from nbgrader.api import Gradebook

    with Gradebook(url, "transformers") as gb:
        return gb.find_submission(AID, "dave").late_submission_penalty or 0.0


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_an_extension_granted_lowers_the_penalty_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # alembic
    course, url = _course(tmp_path)
    root = ("--root", str(course))
    # without the extension: 30 h late, two started days, 20% of 12 points
    _coursepkg("export", AID, "--format", "csv", *root, "--output", str(tmp_path / "a.csv"))
    assert _penalty(url) == pytest.approx(2.4)
    said = _coursepkg(
        "extension", "grant", "dave", "24", "--assignment", AID, "--note", "accommodation", *root
    )
    assert f"dave: 24 hours for {AID}" in said
    assert f"{AID}: dave's late penalty changed; run `nbgrader generate_feedback {AID}`" in said
    assert _penalty(url) == pytest.approx(1.2)  # 6 h late after it: one started day, 10%
    assert "dave                 24 h  ex12_tiled_attention" in _coursepkg(
        "extension", "list", *root
    )
    _coursepkg("extension", "grant", "dave", "31", "--assignment", AID, *root)
    assert _penalty(url) == 0.0  # no longer late
    _coursepkg("extension", "revoke", "dave", "--assignment", AID, *root)
    assert _penalty(url) == pytest.approx(2.4)
    assert "no extension" in _coursepkg("extension", "list", *root)


def test_git_ignores_the_file(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    grant_extension(tmp_path / "extensions.csv", "dave", 24)
    ignored = subprocess.run(
        ["git", "check-ignore", "extensions.csv"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ignored.returncode == 0 and ignored.stdout.strip() == "extensions.csv"
    config = (ROOT / "nbgrader_config.py").read_text(encoding="utf-8").splitlines()
    assert not [line for line in config if line.startswith("c.LatePolicy.extensions")]
