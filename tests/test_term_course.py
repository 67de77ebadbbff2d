"""The instructor's end of term on a class graded by ``coursepkg grade`` (ex01, the fastest
assignment), with the late policy in the course's ``nbgrader_config.py`` and made-up
``timestamp.txt`` files:

* each student's late penalty in the gradebook is the policy's (on time, within the grace
  period, two started days, capped, saved by an extension), the feedback explains it, and
  ``coursepkg export`` writes the points less the penalty.
"""

from __future__ import annotations

import csv
import datetime
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from grading_hostile import points

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
AID = "ex01_attention"
DUE = datetime.datetime(2026, 11, 20, 17, 0)
POLICY = f"""
c.AssignLatePenalties.plugin_class = "coursepkg.grading.term.late.LatePolicy"
c.LatePolicy.due_dates = {{"{AID}": "{DUE:%Y-%m-%d %H:%M:%S} UTC"}}
c.LatePolicy.grace_minutes = 15
c.LatePolicy.percent_per_day = 10
c.LatePolicy.max_percent = 50
c.LatePolicy.extensions = {{"{AID}": {{"extended": 48}}}}
"""
# student -> (hours after the due date, percent of the points taken off)
LATENESS = {
    "ontime": (-2.0, 0),
    "grace": (0.2, 0),  # 12 minutes: within the 15-minute grace period
    "twodays": (30.0, 20),  # 30 h: two started days
    "capped": (240.0, 50),  # 10 days: 100 %, capped at 50 %
    "extended": (30.0, 0),  # 30 h, with a 48 h extension
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def coursepkg(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    run = subprocess.run([str(BIN / "coursepkg"), *args], env=_env(), capture_output=True,
                         text=True, timeout=900)  # fmt: skip
    if ok:
        assert run.returncode == 0, f"coursepkg {args[0]} failed:\n{run.stdout}\n{run.stderr}"
    return run


def grade(course: Path, *args: str) -> str:
    return coursepkg("grade", AID, "--root", str(course), "--workers", "2", "--no-progress",
                     "--cell-timeout", "60", "--notebook-timeout", "300", "--memory-mb", "2048",
                     *args).stdout  # fmt: skip


def feedback_text(course: Path, student: str) -> str:
    path = course / "feedback" / student / AID / f"{AID}.html"
    text = html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))
    return " ".join(text.split())


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = tmp_path_factory.mktemp("term")
    config = (ROOT / "nbgrader_config.py").read_text(encoding="utf-8")
    (course / "nbgrader_config.py").write_text(config + POLICY, encoding="utf-8")
    shutil.copytree(ROOT / "solutions" / AID, course / "solutions" / AID)
    subprocess.run([str(BIN / "nbgrader"), "generate_assignment", AID, "--force"], cwd=course,
                   env=_env(), check=True, capture_output=True, timeout=300)  # fmt: skip
    source = nbformat.read(str(course / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    for sid, (hours, _) in LATENESS.items():
        folder = course / "submitted" / sid / AID
        folder.mkdir(parents=True)
        nbformat.write(source, str(folder / f"{AID}.ipynb"))
        stamp = DUE + datetime.timedelta(hours=hours)
        (folder / "timestamp.txt").write_text(f"{stamp:%Y-%m-%d %H:%M:%S.%f} UTC")
    summary = grade(course)
    return {"root": course, "summary": summary, "total": points(source)}


def test_each_late_penalty_is_the_policys(course):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course['root'] / 'gradebook.db'}", "transformers") as gb:
        assert gb.find_assignment(AID).duedate == DUE  # written from the policy
        found = {
            sid: (
                gb.find_submission(AID, sid).score,
                gb.find_submission(AID, sid).late_submission_penalty,
            )
            for sid in LATENESS
        }
    for sid, (_, percent) in LATENESS.items():
        score, penalty = found[sid]
        assert score == course["total"], (sid, found[sid], course["summary"])
        assert penalty == pytest.approx(course["total"] * percent / 100), sid


def test_the_feedback_explains_the_penalty(course):
    text = feedback_text(course["root"], "twodays")
    total = course["total"]
    assert "Late submission (coursepkg grade)" in text
    assert "1 day(s) 6 h 00 min after the due date (2026-11-20 17:00 UTC)" in text
    assert "a grace period of 15 minutes, then 10% of the points earned per started day" in text
    assert f"Penalty: {total * 0.2:g} point(s) off (your score: {total * 0.8:g} of" in text
    # nbgrader's own line under the score, too
    assert f"Late submission penalty (Score: -{total * 0.2:g})" in text
    assert "Your extension for this assignment: 48 hours" not in text
    assert "Late submission (coursepkg grade)" not in feedback_text(course["root"], "ontime")
    assert "Late submission (coursepkg grade)" in feedback_text(course["root"], "extended")
    assert "Penalty: 0 point(s) off" in feedback_text(course["root"], "extended")


def test_the_export_writes_the_points_less_the_penalty(course):
    out = course["root"] / "export.csv"
    coursepkg("export", AID, "--format", "csv", "--root", str(course["root"]), "--output", str(out))
    with out.open(newline="") as f:
        rows = {r["student_id"]: float(r[AID]) for r in csv.DictReader(f)}
    total = course["total"]
    assert rows == {sid: pytest.approx(total * (1 - p / 100)) for sid, (_, p) in LATENESS.items()}
