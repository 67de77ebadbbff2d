"""The grading worker: what runs on a Dask worker for each student (:func:`grade`).

A worker shares no file system with the client. For each :class:`~.protocol.Assignment` it
prepares a private nbgrader course of its own once (the course's ``nbgrader_config.py``, the
release, the source's data files and an SQLite gradebook holding only the assignment's
definition: no solutions, no other student and no database URL of the real gradebook), and then
grades one submission after another in it with nbgrader's own API
(``NbGraderAPI.autograde`` and ``generate_feedback``, as its formgrader does). The submission
arrives in the :class:`~.protocol.GradeJob`, with the student's standing in the course's
gradebook (hand grades, an extension, regrade requests: :mod:`.standing`), written into the
private gradebook first so that the feedback, made here and only here, shows it; the graded
notebook and the feedback go back in the :class:`~.protocol.GradeAnswer`, and the student's
files are removed from the worker.

Kernels are the sandbox kernels of :mod:`coursepkg.grading.kernel.sandbox`, forked from a fork
server: on a ``LocalCluster``, the one the client started for all its workers before the
cluster (its imports overlap the cluster's start, and are paid once); on a remote scheduler's
workers, one of this worker process's own (:class:`GradingPlugin` starts it when the worker
starts, so its imports overlap the worker's). A job waits for it before its notebook's time
starts. A
notebook that runs longer than its time limit has its kernel killed (and whatever it started);
the student then gets the fallback grade: the release graded in place of the submission, every
test scoring 0 with the reason.

One job runs at a time in a worker process (a lock): nbgrader sets process-wide state (the
working directory, environment variables). Start workers with one thread each
(``dask worker --nthreads 1 --nworkers N``); more threads only wait.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from distributed.core import Status
from distributed.diagnostics.plugin import WorkerPlugin

from ..kernel.confine import ENDED, kill_process_group_cgroup, remove_stale_cgroups
from ..kernel.forkserver import ForkServer
from ..kernel.sandbox import KERNEL_NAME, NOT_GRADED_ENV, PIDFILE_ENV, STATUS_ENV, write_kernelspec
from .gradebook import reused_engines, scratch_gradebook
from .preprocessors import RELEASE_ENV, feedback_preprocessors, sanitize_preprocessors
from .protocol import EXCHANGE_FILES, Assignment, GradeAnswer, GradeJob, SandboxStatus
from .standing import forget, restore, settle

__all__ = ["GradingPlugin", "grade", "hold", "start_fork_server", "stop_fork_server"]

log = logging.getLogger(__name__)

# A graded submission's files bigger than this are not sent back (a notebook may write a huge
# file into its folder); the log says which.
MAX_FILE_BYTES = 20 * 2**20

_lock = threading.Lock()
_state: dict[str, Any] = {"server": None, "home": None, "courses": {}, "shared": None}


def _home() -> Path:
    """This worker process's private scratch folder (short: socket paths are limited)."""
    if _state["home"] is None:
        _state["home"] = Path(tempfile.mkdtemp(prefix="cg-w-", dir="/tmp"))
    return _state["home"]


def start_fork_server() -> ForkServer:
    """This process's fork server, started on first use (it imports torch while the worker does
    other things) and made the one its kernel provisioners use; on a ``LocalCluster``, the
    handle on the one server the client started for all its workers (:class:`GradingPlugin`),
    while that server runs."""
    server = _state["server"]
    if server is None or server.proc.poll() is not None:
        shared = _state["shared"]
        if shared is not None and server is None:
            server = ForkServer.attach(*shared).start()
        else:  # no shared server, or it died: one of this worker's own
            server = ForkServer(_home() / "fork.sock").start()
        _state["server"] = server
    return server


def stop_fork_server() -> None:
    """Stop this process's fork server and remove its scratch folder."""
    server, _state["server"] = _state["server"], None
    if server is not None:
        server.stop()
    if _state["home"] is not None:
        shutil.rmtree(_state["home"], ignore_errors=True)
        _state["home"], _state["courses"] = None, {}


class GradingPlugin(WorkerPlugin):
    """Starts the fork server when a Dask worker starts (or restarts after a crash) and stops
    it with the worker; both times, the ``pids`` cgroups of kernels that died with a worker are
    removed (:func:`~coursepkg.grading.kernel.confine.remove_stale_cgroups`).

    Args:
        shared: ``(socket path, pid)`` of the fork server the client started for its own
            workers (:meth:`~coursepkg.grading.kernel.forkserver.ForkServer.attach`), or None:
            each worker starts its own.
    """

    name = "coursepkg-grading"

    def __init__(self, shared: tuple[str, int] | None = None) -> None:
        self.shared = shared

    def setup(self, worker: Any) -> None:
        _state["shared"] = self.shared
        start_fork_server()
        # A worker started after one was killed: its kernels' pids cgroups go.
        remove_stale_cgroups()

    def teardown(self, worker: Any) -> None:
        stop_fork_server()
        remove_stale_cgroups()
        if getattr(worker, "status", None) == Status.closing:
            # The worker process ends next: spare its exit a collector pass over every object
            # of torch and nbgrader (~0.7 s that the cluster's close waits for).
            gc.freeze()


def hold(assignment: Assignment) -> Assignment:
    """The Dask task that gives every job its assignment (computed again wherever needed)."""
    return assignment


def grade(assignment: Assignment, job: GradeJob) -> GradeAnswer:
    """Grade one student (the Dask task).

    Args:
        assignment: what grading this assignment needs.
        job: the student and their submission.

    Returns:
        The graded notebooks, feedback, log and sandbox report.

    Raises:
        RuntimeError: not even the fallback grade could be made (the client reports it).
    """
    # nbgrader's gradebooks reuse their engines (compiled statements) from student to student.
    with _lock, reused_engines():
        course = _state["courses"].get(assignment.digest)
        if course is None:
            course = _PrivateCourse(_home() / assignment.digest, assignment)
            _state["courses"][assignment.digest] = course
        return course.grade(job)


# ---------------------------------------------------------------------------------------------
# The private course
# ---------------------------------------------------------------------------------------------


# A kernel that could not start because another process took one of its ports as it bound them
# (no code of the student's has run before the kernel answers): passes on a second try.
_PORT_RACE = ("before replying to kernel_info", "Address already in use")
# What nbclient says of a kernel that never answered its first request: it died or hung while
# it started, before any cell ran (the grader's machine: a port race, no memory to start one, a
# machine too busy to answer in time).
_NEVER_STARTED = (*_PORT_RACE, "Kernel didn't respond in")


def classify(output: str, cell_timeout: int) -> str:
    """A sentence for the student from nbgrader's log of a failed run.

    A kernel that never started is the grading machine's failure, not the notebook's: none of
    its code ran, and the sentence says so (the grader tried again first: ``_retrying``,
    :class:`~coursepkg.grading.kernel.execute.RestartingExecute`).
    """
    if any(marker in output for marker in _NEVER_STARTED):
        return (
            "the grader could not start a Python kernel for your notebook (a failure of the "
            "grading machine, not of your code: none of it ran), so it was not graded; grading "
            "it again grades it"
        )
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


# Failures that are the machine's, not the notebook's, and pass on a second try.
_TRANSIENT = ("database is locked", *_PORT_RACE)


def _retrying(call: Any, attempts: int = 4) -> tuple[dict, int]:
    """Call an NbGraderAPI method, again while it fails for a transient reason."""
    for attempt in range(1, attempts + 1):
        out = call()
        text = out.get("log", "") + out.get("error", "")
        if out.get("success") or not any(t in text for t in _TRANSIENT) or attempt == attempts:
            return out, attempt
        time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")


class _PrivateCourse:
    """An nbgrader course folder private to this worker, for one assignment."""

    def __init__(self, root: Path, assignment: Assignment) -> None:
        self.root, self.a = root, assignment
        self.url = f"sqlite:///{root / 'gradebook.db'}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        (root / "nbgrader_config.py").write_text(assignment.config, encoding="utf-8")
        (root / "gradebook.db").write_bytes(assignment.gradebook)
        scratch_gradebook(self.url)  # thrown away with the worker: commits need not wait
        self.release = root / "exercises" / assignment.name
        self.release.mkdir(parents=True)
        for name, data in assignment.release.items():
            (self.release / name).write_bytes(data)
        for name, data in assignment.source_files.items():
            target = root / "solutions" / assignment.name / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        self.jupyter = root / "jupyter"
        write_kernelspec(
            self.jupyter,
            course_root=root,
            memory_mb=assignment.memory_mb,
            cpu_seconds=assignment.notebook_timeout + 60,
            disk_mb=assignment.disk_mb,
            shm_mb=assignment.shm_mb,
        )
        self.api = self._api()

    def _api(self) -> Any:
        """nbgrader's API on this course, configured as ``nbgrader`` would be in its folder,
        with the grader's settings on top."""
        from nbgrader.apps import NbGraderAPI
        from nbgrader.apps.nbgraderapp import NbGraderApp
        from traitlets.config import Config

        here = os.getcwd()
        os.chdir(self.root)
        try:
            app = NbGraderApp()
            app.initialize([])  # the course's nbgrader_config.py, as `nbgrader` reads it
        finally:
            os.chdir(here)
        config = Config()
        config.CourseDirectory.root = str(self.root)
        config.CourseDirectory.db_url = self.url
        config.CourseDirectory.source_directory = "solutions"
        config.CourseDirectory.release_directory = "exercises"
        config.CourseDirectory.submitted_directory = "submitted"
        config.Execute.kernel_name = KERNEL_NAME
        config.Execute.timeout = self.a.cell_timeout
        # Deleted test cells are put back (nbgrader's own option), so deleting them gains nothing.
        config.OverwriteCells.add_missing_cells = True
        # nbconvert validates the notebook once, after an exporter's last preprocessor (its own
        # option), not after each of them: ~20 validations a student -> 3. An invalid notebook
        # still fails its step, before its file is written (the sanitized one before any cell
        # runs), so it still gets the fallback grade.
        config.Exporter.optimistic_validation = True
        # Kernels forked from a process that has imported torch (or started anew), over Unix
        # sockets: the sandbox kernel has no network beyond a loopback of its own.
        from ..kernel.execute import autograde_preprocessors
        from ..kernel.forked import ForkExecute

        config.Autograde.autograde_preprocessors = autograde_preprocessors(ForkExecute)
        config.Autograde.sanitize_preprocessors = sanitize_preprocessors()
        config.SaltHiddenSeeds.salt = self.a.seed_salt  # configuration: never in a kernel's env
        config.GenerateFeedback.preprocessors = feedback_preprocessors(app.config)
        app.update_config(config)
        return NbGraderAPI(parent=app)

    def gradebook(self) -> Any:
        """The private gradebook, open (as :class:`~.gradebook.Course`'s)."""
        from nbgrader.api import Gradebook

        return Gradebook(self.url, self.a.course_id)

    def _folder(self, kind: str, student: str) -> Path:
        return self.root / kind / student / self.a.name

    def grade(self, job: GradeJob) -> GradeAnswer:
        """Autograde, the fallback zero if needed, feedback; then collect and clean up."""
        start = time.perf_counter()
        sid = job.student
        scratch = Path(tempfile.mkdtemp(prefix=f"{sid[:20]}-", dir=_home()))
        env = {
            PIDFILE_ENV: str(scratch / "kernel.pid"),
            STATUS_ENV: str(scratch / "sandbox.json"),
            "TMPDIR": str(scratch),
            RELEASE_ENV: str(self.release),
            "JUPYTER_PATH": str(self.jupyter),
            "OMP_NUM_THREADS": str(self.a.threads),
            "MKL_NUM_THREADS": str(self.a.threads),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        tempfile.tempdir = str(scratch)
        run = _Run(sid, scratch, self.a)
        if self.a.fork and not start_fork_server().wait_ready(timeout=600):
            log.warning("the fork server did not start; kernels are started anew")
        try:
            # The course gradebook's hand grades, extension and regrade requests, so that the
            # feedback, made once here, shows what the client records (.standing).
            kept = restore(self, self.a.name, sid, job.standing)
            reason = job.reason
            if not reason:
                self._submit(sid, job.files)
                reason = run.autograde(self.api)
            if reason:
                self._submit(sid, None, job.files)  # the release in place of the submission
                run.fallback(self.api, reason)
            settle(self, self.a.name, sid, kept)
            ok = run.feedback(self.api)
            return GradeAnswer(
                student=sid,
                graded=not reason,
                reason=reason,
                attempts=run.attempts,
                seconds=time.perf_counter() - start,
                autograded=self._collect("autograded", sid, run.notes),
                feedback=self._collect("feedback", sid) if ok else {},
                log=run.text(),
                sandbox=run.sandbox,
                worker=os.environ.get("DASK_WORKER_NAME", str(os.getpid())),
            )
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            tempfile.tempdir = None
            for kind in ("submitted", "autograded", "feedback"):
                shutil.rmtree(self.root / kind / sid, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)
            try:
                forget(self, self.a.name, sid)
            except Exception:  # noqa: BLE001 - the grade is made; the next restore replaces it
                log.warning("%s: could not remove the student from the private gradebook", sid)

    def _submit(
        self, student: str, files: dict[str, bytes] | None, submitted: dict | None = None
    ) -> None:
        """Write the submission (or, with None, the release under the expected names, with the
        exchange's files of the ``submitted`` ones: its feedback can then be released)."""
        folder = self._folder("submitted", student)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        if files is None:
            files = {f"{name}.ipynb": self.a.release[f"{name}.ipynb"] for name in self.a.notebooks}
            files.update({n: data for n, data in (submitted or {}).items() if n in EXCHANGE_FILES})
        for name, data in files.items():
            target = (folder / name).resolve()
            if not target.is_relative_to(folder.resolve()):
                raise ValueError(f"a submitted file's name leaves its folder: {name!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

    def _collect(self, kind: str, student: str, notes: list[str] | None = None) -> dict[str, bytes]:
        folder = self._folder(kind, student)
        found: dict[str, bytes] = {}
        for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
            if not path.is_file() or path.is_symlink():
                continue
            if path.stat().st_size > MAX_FILE_BYTES:
                if notes is not None:
                    notes.append(f"{path.relative_to(folder)} was too large to keep")
                continue
            found[str(path.relative_to(folder))] = path.read_bytes()
        return found


class _Run:
    """The nbgrader runs of one student, their log, and the watchdog of the time limit."""

    def __init__(self, student: str, scratch: Path, assignment: Assignment) -> None:
        self.student, self.scratch, self.a = student, scratch, assignment
        self.attempts = 0
        self.sandbox: SandboxStatus | None = None
        self.notes: list[str] = []
        self._log: list[str] = []
        self._timed_out = False
        self._out_of_memory = False

    def text(self) -> str:
        return "\n".join(self._log + [f"note: {n}" for n in self.notes])

    def _record(self, title: str, out: dict) -> None:
        self._log.append(f"== {title}: {'ok' if out.get('success') else 'FAILED'}")
        self._log.append(out.get("log", "") + out.get("error", ""))

    def _kill_kernel(self) -> None:
        """Kill the running kernel, its process group and its cgroup (the time limit)."""
        self._timed_out = True
        try:
            pid = int((self.scratch / "kernel.pid").read_text().strip())
        except (OSError, ValueError):
            return
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_process_group_cgroup(pid)

    def _autograde(self, api: Any, title: str) -> dict:
        watchdog = threading.Timer(self.a.notebook_timeout, self._kill_kernel)
        watchdog.daemon = True
        watchdog.start()
        try:
            out, n = _retrying(lambda: api.autograde(self.a.name, self.student, True, True))
        finally:
            watchdog.cancel()
            pidfile = self.scratch / "kernel.pid"
            if pidfile.is_file():  # whatever the kernel left running (a fork bomb) goes too
                try:
                    pid = int(pidfile.read_text().strip())
                    kill_process_group_cgroup(pid)
                    # Its memory cgroup's out-of-memory kills (recorded as it was removed).
                    self._out_of_memory |= ENDED.pop(pid, {}).get("oom_kills", 0) > 0
                except ValueError:
                    pass
                pidfile.unlink()
        self.attempts += n
        self._record(title, out)
        return out

    def autograde(self, api: Any) -> str:
        """Grade the submission; the reason it could not be graded, or ``""``."""
        out = self._autograde(api, "autograde")
        status = self.scratch / "sandbox.json"
        if status.is_file():
            try:
                self.sandbox = SandboxStatus.from_json(json.loads(status.read_text() or "{}"))
            except ValueError:
                pass
            status.unlink()
        if out.get("success") and not self._timed_out:
            return ""
        if self._timed_out:
            return (
                f"it ran longer than the {self.a.notebook_timeout} s allowed for a whole "
                "notebook (an infinite loop or far too slow code), so it was stopped"
            )
        if self._out_of_memory:
            return (
                f"your notebook ran out of memory (limit {self.a.memory_mb} MB, files in /dev/shm "
                "and other in-memory files included), so its kernel was stopped and none of "
                "its tests could run"
            )
        return classify(out.get("log", "") + out.get("error", ""), self.a.cell_timeout)

    def fallback(self, api: Any, reason: str) -> None:
        """The release graded in place of the submission, every check failing with ``reason``.
        It runs no student code, so it cannot hang or crash."""
        self._timed_out = False
        os.environ[NOT_GRADED_ENV] = reason
        try:
            out = self._autograde(api, "autograde (fallback: every test scores 0)")
        finally:
            del os.environ[NOT_GRADED_ENV]
        if not out.get("success"):
            raise RuntimeError(f"even the fallback grading failed:\n{self.text()[-3000:]}")

    def feedback(self, api: Any) -> bool:
        out, _ = _retrying(lambda: api.generate_feedback(self.a.name, self.student, True))
        self._record("generate_feedback", out)
        return bool(out.get("success"))
