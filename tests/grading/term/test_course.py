"""The instructor's end of term on a class graded by ``coursepkg grade`` (ex01, the fastest
assignment), with the late policy in the course's ``nbgrader_config.py`` and made-up
``timestamp.txt`` files:

* each student's late penalty in the gradebook is the policy's (on time, within the grace
  period, two started days, capped, saved by an extension), the feedback explains it, and
  ``coursepkg export`` writes the points less the penalty;
* a regrade request, made with the student's command and with the link in the feedback, is
  recorded, shown open in the dashboard (headless Chromium), answered with a new score and
  with a comment; the gradebook, the feedback, ``grades.csv``, the export and the dashboard
  show the answers,
  the audit trail keeps who, when, old, new and why, and all of it survives a rerun of
  ``coursepkg grade``.

Everything runs twice: with the course's SQLite gradebook, and with a PostgreSQL gradebook
(``--db``, a server started with Debian's initdb/pg_ctl as in ``tests/fixtures/real_parts.py``).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import datetime
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import processes
import pytest
import real_parts
from browser import Browser, chromium_or_skip
from grading_hostile import points
from processes import files_under

from coursepkg.cli import main
from coursepkg.grading.classroom.gradebook import database_url

ROOT = Path(__file__).resolve().parents[3]
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

# student -> (the item whose answer cell is broken, text in the solution, what replaces it): each
# leaves the item's function undefined, so its hidden test cell fails with a NameError.
BROKEN = {
    "raises": (
        "additive_score",
        "def additive_score(",
        "W = weights_not_defined\ndef additive_score(",
    ),
    "unparsed": (
        "scaled_dot_product_attention",
        "def scaled_dot_product_attention(",
        "def scaled_dot_product_attention((",
    ),
    "renamed": (
        "scaled_dot_product_attention",
        "def scaled_dot_product_attention(",
        "def attention(",
    ),
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
postgres = real_parts.postgres  # the PostgreSQL server fixture


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def coursepkg(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """``coursepkg ARGS`` (``export``, ``regrade``) run by the console script's ``main`` in this
    process: they read and write the gradebook and the course's pages only, and a process of
    their own would spend about 8 s of CPU importing torch and nbgrader, some twenty times per
    gradebook. ``test_course_folder.py`` runs each of them as the command."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as stop:  # argparse's usage errors
            code = stop.code
    run = subprocess.CompletedProcess(["coursepkg", *args], code, out.getvalue(), err.getvalue())
    if ok:
        assert run.returncode == 0, f"coursepkg {args[0]} failed:\n{run.stdout}\n{run.stderr}"
    return run


def grade(where: list[str], *args: str) -> str:
    """``coursepkg grade`` on the class, as the command (its workers, kernels and pages)."""
    run = processes.run(
        [
            str(BIN / "coursepkg"),
            "grade",
            AID,
            *where,
            "--workers",
            "2",
            "--no-progress",
            "--cell-timeout",
            "60",
            "--notebook-timeout",
            "300",
            "--memory-mb",
            "2048",
            *args,
        ],
        env=_env(),
        idle=900,
    )
    assert run.returncode == 0, f"coursepkg grade failed:\n{run.stdout}\n{run.stderr}"
    return run.stdout


def feedback_text(course: Path, student: str) -> str:
    path = course / "feedback" / student / AID / f"{AID}.html"
    text = html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))
    return " ".join(text.split())


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """A course folder with ex01's source and its release (``nbgrader generate_assignment``,
    about 13 s of CPU on a busy machine), made once: each gradebook's course is a copy. The
    late policy is added after (it is read when grading, not by the release)."""
    folder = tmp_path_factory.mktemp("release")
    shutil.copy(ROOT / "nbgrader_config.py", folder / "nbgrader_config.py")
    shutil.copytree(ROOT / "solutions" / AID, folder / "solutions" / AID)
    processes.run(
        [str(BIN / "nbgrader"), "generate_assignment", AID, "--force"],
        cwd=folder,
        env=_env(),
        check=True,
        idle=300,
    )
    return folder


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def course(request, tmp_path_factory, released):
    from nbgrader.api import Gradebook

    course = tmp_path_factory.mktemp("term")
    shutil.copytree(released, course, dirs_exist_ok=True)
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres")["url"]
        where = ["--root", str(course), "--db", url]
    else:
        url, where = f"sqlite:///{course / 'gradebook.db'}", ["--root", str(course)]
    config = (ROOT / "nbgrader_config.py").read_text(encoding="utf-8")
    (course / "nbgrader_config.py").write_text(config + POLICY, encoding="utf-8")
    source = nbformat.read(str(course / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    for sid, (hours, _) in LATENESS.items():
        folder = course / "submitted" / sid / AID
        folder.mkdir(parents=True)
        nbformat.write(source, str(folder / f"{AID}.ipynb"))
        stamp = DUE + datetime.timedelta(hours=hours)
        (folder / "timestamp.txt").write_text(f"{stamp:%Y-%m-%d %H:%M:%S.%f} UTC")
    buggy = nbformat.from_dict(source)  # on time, loses the attention tests (no 1/sqrt(d_k))
    (cell,) = [c for c in buggy.cells if "/ math.sqrt(d_k)" in c.source]
    cell.source = cell.source.replace("/ math.sqrt(d_k)", "")
    (course / "submitted" / "buggy" / AID).mkdir(parents=True)
    nbformat.write(buggy, str(course / "submitted" / "buggy" / AID / f"{AID}.ipynb"))
    if request.param == "sqlite":  # answers that leave a function undefined (one gradebook will do)
        for sid, (item, old, new) in BROKEN.items():
            nb = nbformat.from_dict(source)
            (cell,) = [
                c
                for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == f"answer_{item}"
            ]
            assert cell.source.count(old) == 1, sid
            cell.source = cell.source.replace(old, new)
            (course / "submitted" / sid / AID).mkdir(parents=True)
            nbformat.write(nb, str(course / "submitted" / sid / AID / f"{AID}.ipynb"))
        cut = course / "submitted" / "truncated" / AID  # as the exchange left it, cut short
        cut.mkdir(parents=True)
        text = nbformat.writes(source)
        (cut / f"{AID}.ipynb").write_text(text[: len(text) * 6 // 10], encoding="utf-8")
        (cut / "timestamp.txt").write_text(f"{DUE:%Y-%m-%d %H:%M:%S.%f} UTC")
        (cut / "submission_secret.txt").write_text("the exchange's secret")
    summary = grade(where)
    with Gradebook(database_url(url), "transformers") as gb:
        graded = {s.student.id: s.score for s in gb.find_assignment(AID).submissions}
    return {
        "graded": graded,
        "root": course,
        "summary": summary,
        "total": points(source),
        "where": where,
        "url": database_url(url),
        "buggy": points(source, "additive_score"),
    }


def test_each_late_penalty_is_the_policys(course):
    from nbgrader.api import Gradebook

    with Gradebook(course["url"], "transformers") as gb:
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
    off = course["total"] * 0.7  # twodays' 20% and capped's 50%
    assert (
        f"late policy: {AID} due 2026-11-20 17:00 UTC; 2 of {len(course['graded'])} late, "
        f"{off:.4g} point(s) off" in (course["summary"])
    )


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


def test_no_feedback_shows_a_hidden_test_when_the_function_is_undefined(course):
    if "raises" not in course["graded"]:
        pytest.skip("the broken answers are graded with the SQLite gradebook only")
    source = nbformat.read(str(course["root"] / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    hidden = [
        line.strip()
        for cell in source.cells
        for block in re.findall(r"BEGIN HIDDEN TESTS\n(.*?)###", cell.source, flags=re.S)
        for line in block.splitlines()
        if line.strip()
    ]
    assert len(hidden) == 3
    for sid, (item, _, _) in BROKEN.items():
        text = feedback_text(course["root"], sid)
        assert "HIDDEN TESTS" not in text and "thorough=True" not in text and "seed=1" not in text
        assert not [line for line in hidden if line in text], sid
        assert f"NameError: name '{item}' is not defined" in text, sid  # what went wrong
    # the points: the broken item's tests score 0, the other item's all of theirs
    assert course["graded"]["raises"] == course["total"] - points(source, "additive_score")
    assert course["graded"]["renamed"] == points(source, "additive_score")


def test_an_unreadable_notebooks_feedback_can_be_released(course):
    if "truncated" not in course["graded"]:
        pytest.skip("graded with the SQLite gradebook only")
    feedback = course["root"] / "feedback" / "truncated" / AID
    # release_feedback files it under this secret: without it, it would skip the student
    assert (feedback / "submission_secret.txt").read_text() == "the exchange's secret"
    assert "not valid JSON" in feedback_text(course["root"], "truncated")
    assert course["graded"]["truncated"] == 0


def test_the_export_writes_the_points_less_the_penalty(course):
    out = course["root"] / "export.csv"
    coursepkg("export", AID, "--format", "csv", *course["where"], "--output", str(out))
    with out.open(newline="") as f:
        rows = {r["student_id"]: float(r[AID]) for r in csv.DictReader(f)}
    total = course["total"]
    expected = {sid: pytest.approx(total * (1 - p / 100)) for sid, (_, p) in LATENESS.items()}
    assert {sid: rows[sid] for sid in LATENESS} == expected


# ---------------------------------------------------------------------------------------------
# Regrade requests
# ---------------------------------------------------------------------------------------------

PART = "test_scaled_dot_product_attention_hidden"


@pytest.fixture(scope="module")
def chromium():
    with Browser(chromium_or_skip()) as b:
        yield b


def _grade_of(course: dict, student: str, part: str):
    from nbgrader.api import Gradebook

    with Gradebook(course["url"], "transformers") as gb:
        g = gb.find_grade(part, AID, AID, student)
        return g.score, g.needs_manual_grade, gb.find_submission(AID, student).score


def _dashboard_rows(browser: Browser, root: Path) -> dict[str, list[list[str]]]:
    browser.goto((root / "reports" / "dashboard.html").as_uri())
    assert browser.errors == []
    return browser.evaluate(
        "({open: [...document.querySelectorAll('tr.open-request')].map(r => [...r.cells]"
        ".map(c => c.innerText)), answered: [...document.querySelectorAll('tr.answered-request')]"
        ".map(r => [...r.cells].map(c => c.innerText))})"
    )


def test_a_regrade_request_is_answered_and_survives_a_rerun(course, chromium, tmp_path):
    root = course["root"]
    request = tmp_path / "request.json"
    coursepkg(
        "regrade",
        "request",
        AID,
        PART,
        "--student",
        "buggy",
        "--reason",
        "My scaling is in the softmax's temperature.",
        "--output",
        str(request),
    )
    # The feedback's link for the same part downloads a request file too: fill in its reason.
    page = (root / "feedback" / "buggy" / AID / f"{AID}.html").read_text(encoding="utf-8")
    hrefs = re.findall(
        r'<a download="regrade-[^"]+" href="data:application/json;base64,'
        r'([^"]+)"',
        page,
    )
    linked = [json.loads(base64.b64decode(h)) for h in hrefs]
    assert len(linked) == 5  # every graded part
    (by_link,) = [d for d in linked if d["part"] == "test_additive_score_visible"]
    assert by_link["student"] == "buggy" and by_link["reason"] == ""
    by_link["reason"] = "Please look at my additive score again."
    (tmp_path / "link.json").write_text(json.dumps(by_link))
    link = tmp_path / "link.json"
    added = coursepkg("regrade", "add", str(request), str(link), *course["where"]).stdout
    assert f"request 1: buggy, {AID} {PART} (open)" in added
    assert f"request 2: buggy, {AID} test_additive_score_visible (open)" in added
    coursepkg("regrade", "add", str(request), *course["where"])  # twice: still one request
    listed = coursepkg("regrade", "list", *course["where"]).stdout
    assert listed.count("open") == 2 and PART in listed

    rows = _dashboard_rows(chromium, root)
    assert [r[1:4] for r in rows["open"]] == [
        ["buggy", AID, PART],
        ["buggy", AID, "test_additive_score_visible"],
    ]
    assert rows["answered"] == []

    before = _grade_of(course, "buggy", PART)
    assert before[0] == 0 and before[2] == course["buggy"]
    bad = coursepkg(
        "regrade", "answer", "1", "--score", "60", "--why", "x", *course["where"], ok=False
    )
    assert bad.returncode == 2 and "--score must be between 0 and 6" in bad.stderr
    coursepkg(
        "regrade",
        "answer",
        "1",
        "--score",
        "4",
        "--why",
        "Right idea, wrong place.",
        "--by",
        "Dr. Turing",
        *course["where"],
    )
    coursepkg(
        "regrade",
        "answer",
        "2",
        "--why",
        "The additive score passed; nothing to change.",
        "--by",
        "Dr. Turing",
        *course["where"],
    )

    def check_answered() -> None:
        score, needs_grading, total = _grade_of(course, "buggy", PART)
        assert (score, needs_grading, total) == (4, False, course["buggy"] + 4)
        text = feedback_text(root, "buggy")
        assert (f"{PART}`, asked" in text or f"{PART}, asked" in text) and (
            "Answered by Dr. Turing on" in text
        )
        assert "score 0 \u2192 4. Right idea, wrong place." in text
        assert "score unchanged (1). The additive score passed; nothing to change." in text
        rows = _dashboard_rows(chromium, root)
        assert rows["open"] == []
        trail = {r[3]: r[5] for r in rows["answered"]}
        assert re.fullmatch(
            r"\d{4}-\d\d-\d\d \d\d:\d\d UTC, Dr\. Turing: 0 \u2192 4\. "
            r"Right idea, wrong place\.",
            trail[PART],
        )
        out = root / "regraded.csv"
        coursepkg("export", AID, "--format", "csv", *course["where"], "--output", str(out))
        with out.open(newline="") as f:
            exported = {r["student_id"]: float(r[AID]) for r in csv.DictReader(f)}
        assert exported["buggy"] == course["buggy"] + 4
        with (root / "reports" / AID / "grades.csv").open(newline="") as f:  # rewritten at once
            listed = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
        assert listed["buggy"] == course["buggy"] + 4
        report = json.loads((root / "reports" / AID / "buggy.json").read_text(encoding="utf-8"))
        (test,) = [t for t in report["tests"] if t["grade_id"] == PART]
        assert (test["points"], report["score"]) == (4, course["buggy"] + 4)  # rewritten too

    check_answered()
    summary = grade(course["where"], "--student", "buggy")  # the autograder gives 0 again
    assert "graded 1 student(s)" in summary and "with 1 worker(s)" in summary, summary  # of 2
    check_answered()  # the answer stays
    listed = coursepkg("regrade", "list", "--all", *course["where"]).stdout
    assert listed.count("Dr. Turing") == 2  # one entry per change, nothing added by the rerun


# ---------------------------------------------------------------------------------------------
# The walk-through's order: grade, hand scores in the formgrader, feedback, export, a regrade
# ---------------------------------------------------------------------------------------------

WRITTEN = "written_sqrt_dk"  # the 2-point written answer, graded by hand


def _hand_score(course: dict, student: str, score: float) -> None:
    """What the formgrader's grade API does on a save (nbgrader's ``GradeHandler.put``)."""
    from nbgrader.api import Gradebook

    with Gradebook(course["url"], "transformers") as gb:
        grade = gb.find_grade(WRITTEN, AID, AID, student)
        grade.manual_score, grade.needs_manual_grade = score, False
        gb.db.commit()


def _everywhere(course: dict, student: str) -> dict[str, float]:
    """The student's final grade as each page shows it: the export, ``grades.csv``, their JSON
    report, the dashboard and the feedback's late note (after an export: what it said too)."""
    root = course["root"]
    out = root / "walkthrough.csv"
    said = coursepkg("export", AID, "--format", "csv", *course["where"], "--output", str(out))
    with out.open(newline="") as f:
        exported = {r["student_id"]: float(r[AID]) for r in csv.DictReader(f)}
    with (root / "reports" / AID / "grades.csv").open(newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    row = rows[student]
    report = json.loads((root / "reports" / AID / f"{student}.json").read_text(encoding="utf-8"))
    page = (root / "reports" / "dashboard.html").read_text(encoding="utf-8")
    (final,) = re.findall(
        rf"<tr class='final-grade'><td>{student}</td><td>[^<]*</td>"
        r"<td>[^<]*</td><td>([^<]*)</td>",
        page,
    )
    text = feedback_text(root, student)  # the late note's final score, else nbgrader's header
    note = re.search(r"your score: ([\d.]+) of", text) or re.search(
        rf"{AID} \(Score: ([\d.]+) /", text
    )
    return {
        "export": exported[student],
        "grades.csv": float(row["score"]),  # nbgrader's: raw_score less late_submission_penalty
        "report": report["final_score"],
        "dashboard": float(final),
        "feedback": float(note[1]),
        "said": said.stdout,
    }


def test_the_penalty_follows_hand_scores_and_regrade_answers(course, tmp_path):
    root, total = course["root"], course["total"]  # 11 autograded points, all earned
    # By hand: 20% (two started days) of 11 + 2 = 13 is 2.6 off; 50% (capped) of 11 + 1 is 6.
    expected = {"twodays": 13 - 2.6, "capped": (11 + 1) / 2, "ontime": 13.0}
    assert total == 11
    for sid, written in (("twodays", 2), ("capped", 1), ("ontime", 2)):
        _hand_score(course, sid, written)
    db = ["--CourseDirectory.db_url=" + course["url"]]
    run = processes.run(
        [str(BIN / "nbgrader"), "generate_feedback", AID, *db],
        cwd=root,
        env=_env(),
        idle=600,
        progress=lambda: files_under(root),
    )
    assert run.returncode == 0, run.stderr
    said = []
    for sid, grade_now in expected.items():
        shown = _everywhere(course, sid)
        said.append(shown.pop("said"))
        assert shown == dict.fromkeys(shown, pytest.approx(grade_now)), (sid, shown)
    # the first export brought the reports up to date, and said so; the next had nothing to do
    assert f"{AID}: the reports of capped, ontime, twodays now show the grades" in said[0]
    assert "now show the grades" not in said[1]
    assert "Penalty: 2.6 point(s) off (your score: 10.4 of 13)" in feedback_text(root, "twodays")
    # A regrade answer takes twodays' written points away: 20% of 11 is 2.2 off.
    request = tmp_path / "written.json"
    coursepkg(
        "regrade",
        "request",
        AID,
        WRITTEN,
        "--student",
        "twodays",
        "--reason",
        "Please read my answer again.",
        "--output",
        str(request),
    )
    added = coursepkg("regrade", "add", str(request), *course["where"]).stdout
    (rid,) = re.findall(rf"request (\d+): twodays, {AID} {WRITTEN} \(open\)", added)
    coursepkg(
        "regrade",
        "answer",
        rid,
        "--score",
        "0",
        "--why",
        "It restates the question.",
        "--by",
        "Dr. Turing",
        *course["where"],
    )
    shown = _everywhere(course, "twodays")
    shown.pop("said")
    assert shown == dict.fromkeys(shown, pytest.approx(11 - 2.2)), shown
    assert "Penalty: 2.2 point(s) off (your score: 8.8 of 13)" in feedback_text(root, "twodays")
