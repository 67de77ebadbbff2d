"""The ``coursepkg`` command line.

``coursepkg info`` prints versions and the device; ``coursepkg params`` prints the closed-form
parameter breakdown of a preset or of a configuration given on the command line;
``coursepkg check NOTEBOOK`` runs an assignment notebook and reports its visible tests;
``coursepkg release`` regenerates the students' notebooks (exercises/) from solutions/;
``coursepkg grade ASSIGNMENT`` autogrades a whole class with nbgrader (instructors);
``coursepkg export``, ``regrade`` and ``similarity`` are the rest of the instructor's term.
``coursepkg train DATA`` trains a GPT on a text file or folder (also under ``torchrun``);
``coursepkg finetune BASE DATA`` fine-tunes one into an assistant (SFT, LoRA, DPO).
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from pathlib import Path
from typing import Any

from .config import TransformerConfig
from .finetune_cli import add_finetune_parser
from .params import count_parameters, layer_breakdown, parameter_breakdown
from .train_cli import add_train_parser


def _info(_: argparse.Namespace) -> int:
    import torch

    from . import __version__

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"coursepkg {__version__}")
    print(f"torch {torch.__version__} (device: {device}, threads: {torch.get_num_threads()})")
    return 0


def _params(args: argparse.Namespace) -> int:
    fields = {
        k: v
        for k, v in vars(args).items()
        if k in ("d_model", "n_heads", "d_ff", "n_layers") and v is not None
    }
    make = TransformerConfig.big if args.preset == "big" else TransformerConfig.base
    config = make(vocab_size=args.vocab_size, tie_embeddings=not args.untied, **fields)
    kind = "decoder-only" if args.decoder_only else "encoder-decoder"
    parts = parameter_breakdown(config, kind)
    width = max(len(k) for k in [*parts, *layer_breakdown(config)]) + 2
    print(
        f"{kind} model: D={config.d_model} H={config.n_heads} F={config.d_ff} "
        f"N={config.n_layers} V={config.vocab_size} tied={config.tie_embeddings}"
    )
    for name, n in parts.items():
        print(f"  {name:<{width}}{n:>14,}")
    print(f"  {'total':<{width}}{count_parameters(config, kind):>14,}")
    if not args.decoder_only:
        print("one layer:")
        for name, n in layer_breakdown(config).items():
            print(f"  {name:<{width}}{n:>14,}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from .grading.notebook import run_notebook

    report = run_notebook(args.notebook, timeout=args.timeout)
    print(report.format())
    return 0 if report.passed else 1


def _release(args: argparse.Namespace) -> int:
    from .release import find_leaks, generate_release

    db_url = (
        None if args.no_db else args.db or f"sqlite:///{Path(args.root).resolve()}/gradebook.db"
    )
    released = generate_release(args.root, args.assignment, db_url=db_url)
    leaks = 0
    for notebook in released:
        source = Path(args.root) / "solutions" / notebook.parent.name / notebook.name
        found = find_leaks(source, notebook)
        leaks += len(found)
        print(f"{notebook}" + (f": {len(found)} secret line(s) leaked!" if found else ""))
        for line in found:
            print(f"    {line}")
    folders = sorted({str(n.parent.parent) for n in released})
    sqlite = db_url and db_url.startswith("sqlite")  # never print a URL: it may hold a password
    where = f", recorded in {db_url.split('///')[-1] if sqlite else 'the --db gradebook'}"
    print(
        f"{len(released)} notebook(s) generated into {', '.join(folders) or 'nothing'}"
        + (where if db_url else " (no gradebook)")
        + ("; no leaked solution or hidden test" if not leaks else f"; {leaks} leaked line(s)!")
    )
    return 1 if leaks else 0


def _grade(args: argparse.Namespace) -> int:
    import logging

    from .grading.classroom import grade_class
    from .grading.classroom.console import quiet_console

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
        print(
            f"coursepkg grade: interrupted ({signal.Signals(signum).name}); the students "
            "recorded so far are complete, the others keep their earlier grades (run it again "
            "to finish)",
            file=sys.stderr,
        )
        return 128 + signum
    print(result.summary())
    print(f"reports: {result.reports}  dashboard: {result.dashboard}")
    if log is not None:
        print(f"the grader's log (nbgrader, Dask and kernel messages; -v shows them): {log}")
    return 1 if any(s.error for s in result.students) else 0


def _add_grade_parser(sub: Any) -> None:
    """The ``coursepkg grade`` subcommand."""
    p = sub.add_parser(
        "grade",
        help="autograde every submission of an assignment with nbgrader (instructors)",
        description="Autograde submitted/*/ASSIGNMENT with nbgrader, students in parallel, each "
        "notebook in a sandboxed kernel with time and memory limits; then nbgrader's feedback "
        "and CSV export, a JSON report per student and the misconception dashboard in "
        "reports/. A broken or hostile notebook loses the points of what it breaks (0 if it "
        "cannot run at all), with the reason in its feedback; it never stops the batch or "
        "changes another student's grade. Safe to rerun. Exit status 1 if some student's grade "
        "could not be recorded at all. The limits' defaults can be set in the course's "
        "nbgrader_config.py as c.GradeLimits.<option> (memory_mb, disk_mb, shm_mb, "
        "cell_timeout, notebook_timeout).",
    )
    p.add_argument("assignment", help="the assignment id, e.g. ex06_training")
    p.add_argument("--root", default=".", help="the nbgrader course directory (default: .)")
    p.add_argument(
        "--workers",
        type=int,
        help="worker processes of the local Dask cluster (default: cores; not with --scheduler)",
    )
    p.add_argument(
        "--scheduler",
        help="a running Dask scheduler, tcp://HOST:PORT (default: a local cluster)",
    )
    p.add_argument("--student", action="append", help="grade only this student (repeatable)")
    p.add_argument(
        "--db",
        help="gradebook URL: postgresql://USER@HOST:PORT/DB or any SQLAlchemy URL (default: "
        "sqlite gradebook.db in the course)",
    )
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``coursepkg`` command."""
    parser = argparse.ArgumentParser(prog="coursepkg", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="versions and device")
    p.set_defaults(func=_info)
    p = sub.add_parser("params", help="closed-form parameter counts")
    p.add_argument("--preset", choices=("base", "big"), default="base")
    p.add_argument("--vocab-size", type=int, default=37000)
    p.add_argument("--d-model", type=int)
    p.add_argument("--n-heads", type=int)
    p.add_argument("--d-ff", type=int)
    p.add_argument("--n-layers", type=int)
    p.add_argument("--untied", action="store_true", help="separate output projection")
    p.add_argument("--decoder-only", action="store_true", help="GPT-style model")
    p.set_defaults(func=_params)
    p = sub.add_parser(
        "check",
        help="run an assignment notebook and report its tests",
        description="Execute an assignment notebook top to bottom in a fresh kernel (it is not "
        "modified) and print each visible test with pass/fail, points and the check's message. "
        "Exit status 0 when every visible test passes, 1 otherwise, 2 when the file is not a "
        "notebook.",
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
    p = sub.add_parser(
        "release",
        help="regenerate exercises/ from solutions/ (instructors)",
        description="Run nbgrader's generate_assignment on solutions/ into exercises/, record "
        "the assignments and their graded cells in the gradebook (what nbgrader's "
        "release_assignment, autograde and the formgrader need), and scan the result for "
        "leaked solutions or hidden tests.",
    )
    p.add_argument("assignment", nargs="?", default="*", help="an assignment id (default: all)")
    p.add_argument("--root", default=".", help="the course directory (default: .)")
    p.add_argument("--db", help="gradebook SQLAlchemy URL (default: sqlite gradebook.db in root)")
    p.add_argument("--no-db", action="store_true", help="leave every gradebook alone")
    p.set_defaults(func=_release)
    _add_grade_parser(sub)
    from .grading.term.commands import add_parsers as add_term_parsers

    add_term_parsers(sub)  # export, regrade, similarity
    add_train_parser(sub)
    add_finetune_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``coursepkg`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        print(f"coursepkg: error: {err}", file=sys.stderr)
        return 2
    finally:
        if argv is None:  # the console script: the process ends next
            # Nothing left needs collecting; without this the collector walks every object
            # of torch, nbgrader and Dask once more at exit (~0.7 s after `coursepkg grade`).
            gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
