"""``coursepkg grade``: autograde a whole class on Dask distributed.

:func:`grade_class` checks the gradebook and the cluster can be reached (before any work),
ships the assignment to the workers once and each submission as a job
(:mod:`~coursepkg.grading.classroom.protocol`), and records each answer as it arrives: the
graded notebook and feedback into the course folder, the grades into the gradebook
(:mod:`~coursepkg.grading.classroom.gradebook`). Then nbgrader's CSV export, the per-student
JSON reports and the dashboard.

* **Where**: with no scheduler, a ``LocalCluster`` on this machine (one worker process per core,
  but no more workers than students, one job at a time each); with
  ``scheduler="tcp://HOST:PORT"``, a running cluster (``dask scheduler`` and ``dask worker``,
  dask-jobqueue on Slurm, dask-kubernetes).
* **Faults**: a worker killed while it grades (SIGKILL, a crashed machine) is replaced by Dask
  and the student graded by another; a notebook that kills its worker every time fails the
  task after the scheduler's ``allowed-failures`` tries (``distributed.scheduler.allowed-
  failures``, 3 by default) and gets 0 with that reason. Each student is recorded once, by the
  client, from the one answer it receives. A recorded student is never half-written: Ctrl-C
  (SIGINT) or SIGTERM waits for the record in progress, then stops, cancelling the jobs still
  on the cluster (the others keep their earlier grades; a rerun finishes the class).
* **Rerun**: nbgrader replaces a submission's grades in place, and the files are swapped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..kernel.confine import remove_stale_cgroups
from ..notebook import DEFAULT_CELL_TIMEOUT, NotebookError, load_notebook
from ..notebook import cell_timeout as notebook_cell_timeout
from ..policy.late import apply_due_date, check_due_dates, course_zone, in_course_time
from ..release import course_secret
from . import gradebook
from .dashboard import build_dashboard
from .limits import course_limits
from .protocol import EXCHANGE_FILES, Assignment, GradeAnswer, GradeJob, SandboxStatus
from .reports import ClassResult, StudentResult, load_checks, sandbox_summary, student_report
from .standing import standing

__all__ = ["Interrupted", "connect", "grade_class"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def connect(scheduler: str | None, workers: int | None) -> Iterator[Any]:
    """A Dask client: on the scheduler at ``scheduler``, or on a new ``LocalCluster`` of
    ``workers`` processes (default: one per core) that lives as long as the block. Grading
    connects before it writes anything, so an unreachable scheduler changes nothing.

    Raises:
        ValueError: the scheduler cannot be reached.
    """
    import dask
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            client = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError) as err:
            raise ValueError(
                f"cannot reach the Dask scheduler at {scheduler}: {err} (nothing was graded)"
            ) from err
        try:
            yield client
        finally:
            client.close()
        return
    n = max(1, workers or os.cpu_count() or 1)
    # The kernels have their own memory limit; Dask's would count the worker only.
    with dask.config.set({"distributed.scheduler.allowed-failures": 2}):
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            memory_limit=0,
            silence_logs=logging.ERROR,
        )
    try:
        with Client(cluster) as client:
            yield client
    finally:
        cluster.close()
        # The kernels of a worker that was killed leave their pids cgroups behind (root only).
        remove_stale_cgroups()


def _problem(root: Path, assignment: str, student: str, notebooks: list[str]) -> str:
    """Why the submission cannot be run at all (missing, empty, not JSON), or ``""``."""
    folder = root / "submitted" / student / assignment
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


def _job(course: gradebook.Course, assignment: str, student: str, notebooks: list[str]):
    """The student's job: the submission's files (or the reason it cannot run) and the
    student's standing in the gradebook, which the feedback shows."""
    root, state = course.root, standing(course, assignment, student)
    reason = _problem(root, assignment, student, notebooks)
    folder = root / "submitted" / student / assignment
    if reason:  # the release is graded instead; the exchange's files stay with it
        kept = {n: (folder / n).read_bytes() for n in EXCHANGE_FILES if (folder / n).is_file()}
        return GradeJob(student, files=kept, reason=reason, standing=state)
    files = {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".ipynb_checkpoints" not in p.parts
    }
    return GradeJob(student, files=files, standing=state)


class Interrupted(KeyboardInterrupt):
    """Grading was stopped by a signal (Ctrl-C's SIGINT, or SIGTERM); ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Stop:
    """Ctrl-C (SIGINT) and SIGTERM while grading stop it, but never in the middle of recording
    a student: a record in progress (:meth:`recording`) is finished first, so each student is
    recorded whole or not at all. Then :class:`Interrupted` is raised in the main thread."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum = 0
        self._holding = False

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signum = signum
        if not self._holding:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Handle the signals for the duration of the block (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Hold the signals until the block is done, then act on one that came meanwhile."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        if self.signum:
            raise Interrupted(self.signum)


class _Batch:
    """The jobs of one run in flight on the cluster, and what became of each student."""

    def __init__(
        self, client: Any, assignment: Assignment, course: gradebook.Course, stop: _Stop
    ) -> None:
        from .worker import grade, hold

        self.client, self.assignment, self.course, self.stop = client, assignment, course, stop
        self.task = grade
        # A task that returns the assignment, not scattered data: if every worker holding it is
        # killed, Dask computes it again from the task (scattered data would be lost for good).
        self.shipped = client.submit(hold, assignment, key=f"assignment-{assignment.digest}")
        self.results: dict[str, StudentResult] = {}
        self.statuses: list[SandboxStatus] = []
        self.pending: dict[Any, GradeJob] = {}

    def submit(self, job: GradeJob) -> Any:
        key = f"grade-{self.assignment.name}-{job.student}-{uuid.uuid4().hex[:8]}"
        future = self.client.submit(self.task, self.shipped, job, key=key, pure=False)
        self.pending[future] = job
        return future

    def done(self, future: Any) -> GradeJob | None:
        """Record a finished job; return the fallback job to run when it failed."""
        from distributed import KilledWorker

        job = self.pending.pop(future)
        result = self.results.setdefault(job.student, StudentResult(job.student))
        try:
            answer: GradeAnswer = future.result()
        except KilledWorker:
            reason = (
                "the process grading your notebook was killed every time it ran it (did the "
                "notebook kill or crash its grader?), so it was stopped"
            )
            return self._failed(job, result, reason, "its worker was killed every time")
        except Exception as err:  # noqa: BLE001 - the grader's failure, reported as such
            text = f"{type(err).__name__}: {err}"
            reason = f"the grader failed on this notebook ({text[:200]})"
            return self._failed(job, result, reason, text)
        with self.stop.recording():
            self._record(answer, result)
        return None

    def _failed(self, job: GradeJob, result: StudentResult, reason: str, error: str) -> Any:
        result.attempts += 1
        if job.reason:  # even the fallback failed: nothing more to try
            result.graded, result.reason, result.error = False, job.reason, error
            log.error("could not record a grade for %s: %s", job.student, error)
            return None
        kept = {n: data for n, data in job.files.items() if n in EXCHANGE_FILES}
        return GradeJob(job.student, files=kept, reason=reason, standing=job.standing)

    def _record(self, answer: GradeAnswer, result: StudentResult) -> None:
        root = self.course.root
        gradebook.record(self.course, self.assignment.name, answer, list(self.assignment.notebooks))
        logs = root / "reports" / self.assignment.name / "logs"
        (logs / f"{answer.student}.log").write_text(answer.log, encoding="utf-8")
        result.graded, result.reason = answer.graded, answer.reason
        result.attempts += answer.attempts
        result.seconds += answer.seconds
        result.feedback = bool(answer.feedback)
        if answer.sandbox is not None:
            self.statuses.append(answer.sandbox)

    def cancel(self) -> None:
        if self.pending:
            self.client.cancel(list(self.pending))


def _assignment(course: gradebook.Course, name: str, notebooks: list[str], **limits: Any):
    release = course.root / course.release / name
    if not all((release / f"{nb}.ipynb").is_file() for nb in notebooks):
        raise ValueError(f"the release of {name!r} is missing from {release}")
    if limits.get("cell_timeout") is None:
        asked = [notebook_cell_timeout(load_notebook(release / f"{nb}.ipynb")) for nb in notebooks]
        limits["cell_timeout"] = max(asked, default=DEFAULT_CELL_TIMEOUT)
    return Assignment(
        name=name,
        course_id=course.course_id,
        notebooks=tuple(notebooks),
        config=course.config_text,
        release={f"{nb}.ipynb": (release / f"{nb}.ipynb").read_bytes() for nb in notebooks},
        source_files=course.source_files(name),
        gradebook=gradebook.definition(course, name),
        seed_salt=course_secret(course.root),
        **limits,
    )


def _load_checks_ahead() -> threading.Thread:
    """:func:`~.reports.load_checks` in a daemon thread, while the workers grade. A failure is
    left for the reports to meet again: they import the same modules on first use."""

    def attempt() -> None:
        try:
            load_checks()
        except Exception:  # noqa: BLE001 - the reports import again and report it
            log.debug("loading the checks ahead failed; the reports will load them", exc_info=True)

    thread = threading.Thread(target=attempt, name="coursepkg-load-checks", daemon=True)
    thread.start()
    return thread


def _run(batch: _Batch, jobs: list[GradeJob], window: int, progress: bool, console: Any) -> None:
    """Keep at most ``window`` jobs on the cluster; record each answer as it arrives, with a
    progress bar. Whatever is still running when this stops (Ctrl-C) is cancelled."""
    from distributed import as_completed
    from tqdm.auto import tqdm

    name = batch.assignment.name
    todo = list(reversed(jobs))
    shown = {"disable": not progress, "file": console or sys.stderr}
    bar = tqdm(total=len(jobs), desc=f"grading {name}", unit="nb", **shown)
    try:
        with bar:
            running = as_completed(
                [batch.submit(todo.pop()) for _ in range(min(window, len(todo)))]
            )
            for future in running:
                follow_up = batch.done(future)
                if follow_up is not None:
                    running.add(batch.submit(follow_up))
                    continue
                bar.update(1)
                if todo:
                    running.add(batch.submit(todo.pop()))
    finally:
        batch.cancel()


def _finish(batch: _Batch, chosen: list[str], notebooks: list[str], reports: Path, replaced: Any):
    """nbgrader's CSV export, the per-student JSON reports and the dashboard; ``replaced``: the
    gradebook's due date that the policy's replaced (None: none), for the summary."""
    book, assignment = batch.course, batch.assignment.name
    gradebook.export_csv(book, assignment, reports / "grades.csv")
    for sid in chosen:
        report = student_report(book.root, assignment, book.url, batch.results[sid], notebooks)
        (reports / f"{sid}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return ClassResult(
        assignment=assignment,
        students=[batch.results[s] for s in chosen],
        reports=reports,
        dashboard=build_dashboard(book.root),
        sandbox=sandbox_summary(batch.statuses),
        due=_due(book, assignment) + _replaced_note(replaced),
    )


def _replaced_note(replaced: Any) -> str:
    """What the summary adds when the policy's due date replaced the gradebook's (None: none)."""
    if replaced is None:
        return ""
    return (
        f" (it replaced the gradebook's {replaced:%Y-%m-%d %H:%M} UTC: LatePolicy.due_dates "
        "in nbgrader_config.py wins)"
    )


def _due(course: gradebook.Course, assignment: str) -> str:
    """The assignment's due date in the gradebook, for the summary (empty: none)."""
    with course.gradebook() as gb:
        due = gb.find_assignment(assignment).duedate
    return in_course_time(due, course_zone(course.config, assignment)) if due else ""


def _checked_course(root: Path, url: str, name: str) -> gradebook.Course:
    """The course, its due dates readable and the assignment's release there, or an error
    saying what to do, before the cluster starts."""
    course = gradebook.Course(root, url)
    check_due_dates(course.config)
    release = course.root / course.release / name
    if not release.is_dir():
        raise ValueError(
            f"the release of {name!r} is missing from {release}: run `coursepkg release {name} "
            f"--root {course.root}` first (it generates the release from "
            f"{course.root / course.source / name})"
        )
    return course


def _submissions(root: Path, assignment: str, students: list[str] | None) -> list[str]:
    everyone = sorted(
        p.name for p in (root / "submitted").glob("*") if p.is_dir() and (p / assignment).is_dir()
    )
    chosen = everyone if students is None else [s for s in everyone if s in set(students)]
    if not chosen:
        raise ValueError(f"no submissions of {assignment!r} in {root / 'submitted'}")
    return chosen


@contextlib.contextmanager
def _shared_fork_server(fork: bool, scheduler: str | None) -> Iterator[tuple[str, int] | None]:
    """With ``fork`` on a ``LocalCluster``, one fork server for all its workers, started
    before the cluster: it imports torch and the checks (seconds of CPU) once, not once a
    worker, and while the cluster starts. Yields ``(socket path, pid)``, or None where each
    worker starts its own (a remote scheduler's workers are not this process's children; and
    in a process orphans are re-parented to, a child proves nothing:
    :func:`~coursepkg.grading.kernel.forkserver.orphans_become_children`)."""
    from ..kernel.forkserver import ForkServer, orphans_become_children

    if not fork or scheduler or orphans_become_children():
        yield None
        return
    import dask

    # The environment a Dask nanny gives its worker (one thread for OpenMP and the BLAS,
    # glibc's trim threshold), which a worker's own server would have inherited.
    spawned = dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {}
    env = {**os.environ, **{k: str(v) for k, v in spawned.items()}}
    folder = Path(tempfile.mkdtemp(prefix="cg-s-", dir="/tmp"))
    server = ForkServer(folder / "fork.sock", siblings=True, env=env)
    try:
        yield str(server.path), server.proc.pid
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _start_fork_servers(client: Any, fork: bool, shared: tuple[str, int] | None) -> None:
    """With ``fork``, a fork server on each worker (or ``shared``, the client's for all of
    them), started first: it imports torch and the checks while the client prepares the jobs."""
    if fork:
        from .worker import GradingPlugin

        client.register_plugin(GradingPlugin(shared))


def grade_class(
    course: str | Path,
    assignment: str,
    *,
    workers: int | None = None,
    students: list[str] | None = None,
    db_url: str | None = None,
    scheduler: str | None = None,
    cell_timeout: int | None = None,
    notebook_timeout: int | None = None,
    memory_mb: int | None = None,
    disk_mb: int | None = None,
    shm_mb: int | None = None,
    progress: bool = True,
    fork: bool = True,
    console: Any = None,
) -> ClassResult:
    """Autograde every submission of ``assignment`` on Dask, then write feedback, the CSV
    export, the per-student JSON reports and the dashboard.

    Args:
        course: the nbgrader course directory (with ``nbgrader_config.py``, ``submitted/`` and
            the assignment's release; its gradebook entry is made from the source if missing).
        assignment: the assignment id.
        workers: worker processes of the local cluster (default: the number of CPU cores),
            never more than the students graded (each worker's fork server imports torch and
            the checks before it grades anyone); ignored with ``scheduler``.
        students: grade only these student ids (default: everyone in ``submitted/``).
        db_url: the gradebook's URL (default: ``sqlite:///<course>/gradebook.db``;
            ``postgresql://user@host:port/db`` for PostgreSQL).
        scheduler: a running Dask scheduler's address (``tcp://HOST:PORT``); default: a
            ``LocalCluster`` on this machine.
        cell_timeout, notebook_timeout, memory_mb, disk_mb, shm_mb: each kernel's limits
            (:class:`~.limits.GradeLimits` says what each bounds); None: the course's
            ``c.GradeLimits`` in ``nbgrader_config.py``, else the defaults.
        progress: show a tqdm progress bar on ``console`` (default: stderr).
        fork: fork each kernel from a process that has imported torch and the checks
            (:mod:`coursepkg.grading.kernel.forkserver`); False starts every kernel anew.
        console: the progress bar's stream (default: stderr).

    Returns:
        A :class:`ClassResult` (its :meth:`~ClassResult.summary` is the final line).

    Raises:
        ValueError: the course, assignment, gradebook or scheduler is not there.
        Interrupted: stopped by SIGINT (Ctrl-C) or SIGTERM (a :class:`KeyboardInterrupt`);
            every student recorded so far is complete.
    """
    start = time.perf_counter()
    root = Path(course).resolve()
    url = gradebook.reachable_url(root, db_url)
    sizes = dict(cell_timeout=cell_timeout, notebook_timeout=notebook_timeout, memory_mb=memory_mb)
    limits = course_limits(root, **sizes, disk_mb=disk_mb, shm_mb=shm_mb)
    chosen = _submissions(root, assignment, students)
    book = _checked_course(root, url, assignment)
    stop = _Stop()
    with stop.installed(), gradebook.reused_engines():
        local = min(workers or os.cpu_count() or 1, len(chosen))  # an idle worker costs CPU too
        with _shared_fork_server(fork, scheduler) as shared, connect(scheduler, local) as client:
            _start_fork_servers(client, fork, shared)
            notebooks = book.notebooks(assignment)
            replaced = apply_due_date(book, assignment)  # the policy's, before the workers
            reports = root / "reports" / assignment
            (reports / "logs").mkdir(parents=True, exist_ok=True)
            n_workers = len(client.scheduler_info()["workers"]) or 1
            threads = max(1, (os.cpu_count() or 1) // n_workers) if not scheduler else 1
            shipped = _assignment(book, assignment, notebooks, threads=threads, fork=fork, **limits)
            batch = _Batch(client, shipped, book, stop)
            grade_start = time.perf_counter()
            jobs = [_job(book, assignment, sid, notebooks) for sid in chosen]
            loading = _load_checks_ahead()  # the reports' imports, while the workers grade
            _run(batch, jobs, 4 * n_workers, progress, console)
            grade_seconds = time.perf_counter() - grade_start
        loading.join()
        result = _finish(batch, chosen, notebooks, reports, replaced)
        result.grade_seconds, result.workers = grade_seconds, n_workers
        result.subset = students is not None
        result.seconds = time.perf_counter() - start
    log.info("%s", result.summary())
    return result
