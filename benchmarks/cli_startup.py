"""``coursepkg``'s start-up: ``coursepkg --help`` and a command's argument error, side by side
with ``python -c pass`` (the interpreter's own start-up, the floor of any command).

Each case is a fresh process of the course's interpreter, run in turn (A B C A B C ...) so that
the machine's load hits them alike. Reported per case: the median wall time, the median CPU
time of the child (user + system, from ``RUSAGE_CHILDREN``: less sensitive to a busy
machine than the wall clock), and both less those of ``python -c pass``; the target is 0.5 s
from start to answer on a quiet machine. The command is run as ``python -m coursepkg.cli``
(what the console script runs) with this checkout first on the path.

Run: ``.venv/bin/python benchmarks/cli_startup.py --rounds 10`` (about a minute).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "python -c pass": ["-c", "pass"],
    "coursepkg --help": ["-m", "coursepkg.cli", "--help"],
    "coursepkg grade --no-such-option": ["-m", "coursepkg.cli", "grade", "--no-such-option"],
    "coursepkg export (no --format)": ["-m", "coursepkg.cli", "export", "ex01_attention"],
}


def run_child(args: list[str], root: Path = ROOT) -> tuple[float, float]:
    """Wall and CPU seconds of one child process running ``python ARGS`` with the ``coursepkg``
    of the checkout ``root`` (this one by default)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    rounds = parser.parse_args().rounds
    run_child(CASES["coursepkg --help"])  # warm the file cache once
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in CASES}
    for _ in range(rounds):
        for name, args in CASES.items():
            times[name].append(run_child(args))
    base_wall = statistics.median(w for w, _ in times["python -c pass"])
    base_cpu = statistics.median(c for _, c in times["python -c pass"])
    print(f"{rounds} rounds, load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    print(f"{'case':<36}{'wall':>8}{'- pass':>9}{'cpu':>8}{'- pass':>9}")
    for name, pairs in times.items():
        wall = statistics.median(w for w, _ in pairs)
        cpu = statistics.median(c for _, c in pairs)
        print(
            f"{name:<36}{wall:>7.2f}s{wall - base_wall:>+8.2f}s{cpu:>7.2f}s{cpu - base_cpu:>+8.2f}s"
        )


if __name__ == "__main__":
    main()
