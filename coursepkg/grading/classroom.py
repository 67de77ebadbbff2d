"""Autograde a whole class with nbgrader, in parallel and robust to broken or hostile notebooks:
``coursepkg grade <assignment> [--workers N]``.

Everything a grade depends on is nbgrader's own work, through its Python API (what its
formgrader uses): ``NbGraderAPI.autograde`` and ``generate_feedback`` per student, and nbgrader's
``CsvExportPlugin`` for the CSV (what ``nbgrader export`` runs); grades live in nbgrader's
gradebook (SQLite by default, any SQLAlchemy URL). What this module adds around it:

* **Parallel workers**: ``workers`` worker processes (default: the number of cores), each
  importing and configuring nbgrader once and then grading one student after another, with a
  tqdm progress bar and a summary at the end. Each kernel gets ``cores // workers`` threads.
* **Kernels forked, not started**: each worker runs a fork server
  (:mod:`coursepkg.grading.forkserver`) that imports torch, IPython and the checks once; every
  notebook's kernel is a forked child of it, confined like a fresh one, which saves the CPU time a
  fresh kernel spends importing them (``fork=False`` starts kernels as nbgrader does).
* **Limits** per notebook: nbgrader's per-cell timeout (the cell is interrupted, its test
  scores 0), a wall-clock limit per student after which the worker and its kernel are killed
  (and the worker replaced), and the sandbox kernel of :mod:`coursepkg.grading.sandbox`
  (memory, CPU time, file access, capped output, a guard of the checks). A protection the
  system does not offer (Landlock on an old kernel) is skipped and the summary says so.
* **Every student gets a grade**. A notebook that cannot be run (not JSON, empty, missing), whose
  kernel died, or that was stopped, is graded again from a *staging copy* of the release (the
  stubs), with every check failing with the reason: 0 points and a clear line in the feedback.
  The student's files are never modified. SQLite's "database is locked" under concurrent
  writers is waited for (a busy timeout in the URL) and retried.
* **Notes** in the graded notebook: deleted test cells are restored by nbgrader
  (``OverwriteCells.add_missing_cells``); edited locked cells (restored by nbgrader anyway),
  duplicated cell ids and the reason a notebook was not graded are listed in a note cell at the
  top, which the feedback shows. Two small preprocessors work around nbgrader failures that
  one student's notebook could otherwise cause (:class:`DropEmptyMetadata`,
  :class:`DefuseHiddenMarkers`).
* **Reports** in ``<course>/reports/<assignment>/``: ``grades.csv`` (nbgrader's export),
  ``<student>.json`` (each test's points, pass/fail, message and the named diagnoses of
  :func:`coursepkg.grading.catalogue`, notes, review flags), ``logs/<student>.log`` (nbgrader's
  output) and ``<course>/reports/dashboard.html`` (the misconception dashboard, every
  assignment graded so far).

A rerun is safe: nbgrader replaces the grades of a submission in place (``force``), and the
reports are rewritten. :mod:`coursepkg.grading.hostile` holds the catalogue of broken and
hostile notebooks this is tested with.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor

from . import catalogue
from .framework import CHECKER_FAILED
from .notebook import NotebookError, load_notebook
from .sandbox import KERNEL_NAME, NOT_GRADED_ENV, PIDFILE_ENV, STATUS_ENV, write_kernelspec

__all__ = [
    "ClassResult",
    "GraderNotes",
    "StudentResult",
    "build_dashboard",
    "grade_class",
    "review_flags",
]

log = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NOTE_MARK = "**Notes from the grader** (coursepkg grade)"
# Fallback submissions (the release under the student's name), relative to the course root.
_STAGED = ".coursepkg-grade/staged"
RELEASE_ENV = "COURSEPKG_RELEASE_DIR"  # tells GraderNotes where the release notebooks are


# ---------------------------------------------------------------------------------------------
# The nbgrader preprocessor that writes the grader's notes into the notebook
# ---------------------------------------------------------------------------------------------


class GraderNotes(NbGraderPreprocessor):
    """Put a note cell at the top of the notebook being autograded, listing what the grader
    changed or noticed: edited locked cells (nbgrader restores them), duplicated cell ids,
    deleted test cells (nbgrader adds them back), the reason a notebook was not graded.

    Runs first in nbgrader's sanitizing step, so it sees the submission as handed in.
    """

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        from nbgrader.api import Gradebook, MissingEntry

        notes: list[str] = []
        reason = os.environ.get(NOT_GRADED_ENV, "")
        if reason:
            notes.append(f"Your notebook was not graded: {reason}. Every test scores 0.")
        meta = resources.get("metadata", {})
        raw_path = Path(meta.get("path", ".")) / f"{meta.get('name', '')}.ipynb"
        try:
            raw = json.loads(raw_path.read_text(encoding="utf-8"))
            ids = Counter(c.get("id") for c in raw.get("cells", []) if c.get("id"))
            grade_ids = Counter(
                c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                for c in raw.get("cells", [])
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            )
        except (OSError, ValueError, AttributeError):
            ids, grade_ids = Counter(), Counter()
        dup = sorted({k for k, n in (*ids.items(), *grade_ids.items()) if n > 1})
        if dup and not reason:
            notes.append(
                f"Duplicated cell ids ({', '.join(dup)}): a copied graded cell counts once; only "
                "its last copy keeps nbgrader's marks, the others run as ordinary cells."
            )
        info = resources.get("nbgrader", {})
        present: set[str] = set()
        # The release is what the student was given (hidden tests already stripped out).
        release_file = Path(os.environ.get(RELEASE_ENV, "")) / f"{info.get('notebook')}.ipynb"
        try:
            release = nbformat.read(str(release_file), as_version=4)
            originals = {
                c.metadata["nbgrader"]["grade_id"]: c.source
                for c in release.cells
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            }
        except (OSError, ValueError, KeyError):
            originals = {}
        try:
            with Gradebook(info["db_url"]) as gb:
                source = gb.find_notebook(info["notebook"], info["assignment"])
                # A locked cell is as handed out if it reads like the release (hidden tests
                # stripped) or like nbgrader's source (hidden tests in).
                locked = {
                    cell.name: {cell.source.strip()} for cell in source.source_cells if cell.locked
                }
                for grade_id, text in originals.items():
                    locked.get(grade_id, set()).add(text.strip())
                for cell in nb.cells:
                    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                    if not grade_id:
                        continue
                    present.add(grade_id)
                    if grade_id in locked and cell.source.strip() not in locked[grade_id]:
                        if not reason:
                            notes.append(
                                f"The locked cell `{grade_id}` had been edited; it was put back "
                                "to the original before grading."
                            )
                missing = sorted(
                    c.name for c in source.grade_cells if c.name not in present and c.name in locked
                )
        except (KeyError, MissingEntry):
            missing = []
        if missing and not reason:
            notes.append(
                f"Test cells missing from your notebook were added back: {', '.join(missing)}."
            )
        if notes:
            text = _NOTE_MARK + "\n\n" + "\n".join(f"- {n}" for n in notes)
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(text))
        return nb, resources


class DropEmptyMetadata(NbGraderPreprocessor):
    """Remove the empty ``nbgrader`` metadata that nbgrader's ``DeduplicateIds`` leaves on the
    extra copies of a duplicated cell.

    nbgrader 0.9's ``OverwriteCells.add_missing_task_cells`` then reads ``grade_id`` from every
    cell that has ``nbgrader`` metadata and fails on those empty ones (a ``KeyError`` that stops
    the whole notebook), so a student who copied a test cell would get nothing. Without the key
    the copy is an ordinary cell, which is what ``DeduplicateIds`` meant.
    """

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        for cell in nb.cells:
            if "nbgrader" in cell.get("metadata", {}) and not cell.metadata.nbgrader:
                del cell.metadata["nbgrader"]
        return nb, resources


class DefuseHiddenMarkers(NbGraderPreprocessor):
    """Before feedback: drop hidden-test regions from cells that are not test cells.

    nbgrader's ``ClearHiddenTests`` refuses to make feedback at all when a student's own cell
    contains its ``BEGIN HIDDEN TESTS`` marker (a copied test cell, or the text typed in an
    answer), so that student would get no feedback. Here such a region is replaced by a comment
    (as ``ClearHiddenTests`` would do to a test cell), an unterminated one up to the cell's end.
    The autograded notebook and its grades are not touched; this is the feedback's copy.
    """

    def preprocess_cell(self, cell: Any, resources: dict, index: int) -> tuple[Any, dict]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade") or (
            "BEGIN HIDDEN TESTS" not in cell.source and "END HIDDEN TESTS" not in cell.source
        ):
            return cell, resources
        kept, inside = [], False
        for line in cell.source.split("\n"):
            if "BEGIN HIDDEN TESTS" in line:
                if not inside:
                    kept.append("# (a hidden-test region here was removed by the grader)")
                inside = True
            elif "END HIDDEN TESTS" in line:
                inside = False
            elif not inside:
                kept.append(line)
        cell.source = "\n".join(kept)
        return cell, resources


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass
class StudentResult:
    """How grading one student went.

    Attributes:
        student: the student id.
        graded: False when the notebook could not be run and got the fallback zero.
        reason: why it was not graded (empty when it was).
        score: total points in the gradebook.
        max_score: points available.
        seconds: wall-clock time of this student's autograde runs.
        attempts: nbgrader runs (a retry after "database is locked" counts).
        error: set when not even the fallback grade could be recorded (the student then has
            no grade in the gradebook; the summary says so).
        feedback: whether nbgrader's feedback was generated.
        checker_failed: test cells whose check itself crashed (to grade by hand).
    """

    student: str
    graded: bool = True
    reason: str = ""
    score: float = 0.0
    max_score: float = 0.0
    seconds: float = 0.0
    attempts: int = 0
    error: str = ""
    feedback: bool = True
    checker_failed: list[str] = field(default_factory=list)


@dataclass
class ClassResult:
    """The outcome of :func:`grade_class`.

    Attributes:
        assignment: the assignment id.
        students: one result per student, sorted by id.
        seconds: wall-clock time of the whole run.
        grade_seconds: of which autograding (and feedback) in the workers.
        workers: parallel workers used.
        reports: the directory holding the CSV, JSON files and logs.
        dashboard: the dashboard's HTML file.
        sandbox: how the kernels were confined (see :func:`sandbox_summary`).
    """

    assignment: str
    students: list[StudentResult] = field(default_factory=list)
    seconds: float = 0.0
    grade_seconds: float = 0.0
    workers: int = 1
    reports: Path = Path()
    dashboard: Path = Path()
    sandbox: str = ""

    def summary(self) -> str:
        """A few lines: how many were graded, how fast, the mean score, who could not be run
        (and why), and how the notebooks were confined."""
        n = len(self.students)
        mean = sum(s.score for s in self.students) / n if n else 0.0
        top = max((s.max_score for s in self.students), default=0.0)
        rate = 60 * n / self.grade_seconds if self.grade_seconds else 0.0
        lines = [
            f"{self.assignment}: graded {n} student(s) in {self.seconds:.0f} s with "
            f"{self.workers} worker(s) ({rate:.1f} notebooks/min); mean score "
            f"{mean:.2f}/{top:g}"
        ]
        failed = [s for s in self.students if not s.graded]
        if failed:
            lines.append(f"{len(failed)} notebook(s) could not be run and scored 0:")
            lines.extend(f"  {s.student}: {s.reason}" for s in failed)
        lost = [s.student for s in self.students if s.error]
        if lost:
            lines.append(
                f"ERROR: no grade could be recorded for {', '.join(lost)} (see the logs in "
                f"{self.reports / 'logs'}); grade them again with --student"
            )
        review = [s for s in self.students if s.checker_failed]
        if review:
            lines.append(
                f"REVIEW: the checker itself failed for {len(review)} student(s); their points "
                "in those cells are not a verdict, grade them by hand:"
            )
            lines.extend(f"  {s.student}: {', '.join(s.checker_failed)}" for s in review)
        no_feedback = [s.student for s in self.students if not s.feedback and not s.error]
        if no_feedback:
            lines.append(
                f"WARNING: nbgrader could not generate feedback for {', '.join(no_feedback)} "
                f"(see the logs in {self.reports / 'logs'})"
            )
        if self.sandbox:
            lines.append(self.sandbox)
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The worker processes: nbgrader's own API, loaded once per worker
# ---------------------------------------------------------------------------------------------


@dataclass
class _Settings:
    """What a worker needs (JSON-serialisable: it is passed on the worker's command line)."""

    course: str
    assignment: str
    db_url: str
    cell_timeout: int
    notebook_timeout: int
    scratch: str
    logs: str
    release: str
    threads: int
    fork: bool = True

    @property
    def staged(self) -> Path:
        return Path(self.course) / _STAGED


def _classify(output: str, cell_timeout: int) -> str:
    """A sentence for the student from nbgrader's log of a failed run."""
    if "DeadKernelError" in output or "Kernel died" in output or "kernel died" in output:
        return (
            "the Python kernel died while running your notebook (the code exited the process, "
            "killed it, crashed it or ran out of memory), so none of its tests could run"
        )
    if "CellTimeoutError" in output or "UnresponsiveKernelError" in output:
        # nbgrader interrupts a cell that runs too long; this one ignored the interrupt.
        return (
            f"a cell ran longer than the {cell_timeout} s allowed and could not be interrupted "
            "(a loop that ignores KeyboardInterrupt?), so the notebook was stopped"
        )
    errors = [ln for ln in output.splitlines() if "ERROR" in ln or "Error" in ln]
    last = errors[-1].strip() if errors else "unknown error"
    return f"nbgrader could not run your notebook ({last[:200]})"


def _problem(course: Path, assignment: str, student: str, notebooks: list[str]) -> str:
    """Why the submission cannot be run at all (missing, empty, not JSON), or ``""``."""
    folder = course / "submitted" / student / assignment
    for name in notebooks:
        path = folder / f"{name}.ipynb"
        if not path.exists():
            found = sorted(p.name for p in folder.glob("*.ipynb"))
            return f"no {name}.ipynb in your submission (found: {', '.join(found) or 'nothing'})"
        # Only what certainly cannot run is caught here; anything nbgrader can read, it grades
        # (a stricter schema check would give zeros to notebooks nbgrader accepts).
        try:
            load_notebook(path)
        except NotebookError as err:
            return str(err).replace(str(path), f"{name}.ipynb")
    return ""


def _stage_fallback(settings: _Settings, student: str, notebooks: list[str]) -> None:
    """A staging submission for ``student``: the release (stubs) under each expected name.

    The student's own files stay untouched; nbgrader reads this copy instead.
    """
    staged = settings.staged / student / settings.assignment
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for name in notebooks:
        shutil.copy(Path(settings.release) / f"{name}.ipynb", staged / f"{name}.ipynb")
    stamp = Path(settings.course) / "submitted" / student / settings.assignment / "timestamp.txt"
    if stamp.is_file():
        shutil.copy(stamp, staged / "timestamp.txt")


def _worker_config(settings: _Settings) -> Any:
    """nbgrader settings that outrank the course's ``nbgrader_config.py`` when grading."""
    from traitlets.config import Config

    config = Config()
    config.CourseDirectory.db_url = settings.db_url
    config.Execute.kernel_name = KERNEL_NAME
    config.Execute.timeout = settings.cell_timeout
    # Deleted test cells are put back (nbgrader's own option), so deleting them gains nothing.
    config.OverwriteCells.add_missing_cells = True
    if settings.fork:
        # Kernels forked from a process that has imported torch (see forkserver.py).
        from nbgrader.converters import Autograde
        from nbgrader.preprocessors import Execute

        from .forkserver import ForkExecute

        config.Autograde.autograde_preprocessors = [
            ForkExecute if pp is Execute else pp
            for pp in Autograde.class_traits()["autograde_preprocessors"].default()
        ]
    config.Autograde.sanitize_preprocessors = [
        "coursepkg.grading.classroom.GraderNotes",
        "nbgrader.preprocessors.ClearOutput",
        "nbgrader.preprocessors.DeduplicateIds",
        "coursepkg.grading.classroom.DropEmptyMetadata",
        "nbgrader.preprocessors.OverwriteKernelspec",
        "nbgrader.preprocessors.OverwriteCells",
        "nbgrader.preprocessors.CheckCellMetadata",
    ]
    return config


# Failures that are the machine's, not the notebook's, and pass on a second try: SQLite busy
# with another worker's write, and a kernel that could not start (jupyter_client picks free
# ports, and another kernel starting at the same moment may take one first). Neither can be
# caused by the student: no code of theirs has run before the kernel answers.
_TRANSIENT = ("database is locked", "before replying to kernel_info", "Address already in use")


def _retrying(call: Any, attempts: int = 6) -> tuple[dict, int]:
    """Call an NbGraderAPI method, again while it fails for a transient reason."""
    for attempt in range(1, attempts + 1):
        out = call()
        text = out.get("log", "") + out.get("error", "")
        transient = any(t in text for t in _TRANSIENT)
        if out.get("success") or not transient or attempt == attempts:
            return out, attempt
        time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")


def _worker_grade(api: Any, settings: _Settings, job: dict) -> dict:
    """One student, inside a worker: autograde, the fallback zero if needed, feedback."""
    from nbgrader.utils import temp_attrs

    student, notebooks = job["student"], job["notebooks"]
    start = time.perf_counter()
    log_to = Path(settings.logs) / f"{student}.log"
    pidfile = Path(settings.scratch) / f"{student}.pid"
    status = Path(settings.scratch) / f"{student}.sandbox.json"
    tmp = Path(settings.scratch) / "tmp" / student
    tmp.mkdir(parents=True, exist_ok=True)
    env = {PIDFILE_ENV: str(pidfile), STATUS_ENV: str(status), "TMPDIR": str(tmp)}
    os.environ.update(env)
    # The kernel's connection file goes there too (the kernel may read that one file, and
    # write this folder: its private scratch); tempfile caches the folder, so tell it as well.
    tempfile.tempdir = str(tmp)
    reason, attempts = job.get("reason", ""), 0
    sandbox: dict = {}
    feedback = False

    def record(title: str, out: dict) -> None:
        with open(log_to, "a", encoding="utf-8", errors="replace") as f:
            f.write(f"== {title}: {'ok' if out.get('success') else 'FAILED'}\n")
            f.write(out.get("log", "") + out.get("error", "") + "\n")

    hand_graded = _hand_grades(settings, student)

    def autograde() -> dict:
        out = api.autograde(settings.assignment, student, force=True, create=True)
        pidfile.unlink(missing_ok=True)
        if out.get("success"):
            _keep_hand_grades(settings, student, hand_graded)
        return out

    try:
        if not reason:
            out, n = _retrying(autograde)
            attempts += n
            record("autograde", out)
            if status.is_file():
                sandbox = json.loads(status.read_text() or "{}")
                status.unlink()
            if not out.get("success"):
                reason = _classify(out.get("log", "") + out.get("error", ""), settings.cell_timeout)
        if reason:
            # The fallback: the release's stubs under the expected names, every check failing
            # with the reason. It runs no student code, so it cannot hang or crash.
            _stage_fallback(settings, student, notebooks)
            os.environ[NOT_GRADED_ENV] = reason
            try:
                with temp_attrs(api.coursedir, submitted_directory=_STAGED):
                    out, n = _retrying(autograde)
            finally:
                del os.environ[NOT_GRADED_ENV]
                shutil.rmtree(settings.staged / student, ignore_errors=True)
            attempts += n
            record("autograde (fallback: every test scores 0)", out)
            if not out.get("success"):
                raise RuntimeError(f"even the fallback grading failed; see {log_to}")
        out, _ = _retrying(lambda: api.generate_feedback(settings.assignment, student, True))
        record("generate_feedback", out)
        feedback = bool(out.get("success"))
    finally:
        for name in env:
            os.environ.pop(name, None)
        tempfile.tempdir = None
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "student": student,
        "graded": not reason,
        "reason": reason,
        "attempts": attempts,
        "seconds": time.perf_counter() - start,
        "sandbox": sandbox,
        "feedback": feedback,
    }


def _hand_grades(settings: _Settings, student: str) -> dict[tuple[str, str], tuple]:
    """The grades of ``student`` a grader has settled by hand (in the formgrader), keyed by
    (notebook, cell), with the submission's timestamp and the autograder's score then."""
    from nbgrader.api import Gradebook, MissingEntry

    kept: dict[tuple[str, str], tuple] = {}
    with Gradebook(settings.db_url) as gb:
        try:
            submission = gb.find_submission(settings.assignment, student)
        except MissingEntry:
            return kept
        for nb in submission.notebooks:
            for grade in nb.grades:
                if grade.manual_score is not None and not grade.needs_manual_grade:
                    kept[nb.name, grade.name] = (submission.timestamp, grade.auto_score)
    return kept


def _keep_hand_grades(
    settings: _Settings, student: str, kept: dict[tuple[str, str], tuple]
) -> None:
    """After a rerun of the autograder: a hand grade given to this same submission stays
    settled. nbgrader flags every hand-graded cell for manual grading again on each autograde;
    that is right for a new submission or a changed autograder score, not for a rerun."""
    from nbgrader.api import Gradebook

    if not kept:
        return
    with Gradebook(settings.db_url) as gb:
        submission = gb.find_submission(settings.assignment, student)
        for nb in submission.notebooks:
            for grade in nb.grades:
                before = kept.get((nb.name, grade.name))
                if before is not None and before == (submission.timestamp, grade.auto_score):
                    grade.needs_manual_grade = False
        gb.db.commit()


def _worker_export(api: Any, settings: _Settings, job: dict) -> dict:
    """nbgrader's CSV export (what ``nbgrader export`` runs), for one assignment."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    plugin = CsvExportPlugin(parent=api, to=job["to"], assignment=[settings.assignment])
    with Gradebook(settings.db_url) as gb:
        plugin.export(gb)
    return {"exported": job["to"]}


def _worker_main(settings_json: str) -> None:
    """A grading worker: read jobs (JSON lines) on stdin, answer each with a JSON line.

    nbgrader is imported and configured once here, then each job calls nbgrader's own API
    (``NbGraderAPI.autograde`` / ``generate_feedback``, as its formgrader does). Whatever
    nbgrader or a kernel prints goes to stderr (the worker's log), never into the answers.
    """
    settings = _Settings(**json.loads(settings_json))
    answers = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.chdir(settings.course)
    server = None
    if settings.fork:
        # Started first: it imports torch while this process imports nbgrader.
        from .forkserver import ForkServer

        server = ForkServer(Path(settings.scratch) / f"fork-{os.getpid()}.sock").start()
    from nbgrader.apps import NbGraderAPI
    from nbgrader.apps.nbgraderapp import NbGraderApp

    app = NbGraderApp()
    app.initialize([])  # the course's nbgrader_config.py, as `nbgrader` reads it
    app.update_config(_worker_config(settings))
    # Feedback: the course's preprocessors (or nbgrader's), after DefuseHiddenMarkers.
    from nbgrader.converters import GenerateFeedback
    from traitlets.config import Config

    feedback = app.config.GenerateFeedback.get("preprocessors") or list(
        GenerateFeedback.class_traits()["preprocessors"].default()
    )
    extra = Config()
    extra.GenerateFeedback.preprocessors = [
        "coursepkg.grading.classroom.DefuseHiddenMarkers",
        *feedback,
    ]
    app.update_config(extra)
    api = NbGraderAPI(parent=app)
    answers.write(json.dumps({"ready": True}) + "\n")
    try:
        for line in sys.stdin:
            job = json.loads(line)
            try:
                kind = job["kind"]
                out = (_worker_export if kind == "export" else _worker_grade)(api, settings, job)
            except Exception as err:  # noqa: BLE001 - reported to the parent, which decides
                log.exception("job %s failed", job)
                out = {"error": f"{type(err).__name__}: {err}"}
            answers.write(json.dumps(out) + "\n")
    finally:
        if server is not None:
            server.stop()


class _Worker:
    """The parent's handle on one worker process."""

    def __init__(self, settings: _Settings, index: int) -> None:
        env = {
            **os.environ,
            "PATH": f"{_bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}",
            "JUPYTER_PATH": os.pathsep.join(
                [str(Path(settings.scratch) / "jupyter"), os.environ.get("JUPYTER_PATH", "")]
            ),
            RELEASE_ENV: settings.release,
            # Each kernel gets its share of the cores: N workers x default threads would
            # oversubscribe them and make every notebook slower.
            "OMP_NUM_THREADS": str(settings.threads),
            "MKL_NUM_THREADS": str(settings.threads),
            "PYTHONUNBUFFERED": "1",
        }
        self.log_path = Path(settings.logs) / f"_worker{index}.log"
        with open(self.log_path, "a", encoding="utf-8") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "coursepkg.grading.classroom", json.dumps(asdict(settings))],
                cwd=settings.course,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        self.scratch = Path(settings.scratch)
        self.buffer = b""
        self.ready = False
        self.job: dict | None = None
        self.deadline = float("inf")

    def send(self, job: dict, seconds: float) -> None:
        self.job = job
        self.deadline = time.monotonic() + seconds
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()

    def read(self) -> list[dict] | None:
        """The complete answers available now; None when the worker has gone."""
        assert self.proc.stdout is not None
        data = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not data:
            return None
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def kill(self) -> None:
        """Kill the worker's process group and the kernel it runs (a session of its own)."""
        student = (self.job or {}).get("student")
        pidfile = self.scratch / f"{student}.pid"
        if student and pidfile.is_file():
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
            pidfile.unlink(missing_ok=True)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()


def _bin_dir() -> Path:
    return Path(sys.executable).parent


def _release_dir(course: Path) -> str:
    """nbgrader's release directory of the course (``exercises`` in this repository)."""
    return "exercises" if (course / "exercises").is_dir() else "release"


def _with_busy_timeout(db_url: str, seconds: int = 120) -> str:
    """SQLite URLs get a busy timeout (pysqlite reads ``timeout`` from the query) so that
    concurrent writers wait for each other; other URLs pass through."""
    if not db_url.startswith("sqlite") or "timeout=" in db_url:
        return db_url
    return db_url + ("&" if "?" in db_url else "?") + f"timeout={seconds}"


def _run_jobs(
    settings: _Settings, jobs: list[dict], workers: int, on_done: Any, final: dict
) -> None:
    """Hand ``jobs`` to ``workers`` worker processes; call ``on_done(job, answer)`` for each,
    then run ``final`` (the export) once every job is done.

    A worker that does not answer within its job's time limit is killed (with its kernel) and
    replaced, and so is one that dies; ``answer`` is then ``{"killed": ...}``. ``on_done`` may
    return a new job (the fallback), which is run before the remaining ones.
    """
    pending = deque(jobs)
    final_sent = False
    pool = [_Worker(settings, i) for i in range(min(workers, len(jobs)))]
    chooser = selectors.DefaultSelector()
    for worker in pool:
        chooser.register(worker.proc.stdout, selectors.EVENT_READ, worker)
    # A worker must start (import nbgrader and torch) within this many seconds.
    startup = 300.0
    for worker in pool:
        worker.deadline = time.monotonic() + startup
    try:
        while True:
            for worker in pool:
                if worker.ready and worker.job is None and pending:
                    job = pending.popleft()
                    worker.send(job, job["seconds"])
            if all(w.job is None for w in pool) and not pending:
                if final_sent:
                    break
                ready = [w for w in pool if w.ready]
                if ready:
                    ready[0].send(final, final["seconds"])
                    final_sent = True
            now = time.monotonic()
            wait = max(0.05, min(w.deadline for w in pool) - now)
            for key, _ in chooser.select(timeout=min(wait, 5.0)):
                worker = key.data
                answers = worker.read()
                if answers is None:  # the worker died (killed by a notebook, or crashed)
                    problem = "the grading process running your notebook was killed"
                    if worker.job is None and not worker.ready:
                        raise RuntimeError(
                            f"a grading worker could not start; see {worker.log_path}"
                        )
                    _replace(pool, worker, settings, chooser)
                    _finish(worker, {"killed": problem}, on_done, pending)
                    continue
                for answer in answers:
                    if answer.get("ready"):
                        worker.ready, worker.deadline = True, float("inf")
                    elif worker.job is not None:
                        _finish(worker, answer, on_done, pending)
            now = time.monotonic()
            for worker in list(pool):
                if worker.deadline <= now:
                    if worker.job is None:
                        raise RuntimeError(f"a grading worker did not start; see {worker.log_path}")
                    worker.kill()
                    _replace(pool, worker, settings, chooser)
                    _finish(worker, {"killed": "timeout"}, on_done, pending)
    finally:
        for worker in pool:
            worker.close()
        chooser.close()


def _replace(pool: list[_Worker], worker: _Worker, settings: _Settings, chooser: Any) -> None:
    chooser.unregister(worker.proc.stdout)
    if worker.proc.poll() is None:
        worker.kill()
    fresh = _Worker(settings, pool.index(worker))
    fresh.deadline = time.monotonic() + 300.0
    pool[pool.index(worker)] = fresh
    chooser.register(fresh.proc.stdout, selectors.EVENT_READ, fresh)


def _finish(worker: _Worker, answer: dict, on_done: Any, pending: deque) -> None:
    job, worker.job, worker.deadline = worker.job, None, float("inf")
    follow_up = on_done(job, answer)
    if follow_up is not None:
        pending.appendleft(follow_up)


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------

_REVIEW_PATTERNS = [
    (r"\bcoursepkg\b", "mentions coursepkg in an answer cell"),
    (
        r"sys\.modules|__code__|__globals__|setattr\s*\(|\bbuiltins\b|gc\.get_objects|settrace|"
        r"setprofile|events\.unregister|get_ipython",
        "touches the interpreter's internals (possible tampering with the checks)",
    ),
    (r"os\._exit|os\.kill|\bsignal\.|sys\.exit|os\.abort", "exits or signals the process"),
    (
        r"(?m)^\s*(torch|coursepkg|math|np|numpy)(\.\w+)+\s*=[^=]",
        "assigns to an attribute of torch, coursepkg or math (monkeypatching)",
    ),
    (r"\bsolutions\b|\.\./|gradebook", "refers to files outside the notebook's folder"),
    (r"subprocess|os\.system|socket", "starts processes or opens network connections"),
]


def review_flags(nb: Any) -> list[str]:
    """Reasons an instructor may want to read the answer cells of a notebook.

    Only cells a student could write are scanned (nbgrader's answer cells and cells the student
    added); the locked cells are restored by nbgrader anyway.

    Args:
        nb: the notebook as handed in.

    Returns:
        One phrase per kind of suspicious code found, in a fixed order.
    """
    text = "\n".join(
        cell.source
        for cell in nb.cells
        if cell.cell_type == "code"
        and not cell.get("metadata", {}).get("nbgrader", {}).get("locked", False)
    )
    return [label for pattern, label in _REVIEW_PATTERNS if re.search(pattern, text)]


def checker_failure_flag(grade_id: str, message: str) -> str | None:
    """The review flag of a test cell whose check crashed (:class:`~._core.CheckerError`): its
    points are not a verdict on the student, so the instructor grades that cell by hand."""
    if CHECKER_FAILED in message:
        return f"the checker itself failed on {grade_id}: grade that cell by hand"
    return None


def _diagnoses(message: str) -> list[dict[str, str]]:
    """The catalogued mistakes a check's message names (its "known mistake" sentences)."""
    found = []
    for bug in catalogue():
        if f"known mistake: {bug.description.rstrip('.')}" in message or (
            f"(known mistake: {bug.id})" in message
        ):
            found.append({"id": bug.id, "item": bug.item, "description": bug.description})
    return found


def _cell_message(cell: Any) -> str:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            name, value = output.get("ename", "Error"), _ANSI.sub("", output.get("evalue", ""))
            return value if name in ("CheckFailure", "NotImplementedYet") else f"{name}: {value}"
    for output in cell.get("outputs", []):
        if output.get("output_type") in ("execute_result", "display_data"):
            return _ANSI.sub("", output.get("data", {}).get("text/plain", ""))
    return ""


def _student_report(
    course: Path, aid: str, db_url: str, result: StudentResult, notebooks: list[str]
) -> dict:
    """The per-student JSON: every graded cell's points, message and diagnoses."""
    from nbgrader.api import Gradebook, MissingEntry

    student = result.student
    tests: list[dict] = []
    notes: list[str] = []
    flags: list[str] = []
    with Gradebook(db_url) as gb:
        for name in notebooks:
            try:
                sub = gb.find_submission_notebook(name, aid, student)
            except MissingEntry:
                continue
            grades = {g.name: g for g in sub.grades}
            graded = course / "autograded" / student / aid / f"{name}.ipynb"
            cells = {}
            if graded.is_file():
                nb = nbformat.read(str(graded), as_version=4)
                for cell in nb.cells:
                    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                    if grade_id:
                        cells[grade_id] = cell
                    elif cell.cell_type == "markdown" and cell.source.startswith(_NOTE_MARK):
                        notes.extend(
                            ln[2:] for ln in cell.source.splitlines() if ln.startswith("- ")
                        )
            submitted = course / "submitted" / student / aid / f"{name}.ipynb"
            if result.graded:
                try:
                    flags.extend(review_flags(load_notebook(submitted)))
                except NotebookError:
                    pass
            for grade_id, grade in grades.items():
                if grade.cell.cell_type != "code":
                    continue  # written answers are graded by hand
                message = _cell_message(cells[grade_id]) if grade_id in cells else ""
                flag = checker_failure_flag(grade_id, message)
                if flag:
                    flags.append(flag)
                    result.checker_failed.append(grade_id)
                earned = grade.score
                tests.append(
                    {
                        "notebook": name,
                        "grade_id": grade_id,
                        "points": earned,
                        "max_points": grade.max_score,
                        "passed": earned == grade.max_score,
                        "message": message,
                        "diagnoses": _diagnoses(message),
                    }
                )
        try:
            submission = gb.find_submission(aid, student)
            score, max_score = submission.score, submission.max_score
        except MissingEntry:
            score, max_score = 0.0, 0.0
    result.score, result.max_score = score, max_score
    tests.sort(key=lambda t: (t["notebook"], t["grade_id"]))
    return {
        "student": student,
        "assignment": aid,
        "score": score,
        "max_score": max_score,
        "autograded_points": sum(t["points"] for t in tests),
        "autograded_max_points": sum(t["max_points"] for t in tests),
        "graded": result.graded,
        "reason": result.reason,
        "notes": notes,
        "review_flags": sorted(set(flags)),
        "diagnoses": sorted({d["id"] for t in tests for d in t["diagnoses"]}),
        "tests": tests,
        "seconds": round(result.seconds, 2),
        "attempts": result.attempts,
    }


def _figure_png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def build_dashboard(course: str | Path) -> Path:
    """Write ``<course>/reports/dashboard.html``: per assignment graded so far, how many students
    hit each named mistake, the score distribution, and who needs a look.

    Args:
        course: the nbgrader course directory (its ``reports/<assignment>/*.json``).

    Returns:
        The HTML file (figures embedded as PNG, so it is one self-contained file).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    course = Path(course)
    descriptions = {bug.id: bug.description for bug in catalogue()}
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Misconception dashboard</title>"
        "<style>body{font-family:sans-serif;max-width:1000px;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:left}img{max-width:100%;height:auto}</style></head><body>"
        "<h1>Misconception dashboard</h1>"
    ]
    for folder in sorted(p for p in (course / "reports").glob("*") if p.is_dir()):
        reports = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
        if not reports:
            continue
        aid = folder.name
        scores = [r["autograded_points"] for r in reports]
        top = max(r["autograded_max_points"] for r in reports)
        hits = Counter(d for r in reports for d in r["diagnoses"])
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
        axes[0].hist(scores, bins=min(20, max(int(top), 1) + 1), range=(-0.5, top + 0.5))
        axes[0].set(
            xlabel="autograded points", ylabel="students", title=f"{aid}: score distribution"
        )
        if hits:
            names = sorted(hits, key=lambda k: (-hits[k], k))
            axes[1].barh(names[::-1], [hits[k] for k in names[::-1]], color="#c62828")
            axes[1].set(xlabel="students", title="named mistakes")
            axes[1].xaxis.set_major_locator(MaxNLocator(integer=True))
        else:
            axes[1].text(0.5, 0.5, "no named mistake", ha="center", va="center")
            axes[1].set_axis_off()
        axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        image = _figure_png(fig)
        plt.close(fig)
        mean = sum(scores) / len(scores)
        parts.append(
            f"<h2>{html.escape(aid)}</h2><p>{len(reports)} students, mean {mean:.2f} of "
            f"{top:g} autograded points, {sum(s == top for s in scores)} with full marks, "
            f"{sum(not r['graded'] for r in reports)} not gradable.</p>"
            f"<img alt='score distribution and named mistakes of {html.escape(aid)}' "
            f"src='data:image/png;base64,{image}'>"
        )
        rows = "".join(
            f"<tr><td><code>{html.escape(k)}</code></td>"
            f"<td>{html.escape(descriptions.get(k, ''))}</td><td>{hits[k]}</td>"
            f"<td>{html.escape(', '.join(r['student'] for r in reports if k in r['diagnoses']))}"
            "</td></tr>"
            for k in sorted(hits, key=lambda k: (-hits[k], k))
        )
        parts.append(
            "<h3>Named mistakes</h3><table><tr><th>mistake</th><th>what it is</th>"
            f"<th>students</th><th>who</th></tr>{rows}</table>"
            if rows
            else "<p>No catalogued mistake was named.</p>"
        )
        attention = [r for r in reports if not r["graded"] or r["review_flags"] or r["notes"]]
        if attention:
            rows = "".join(
                f"<tr><td>{html.escape(r['student'])}</td><td>{r['autograded_points']:g}</td>"
                f"<td>{html.escape(r['reason'] or '; '.join(r['notes']))}</td>"
                f"<td>{html.escape('; '.join(r['review_flags']))}</td></tr>"
                for r in attention
            )
            parts.append(
                "<h3>Needs a look</h3><table><tr><th>student</th><th>points</th>"
                f"<th>not graded / notes</th><th>review flags</th></tr>{rows}</table>"
            )
    parts.append("</body></html>")
    out = course / "reports" / "dashboard.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(parts), encoding="utf-8")
    return out


# ---------------------------------------------------------------------------------------------
# The whole class
# ---------------------------------------------------------------------------------------------


def _gradebook_notebooks(url: str, assignment: str) -> list[str]:
    from nbgrader.api import Gradebook

    with Gradebook(url) as gb:
        return sorted(nb.name for nb in gb.find_assignment(assignment).notebooks)


def _add_to_gradebook(course: Path, assignment: str, url: str) -> None:
    """Record an assignment the gradebook lacks, from its source, as ``coursepkg release`` and
    ``nbgrader generate_assignment`` do; the release students have is left as it is."""
    from ..release import generate_release

    source = "solutions" if (course / "solutions").is_dir() else "source"
    if not (course / source / assignment).is_dir():
        raise ValueError(
            f"the gradebook does not know assignment {assignment!r} and {course / source} has "
            f"no source for it: run `coursepkg release {assignment}` (or `nbgrader "
            f"generate_assignment {assignment} --force`) where the source is"
        )
    with tempfile.TemporaryDirectory(prefix="coursepkg-release-") as scratch:
        generate_release(course, assignment, source=source, release=scratch, db_url=url)
    log.warning(
        "the gradebook did not know %s: recorded it from %s/%s (the release students have is "
        "unchanged)",
        assignment,
        source,
        assignment,
    )


def _students(course: Path, assignment: str) -> list[str]:
    submitted = course / "submitted"
    return sorted(p.name for p in submitted.glob("*") if p.is_dir() and (p / assignment).is_dir())


def sandbox_summary(statuses: list[dict]) -> str:
    """One sentence on how the kernels were confined (from the kernels' own reports).

    Args:
        statuses: what each sandbox kernel reported (``landlock``, ``memory``, ``cpu``, ``error``).

    Returns:
        ``"sandbox: ..."``, with a warning when a protection was unavailable.
    """
    if not statuses:
        return "sandbox: no student code was run"
    abis = {s.get("landlock", 0) for s in statuses}
    parts = []
    if min(abis) >= 1:
        parts.append(
            f"file access confined with Landlock (ABI {min(abis)})"
            + (", signals too" if min(abis) >= 6 else "")
        )
    else:
        parts.append(
            "WARNING: Landlock is not available on this system, so notebooks were NOT confined "
            "to their own folder (they could read solutions/ or write elsewhere; grade in a "
            "container or as a separate user)"
        )
    if all(s.get("memory") for s in statuses):
        parts.append(f"memory limited to {statuses[0]['memory']} MiB per kernel")
    else:
        parts.append("WARNING: the memory limit could not be set")
    if not all(s.get("cpu") for s in statuses):
        parts.append("WARNING: the CPU-time limit could not be set")
    errors = sorted({s["error"] for s in statuses if s.get("error")})
    if errors:
        parts.append("problems: " + "; ".join(errors))
    return "sandbox: " + ", ".join(parts)


def grade_class(
    course: str | Path,
    assignment: str,
    *,
    workers: int | None = None,
    students: list[str] | None = None,
    db_url: str | None = None,
    cell_timeout: int = 120,
    notebook_timeout: int = 900,
    memory_mb: int = 4096,
    progress: bool = True,
    fork: bool = True,
) -> ClassResult:
    """Autograde every submission of ``assignment``, then write feedback, the CSV export, the
    per-student JSON reports and the dashboard.

    Args:
        course: the nbgrader course directory (with ``nbgrader_config.py``, ``submitted/`` and
            the assignment's source; its gradebook entry is made if missing).
        assignment: the assignment id.
        workers: students graded at a time (default: the number of CPU cores).
        students: grade only these student ids (default: everyone in ``submitted/``).
        db_url: the gradebook's SQLAlchemy URL (default: ``sqlite:///<course>/gradebook.db``).
        cell_timeout: seconds one cell may run (nbgrader's ``Execute.timeout``); a cell that
            runs longer is interrupted and its test scores 0.
        notebook_timeout: wall-clock seconds one student's notebook may take in all; then its
            kernel is killed and the student gets the fallback zero with the reason.
        memory_mb: the address-space limit of each student's kernel, in MiB.
        progress: show a tqdm progress bar on stderr.
        fork: start each kernel by forking a process that has imported torch and the checks
            (:mod:`coursepkg.grading.forkserver`) instead of starting Python anew; False
            starts every kernel the way nbgrader does (slower, for comparison or debugging).

    Returns:
        A :class:`ClassResult` (its :meth:`~ClassResult.summary` is the final line).

    Raises:
        ValueError: the course or assignment is not there. An assignment the gradebook does
            not know yet is recorded from its source first (nbgrader's generate_assignment).
    """
    from nbgrader.api import MissingEntry
    from tqdm.auto import tqdm

    start = time.perf_counter()
    course = Path(course).resolve()
    if not (course / "nbgrader_config.py").is_file():
        raise ValueError(f"{course} is not an nbgrader course directory (no nbgrader_config.py)")
    url = _with_busy_timeout(db_url or f"sqlite:///{course / 'gradebook.db'}")
    try:
        notebooks = _gradebook_notebooks(url, assignment)
    except MissingEntry:
        _add_to_gradebook(course, assignment, url)
        notebooks = _gradebook_notebooks(url, assignment)
    release = course / _release_dir(course) / assignment
    if not all((release / f"{name}.ipynb").is_file() for name in notebooks):
        raise ValueError(f"the release of {assignment!r} is missing from {release}")
    everyone = _students(course, assignment)
    chosen = everyone if students is None else [s for s in everyone if s in set(students)]
    if not chosen:
        raise ValueError(f"no submissions of {assignment!r} in {course / 'submitted'}")
    workers = max(1, workers or os.cpu_count() or 1)

    reports = course / "reports" / assignment
    (reports / "logs").mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="coursepkg-grade-"))
    results: dict[str, StudentResult] = {}
    statuses: list[dict] = []
    try:
        write_kernelspec(
            scratch / "jupyter",
            course_root=course,
            memory_mb=memory_mb,
            cpu_seconds=notebook_timeout + 60,
        )
        settings = _Settings(
            course=str(course),
            assignment=assignment,
            db_url=url,
            cell_timeout=cell_timeout,
            notebook_timeout=notebook_timeout,
            scratch=str(scratch),
            logs=str(reports / "logs"),
            release=str(release),
            threads=max(1, (os.cpu_count() or 1) // workers),
            fork=fork,
        )
        jobs = []
        for sid in chosen:
            (reports / "logs" / f"{sid}.log").write_text("")
            results[sid] = StudentResult(sid)
            reason = _problem(course, assignment, sid, notebooks)
            jobs.append(
                {
                    "kind": "grade",
                    "student": sid,
                    "notebooks": notebooks,
                    "reason": reason,
                    "seconds": notebook_timeout,
                }
            )
        bar = tqdm(
            total=len(chosen),
            desc=f"grading {assignment}",
            unit="nb",
            disable=not progress,
            file=sys.stderr,
        )

        def finished() -> None:
            nonlocal grade_seconds
            bar.update(1)
            grade_seconds = time.perf_counter() - grade_start

        def done(job: dict, answer: dict) -> dict | None:
            if job["kind"] != "grade":
                if "exported" not in answer:
                    log.error("nbgrader's export failed: %s", answer)
                return None
            sid = job["student"]
            result = results[sid]
            if "killed" in answer or "error" in answer:
                if job.get("reason"):  # even the fallback failed: nothing more to try
                    result.graded, result.reason = False, job["reason"]
                    result.error = answer.get("error") or answer["killed"]
                    log.error("could not record a grade for %s: %s", sid, result.error)
                    finished()
                    return None
                if answer.get("killed") == "timeout":
                    reason = (
                        f"it ran longer than the {notebook_timeout} s allowed for a whole "
                        "notebook (an infinite loop or far too slow code), so it was stopped"
                    )
                elif "killed" in answer:
                    reason = (
                        "the process grading your notebook was killed while it ran (did the "
                        "notebook signal or kill other processes?)"
                    )
                else:
                    reason = f"the grader failed on this notebook ({answer['error'][:200]})"
                result.attempts += 1
                result.seconds += notebook_timeout if answer.get("killed") == "timeout" else 0
                return {**job, "reason": reason, "seconds": max(notebook_timeout, 600)}
            result.graded, result.reason = answer["graded"], answer["reason"]
            result.attempts += answer["attempts"]
            result.seconds += answer["seconds"]
            result.feedback = answer["feedback"]
            if answer.get("sandbox"):
                statuses.append(answer["sandbox"])
            finished()
            return None

        grade_start = time.perf_counter()
        grade_seconds = 0.0
        export = {"kind": "export", "to": str(reports / "grades.csv"), "seconds": 600}
        with bar:
            _run_jobs(settings, jobs, workers, done, export)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(course / Path(_STAGED).parent, ignore_errors=True)

    for sid in chosen:
        report = _student_report(course, assignment, url, results[sid], notebooks)
        (reports / f"{sid}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    dashboard = build_dashboard(course)
    result = ClassResult(
        assignment=assignment,
        students=[results[s] for s in chosen],
        seconds=time.perf_counter() - start,
        grade_seconds=grade_seconds,
        workers=workers,
        reports=reports,
        dashboard=dashboard,
        sandbox=sandbox_summary(statuses),
    )
    log.info("%s", result.summary())
    return result


def _asdict(result: ClassResult) -> dict:
    return {**asdict(result), "reports": str(result.reports), "dashboard": str(result.dashboard)}


if __name__ == "__main__":
    _worker_main(sys.argv[1])
