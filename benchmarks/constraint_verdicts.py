"""Which choice wins depends on the constraint (``coursepkg.chapters.constraints``): ReLU^2 against
SwiGLU, dense against a mixture of experts, AdamW against Muon, each at fixed data, fixed
parameter count and fixed CPU time (one thread), over several seeds, in held-out bits per byte.
A winner is named only where the difference of means exceeds two combined standard errors.

Run: ``.venv/bin/python benchmarks/constraint_verdicts.py [--cache save] [--steps 200]
[--seeds 0 1 2] [--write FILE]`` (``--cache save`` keeps the grid for a later ``--cache
reuse``; ``--write`` writes the result and its provenance as JSON, as the book ships it in
``coursepkg/chapters/results/constraints.json``, read by ``coursepkg.chapters.shipped``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from coursepkg.chapters.constraints import CONSTRAINTS, PAIRS, constraint_verdicts, winner_changes
from coursepkg.chapters.shipped import write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache", choices=["save", "reuse"], default=None)
    parser.add_argument("--write", default=None, help="write the result as JSON to this file")
    args = parser.parse_args()
    start, cpu = time.perf_counter(), time.process_time()
    result = constraint_verdicts(steps=args.steps, seeds=tuple(args.seeds), cache=args.cache)
    print(
        f"{'pair':<28} {'constraint':<8} {'a bpb':>7} {'b bpb':>7} {'b - a':>8} {'z':>6}  verdict"
    )
    for pair, (a, b) in PAIRS.items():
        rows = result["pairs"][pair]
        for constraint in CONSTRAINTS:
            row = rows[constraint]
            winner = "no separation" if row["winner"] is None else (a, b)[row["winner"]]
            print(
                f"{a + ' vs ' + b:<28} {constraint:<8} {row['mean_a']:>7.4f} {row['mean_b']:>7.4f}"
                f" {row['diff']:>+8.4f} {row['z']:>+6.1f}  {winner}"
            )
        changes = winner_changes([rows[c]["winner"] for c in CONSTRAINTS])
        print(f"  the winner {'changes' if changes else 'does not change'} with the constraint")
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"wall time {wall:.0f} s, CPU time {cpu:.0f} s")
    if args.write:
        write_results(
            args.write,
            result,
            command="benchmarks/constraint_verdicts.py " + shlex.join(sys.argv[1:]),
            settings=result["settings"],
            cpu_seconds=cpu,
            wall_seconds=wall,
        )


if __name__ == "__main__":
    main()
