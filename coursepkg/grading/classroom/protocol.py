"""What the client and the grading workers send each other: typed, picklable, and free of any
path either side sees (workers need no shared file system).

The client ships one :class:`Assignment` per batch (once per worker, through Dask's scatter)
and one :class:`GradeJob` per student; a worker answers with a :class:`GradeAnswer` holding
everything the client writes: the graded notebooks, the feedback, nbgrader's log and how the
kernel was confined. Scores are not sent as numbers: the client records them from the graded
notebooks with nbgrader's own ``SaveAutoGrades``, as nbgrader's autograder does.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Assignment", "GradeAnswer", "GradeJob", "SandboxStatus", "Standing"]


@dataclass(frozen=True)
class Assignment:
    """What grading any submission of one assignment needs, shipped once to each worker.

    Attributes:
        name: the assignment id.
        course_id: nbgrader's course id (the gradebook's ``course`` row).
        notebooks: the notebooks nbgrader grades (names without ``.ipynb``).
        config: the course's ``nbgrader_config.py``.
        release: the students' notebooks, by file name (graded in place of a submission that
            cannot run, and read by the grader's notes).
        source_files: the files nbgrader copies from the source folder into every graded
            submission (data files; never a notebook, so never a solution), by relative path.
        gradebook: an SQLite gradebook holding only this assignment's definition (its cells,
            points and locked sources): the worker's private copy of what autograde reads.
        cell_timeout: seconds one cell may run.
        notebook_timeout: seconds a whole notebook may take.
        memory_mb: the kernel's memory limit in MiB (its memory cgroup and address space).
        disk_mb: MiB the kernel's working and scratch directories may hold together (and the
            largest file it may write).
        shm_mb: MiB of the kernel's private ``/dev/shm``.
        threads: threads each kernel may use.
        fork: fork kernels from a server that has imported torch.
        seed_salt: the course's secret (``course_secret.txt``), which salts the seeds of the
            hidden tests before they run (:func:`~coursepkg.grading.release.salted_seed`);
            empty: the seeds are the source's.
    """

    name: str
    course_id: str
    notebooks: tuple[str, ...]
    config: str
    release: dict[str, bytes]
    source_files: dict[str, bytes]
    gradebook: bytes
    cell_timeout: int = 120
    notebook_timeout: int = 900
    memory_mb: int = 4096
    disk_mb: int = 1024
    shm_mb: int = 256
    threads: int = 1
    fork: bool = True
    seed_salt: str = ""

    @property
    def digest(self) -> str:
        """A short fingerprint: a worker keeps one prepared course folder per digest."""
        h = hashlib.sha256()
        for part in (self.name, self.course_id, self.config, self.seed_salt, *self.notebooks):
            h.update(part.encode())
        for files in (self.release, self.source_files):
            for key in sorted(files):
                h.update(key.encode())
                h.update(files[key])
        h.update(self.gradebook)
        limits = (self.cell_timeout, self.memory_mb, self.notebook_timeout)
        h.update(repr((*limits, self.disk_mb, self.shm_mb)).encode())
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class Standing:
    """What the course's gradebook holds about a student's submission beyond the autograder's
    scores: what the feedback shows, made on the worker (:mod:`.standing`).

    Attributes:
        timestamp: when it was handed in (``timestamp.txt``), as the client records it.
        prior_timestamp: the timestamp the gradebook holds from an earlier grading.
        extension: an extension granted in the gradebook (None: none).
        grades: ``(notebook, cell) -> (manual score, needs manual grade, autograder's score)``
            of each grade given by hand (or by a regrade answer).
        requests: the student's regrade requests on this assignment, with their trails
            (:class:`~coursepkg.grading.policy.regrade.Request`).
    """

    timestamp: datetime.datetime | None = None
    prior_timestamp: datetime.datetime | None = None
    extension: datetime.timedelta | None = None
    grades: dict[tuple[str, str], tuple[float, bool, float | None]] = field(default_factory=dict)
    requests: tuple[Any, ...] = ()


@dataclass(frozen=True)
class GradeJob:
    """One student to grade.

    Attributes:
        student: the student id.
        files: the submission folder's files (``<name>.ipynb``, ``timestamp.txt``, ...) by
            relative path; with ``reason``, only the exchange's (:data:`EXCHANGE_FILES`), which
            the release graded in its place keeps, so that its feedback can be released.
        reason: set when the submission cannot be run (missing, not JSON, or it killed its
            worker every time): the release is graded instead, every test scoring 0 with this
            reason in the feedback.
        standing: what the course's gradebook holds about the student (hand grades, an
            extension, regrade requests), which the feedback made on the worker shows.
    """

    student: str
    files: dict[str, bytes] = field(default_factory=dict)
    reason: str = ""
    standing: Standing = field(default_factory=Standing)


#: The files nbgrader's exchange writes beside a submission: when it was handed in, and the
#: secret ``release_feedback`` files the feedback under.
EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")


@dataclass(frozen=True)
class SandboxStatus:
    """How a kernel was confined, as it reported itself.

    Attributes:
        landlock: the Landlock ABI used (0: files not confined).
        memory: the address-space limit in MiB (0: none).
        memory_cgroup: ``"cgroup v1"`` or ``"cgroup v2"`` when a memory cgroup counted tmpfs
            and page cache too (``""``: none).
        file_size: the largest file it could write, in MiB (0: no limit).
        disk: MiB its working and scratch directories could hold together (0: not bounded).
        shm: MiB of its private ``/dev/shm`` (0: it had the host's, read-only with Landlock).
        cpu: the CPU-time limit in seconds (0: none).
        network: ``"namespace"``, ``"landlock-tcp"`` or ``""`` (the kernel had a network).
        processes: the ceiling on processes (0: none).
        error: what could not be applied, and why.
    """

    landlock: int = 0
    memory: int = 0
    memory_cgroup: str = ""
    file_size: int = 0
    disk: int = 0
    shm: int = 0
    cpu: int = 0
    network: str = ""
    processes: int = 0
    error: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxStatus:
        """From the kernel's JSON report (unknown keys ignored)."""
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class GradeAnswer:
    """What a worker sends back for one :class:`GradeJob`.

    Attributes:
        student: the student id.
        graded: False when the release was graded in its place (every test 0).
        reason: why it was not graded (empty when it was).
        attempts: nbgrader runs (a retry after a kernel that could not start counts).
        seconds: wall-clock time on the worker.
        autograded: nbgrader's ``autograded/<student>/<assignment>/`` files by relative path.
        feedback: nbgrader's ``feedback/<student>/<assignment>/`` files (empty if it failed).
        log: nbgrader's output.
        sandbox: how the kernel was confined (None when no student code ran).
        worker: the worker's address (for the logs).
    """

    student: str
    graded: bool
    reason: str
    attempts: int
    seconds: float
    autograded: dict[str, bytes]
    feedback: dict[str, bytes]
    log: str
    sandbox: SandboxStatus | None = None
    worker: str = ""
