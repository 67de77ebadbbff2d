"""Results and reports of ``coursepkg grade``: one :class:`StudentResult` per student, the
:class:`ClassResult` and its summary, and the per-student JSON report (each test's points,
message and the named mistakes of :func:`coursepkg.grading.catalogue`, notes, review flags),
read from the gradebook (whichever it is) and the graded notebooks in the course folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from ..notebook import NotebookError, load_notebook
from .preprocessors import NOTE_MARK
from .protocol import SandboxStatus

__all__ = [
    "ClassResult",
    "StudentResult",
    "checker_failure_flag",
    "diagnoses_in",
    "load_checks",
    "review_flags",
    "sandbox_summary",
    "student_report",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class StudentResult:
    """How grading one student went.

    Attributes:
        student: the student id.
        graded: False when the notebook could not be run and got the fallback zero.
        reason: why it was not graded (empty when it was).
        score: total points in the gradebook, before the late penalty.
        max_score: points available (the written answers included, as the exports count).
        penalty: the late penalty in points (0 when on time).
        late: whether the submission lost points to the late policy.
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
    penalty: float = 0.0
    late: bool = False
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
        due: the assignment's due date as the summary states it (empty: none).
        subset: only some students were graded (``--student``): the late count is theirs.
    """

    assignment: str
    students: list[StudentResult] = field(default_factory=list)
    seconds: float = 0.0
    grade_seconds: float = 0.0
    workers: int = 1
    reports: Path = Path()
    dashboard: Path = Path()
    sandbox: str = ""
    due: str = ""
    subset: bool = False

    def late_lines(self) -> list[str]:
        """The late policy's effect: how many late, the points taken off, and a warning when
        more than half the class is late (a due date read wrong looks like that)."""
        late = [s for s in self.students if s.late]
        if not self.due and not late:
            return []
        off = sum(s.penalty for s in self.students)
        due = f"{self.assignment} due {self.due}; " if self.due else ""
        graded = f"{len(self.students)} graded now" if self.subset else f"{len(self.students)}"
        lines = [f"late policy: {due}{len(late)} of {graded} late, {off:.4g} point(s) off"]
        # a few students graded again say nothing about the class's due date
        if 2 * len(late) > len(self.students) and not self.subset:
            lines.append(
                f"WARNING: {len(late)} of {len(self.students)} students are late, more than "
                "half the class: check the due date (LatePolicy.due_dates in nbgrader_config.py "
                "or the gradebook's) before the grades go out"
            )
        return lines

    def summary(self) -> str:
        """A few lines: how many were graded, how fast, the mean score, who could not be run
        (and why), and how the notebooks were confined."""
        n = len(self.students)
        raw = sum(s.score for s in self.students) / n if n else 0.0
        final = sum(max(0.0, s.score - s.penalty) for s in self.students) / n if n else 0.0
        top = max((s.max_score for s in self.students), default=0.0)
        rate = 60 * n / self.grade_seconds if self.grade_seconds else 0.0
        late = [s for s in self.students if s.late]
        raw_note = (
            f" (raw {raw:.2f}; {len(late)} late, -{sum(s.penalty for s in late):.4g})"
            if late
            else ""
        )
        lines = [
            f"{self.assignment}: graded {n} student(s) in {self.seconds:.0f} s with "
            f"{self.workers} worker(s) ({rate:.1f} notebooks/min); mean final score "
            f"{final:.2f}/{top:g}{raw_note}, as the exports count it",
            *self.late_lines(),
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


def review_flags(nb: Any, given: Any = None) -> list[str]:
    """Reasons an instructor may want to read the answer cells of a notebook.

    Only what the student wrote is scanned: the cells a student could write (nbgrader's answer
    cells and cells the student added; the locked cells are restored by nbgrader anyway), less
    the lines the release gave them (a stub's docstring that names ``coursepkg`` is no flag).

    Args:
        nb: the notebook as handed in.
        given: the release notebook the student started from, if known.

    Returns:
        One phrase per kind of suspicious code found, in a fixed order.
    """
    given_lines = {
        line.strip()
        for cell in (given.cells if given is not None else [])
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
    }
    text = "\n".join(
        line
        for cell in nb.cells
        if cell.cell_type == "code"
        and not cell.get("metadata", {}).get("nbgrader", {}).get("locked", False)
        for line in cell.source.splitlines()
        if line.strip() not in given_lines
    )
    return [label for pattern, label in _REVIEW_PATTERNS if re.search(pattern, text)]


def checker_failure_flag(grade_id: str, message: str) -> str | None:
    """The review flag of a test cell whose check crashed (``CheckerError``): its
    points are not a verdict on the student, so the instructor grades that cell by hand."""
    from ..framework.results import CHECKER_FAILED  # the checks import torch: see load_checks

    if CHECKER_FAILED in message:
        return f"the checker itself failed on {grade_id}: grade that cell by hand"
    return None


def load_checks() -> None:
    """Import what the reports and the dashboard need from the checks and matplotlib: the
    catalogue (every check module, so torch) and pyplot, about 3 s of one core.

    This module and the dashboard import them on first use, not with themselves, so that
    ``coursepkg grade`` starts its cluster without paying for them; it calls this in a thread
    while the workers grade (its main process waits on them then), and the reports find them
    loaded. Calling it again costs nothing.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401 - loaded for the dashboard's figures

    from .. import catalogue

    catalogue()


def diagnoses_in(message: str) -> list[dict[str, str]]:
    """The catalogued mistakes a check's message names (its "known mistake" sentences)."""
    from .. import catalogue  # the checks import torch: see load_checks

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


def _totals(gb: Any, aid: str, result: StudentResult) -> tuple[float, float, float]:
    """The submission's points, points possible and late penalty, kept on ``result`` too."""
    from nbgrader.api import MissingEntry

    try:
        submission = gb.find_submission(aid, result.student)
        score, top = submission.score, submission.max_score
        penalty = submission.late_submission_penalty or 0.0
    except MissingEntry:
        score, top, penalty = 0.0, 0.0, 0.0
    result.score, result.max_score, result.penalty, result.late = score, top, penalty, penalty > 0
    return score, top, penalty


def _release(course: Path, aid: str, name: str) -> Any:
    """The release notebook a student started from (nbgrader's release folder, ``exercises``
    in this course), or None."""
    for folder in ("exercises", "release"):
        try:
            return load_notebook(course / folder / aid / f"{name}.ipynb")
        except NotebookError:
            continue
    return None


def student_report(
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
                    elif cell.cell_type == "markdown" and cell.source.startswith(NOTE_MARK):
                        notes.extend(
                            ln[2:] for ln in cell.source.splitlines() if ln.startswith("- ")
                        )
            submitted = course / "submitted" / student / aid / f"{name}.ipynb"
            if result.graded:
                try:
                    flags.extend(
                        review_flags(load_notebook(submitted), _release(course, aid, name))
                    )
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
                        "diagnoses": diagnoses_in(message),
                    }
                )
        score, max_score, penalty = _totals(gb, aid, result)
    tests.sort(key=lambda t: (t["notebook"], t["grade_id"]))
    return {
        "student": student,
        "assignment": aid,
        "score": score,
        "max_score": max_score,
        "late_penalty": penalty,
        "final_score": max(0.0, score - penalty),
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


def _storage_summary(statuses: list[SandboxStatus], abi: int) -> list[str]:
    """The summary's words on memory, ``/dev/shm`` and the kernels' folders (what is not
    enforced, and why, as a WARNING)."""
    parts = []
    cgroups = {s.memory_cgroup for s in statuses}
    if all(s.memory for s in statuses) and "" not in cgroups:
        parts.append(
            f"memory limited to {statuses[0].memory} MiB per kernel ({', '.join(sorted(cgroups))}"
            " memory cgroup: tmpfs and page cache count)"
        )
    elif all(s.memory for s in statuses):
        parts.append(
            f"memory limited to {statuses[0].memory} MiB per kernel of address space only "
            "(WARNING: no writable memory cgroup, as root with a memory controller: files in a "
            "tmpfs and the page cache are NOT counted)"
        )
    else:
        parts.append("WARNING: the memory limit could not be set")
    if all(s.shm for s in statuses):
        parts.append(f"a private /dev/shm of {statuses[0].shm} MiB per kernel")
    elif abi >= 1:
        parts.append("WARNING: no private /dev/shm (no mount namespace), so it was read-only")
    else:
        parts.append(
            "WARNING: kernels could fill the host's /dev/shm (no mount namespace, no Landlock)"
        )
    if all(s.disk for s in statuses):
        parts.append(
            f"working and scratch folders bounded to {statuses[0].disk} MiB per kernel (a private "
            "tmpfs, gone with the kernel)"
        )
    else:
        per_file = all(s.file_size for s in statuses)
        parts.append(
            "WARNING: the working and scratch folders were NOT bounded (no mount namespace); "
            + (f"each file at most {statuses[0].file_size} MiB" if per_file else "nor each file")
        )
    return parts


def sandbox_summary(statuses: list[SandboxStatus]) -> str:
    """One sentence on how the kernels were confined (from the kernels' own reports).

    Args:
        statuses: what each sandbox kernel reported.

    Returns:
        ``"sandbox: ..."``, with a warning for each protection that was unavailable.
    """
    if not statuses:
        return "sandbox: no student code was run"
    abi = min(s.landlock for s in statuses)
    parts = []
    if abi >= 1:
        parts.append(
            f"file access confined with Landlock (ABI {abi})"
            + (", signals too" if abi >= 6 else "")
        )
    else:
        parts.append(
            "WARNING: Landlock is not available on this system, so notebooks were NOT confined "
            "to their own folder (they could read solutions/ or write elsewhere; grade in a "
            "container or as a separate user)"
        )
    networks = {s.network for s in statuses}
    if networks == {"namespace"}:
        parts.append("no network beyond a loopback of their own (a namespace each)")
    elif "" not in networks:
        parts.append("no TCP connections (Landlock; a network namespace was not possible)")
    else:
        parts.append("WARNING: some kernels had network access (no network namespace possible)")
    parts += _storage_summary(statuses, abi)
    if not all(s.cpu for s in statuses):
        parts.append("WARNING: the CPU-time limit could not be set")
    if all(s.processes for s in statuses):
        parts.append(f"at most {statuses[0].processes} processes per kernel")
    else:
        parts.append("WARNING: the number of processes could not be limited (fork bombs)")
    errors = sorted({s.error for s in statuses if s.error})
    if errors:
        parts.append("problems: " + "; ".join(errors))
    return "sandbox: " + ", ".join(parts)
