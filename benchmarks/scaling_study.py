"""The toy scaling study (``coursepkg.chapters.scaling``): the grid of small byte-level GPTs,
Chinchilla's approach-3 fit L = E + A / N^alpha + B / D^beta, the compute-optimal size it
predicts for a budget ``--budget-factor`` times the grid's largest, that run made, and the
prediction's error. Not a speed comparison: every figure is a held-out loss in bits per byte.

Run: ``.venv/bin/python benchmarks/scaling_study.py [--cache reuse] [--widths 32 48 64 96]
[--steps 150 300 600] [--write FILE]`` (``--cache save`` keeps the runs for the next ``--cache
reuse``; ``--write`` writes the result and its provenance as JSON, as the book ships it in
``coursepkg/chapters/results/scaling.json``, read by ``coursepkg.chapters.shipped``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import asdict

from coursepkg.chapters.scaling import scaling_study
from coursepkg.chapters.shipped import write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 48, 64, 96])
    parser.add_argument("--steps", type=int, nargs="+", default=[150, 300, 600])
    parser.add_argument("--budget-factor", type=float, default=3.0)
    parser.add_argument("--cache", choices=["save", "reuse"], default=None)
    parser.add_argument("--write", default=None, help="write the result as JSON to this file")
    args = parser.parse_args()
    start, cpu = time.perf_counter(), time.process_time()
    study = scaling_study(
        widths=tuple(args.widths),
        steps=tuple(args.steps),
        budget_factor=args.budget_factor,
        cache=args.cache,
    )
    print(f"{'d_model':>8} {'steps':>6} {'N':>9} {'D':>9} {'bpb':>7}")
    for run in study.runs:
        print(
            f"{run['d_model']:>8} {run['steps']:>6} {run['params']:>9,} {run['tokens']:>9,} "
            f"{run['bpb']:>7.4f}"
        )
    law = study.law
    print(
        f"fit (Chinchilla approach 3): L = {law['E']:.3f} + {law['A']:.4g} / N^{law['alpha']:.3f}"
        f" + {law['B']:.4g} / D^{law['beta']:.3f} (bits per byte)"
    )
    n_opt, d_opt = study.optimal
    check = study.check
    print(
        f"budget C = 6ND = {study.budget:.3g} FLOPs: the law's optimum "
        f"N = {n_opt:,.0f}, D = {d_opt:,.0f}"
    )
    print(
        f"run made: d_model {check['d_model']}, N = {check['params']:,}, D = {check['tokens']:,}: "
        f"measured {check['bpb']:.4f} bpb, predicted {check['predicted']:.4f}, error "
        f"{check['error']:+.4f} ({100 * check['error'] / check['predicted']:+.1f}%)"
    )
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"wall time {wall:.0f} s, CPU time {cpu:.0f} s")
    if args.write:
        write_results(
            args.write,
            asdict(study),
            command="benchmarks/scaling_study.py " + shlex.join(sys.argv[1:]),
            settings=study.settings,
            cpu_seconds=cpu,
            wall_seconds=wall,
        )


if __name__ == "__main__":
    main()
