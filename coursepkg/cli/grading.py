"""The grading commands: ``coursepkg check NOTEBOOK`` (a student runs an assignment notebook and
reads its visible tests), ``coursepkg release`` (the instructor regenerates the students'
notebooks, exercises/, from solutions/) and ``coursepkg grade ASSIGNMENT`` (the instructor
autogrades a whole class with nbgrader). The end of term's commands (``export``, ``regrade``,
``similarity``) are in :mod:`coursepkg.cli.term`.

Each command is a pair, ``_add_<verb>(sub)`` that declares its arguments and ``_<verb>(args)``
that runs it (its exit status), as in every home of ``coursepkg``'s commands
(:mod:`coursepkg.cli.model`). What a command runs (:mod:`coursepkg.grading`, which imports torch,
nbgrader and Dask) is imported when it runs, so ``coursepkg --help`` and an argument's error come
at once.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

__all__ = ["ARGUMENTS", "COMMANDS", "add_gradebook_option"]

#: The commands of this home and their line in ``coursepkg --help``.
COMMANDS = {
    "check": "run an assignment notebook and report its tests",
    "release": "regenerate exercises/ from solutions/ (instructors)",
    "grade": "autograde every submission of an assignment with nbgrader (instructors)",
    "kit": "the zip a student installs: the package and the released exercises (instructors)",
}


def _add_check(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg check`` subcommand."""
    p.description = (
        "Execute an assignment notebook top to bottom in a fresh kernel (it is not "
        "modified) and print each visible test with pass/fail, points and the check's message. "
        "Exit status 0 when every visible test passes, 1 otherwise, 2 when the file is not a "
        "notebook."
    )
    p.add_argument(
        "notebook", help="the .ipynb file, e.g. exercises/ex01_attention/ex01_attention.ipynb"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds a single cell may run (default: the notebook's "
        "metadata.coursepkg.cell_timeout, else 120)",
    )
    p.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    from ..grading.notebook import run_notebook

    report = run_notebook(args.notebook, timeout=args.timeout)
    sys.stdout.write(report.format() + "\n")
    return 0 if report.passed else 1


def _add_release(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg release`` subcommand."""
    p.description = (
        "Run nbgrader's generate_assignment on solutions/ into exercises/, record "
        "the assignments and their graded cells in the gradebook (what nbgrader's "
        "release_assignment, autograde and the formgrader need), and scan the result for "
        "leaked solutions or hidden tests."
    )
    p.add_argument("assignment", nargs="?", default="*", help="an assignment id (default: all)")
    p.add_argument("--root", default=".", help="the course directory (default: .)")
    p.add_argument("--db", help="gradebook SQLAlchemy URL (default: sqlite gradebook.db in root)")
    p.add_argument("--no-db", action="store_true", help="leave every gradebook alone")
    p.set_defaults(func=_release)


def _release(args: argparse.Namespace) -> int:
    from ..grading.release import course_secret, find_leaks, generate_release

    db_url = (
        None if args.no_db else args.db or f"sqlite:///{Path(args.root).resolve()}/gradebook.db"
    )
    released = generate_release(args.root, args.assignment, db_url=db_url)
    if not args.no_db:  # a graded course: its secret salts the hidden tests' seeds
        course_secret(args.root, create=True)
    leaks = 0
    for notebook in released:
        source = Path(args.root) / "solutions" / notebook.parent.name / notebook.name
        found = find_leaks(source, notebook)
        leaks += len(found)
        sys.stdout.write(
            f"{notebook}" + (f": {len(found)} secret line(s) leaked!" if found else "") + "\n"
        )
        for line in found:
            sys.stdout.write(f"    {line}\n")
    folders = sorted({str(n.parent.parent) for n in released})
    sqlite = db_url and db_url.startswith("sqlite")  # never print a URL: it may hold a password
    where = f", recorded in {db_url.split('///')[-1] if sqlite else 'the --db gradebook'}"
    sys.stdout.write(
        f"{len(released)} notebook(s) generated into {', '.join(folders) or 'nothing'}"
        + (where if db_url else " (no gradebook)")
        + ("; no leaked solution or hidden test" if not leaks else f"; {leaks} leaked line(s)!")
        + "\n"
    )
    return 1 if leaks else 0


def _add_grade(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg grade`` subcommand."""
    p.description = (
        "Autograde submitted/*/ASSIGNMENT with nbgrader, students in parallel, each "
        "notebook in a sandboxed kernel with time and memory limits; then nbgrader's feedback "
        "and CSV export, a JSON report per student and the misconception dashboard in "
        "reports/. A broken or hostile notebook loses the points of what it breaks (0 if it "
        "cannot run at all), with the reason in its feedback; it never stops the batch or "
        "changes another student's grade. Safe to rerun. Exit status 1 if some student's grade "
        "could not be recorded at all. The limits' defaults can be set in the course's "
        "nbgrader_config.py as c.GradeLimits.<option> (memory_mb, disk_mb, shm_mb, "
        "cell_timeout, notebook_timeout)."
    )
    p.add_argument("assignment", help="the assignment id, e.g. ex06_training")
    p.add_argument("--root", default=".", help="the nbgrader course directory (default: .)")
    p.add_argument(
        "--workers",
        type=int,
        help="worker processes of the local Dask cluster (default: cores; never more than the "
        "students graded; not with --scheduler)",
    )
    p.add_argument(
        "--scheduler",
        help="a running Dask scheduler, tcp://HOST:PORT (default: a local cluster)",
    )
    p.add_argument("--student", action="append", help="grade only this student (repeatable)")
    add_gradebook_option(p)
    # Each limit's default is c.GradeLimits.<name> in the course's nbgrader_config.py, else
    # GradeLimits' own (coursepkg/grading/classroom/limits.py).
    p.add_argument(
        "--cell-timeout",
        type=int,
        default=None,
        help="seconds per cell (default: the notebook's metadata.coursepkg.cell_timeout, else 120)",
    )
    p.add_argument(
        "--notebook-timeout", type=int, default=None, help="seconds per notebook in all (900)"
    )
    p.add_argument(
        "--memory-mb",
        type=int,
        default=None,
        help="MiB of memory per kernel, files in /dev/shm and page cache included where the host "
        "has a memory cgroup (4096)",
    )
    p.add_argument(
        "--disk-mb",
        type=int,
        default=None,
        help="MiB a kernel's working and scratch folders may hold together, and the largest file "
        "it may write (1024)",
    )
    p.add_argument(
        "--shm-mb", type=int, default=None, help="MiB of a kernel's private /dev/shm (256)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show the messages of nbgrader, Dask and the kernels as they come (default: in "
        "reports/ASSIGNMENT/grade.log; the console has the progress bar and the summary)",
    )
    p.add_argument(
        "--no-fork",
        action="store_true",
        help="start every kernel anew, as nbgrader does, instead of forking it from a process "
        "that has imported torch (slower; for comparison or debugging)",
    )
    p.set_defaults(func=_grade)


def _grade(args: argparse.Namespace) -> int:
    import logging

    from ..grading.classroom import grade_class
    from ..grading.classroom.console import quiet_console

    # Dask's own bookkeeping (workers joining, closing) is not the instructor's business.
    logging.getLogger("distributed").setLevel(logging.WARNING if args.verbose else logging.ERROR)
    root = Path(args.root).resolve()
    log = root / "reports" / args.assignment / "grade.log"
    if args.verbose or not (root / "nbgrader_config.py").is_file():
        log = None  # -v, or no course there (grade_class says so): nothing to hide
    options = dict(
        course=args.root,
        assignment=args.assignment,
        workers=args.workers,
        students=args.student or None,
        db_url=args.db,
        scheduler=args.scheduler,
        cell_timeout=args.cell_timeout,
        notebook_timeout=args.notebook_timeout,
        memory_mb=args.memory_mb,
        disk_mb=args.disk_mb,
        shm_mb=args.shm_mb,
        progress=not args.no_progress,
        fork=not args.no_fork,
    )
    try:
        with quiet_console(log) as console:
            result = grade_class(**options, console=console)
    except KeyboardInterrupt as stop:
        signum = getattr(stop, "signum", signal.SIGINT)
        sys.stderr.write(
            f"coursepkg grade: interrupted ({signal.Signals(signum).name}); the students "
            "recorded so far are complete, the others keep their earlier grades (run it again "
            "to finish)\n"
        )
        return 128 + signum
    sys.stdout.write(f"{result.summary()}\n")
    sys.stdout.write(f"reports: {result.reports}  dashboard: {result.dashboard}\n")
    if log is not None:
        sys.stdout.write(
            f"the grader's log (nbgrader, Dask and kernel messages; -v shows them): {log}\n"
        )
    return 1 if any(s.error for s in result.students) else 0


def _add_kit(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg kit`` subcommand."""
    p.description = (
        "Write the student kit: one zip with the course's package (coursepkg/, "
        "pyproject.toml), the released notebooks (exercises/), the students' Jupyter settings "
        "(jupyter/student/) and a STUDENTS.md on installing it. Never solutions/, the course's "
        "secret, the gradebook or students' work; every released notebook is checked for "
        "leaked solution lines and hidden tests first (exit status 2 and no kit if any)."
    )
    p.add_argument("--root", default=".", help="the course directory (default: .)")
    p.add_argument("--output", help="the zip to write (default: dist/coursepkg-student-kit.zip)")
    p.set_defaults(func=_kit)


def _kit(args: argparse.Namespace) -> int:
    from ..grading.release import build_student_kit

    out = Path(args.output or Path(args.root) / "dist" / "coursepkg-student-kit.zip")
    kit = build_student_kit(args.root, out)
    sys.stdout.write(
        f"wrote {kit['path']}: {kit['files']} files, {kit['notebooks']} released notebook(s); no "
        "solutions/, hidden test or course secret (STUDENTS.md inside says how to install it)\n"
    )
    return 0


def add_gradebook_option(p: argparse.ArgumentParser) -> None:
    """Declare ``--db``, the gradebook's URL, on ``p``: the same option for ``coursepkg grade``
    and for the instructor's term commands (:mod:`coursepkg.cli.term`), which read the grades
    it wrote."""
    p.add_argument(
        "--db",
        help="gradebook URL: postgresql://USER@HOST:PORT/DB or any SQLAlchemy URL (default: "
        "sqlite gradebook.db in the course)",
    )


#: How each command of this home declares its arguments, on the subparser ``coursepkg``
#: makes for it (its :data:`COMMANDS` line as help).
ARGUMENTS = {"check": _add_check, "release": _add_release, "grade": _add_grade, "kit": _add_kit}
