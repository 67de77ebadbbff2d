"""Grade a generated class of capstone recipes and print each verdict, the grader's overhead per
run against the budget, the baseline's seed spread and the record rule's false-positive rate at
that spread.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/capstone_class.py --budget-s 30 --workers 2

A small class for the overhead at an instructor's budget: ``--honest 4 --no-bad``.
``--dask``: the class graded as ``coursepkg leaderboard --grade`` grades it, one task a student on
a Dask LocalCluster of ``--workers`` workers (``grade_class``), its verdicts checked; the overhead
figures need the thread pool's run records, so they are printed without ``--dask`` only.

The class (24 by default): honest recipes of several sizes, step counts and learning rates
(the first is the baseline), and one of each bad kind in ``tests/fixtures/capstone_recipes.py``.
Overhead of a run = its wall time (start to end, as the grader waits for it) less the training
time its watch measured, as a fraction of the budget.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean, stdev

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

import capstone_recipes as recipes  # noqa: E402

from coursepkg.grading.classroom.capstone import (  # noqa: E402
    CapstoneRules,
    corpus_splits,
    grade_recipe,
)
from coursepkg.grading.policy.leaderboard import (  # noqa: E402
    leaderboard_rows,
    record_false_positive_rate,
)

HONEST = [  # (steps, d_model, lr): the baseline first
    (20, 16, 3e-3),
    (40, 16, 3e-3),
    (60, 16, 3e-3),
    (20, 32, 3e-3),
    (40, 32, 3e-3),
    (20, 16, 1e-4),
    (20, 16, 3e-2),
    (10, 16, 3e-3),
    (30, 24, 3e-3),
    (20, 48, 1e-3),
    (40, 24, 1e-2),
    (15, 16, 3e-3),
    (25, 32, 1e-3),
    (50, 16, 1e-3),
    (35, 24, 3e-3),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--honest", type=int, default=len(HONEST), help="honest recipes (the baseline first)"
    )
    parser.add_argument("--no-bad", action="store_true", help="leave out the bad recipes")
    parser.add_argument("--dask", action="store_true", help="grade on a Dask LocalCluster")
    args = parser.parse_args()
    train, held_out, protected = corpus_splits()
    train = train[:200_000]
    rules = CapstoneRules(budget_s=args.budget_s, max_params=60_000, threads=1, disk_mb=16)
    folder = Path(tempfile.mkdtemp(prefix="capstone-class-"))
    submissions = {
        f"honest{i:02d}": (recipes.recipe(*h), "capstone.ok")
        for i, h in enumerate(HONEST[: max(1, args.honest)])
    }
    for name, source in {} if args.no_bad else recipes.BAD.items():
        submissions[name] = (source, recipes.EXPECTED[name])

    if args.dask:
        return _grade_on_dask(submissions, folder, rules, protected, args.workers)

    def grade(item):
        name, (source, _) = item
        path = recipes.write(folder, name, source, held_out=protected[0])
        started = time.monotonic()
        result = grade_recipe(path, train, held_out, rules, folder / name, protected, ROOT, 16_384)
        graded[name] = time.monotonic() - started  # the runs and their scoring
        return name, result

    graded: dict[str, float] = {}

    with ThreadPoolExecutor(args.workers) as pool:
        results = dict(pool.map(grade, submissions.items()))
    right = 0
    for name, (_, expected) in submissions.items():
        r = results[name]
        right += r.verdict == expected
        score = f"{r.mean:.4f} +- {r.spread:.4f}" if r.scores else "unscored"
        print(f"{name:22s} {r.verdict:32s} expected {expected:32s} {score}")
    print(f"verdicts right: {right}/{len(submissions)}")
    runs = [run for r in results.values() for run in r.runs if run.train_s > 0]
    over = [(run.wall_s - run.train_s) / args.budget_s for run in runs]
    extra = mean(run.wall_s - run.train_s for run in runs)
    print(
        f"overhead per run (wall - training) / budget: mean {mean(over):.1%}, max {max(over):.1%}"
        f" over {len(runs)} runs; absolute mean {extra:.1f} s"
    )
    whole = [
        (graded[n] - sum(run.train_s for run in r.runs)) / (len(r.runs) * args.budget_s)
        for n, r in results.items()
        if all(run.train_s > 0 for run in r.runs)
    ]
    print(
        "grading time per submission less its training, per run, / budget (scoring included):"
        f" mean {mean(whole):.1%}, max {max(whole):.1%} over {len(whole)} submissions"
    )
    base = results["honest00"].scores
    spread = stdev(base)
    print(f"baseline: {mean(base):.4f} bits per byte, seed sd {spread:.4f} ({len(base)} seeds)")
    fp = record_false_positive_rate(max(spread, 1e-6), trials=100_000, seed=0)
    print(f"record rule's false-positive rate at that spread (100,000 simulated pairs): {fp:.4%}")
    entries = [{"student": n, "verdict": r.verdict, "scores": r.scores} for n, r in results.items()]
    rows = leaderboard_rows(entries, base)
    print("records:", [r["student"] for r in rows if r["record"]])


def _grade_on_dask(submissions: dict, folder: Path, rules, protected, workers: int) -> None:
    """Grade the class with ``grade_class`` on a LocalCluster; print each verdict."""
    from coursepkg.grading.classroom.capstone import grade_class
    from coursepkg.grading.classroom.orchestrate import connect

    paths = {
        name: recipes.write(folder, name, source, held_out=protected[0])
        for name, (source, _) in submissions.items()
    }
    started = time.monotonic()
    with connect(None, workers) as client:
        entries = grade_class(paths, rules, None, ROOT, 16_384, client)
    right = 0
    for entry in entries:
        expected = submissions[entry["student"]][1]
        right += entry["verdict"] == expected
        print(f"{entry['student']:22s} {entry['verdict']:32s} expected {expected}")
    print(f"verdicts right on Dask: {right}/{len(entries)} in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
