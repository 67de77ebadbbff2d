"""``coursepkg grade`` on a whole class: honest, buggy, broken and hostile notebooks in ONE batch.

In a temporary nbgrader course directory holding ex01 (the fastest assignment), every entry of
:func:`grading_hostile.hostile_catalogue` is handed in by its own student, next to
two correct submissions (the solutions and an independent implementation), the untouched
release and a known bug (``sdpa.no_scaling``). One ``coursepkg grade --workers 2`` run grades
them all, with short time limits so the loops cost seconds. Then:

* each student's score in nbgrader's exported CSV is exactly the catalogue's expectation, and
  their feedback holds the catalogue's phrase (the reason for lost points);
* the gradebook holds exactly one submission per student, each with one grade per test cell;
* nothing under ``submitted/`` or ``solutions/`` changed (hashes before and after), and no file
  appeared outside the notebooks' own folders;
* grading again (a subset, and with Landlock switched off, as on a CI kernel without it) gives
  the same grades, adds no row, and the summary warns about the missing sandbox; so does a
  subset graded with kernels started anew (``--no-fork``) instead of forked;
* the JSON reports name the known bug, and the dashboard shows figures and counts it.

Entries whose outcome relies on Landlock (reading ``solutions/``, writing outside the folder...)
are left out where the kernel has no Landlock: there nothing can promise what they test.
"""

from __future__ import annotations

import csv
import hashlib
import html
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grading_impls_encoder as impls
import nbformat
import processes
import pytest
from grading_hostile import expected_score, hostile_catalogue, points, write_submissions
from processes import files_under

from coursepkg.grading.kernel.confine import landlock_abi

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
AID = "ex01_attention"
# Short limits, so that the loops and the too-slow notebook cost seconds, not minutes; a
# normal ex01 notebook takes 5-15 s on two busy cores.
CELL_TIMEOUT, NOTEBOOK_TIMEOUT, MEMORY_MB = 8, 50, 2048
BUG = "sdpa.no_scaling"
# Where grading differs from the catalogue's phrase by design: a grading worker never receives
# solutions/ (only the release and the source's data files), so a notebook that reads them finds
# no file at all rather than one it may not read.
_PHRASES = {"h_reads_solutions": "FileNotFoundError"}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def _grade(course: Path, *args: str, **env: str) -> str:
    run = processes.run(
        [str(BIN / "coursepkg"), "grade", AID, "--root", str(course), "--workers", "2"]
        + ["--cell-timeout", str(CELL_TIMEOUT), "--notebook-timeout", str(NOTEBOOK_TIMEOUT)]
        + ["--memory-mb", str(MEMORY_MB), "--no-progress", *args],
        env=_env(**env),
        idle=600,  # without output or a file written in the course
        progress=lambda: files_under(course),
    )
    assert run.returncode == 0, f"coursepkg grade failed:\n{run.stdout}\n{run.stderr}"
    return run.stdout


def _answer(nb, item: str):
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == item]
    return cell


def _hashes(*folders: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in folders
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _csv(course: Path) -> dict[str, float]:
    with open(course / "reports" / AID / "grades.csv", newline="") as f:
        return {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}


def _feedback(course: Path, student: str) -> str:
    """The feedback's text, its whitespace squashed: a check's message is wrapped into lines
    where a notebook shows it, and a phrase may span two of them."""
    path = course / "feedback" / student / AID / f"{AID}.html"
    return _squash(html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8"))))


def _squash(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = tmp_path_factory.mktemp("class")
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(ROOT / "solutions" / AID, course / "solutions" / AID)
    subprocess.run(
        [str(BIN / "nbgrader"), "generate_assignment", AID, "--force"],
        cwd=course,
        env=_env(),
        check=True,
        capture_output=True,
    )
    source = nbformat.read(str(course / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    release = nbformat.read(str(course / "exercises" / AID / f"{AID}.ipynb"), as_version=4)

    abi = landlock_abi()
    entries = [
        e
        for e in hostile_catalogue(cell_timeout=CELL_TIMEOUT, notebook_timeout=NOTEBOOK_TIMEOUT)
        if e.needs_landlock <= abi
    ]
    write_submissions(course, AID, entries)
    expected = {
        e.id: (expected_score(e, source), _PHRASES.get(e.id, e.phrase), e.graded) for e in entries
    }

    total = points(source)
    honest = {
        "solved": (source, total, "passed"),
        "independent": (nbformat.from_dict(source), total, "passed"),
        "untouched": (release, 0.0, "not implemented yet"),
        "buggy": (nbformat.from_dict(source), points(source, "additive_score"), "divided by sqrt"),
    }
    independent = honest["independent"][0]
    _answer(independent, "answer_additive_score").source = inspect.getsource(
        impls.additive_score_einsum
    ).replace("additive_score_einsum", "additive_score")
    _answer(independent, "answer_scaled_dot_product_attention").source = inspect.getsource(
        impls.sdpa_manual_softmax
    ).replace("sdpa_manual_softmax", "scaled_dot_product_attention")
    buggy = _answer(honest["buggy"][0], "answer_scaled_dot_product_attention")
    assert buggy.source.count("/ math.sqrt(d_k)") == 1
    buggy.source = buggy.source.replace("/ math.sqrt(d_k)", "")
    for student, (nb, score, phrase) in honest.items():
        target = course / "submitted" / student / AID / f"{AID}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, str(target))
        expected[student] = (score, phrase, True)

    before = _hashes(course / "submitted", course / "solutions")
    start = time.perf_counter()
    summary = _grade(course)
    seconds = time.perf_counter() - start
    return {
        "course": course,
        "expected": expected,
        "entries": entries,
        "before": before,
        "summary": summary,
        "seconds": seconds,
        "scores": _csv(course),
        "abi": abi,
    }


def test_the_catalogue_has_at_least_twenty_entries():
    entries = hostile_catalogue()
    assert len(entries) >= 20
    assert len({e.id for e in entries}) == len(entries)


def test_every_student_gets_exactly_the_expected_score(graded):
    scores, expected = graded["scores"], graded["expected"]
    assert set(scores) == set(expected), "a student is missing from the export, or extra"
    wrong = {s: (scores[s], want) for s, (want, _, _) in expected.items() if scores[s] != want}
    assert not wrong, f"(got, expected): {wrong}\n{graded['summary']}"


@pytest.mark.parametrize("entry", [e.id for e in hostile_catalogue()])
def test_each_feedback_says_what_happened(graded, entry):
    if entry not in graded["expected"]:
        pytest.skip(f"needs Landlock, which this kernel lacks (ABI {graded['abi']})")
    _, phrase, _ = graded["expected"][entry]
    assert _squash(phrase) in _feedback(graded["course"], entry)


def test_honest_students_feedback(graded):
    for student in ("solved", "independent", "untouched", "buggy"):
        _, phrase, _ = graded["expected"][student]
        assert _squash(phrase) in _feedback(graded["course"], student), student


def test_unrunnable_notebooks_are_listed_with_their_reason(graded):
    reports = graded["course"] / "reports" / AID
    for student, (_, phrase, runnable) in graded["expected"].items():
        report = json.loads((reports / f"{student}.json").read_text())
        assert report["graded"] == runnable, student
        if not runnable:
            assert phrase in report["reason"], (student, report["reason"])
            assert f"{student}: " in graded["summary"]


def test_the_known_bug_is_named_in_the_json_report(graded):
    report = json.loads((graded["course"] / "reports" / AID / "buggy.json").read_text())
    assert report["diagnoses"] == [BUG]
    assert report["autograded_points"] == graded["expected"]["buggy"][0]
    failed = [t for t in report["tests"] if not t["passed"]]
    assert {t["grade_id"] for t in failed} == {
        "test_scaled_dot_product_attention_visible",
        "test_scaled_dot_product_attention_hidden",
    }
    assert all(t["diagnoses"][0]["id"] == BUG for t in failed)


def _gradebook_rows(course: Path, db: str = "gradebook.db") -> tuple[dict[str, int], int]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / db}") as gb:
        per_student = {}
        for sub in gb.assignment_submissions(AID):
            (nb,) = sub.notebooks
            assert len(nb.grades) == len(gb.find_notebook(AID, AID).grade_cells)
            per_student[sub.student.id] = per_student.get(sub.student.id, 0) + 1
        return per_student, len(gb.students)


def test_one_gradebook_submission_per_student(graded):
    per_student, students = _gradebook_rows(graded["course"])
    assert per_student == {s: 1 for s in graded["expected"]}
    assert students == len(graded["expected"])


def test_no_student_file_changed_and_nothing_written_outside(graded):
    course = graded["course"]
    assert _hashes(course / "submitted", course / "solutions") == graded["before"]
    assert not list(course.rglob("HACKED*"))
    # The grader's staging copies are gone; only nbgrader's folders and the reports remain.
    assert sorted(p.name for p in course.iterdir()) == sorted(
        [
            "autograded",
            "exercises",
            "feedback",
            "gradebook.db",
            "nbgrader_config.py",
            "reports",
            "solutions",
            "submitted",
        ]
    )


def test_huge_output_is_capped_in_the_feedback(graded):
    feedback = graded["course"] / "feedback" / "h_prints_100mb" / AID / f"{AID}.html"
    assert feedback.stat().st_size < 5_000_000


def test_summary_reports_the_batch_and_the_sandbox(graded):
    summary = graded["summary"]
    assert f"graded {len(graded['expected'])} student(s)" in summary
    assert "with 2 worker(s)" in summary
    if graded["abi"]:
        assert f"Landlock (ABI {graded['abi']})" in summary
    assert "memory limited to 2048 MiB" in summary


def test_dashboard_counts_the_named_bug(graded):
    course = graded["course"]
    page = (course / "reports" / "dashboard.html").read_text()
    assert page.count("<img") >= 1 and "data:image/png;base64," in page
    reports = [json.loads(p.read_text()) for p in (course / "reports" / AID).glob("*.json")]
    hits = sum(BUG in r["diagnoses"] for r in reports)
    assert hits >= 1
    row = re.search(rf"<code>{re.escape(BUG)}</code></td><td>[^<]*</td><td>(\d+)</td>", page)
    assert row and int(row.group(1)) == hits
    assert f"{len(reports)} students" in page


def test_rerun_without_landlock_gives_the_same_grades_and_warns(graded):
    """Grade a few students again, with Landlock switched off (as on a kernel without it):
    same scores, still one submission each, and the summary says the sandbox is missing."""
    course = graded["course"]
    again = ["solved", "buggy", "untouched", "h_not_json", "h_os_exit", "h_monkeypatch_grading"]
    rows_before = _gradebook_rows(course)
    summary = _grade(course, *[f"--student={s}" for s in again], COURSEPKG_LANDLOCK="0")
    assert "WARNING: Landlock is not available" in summary
    assert _csv(course) == graded["scores"]
    assert _gradebook_rows(course) == rows_before
    for student in again:
        assert _squash(graded["expected"][student][1]) in _feedback(course, student)


def test_kernels_started_anew_give_the_same_grades(graded):
    """The batch forked its kernels from a server (forkserver.py); kernels started anew, as
    nbgrader starts them, must give every student the same grade and feedback."""
    course = graded["course"]
    again = [
        s
        for s in ("solved", "buggy", "h_infinite_loop", "h_kernel_sigkill", "h_memory_bomb")
        + ("h_monkeypatch_grading", "h_reads_solutions", "h_kills_grader")
        if s in graded["expected"]
    ]
    rows_before = _gradebook_rows(course)
    _grade(course, "--no-fork", *[f"--student={s}" for s in again])
    assert _csv(course) == graded["scores"]
    assert _gradebook_rows(course) == rows_before
    for student in again:
        assert _squash(graded["expected"][student][1]) in _feedback(course, student)


def test_another_gradebook_url(graded):
    """``--db`` sends the grades to that gradebook (any SQLAlchemy URL; here another SQLite
    file), leaving the default one alone; a gradebook without the assignment gets it recorded
    from solutions/ first (what ``make release`` does), so grading needs no other command."""
    course = graded["course"]
    url = f"sqlite:///{course / 'other.db'}"
    rows_before = _gradebook_rows(course)
    export = course / "reports" / AID / "grades.csv"
    kept = export.read_bytes()
    try:
        # One worker: a second one (its process and its fork server) costs about 12 s of CPU,
        # more than it saves on two students; the batch on two workers is the fixture's.
        run = processes.run(
            [
                str(BIN / "coursepkg"),
                "grade",
                AID,
                "--root",
                str(course),
                "--db",
                url,
                "--workers",
                "1",
                "--no-progress",
                "--student=solved",
                "--student=buggy",
            ],
            env=_env(),
            idle=600,
            check=False,
            progress=lambda: files_under(course),
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "the gradebook did not know ex01_attention: recorded it from solutions" in (
            run.stderr
        ), run.stderr
        assert _gradebook_rows(course, "other.db") == ({"solved": 1, "buggy": 1}, 2)
        assert _gradebook_rows(course) == rows_before
        scores = _csv(course)  # the export now comes from other.db
        assert scores == {s: graded["scores"][s] for s in ("solved", "buggy")}
    finally:
        export.write_bytes(kept)  # the class's export, for the other tests


def test_release_feedback_skips_a_zip_collect_submission(tmp_path):
    """nbgrader's release_feedback stopped at a student without an exchange secret (collected
    with zip_collect); the course's ReleaseFeedback releases the others and names the skipped."""
    course, exchange = tmp_path / "course", tmp_path / "exchange"
    shutil.copytree(ROOT / "solutions" / "ex01_attention", course / "solutions" / "ex01_attention")
    shutil.copy(ROOT / "nbgrader_config.py", course)
    exchange.mkdir()
    for student, secret in (("zoe", None), ("yan", "s3cret")):
        folder = course / "feedback" / student / "ex01_attention"
        folder.mkdir(parents=True)
        (folder / "ex01_attention.html").write_text(f"<p>feedback for {student}</p>")
        (folder / "timestamp.txt").write_text("2026-01-01 00:00:00.000000 UTC")
        if secret:
            (folder / "submission_secret.txt").write_text(secret)
    env = {**os.environ, "COURSE_EXCHANGE": str(exchange), "PATH": f"{BIN}:{os.environ['PATH']}"}
    done = processes.run(
        [str(BIN / "nbgrader"), "release_feedback", "ex01_attention"],
        cwd=course,
        env=env,
        idle=300,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    released = list((exchange / "transformers" / "feedback").glob("*.html"))
    assert [p.read_text() for p in released] == ["<p>feedback for yan</p>"], out
    assert "zoe" in out and "submission_secret.txt" in out, out


def test_the_definition_shipped_to_workers_is_stamped_without_a_subprocess(graded, monkeypatch):
    """The assignment's definition (an SQLite gradebook for the workers) has the course
    gradebook's tables and schema version; nbgrader would stamp a new database by running
    ``alembic heads`` in a subprocess (seconds per run), so that path must not be taken. A
    gradebook without a stamp falls back to nbgrader's own."""
    import sqlite3

    import nbgrader.api

    from coursepkg.grading.classroom import gradebook

    course = graded["course"]
    book = gradebook.Course(course, f"sqlite:///{course / 'gradebook.db'}")

    def forbidden():
        raise AssertionError("nbgrader ran `alembic heads`")

    def schema(path: Path) -> tuple[list, list]:
        with sqlite3.connect(path) as db:
            tables = sorted(r[0] for r in db.execute("SELECT sql FROM sqlite_master") if r[0])
            return tables, db.execute("SELECT version_num FROM alembic_version").fetchall()

    monkeypatch.setattr(nbgrader.api, "get_alembic_version", forbidden)
    shipped = course / "definition.db"
    shipped.write_bytes(gradebook.definition(book, AID))
    assert schema(shipped) == schema(course / "gradebook.db")
    with sqlite3.connect(shipped) as db:
        assert db.execute("SELECT count(*) FROM grade_cells").fetchone()[0] > 0

    unstamped = course / "unstamped.db"
    shutil.copy(course / "gradebook.db", unstamped)
    with sqlite3.connect(unstamped) as db:
        db.execute("DROP TABLE alembic_version")
    monkeypatch.setattr(nbgrader.api, "get_alembic_version", lambda: "f00d")
    book = gradebook.Course(course, f"sqlite:///{unstamped}")
    shipped.write_bytes(gradebook.definition(book, AID))
    assert schema(shipped)[1] == [("f00d",)]


@pytest.mark.parametrize(
    ("module", "skipped"),
    [
        ("coursepkg.grading.classroom.worker", True),  # a Dask worker (and the client)
        ("coursepkg.grading.kernel.forkserver", True),  # a fork server, its kernels
        ("coursepkg.grading", False),  # a student's notebook: nothing changes
    ],
)
def test_only_the_graders_processes_skip_the_iri_grammar(module, skipped):
    """The grader's own processes start without jsonschema's IRI grammar (seconds of CPU per
    process); a student's process importing the checks is left as it was; notebooks still
    validate either way."""
    code = (
        f"import sys, {module}, nbformat\n"
        "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('1')])\n"
        "nbformat.validate(nb)\n"
        "print(sys.modules.get('rfc3987_syntax', 'absent') is None)\n"
    )
    out = processes.run([sys.executable, "-c", code], idle=300, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(skipped)]
