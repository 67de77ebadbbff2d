"""Autograde a whole class with nbgrader, in parallel and robust to broken or hostile notebooks:
``coursepkg grade <assignment> [--workers N]``.

Everything a grade depends on is nbgrader's own work: each student is graded by one
``nbgrader autograde <assignment> --student <id> --force --create`` process, feedback by
``nbgrader generate_feedback``, the CSV by ``nbgrader export``; grades live in nbgrader's gradebook
(SQLite by default, any SQLAlchemy URL). What this module adds around it:

* **Parallel workers**: at most ``workers`` students are graded at a time (default: the number
  of cores), each in its own process tree, with a tqdm progress bar and a summary at the end.
* **Limits** per notebook: nbgrader's per-cell timeout, a wall-clock limit per student after
  which the whole process tree is killed, and the sandbox kernel of
  :mod:`coursepkg.grading.sandbox` (memory, CPU time, file access, capped output, a guard of the
  checks).
* **Every student gets a grade**. A notebook that cannot be run (not JSON, empty, missing) or
  whose run was killed or crashed is graded again from a *staging copy* of the release (the
  stubs), with every check failing with the reason: 0 points and a clear line in the feedback.
  The student's files are never modified. SQLite's "database is locked" under concurrent
  writers is waited for (a busy timeout in the URL) and retried.
* **Notes** in the graded notebook: deleted test cells are restored by nbgrader
  (``OverwriteCells.add_missing_cells``); edited locked cells (restored by nbgrader anyway),
  duplicated cell ids and the reason a notebook was not graded are listed in a note cell at the
  top, which the feedback shows.
* **Reports** in ``<course>/reports/<assignment>/``: ``grades.csv`` (nbgrader's export),
  ``<student>.json`` (each test's points, pass/fail, message and the named diagnoses of
  :func:`coursepkg.grading.catalogue`), ``logs/<student>.log`` (nbgrader's output) and
  ``<course>/reports/dashboard.html`` (the misconception dashboard, every assignment graded so
  far).

A rerun is safe: nbgrader updates the grades of a submission in place (``--force``), and the
reports are rewritten.
"""

from __future__ import annotations

import base64
import concurrent.futures
import html
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor

from . import catalogue
from .notebook import NotebookError, load_notebook
from .sandbox import KERNEL_NAME, NOT_GRADED_ENV, PIDFILE_ENV, write_kernelspec

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
_STAGED = ".coursepkg-grade/staged"  # (relative to the course root)
# relative to the course root: fallback submissions
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
        dup = sorted(k for k, n in ids.items() if n > 1) + sorted(
            k for k, n in grade_ids.items() if n > 1 and k not in ids
        )
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
                locked = {cell.name for cell in source.source_cells if cell.locked}
                for cell in nb.cells:
                    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                    if not grade_id:
                        continue
                    present.add(grade_id)
                    original = originals.get(grade_id)
                    if (
                        grade_id in locked
                        and original is not None
                        and (cell.source.strip() != original.strip())
                    ):
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
    """

    student: str
    graded: bool = True
    reason: str = ""
    score: float = 0.0
    max_score: float = 0.0
    seconds: float = 0.0
    attempts: int = 0


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
    """

    assignment: str
    students: list[StudentResult] = field(default_factory=list)
    seconds: float = 0.0
    grade_seconds: float = 0.0
    workers: int = 1
    reports: Path = Path()
    dashboard: Path = Path()

    def summary(self) -> str:
        """One line: how many were graded, how fast, the mean score, and who was not graded."""
        n = len(self.students)
        mean = sum(s.score for s in self.students) / n if n else 0.0
        top = max((s.max_score for s in self.students), default=0.0)
        failed = [s.student for s in self.students if not s.graded]
        rate = 60 * n / self.grade_seconds if self.grade_seconds else 0.0
        line = (
            f"{self.assignment}: graded {n} student(s) in {self.seconds:.0f} s with "
            f"{self.workers} worker(s) ({rate:.1f} notebooks/min); mean score {mean:.2f}/{top:g}"
        )
        if failed:
            line += f"; {len(failed)} could not be run (0 points): {', '.join(failed)}"
        return line


# ---------------------------------------------------------------------------------------------
# Running nbgrader
# ---------------------------------------------------------------------------------------------


def _bin_dir() -> Path:
    return Path(sys.executable).parent


def _nbgrader_cmd() -> list[str]:
    exe = _bin_dir() / "nbgrader"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "nbgrader"]


def _with_busy_timeout(db_url: str, seconds: int = 120) -> str:
    """SQLite URLs get a busy timeout (pysqlite reads ``timeout`` from the query) so that
    concurrent writers wait for each other; other URLs pass through."""
    if not db_url.startswith("sqlite") or "timeout=" in db_url:
        return db_url
    return db_url + ("&" if "?" in db_url else "?") + f"timeout={seconds}"


def _kill_tree(proc: subprocess.Popen, pidfile: Path) -> None:
    """Kill nbgrader's process group and the kernel (which runs in a session of its own)."""
    for pid_text in [pidfile.read_text().strip()] if pidfile.exists() else []:
        try:
            os.kill(int(pid_text), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class _Settings:
    course: Path
    assignment: str
    db_url: str
    cell_timeout: int
    notebook_timeout: int
    memory_mb: int
    scratch: Path
    config_file: Path
    logs: Path


def _run(
    settings: _Settings, args: list[str], *, env_extra: dict[str, str], timeout: float, log_to: Path
) -> tuple[int | None, str]:
    """Run one nbgrader command in its own session; None as return code when it was killed."""
    pidfile = Path(env_extra.get(PIDFILE_ENV, settings.scratch / "none.pid"))
    env = {
        **os.environ,
        "PATH": f"{_bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}",
        "JUPYTER_PATH": os.pathsep.join(
            [str(settings.scratch / "jupyter"), os.environ.get("JUPYTER_PATH", "")]
        ),
        "JUPYTER_CONFIG_PATH": os.pathsep.join(
            [str(settings.config_file.parent), os.environ.get("JUPYTER_CONFIG_PATH", "")]
        ),
        **env_extra,
    }
    with open(log_to, "a", encoding="utf-8", errors="replace") as out:
        out.write(f"$ nbgrader {' '.join(args)}\n")
        out.flush()
        proc = subprocess.Popen(
            [*_nbgrader_cmd(), *args],
            cwd=settings.course,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc, pidfile)
            proc.wait()
            code = None
        # The kernel dies with nbgrader (PR_SET_PDEATHSIG); forget its pid, which the system
        # may reuse.
        pidfile.unlink(missing_ok=True)
    return code, log_to.read_text(encoding="utf-8", errors="replace")


def _common_args(settings: _Settings) -> list[str]:
    # The command line outranks the course's nbgrader_config.py; the preprocessor list, which
    # the command line cannot express, comes from the grader's config directory (see _run).
    return [
        f"--CourseDirectory.db_url={settings.db_url}",
        f"--Execute.kernel_name={KERNEL_NAME}",
        f"--Execute.timeout={settings.cell_timeout}",
        "--OverwriteCells.add_missing_cells=True",
    ]


def _classify(output: str) -> str:
    """A sentence for the student from nbgrader's log of a failed run."""
    if "DeadKernelError" in output or "Kernel died" in output or "kernel died" in output:
        return (
            "the Python kernel died while running your notebook (the code exited the process, "
            "killed it, crashed it or ran out of memory), so none of its tests could run"
        )
    if "UnresponsiveKernelError" in output:
        return "the Python kernel stopped responding (an infinite loop that ignores interrupts)"
    errors = [ln for ln in output.splitlines() if "ERROR" in ln or "Error" in ln]
    last = errors[-1].strip() if errors else "unknown error"
    return f"nbgrader could not run your notebook ({last[:200]})"


def _stage_fallback(settings: _Settings, student: str, notebooks: list[str]) -> None:
    """A staging submission for ``student``: the release (stubs) under each expected name.

    The student's own files stay untouched; nbgrader reads this copy instead.
    """
    course, aid = settings.course, settings.assignment
    staged = course / _STAGED / student / aid
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for name in notebooks:
        release = course / _release_dir(course) / aid / f"{name}.ipynb"
        shutil.copy(release, staged / f"{name}.ipynb")
    stamp = course / "submitted" / student / aid / "timestamp.txt"
    if stamp.is_file():
        shutil.copy(stamp, staged / "timestamp.txt")


def _release_dir(course: Path) -> str:
    """nbgrader's release directory of the course (``exercises`` in this repository)."""
    return "exercises" if (course / "exercises").is_dir() else "release"


def _problem(settings: _Settings, student: str, notebooks: list[str]) -> str:
    """Why the submission cannot be run at all (missing, empty, not JSON), or ``""``."""
    folder = settings.course / "submitted" / student / settings.assignment
    for name in notebooks:
        path = folder / f"{name}.ipynb"
        if not path.exists():
            found = sorted(p.name for p in folder.glob("*.ipynb"))
            return f"no {name}.ipynb in your submission (found: {', '.join(found) or 'nothing'})"
        try:
            load_notebook(path)
        except NotebookError as err:
            return str(err).replace(str(path), f"{name}.ipynb")
    return ""


def _grade_student(settings: _Settings, student: str, notebooks: list[str]) -> StudentResult:
    """Autograde one student (with retries and the fallback), then generate their feedback."""
    result = StudentResult(student)
    start = time.perf_counter()
    log_to = settings.logs / f"{student}.log"
    log_to.write_text("")
    pidfile = settings.scratch / f"{student}.pid"
    tmp = settings.scratch / "tmp" / student
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        PIDFILE_ENV: str(pidfile),
        "TMPDIR": str(tmp),
        RELEASE_ENV: str(settings.course / _release_dir(settings.course) / settings.assignment),
    }
    base = ["autograde", settings.assignment, "--student", student, "--force", "--create"]
    reason = _problem(settings, student, notebooks)
    for _ in range(4):
        if reason:
            break
        result.attempts += 1
        code, output = _run(
            settings,
            [*base, *_common_args(settings)],
            env_extra=env,
            timeout=settings.notebook_timeout,
            log_to=log_to,
        )
        if code == 0:
            break
        if code is None:
            reason = (
                f"it ran longer than the {settings.notebook_timeout} s allowed for a whole "
                "notebook (an infinite loop or far too slow code), so it was stopped"
            )
        elif "database is locked" in output:
            time.sleep(1.0 + result.attempts)
            continue
        else:
            reason = _classify(output)
    else:
        reason = "the gradebook stayed locked by other writers; grade this student again"
    if reason:
        # The fallback: the release's stubs under the expected names, every check failing with
        # the reason. It runs no student code, so it cannot hang or crash.
        result.graded, result.reason = False, reason
        _stage_fallback(settings, student, notebooks)
        for _ in range(4):
            result.attempts += 1
            code, output = _run(
                settings,
                [
                    *base,
                    *_common_args(settings),
                    f"--CourseDirectory.submitted_directory={_STAGED}",
                ],
                env_extra={**env, NOT_GRADED_ENV: reason},
                timeout=max(settings.notebook_timeout, 600),
                log_to=log_to,
            )
            if code == 0 or "database is locked" not in output:
                break
            time.sleep(1.0 + result.attempts)
    for _ in range(4):
        code, output = _run(
            settings,
            ["generate_feedback", settings.assignment, "--student", student, "--force"]
            + _common_args(settings),
            env_extra=env,
            timeout=600,
            log_to=log_to,
        )
        if code == 0 or "database is locked" not in output:
            break
        time.sleep(2.0)
    result.seconds = time.perf_counter() - start
    return result


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
        if output.get("output_type") == "execute_result":
            return _ANSI.sub("", output.get("data", {}).get("text/plain", ""))
    return ""


def _student_report(
    settings: _Settings, student: str, result: StudentResult, notebooks: list[str]
) -> dict:
    """The per-student JSON: every graded cell's points, message and diagnoses."""
    from nbgrader.api import Gradebook, MissingEntry

    aid = settings.assignment
    tests: list[dict] = []
    notes: list[str] = []
    flags: list[str] = []
    with Gradebook(settings.db_url) as gb:
        for name in notebooks:
            try:
                sub = gb.find_submission_notebook(name, aid, student)
            except MissingEntry:
                continue
            grades = {g.name: g for g in sub.grades}
            graded = settings.course / "autograded" / student / aid / f"{name}.ipynb"
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
            submitted = settings.course / "submitted" / student / aid / f"{name}.ipynb"
            if result.graded:
                try:
                    flags.extend(review_flags(load_notebook(submitted)))
                except NotebookError:
                    pass
            for grade_id, grade in grades.items():
                if grade.cell.cell_type != "code":
                    continue  # written answers are graded by hand
                message = _cell_message(cells[grade_id]) if grade_id in cells else ""
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

    course = Path(course)
    descriptions = {bug.id: bug.description for bug in catalogue()}
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Misconception dashboard</title>"
        "<style>body{font-family:sans-serif;max-width:1000px;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:left}</style></head><body><h1>Misconception dashboard</h1>"
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
        else:
            axes[1].text(0.5, 0.5, "no named mistake", ha="center", va="center")
            axes[1].set_axis_off()
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


def _students(course: Path, assignment: str) -> list[str]:
    submitted = course / "submitted"
    return sorted(p.name for p in submitted.glob("*") if p.is_dir() and (p / assignment).is_dir())


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
) -> ClassResult:
    """Autograde every submission of ``assignment``, then write feedback, the CSV export, the
    per-student JSON reports and the dashboard.

    Args:
        course: the nbgrader course directory (with ``nbgrader_config.py``, ``submitted/`` and
            a gradebook holding the assignment, i.e. after ``nbgrader generate_assignment``).
        assignment: the assignment id.
        workers: students graded at a time (default: the number of CPU cores).
        students: grade only these student ids (default: everyone in ``submitted/``).
        db_url: the gradebook's SQLAlchemy URL (default: ``sqlite:///<course>/gradebook.db``).
        cell_timeout: seconds one cell may run (nbgrader's ``ExecutePreprocessor.timeout``).
        notebook_timeout: wall-clock seconds one student's autograde may take in all.
        memory_mb: the address-space limit of each student's kernel, in MiB.
        progress: show a tqdm progress bar on stderr.

    Returns:
        A :class:`ClassResult` (its :meth:`~ClassResult.summary` is the final line).

    Raises:
        ValueError: the course or assignment is not there, or the gradebook does not know it.
    """
    from nbgrader.api import Gradebook, MissingEntry
    from tqdm.auto import tqdm

    start = time.perf_counter()
    course = Path(course).resolve()
    if not (course / "nbgrader_config.py").is_file():
        raise ValueError(f"{course} is not an nbgrader course directory (no nbgrader_config.py)")
    url = _with_busy_timeout(db_url or f"sqlite:///{course / 'gradebook.db'}")
    try:
        with Gradebook(url) as gb:
            notebooks = sorted(nb.name for nb in gb.find_assignment(assignment).notebooks)
    except MissingEntry:
        raise ValueError(
            f"the gradebook does not know assignment {assignment!r}: run "
            f"`nbgrader generate_assignment {assignment}` in {course} first"
        ) from None
    everyone = _students(course, assignment)
    chosen = everyone if students is None else [s for s in everyone if s in set(students)]
    if not chosen:
        raise ValueError(f"no submissions of {assignment!r} in {course / 'submitted'}")
    workers = max(1, workers or os.cpu_count() or 1)

    reports = course / "reports" / assignment
    (reports / "logs").mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="coursepkg-grade-"))
    try:
        write_kernelspec(
            scratch / "jupyter",
            course_root=course,
            memory_mb=memory_mb,
            cpu_seconds=notebook_timeout + 60,
        )
        config_file = scratch / "config" / "nbgrader_config.py"
        config_file.parent.mkdir()
        config_file.write_text(
            "c = get_config()  # noqa: F821\n"
            "c.Autograde.sanitize_preprocessors = [\n"
            "    'coursepkg.grading.classroom.GraderNotes',\n"
            "    'nbgrader.preprocessors.ClearOutput',\n"
            "    'nbgrader.preprocessors.DeduplicateIds',\n"
            "    'nbgrader.preprocessors.OverwriteKernelspec',\n"
            "    'nbgrader.preprocessors.OverwriteCells',\n"
            "    'nbgrader.preprocessors.CheckCellMetadata',\n"
            "]\n"
        )
        settings = _Settings(
            course=course,
            assignment=assignment,
            db_url=url,
            cell_timeout=cell_timeout,
            notebook_timeout=notebook_timeout,
            memory_mb=memory_mb,
            scratch=scratch,
            config_file=config_file,
            logs=reports / "logs",
        )
        results: dict[str, StudentResult] = {}
        grade_start = time.perf_counter()
        with (
            concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool,
            tqdm(
                total=len(chosen),
                desc=f"grading {assignment}",
                unit="nb",
                disable=not progress,
                file=sys.stderr,
            ) as bar,
        ):
            # Threads only wait on nbgrader processes: the work and the isolation are in those.
            futures = {pool.submit(_grade_student, settings, sid, notebooks): sid for sid in chosen}
            for future in concurrent.futures.as_completed(futures):
                sid = futures[future]
                try:
                    results[sid] = future.result()
                except Exception as err:  # noqa: BLE001 - one student never stops the batch
                    log.exception("grading %s failed", sid)
                    results[sid] = StudentResult(sid, graded=False, reason=f"grader error: {err}")
                bar.update(1)
        grade_seconds = time.perf_counter() - grade_start
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(course / _STAGED, ignore_errors=True)

    for sid in chosen:
        report = _student_report(settings, sid, results[sid], notebooks)
        (reports / f"{sid}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    export_log = reports / "logs" / "_export.log"
    export_log.write_text("")
    for _ in range(4):
        code, output = _run(
            settings,
            ["export", "--to", str(reports / "grades.csv"), f"--assignment={assignment}"]
            + [f"--CourseDirectory.db_url={url}"],
            env_extra={},
            timeout=600,
            log_to=export_log,
        )
        if code == 0 or "database is locked" not in output:
            break
        time.sleep(2.0)
    dashboard = build_dashboard(course)
    result = ClassResult(
        assignment=assignment,
        students=[results[s] for s in chosen],
        seconds=time.perf_counter() - start,
        grade_seconds=grade_seconds,
        workers=workers,
        reports=reports,
        dashboard=dashboard,
    )
    log.info("%s", result.summary())
    return result


def _asdict(result: ClassResult) -> dict:
    return {**asdict(result), "reports": str(result.reports), "dashboard": str(result.dashboard)}
