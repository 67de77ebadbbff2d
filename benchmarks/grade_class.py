"""Grading a class: ``coursepkg grade --workers 2`` vs plain sequential ``nbgrader autograde``.

Forty synthetic submissions of ex01 (the solutions, a correct variant, a known bug, the untouched
release: a mix of full, partial and zero scores) are graded in fresh nbgrader course directories,
one after the other in the same run:

1. ``nbgrader autograde ex01_attention`` (one process, students one at a time, the course's
   own configuration), then ``generate_feedback`` and ``export`` for the full nbgrader pipeline;
2. ``coursepkg grade ex01_attention --workers 2`` (autograde in the sandbox kernel, feedback,
   export, per-student JSON and the dashboard), kernels forked from a process that has imported
   torch (:mod:`coursepkg.grading.kernel.forkserver`);
3. ``coursepkg grade ex01_attention --workers 1``, whose difference from (1) is the per-notebook
   cost of the wrapper (sandbox, guard, feedback, reports) net of what the fork server saves;
4. ``coursepkg grade ex01_attention --workers 2 --no-fork``: kernels started anew as nbgrader
   starts them, which separates the gain of the two workers from that of the fork server.

Prints notebooks per minute for each, the speed-up of (2) over plain ``nbgrader autograde``
(target >= 1.8x on 2 cores), the per-notebook overhead, and checks that every run gave every
student the same score.

Run: ``PATH=$PWD/.venv/bin:$PATH .venv/bin/python benchmarks/grade_class.py [--students 40]``
(about fifteen minutes on 2 cores; ``--no-overhead`` skips runs 3 and 4; ``--rounds 4``
alternates the methods on four batches of ten, for a machine shared with other work).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
AID = "ex01_attention"


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _run(cmd: list[str], cwd: Path) -> float:
    """Wall time of one command, which must succeed."""
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return seconds


def _variants(source, release) -> list:
    """Four kinds of submission: correct, correct written differently, a known bug, stubs."""

    def edited(old: str, new: str):
        nb = nbformat.from_dict(source)
        (cell,) = [
            c
            for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade_id")
            == "answer_scaled_dot_product_attention"
        ]
        assert cell.source.count(old) == 1, old
        cell.source = cell.source.replace(old, new)
        return nb

    return [
        source,
        edited("torch.softmax(scores, dim=-1)", "scores.softmax(-1)"),
        edited("/ math.sqrt(d_k)", ""),  # sdpa.no_scaling
        release,
    ]


def make_course(folder: Path, students: int) -> Path:
    """A fresh course directory with ex01 released and ``students`` submissions."""
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "nbgrader_config.py", folder / "nbgrader_config.py")
    shutil.copytree(ROOT / "solutions" / AID, folder / "solutions" / AID)
    _run([str(BIN / "nbgrader"), "generate_assignment", AID, "--force"], folder)
    source = nbformat.read(str(folder / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    release = nbformat.read(str(folder / "exercises" / AID / f"{AID}.ipynb"), as_version=4)
    variants = _variants(source, release)
    for i in range(students):
        target = folder / "submitted" / f"s{i:03d}" / AID / f"{AID}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(variants[i % len(variants)], str(target))
    return folder


def _scores(path: Path) -> dict[str, float]:
    with open(path, newline="") as f:
        return {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--no-overhead", action="store_true", help="skip the 1-worker and --no-fork runs"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="split the students into this many rounds, each grading a fresh batch with every "
        "method in turn (A B C A B C ...), so that other work on a shared machine hits the "
        "methods alike (default 1)",
    )
    args = parser.parse_args(argv)
    n = args.students
    nbgrader, coursepkg = str(BIN / "nbgrader"), str(BIN / "coursepkg")
    runs: list[tuple[str, ...]] = [("--workers", str(args.workers))]
    if not args.no_overhead:
        runs += [("--workers", "1")] if args.workers != 1 else []
        runs += [("--workers", str(args.workers), "--no-fork")]
    names = ["nbgrader autograde", "nbgrader autograde+feedback+export"] + [
        "coursepkg grade " + " ".join(r) for r in runs
    ]
    results: dict[str, float] = dict.fromkeys(names, 0.0)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
        for r in range(args.rounds):
            size = n // args.rounds + (r < n % args.rounds)
            seq = make_course(Path(tmp) / f"sequential{r}", size)
            autograde = _run([nbgrader, "autograde", AID, "--create"], seq)
            feedback = _run([nbgrader, "generate_feedback", AID], seq)
            export = _run([nbgrader, "export", "--to", str(seq / "grades.csv")], seq)
            results["nbgrader autograde"] += autograde
            results["nbgrader autograde+feedback+export"] += autograde + feedback + export
            expected = _scores(seq / "grades.csv")
            for i, flags in enumerate(runs):
                course = make_course(Path(tmp) / f"coursepkg{i}-{r}", size)
                name = "coursepkg grade " + " ".join(flags)
                results[name] += _run([coursepkg, "grade", AID, *flags, "--no-progress"], course)
                got = _scores(course / "reports" / AID / "grades.csv")
                if got != expected:
                    raise SystemExit(f"{name} disagrees with nbgrader: {got} vs {expected}")

    print(
        f"{n} submissions of {AID} in {args.rounds} round(s), {os.cpu_count()} cores; every "
        "run gave the same scores"
    )
    print(
        "load average before/after (other work on the machine skews the numbers): "
        f"{load_before:.1f} / {os.getloadavg()[0]:.1f}"
    )
    print(f"{'run':<40}{'seconds':>10}{'notebooks/min':>16}")
    for name, seconds in results.items():
        print(f"{name:<40}{seconds:>10.1f}{60 * n / seconds:>16.1f}")
    parallel = results[f"coursepkg grade --workers {args.workers}"]
    ratio = results["nbgrader autograde"] / parallel
    spawn = results.get(f"coursepkg grade --workers {args.workers} --no-fork")
    print(
        f"speed-up of coursepkg grade --workers {args.workers} over sequential nbgrader "
        f"autograde: {ratio:.2f}x (target >= 1.8x with 2 workers on 2 cores)"
    )
    if spawn is not None:
        print(
            f"  of which the fork server: {spawn / parallel:.2f}x (--no-fork: "
            f"{results['nbgrader autograde'] / spawn:.2f}x over nbgrader autograde)"
        )
    one = results.get("coursepkg grade --workers 1")
    if one is not None:
        overhead = (one - results["nbgrader autograde"]) / n
        full = (one - results["nbgrader autograde+feedback+export"]) / n
        print(
            f"per-notebook overhead of the wrapper (1 worker vs nbgrader autograde): "
            f"{overhead:+.2f} s; vs autograde+feedback+export: {full:+.2f} s"
        )
    results["ratio"] = ratio
    return results


if __name__ == "__main__":
    main()
