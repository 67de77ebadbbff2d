"""Grading a class: ``coursepkg grade`` on Dask vs sequential ``nbgrader autograde``, and vs the
hand-written worker pool Dask replaced.

Synthetic submissions of ex01 (the solutions, a correct variant, a known bug, the untouched
release: a mix of full, partial and zero scores) are graded in fresh nbgrader course directories,
side by side in the same run:

1. ``nbgrader autograde ex01_attention`` (one process, students one at a time, the course's
   own configuration), then ``generate_feedback`` and ``export`` for the full nbgrader pipeline;
2. ``coursepkg grade ex01_attention --workers 2``: the default Dask ``LocalCluster`` of 2 worker
   processes (autograde in the sandbox kernel, feedback, export, per-student JSON and the
   dashboard), kernels forked from a process that has imported torch
   (:mod:`coursepkg.grading.kernel.forkserver`);
3. with ``--pool DIR``: the same command from the checkout ``DIR`` with its own ``.venv``: the
   hand-written process pool Dask replaced (``git worktree add DIR 3c91388^1``, then
   ``make -C DIR install``); the difference from (2) is Dask's overhead (target <= 5 %);
4. unless ``--no-overhead``: ``--workers 1`` (its difference from (1) is the per-notebook cost of
   the wrapper net of what the fork server saves) and ``--workers 2 --no-fork`` (kernels started
   anew, as nbgrader starts them: the gain of the fork server apart from that of two workers).

With ``--rounds R`` the students are split into R batches and every method grades each batch
in turn, in the opposite order on every other round (A B C, C B A, ...), so that other work on a
shared machine, and its drift, hits the methods alike. Every method must give every student the
score nbgrader gives, or the script fails.

Prints notebooks per minute for each, the speed-up of (2) over plain ``nbgrader autograde``
(target >= 2.0x on 2 cores), the pool's comparison, the per-notebook overhead, and ``uptime``
before and after.

Each run pays its start-up (a cluster, the fork servers importing torch) once per batch, so
small batches understate both parallel graders against nbgrader: compare on batches of 40.

Run: ``PATH=$PWD/.venv/bin:$PATH .venv/bin/python benchmarks/grade_class.py --students 80
--rounds 2 --pool /work/wt/oldpool --no-overhead`` (two batches of 40, each graded by nbgrader,
the Dask LocalCluster and the pool; about 20 minutes on a quiet 2-core machine); without
``--no-overhead`` and ``--pool``, ``--students 40`` adds the 1-worker and ``--no-fork`` runs
(about 15 minutes).
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


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _env(bin_dir: Path = BIN) -> dict[str, str]:
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def _run(cmd: list[str], cwd: Path, bin_dir: Path = BIN) -> float:
    """Wall time of one command, which must succeed."""
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=_env(bin_dir), capture_output=True, text=True)
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


def make_course(
    folder: Path, students: int, first: int = 0, checkout: Path = ROOT, bin_dir: Path = BIN
) -> Path:
    """A fresh course directory with ex01 released and ``students`` submissions
    (``s<first>``, ``s<first + 1>``, ...), from ``checkout``'s course configuration and
    solutions, released by the nbgrader in ``bin_dir``."""
    folder.mkdir(parents=True)
    shutil.copy(checkout / "nbgrader_config.py", folder / "nbgrader_config.py")
    shutil.copytree(checkout / "solutions" / AID, folder / "solutions" / AID)
    _run([str(bin_dir / "nbgrader"), "generate_assignment", AID, "--force"], folder, bin_dir)
    source = nbformat.read(str(folder / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    release = nbformat.read(str(folder / "exercises" / AID / f"{AID}.ipynb"), as_version=4)
    variants = _variants(source, release)
    for i in range(first, first + students):
        target = folder / "submitted" / f"s{i:03d}" / AID / f"{AID}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(variants[i % len(variants)], str(target))
    return folder


def rounds(n: int, count: int, names: list[str]):
    """Split ``n`` students into ``count`` batches: yields ``(r, first, size, order)`` for each,
    the runs ``names`` in the opposite order every other round (load hits them alike)."""
    first = 0
    for r in range(count):
        size = n // count + (r < n % count)
        yield r, first, size, (list(names) if r % 2 == 0 else list(names)[::-1])
        first += size


def _scores(path: Path) -> dict[str, float]:
    with open(path, newline="") as f:
        return {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}


def _methods(args: argparse.Namespace) -> dict[str, tuple[Path, Path]]:
    """Each ``coursepkg grade`` run to time: its checkout and the ``bin`` of its environment
    (the pool's course is made from its own checkout: its ``nbgrader_config.py`` names its
    own modules)."""
    workers = str(args.workers)
    methods = {f"coursepkg grade --workers {workers}": (ROOT, BIN)}
    if args.pool:
        pool_bin = args.pool.resolve() / ".venv" / "bin"
        if not (pool_bin / "coursepkg").is_file():
            raise SystemExit(
                f"--pool {args.pool}: no {pool_bin / 'coursepkg'} (run `make -C {args.pool} "
                "install` first)"
            )
        methods[f"pool ({args.pool.name}) --workers {workers}"] = (args.pool.resolve(), pool_bin)
    if not args.no_overhead:
        if args.workers != 1:
            methods["coursepkg grade --workers 1"] = (ROOT, BIN)
        methods[f"coursepkg grade --workers {workers} --no-fork"] = (ROOT, BIN)
    return methods


def _flags(name: str) -> list[str]:
    """The ``coursepkg grade`` flags in a method's name."""
    return name[name.index("--") :].split()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--pool",
        type=Path,
        help="also time `coursepkg grade` of this checkout (its own .venv): the hand-written "
        "pool before Dask is commit 3c91388^1",
    )
    parser.add_argument(
        "--no-overhead", action="store_true", help="skip the 1-worker and --no-fork runs"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="split the students into this many batches, each graded by every method in turn "
        "(the order reversed every other round), so that other work on a shared machine hits "
        "the methods alike (default 1)",
    )
    args = parser.parse_args(argv)
    n = args.students
    if args.rounds < 1 or n < args.rounds:
        parser.error("--rounds must be between 1 and --students")
    methods = _methods(args)
    names = ["nbgrader autograde", *methods]
    results: dict[str, float] = dict.fromkeys(names, 0.0)
    pipeline = 0.0  # nbgrader autograde + generate_feedback + export
    before = uptime()
    print(f"uptime: {before}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
        for r, first, size, order in rounds(n, args.rounds, names):
            expected: dict[str, float] | None = None
            scores: dict[str, dict[str, float]] = {}
            for i, name in enumerate(order):
                checkout, bin_dir = methods.get(name, (ROOT, BIN))
                course = make_course(Path(tmp) / f"r{r}-{i}", size, first, checkout, bin_dir)
                if name == "nbgrader autograde":
                    nbgrader = str(BIN / "nbgrader")
                    seconds = _run([nbgrader, "autograde", AID, "--create"], course)
                    pipeline += seconds + _run([nbgrader, "generate_feedback", AID], course)
                    pipeline += _run([nbgrader, "export", "--to", "grades.csv"], course)
                    expected = _scores(course / "grades.csv")
                else:
                    command = [str(bin_dir / "coursepkg"), "grade", AID, *_flags(name)]
                    seconds = _run([*command, "--no-progress"], course, bin_dir)
                    scores[name] = _scores(course / "reports" / AID / "grades.csv")
                results[name] += seconds
                print(f"  round {r + 1}/{args.rounds}: {name}: {seconds:.1f} s", flush=True)
                shutil.rmtree(course, ignore_errors=True)
            for name, got in scores.items():
                if got != expected:
                    raise SystemExit(f"{name} disagrees with nbgrader: {got} vs {expected}")

    after = uptime()
    print(f"\n{n} submissions of {AID} in {args.rounds} round(s), {os.cpu_count()} cores")
    print("every method gave every student the score nbgrader autograde gave")
    print(f"{'run':<44}{'seconds':>10}{'notebooks/min':>16}")
    for name, seconds in [*results.items(), ("nbgrader autograde+feedback+export", pipeline)]:
        print(f"{name:<44}{seconds:>10.1f}{60 * n / seconds:>16.1f}")
    dask = results[f"coursepkg grade --workers {args.workers}"]
    ratio = results["nbgrader autograde"] / dask
    print(
        f"speed-up of coursepkg grade --workers {args.workers} (Dask LocalCluster) over "
        f"sequential nbgrader autograde: {ratio:.2f}x (target >= 2.0x with 2 workers on 2 cores)"
    )
    pool = next((s for k, s in results.items() if k.startswith("pool (")), None)
    if pool is not None:
        print(
            f"Dask LocalCluster vs the hand-written pool: {dask / pool:.3f}x the time "
            f"({100 * (dask - pool) / pool:+.1f}% overhead; target <= +5%)"
        )
    spawn = results.get(f"coursepkg grade --workers {args.workers} --no-fork")
    if spawn is not None:
        print(
            f"  the fork server's part: --no-fork takes {spawn / dask:.2f}x the time "
            f"({results['nbgrader autograde'] / spawn:.2f}x over nbgrader autograde)"
        )
    one = results.get("coursepkg grade --workers 1")
    if one is not None:
        print(
            "per-notebook overhead of the wrapper (1 worker vs nbgrader autograde): "
            f"{(one - results['nbgrader autograde']) / n:+.2f} s; vs autograde+feedback+export: "
            f"{(one - pipeline) / n:+.2f} s"
        )
    print(f"uptime before: {before}\nuptime after:  {after}")
    results["ratio"] = ratio
    return results


if __name__ == "__main__":
    main()
