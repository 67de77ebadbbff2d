"""``coursepkg check`` on a solved notebook (the student's self-check), side by side with
``python -c "import torch"`` (what any kernel running the notebook's first cell pays at least)
and ``python -c pass`` (the interpreter's start-up).

Each case is a fresh process of the course's interpreter, run in turn (A B C A B C ...) so that
the machine's load hits them alike. Reported per case: the median wall time and the median CPU
time (user + system, from ``RUSAGE_CHILDREN`` as ``cli_startup.py`` measures: the check's
kernel is its child and is counted too; CPU time is less sensitive to a busy machine than
the wall clock), with the load average. The target (issue 68): a median of 5 s wall for a
solved ex01 on a quiet 2-core machine.

Run: ``.venv/bin/python benchmarks/self_check.py --rounds 5`` (about a minute on a quiet
machine), or ``--notebook PATH`` for another notebook. ``--peer DIR`` adds the same check run
with the ``coursepkg`` of another checkout (an earlier commit: ``git worktree add DIR COMMIT``),
in the same rounds: a before/after that the machine's load hits alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_startup import ROOT, run_child  # noqa: E402

NOTEBOOK = ROOT / "solutions" / "ex01_attention" / "ex01_attention.ipynb"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--notebook", type=Path, default=NOTEBOOK)
    parser.add_argument("--peer", type=Path, help="another checkout whose check runs beside")
    args = parser.parse_args()
    check = ["-m", "coursepkg.cli", "check", str(args.notebook.resolve())]
    cases = {
        "python -c pass": (["-c", "pass"], ROOT),
        'python -c "import torch"': (["-c", "import torch"], ROOT),
        f"coursepkg check {args.notebook.name}": (check, ROOT),
    }
    if args.peer is not None:
        if not (args.peer / "coursepkg" / "grading" / "notebook.py").is_file():
            parser.error(f"--peer {args.peer}: not a checkout of this course (no coursepkg)")
        cases[f"  the same, coursepkg of {args.peer.name}"] = (check, args.peer.resolve())
    run_child(["-c", "import torch"])  # warm the file cache once
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    loads = []
    for _ in range(args.rounds):
        for name, (case, root) in cases.items():
            times[name].append(run_child(case, root))
        loads.append(os.getloadavg()[0])
    print(
        f"{args.rounds} rounds, load average {min(loads):.1f}-{max(loads):.1f}, "
        f"{os.cpu_count()} cores"
    )
    print(f"{'case':<44}{'wall':>8}{'cpu':>8}   (each round's wall)")
    for name, pairs in times.items():
        wall = statistics.median(w for w, _ in pairs)
        cpu = statistics.median(c for _, c in pairs)
        each = " ".join(f"{w:.1f}" for w, _ in pairs)
        print(f"{name:<44}{wall:>7.2f}s{cpu:>7.2f}s   ({each})")


if __name__ == "__main__":
    main()
