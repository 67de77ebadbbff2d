"""What the kernels' memory and file limits cost: ``coursepkg grade`` with them (a memory cgroup,
a mount namespace with a private ``/dev/shm`` and a tmpfs under an overlay for the working and
scratch folders, ``RLIMIT_FSIZE``) against the same command without them
(``COURSEPKG_KERNEL_RESOURCES=0``, the sandbox as it was before them), side by side.

Submissions of ex01 (the mix of :mod:`grade_class`: correct, a variant, a known bug, the stubs) are
graded with ``--workers 2`` in fresh course directories; with ``--rounds R`` the students are split
into R batches and both runs grade each batch, in the opposite order every other round, so that
other work on a shared machine hits both alike. Both must give every student the same score.

Prints each run's seconds and notebooks per minute, the ratio (with / without), what the kernels
reported about their limits, and ``uptime`` before and after. With ``--setup N`` it also times
what the limits add to one kernel's start and end, N times, against a child that sets none, side
by side: joining a memory cgroup, the private mounts, and removing the cgroup after it exits.

Run: ``PATH=$PWD/.venv/bin:$PATH .venv/bin/python benchmarks/grade_limits.py --students 40``
(as root, where the limits apply; a few minutes on a quiet 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grade_class import AID, BIN, _env, _scores, make_course, rounds, uptime  # noqa: E402

RUNS = {
    "with the limits": {},
    "without (COURSEPKG_KERNEL_RESOURCES=0)": {"COURSEPKG_KERNEL_RESOURCES": "0"},
}


def _grade(course: Path, workers: int, extra: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(
        [str(BIN / "coursepkg"), "grade", AID, "--workers", str(workers), "--no-progress"],
        cwd=course,
        env={**_env(), **extra},
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"coursepkg grade failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return seconds, out.stdout


# A kernel's start with the limits (or, with "0", without), as the sandbox launcher sets them.
_SETUP = """import os, sys, time
from pathlib import Path
from coursepkg.grading.kernel.confine import limit_memory
from coursepkg.grading.kernel.mounts import private_mounts
folder, scratch = Path(sys.argv[1]), Path(sys.argv[2])
start = time.perf_counter()
if sys.argv[3] == "1":
    limit_memory(4096)
    private_mounts(folder, scratch, disk_mb=1024, shm_mb=256)
print(time.perf_counter() - start)
"""


def setup_cost(times: int) -> dict[str, float]:
    """Mean seconds the limits add to a kernel's start (in the child) and end (removing its
    cgroups, in the parent), against a child that sets none, the two alternating."""
    from coursepkg.grading.kernel.confine import kill_process_group_cgroup

    spent = {"with": 0.0, "without": 0.0}
    with tempfile.TemporaryDirectory(prefix="bench-setup-") as tmp:
        for i in range(2 * times):
            name = ("with", "without")[i % 2]
            folder, scratch = Path(tmp) / f"f{i}", Path(tmp) / f"s{i}"
            folder.mkdir()
            scratch.mkdir()
            flag = "1" if name == "with" else "0"
            argv = [sys.executable, "-c", _SETUP, str(folder), str(scratch), flag]
            child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            out, _ = child.communicate()
            start = time.perf_counter()
            kill_process_group_cgroup(child.pid)  # nothing to do without the limits
            spent[name] += float(out.split()[-1]) + time.perf_counter() - start
    return {k: v / times for k, v in spent.items()}


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--setup", type=int, default=0, help="also time the per-kernel set-up")
    args = parser.parse_args(argv)
    n = args.students
    if args.rounds < 1 or n < args.rounds:
        parser.error("--rounds must be between 1 and --students")
    results = dict.fromkeys(RUNS, 0.0)
    sandbox: dict[str, str] = {}
    before = uptime()
    print(f"uptime: {before}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        for r, first, size, order in rounds(n, args.rounds, list(RUNS)):
            scores = {}
            for i, name in enumerate(order):
                course = make_course(Path(tmp) / f"r{r}-{i}", size, first)
                seconds, out = _grade(course, args.workers, RUNS[name])
                results[name] += seconds
                scores[name] = _scores(course / "reports" / AID / "grades.csv")
                sandbox[name] = next(iter(re.findall(r"^sandbox: .*$", out, re.MULTILINE)), "")
                print(f"  round {r + 1}/{args.rounds}: {name}: {seconds:.1f} s", flush=True)
                shutil.rmtree(course, ignore_errors=True)
            if len({tuple(sorted(s.items())) for s in scores.values()}) != 1:
                raise SystemExit(f"the runs disagree: {scores}")
    after = uptime()
    print(
        f"\n{n} submissions of {AID} in {args.rounds} round(s), {args.workers} workers, "
        f"{os.cpu_count()} cores; both runs gave every student the same score"
    )
    for name, seconds in results.items():
        print(f"{name:<44}{seconds:>8.1f} s{60 * n / seconds:>8.1f} notebooks/min")
        print(f"    {sandbox[name]}")
    with_, without = results.values()
    ratio = with_ / without
    print(f"time with the limits / without: {ratio:.3f}")
    print(f"uptime before: {before}\nuptime after:  {after}")
    if args.setup:
        cost = {k: 1000 * v for k, v in setup_cost(args.setup).items()}
        print(
            f"per kernel, start and end, mean of {args.setup}: {cost['with']:.1f} ms with the "
            f"limits, {cost['without']:.1f} ms without: +{cost['with'] - cost['without']:.1f} ms"
        )
        results.update(setup_ms_with=cost["with"], setup_ms_without=cost["without"])
    return {**results, "ratio": ratio}


if __name__ == "__main__":
    main()
