"""What curation buys (``coursepkg.chapters.data_effect``): the same small byte-level GPT trained
on a synthetic crawl's raw text and on its curated text under the same budget, over seeds, scored
on held-out Tiny Shakespeare in bits per byte. Not a speed comparison.

Run: ``.venv/bin/python benchmarks/data_effect.py [--steps 400] [--seeds 0 1 2] [--write FILE]``
(``--write`` writes the result and its provenance as JSON, as the book ships it in
``coursepkg/chapters/results/data_effect.json``, read by ``coursepkg.chapters.shipped``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import asdict

from coursepkg.chapters.data_effect import compare_raw_and_curated
from coursepkg.chapters.shipped import write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache", choices=["save", "reuse"], default=None)
    parser.add_argument("--write", default=None, help="write the result as JSON to this file")
    args = parser.parse_args()
    start, cpu = time.perf_counter(), time.process_time()
    effect = compare_raw_and_curated(steps=args.steps, seeds=tuple(args.seeds), cache=args.cache)
    for corpus in ("raw", "curated"):
        values = ", ".join(f"{x:.4f}" for x in effect.bpb[corpus])
        print(
            f"{corpus:>8}: {effect.corpus_bytes[corpus]:>9,} bytes, held-out bits per byte "
            f"{values} (mean {effect.mean(corpus):.4f} +- {effect.spread(corpus):.4f})"
        )
    print(f"removed by stage: {dict(effect.removed)}; verdict: {effect.verdict()}")
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"wall time {wall:.0f} s, CPU time {cpu:.0f} s")
    if args.write:
        write_results(
            args.write,
            asdict(effect),
            command="benchmarks/data_effect.py " + shlex.join(sys.argv[1:]),
            settings=effect.settings,
            cpu_seconds=cpu,
            wall_seconds=wall,
        )


if __name__ == "__main__":
    main()
