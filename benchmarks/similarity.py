"""``coursepkg similarity``: does it see through a disguised copy, how often does it flag
independent work, what does an honest answer score, and how does it do on a class of 200.

1. **Disguised copies.** For every made-up class of the project's independent implementations
   (``tests/fixtures/similarity_corpus.py``: per assignment, student k hands in the k-th
   implementation of each item) and each of its students in turn, a copier hands in that
   student's answers disguised by rewrites that keep the meaning
   (``tests/fixtures/similarity_disguise.py``: renamed, reordered, respelled, padded with
   code that does nothing, temporaries added), one seed per class and round. Counted: the
   classes where the copy's pair ranks first, and first at or above the threshold (target
   >= 90 % outside ex05, whose answers the exercise dictates), and the copy's mean score;
   for Dolos alone, the normal form alone and the combination the command uses (the higher
   of the two).
2. **False positives.** Every pair of independent implementations, whole submissions (what
   the command compares) and single items: the share at or above the threshold (target
   <= 2 %), and the scores of honest pairs on a short exercise (ex01) and overall.
3. **A class of 200** generated submissions (``generated_class``: 5 groups of 40 disguised
   copies of ex04's made-up class): the time of ``similarity_report`` and the page's size.

Needs Node.js and Dolos (``make install``). Run: ``.venv/bin/python benchmarks/similarity.py
--rounds 2`` (about 5 minutes on a quiet 2-core machine); ``--no-class`` skips (3).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

import nbformat  # noqa: E402
from similarity_corpus import GROUPS, classes, groups  # noqa: E402
from similarity_disguise import generated_class, rewrite  # noqa: E402

from coursepkg.grading.term.similarity import (  # noqa: E402
    DEFAULT_THRESHOLD,
    compare,
    similarity_report,
)

KEEP = {name for _, name, _ in GROUPS.values()}
SIGNALS = {
    "Dolos": lambda p: p.dolos,
    "normal form": lambda p: p.normal,
    "combined (max)": lambda p: p.similarity,
}


def disguised_copies(rounds: int, threshold: float) -> None:
    tally = {name: {"first": 0, "above": 0, "scores": []} for name in SIGNALS}
    ex05 = {name: {"first": 0, "above": 0, "scores": []} for name in SIGNALS}
    total = total05 = 0
    for r in range(rounds):
        for a, (students, template) in classes().items():
            for i, victim in enumerate(students):
                copier = rewrite(students[victim], KEEP, seed=1000 * r + i)
                pairs = compare({**students, "copier": copier}, template)
                into = ex05 if a == "ex05_decoder" else tally
                total05 += a == "ex05_decoder"
                total += a != "ex05_decoder"
                for name, score in SIGNALS.items():
                    best = max(pairs, key=lambda p: (score(p), "copier" in (p.left, p.right)))
                    copy = next(score(p) for p in pairs if {p.left, p.right} == {victim, "copier"})
                    first = {best.left, best.right} == {victim, "copier"}
                    into[name]["first"] += first
                    into[name]["above"] += first and copy >= threshold
                    into[name]["scores"].append(copy)
    print(f"1. disguised copies ({rounds} round(s), threshold {threshold:g}):")
    for name in SIGNALS:
        t, e = tally[name], ex05[name]
        print(
            f"   {name:15s} first {t['first']}/{total}, first and at or above "
            f"{t['above']}/{total} ({t['above'] / total:.0%}), copy's mean "
            f"{statistics.mean(t['scores']):.2f} (min {min(t['scores']):.2f}); ex05: first "
            f"{e['first']}/{total05}, at or above {e['above']}/{total05}, mean "
            f"{statistics.mean(e['scores']):.2f}"
        )


def false_positives(threshold: float) -> None:
    print(f"2. independent pairs at or above {threshold:g}:")
    for what, found in (("whole submissions", classes()), ("single items", groups())):
        for name, score in SIGNALS.items():
            n = above = 0
            for sources, template in found.values():
                n += len(sources) * (len(sources) - 1) // 2
                above += sum(score(p) >= threshold for p in compare(sources, template))
            print(f"   {what:17s} {name:15s} {above}/{n} ({above / n:.1%})")
    scores = {}
    for a, (sources, template) in classes().items():
        pairs = compare(sources, template)
        n = len(sources) * (len(sources) - 1) // 2
        scores[a] = [p.similarity for p in pairs] + [0.0] * (n - len(pairs))
    short = scores["ex01_attention"]
    every = [s for v in scores.values() for s in v]
    p90 = sorted(every)[int(0.9 * len(every))]
    print(
        f"   honest pairs, combined: ex01 median {statistics.median(short):.2f}, max "
        f"{max(short):.2f}; all assignments median {statistics.median(every):.2f}, 90th "
        f"percentile {p90:.2f}, max {max(every):.2f}"
    )


def class_of_200(students: int) -> None:
    aid = "ex04_encoder"
    handed, _ = generated_class(aid, students, seed=0)
    with tempfile.TemporaryDirectory(prefix="similarity-bench-") as tmp:
        root = Path(tmp)
        shutil.copytree(ROOT / "exercises" / aid, root / "exercises" / aid)
        release = nbformat.read(str(root / "exercises" / aid / f"{aid}.ipynb"), as_version=4)
        for sid, items in handed.items():
            nb = nbformat.from_dict(release)
            for cell in nb.cells:
                grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                cell.source = items.get(grade_id, cell.source)
            (root / "submitted" / sid / aid).mkdir(parents=True)
            nbformat.write(nb, str(root / "submitted" / sid / aid / f"{aid}.ipynb"))
        start = time.perf_counter()
        found = similarity_report(root, aid)
        took = time.perf_counter() - start
        size = found.page.stat().st_size
    above = sum(p.similarity >= DEFAULT_THRESHOLD for p in found.pairs)
    print(
        f"3. a class of {students} ({aid}): similarity_report {took:.1f} s; "
        f"{len(found.pairs)} pairs sharing code, {above} at or above the threshold, "
        f"{len(found.clusters)} groups; page {size / 1e6:.2f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="seeds per class (1)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--students", type=int, default=200, help="the large class's size")
    parser.add_argument("--no-class", action="store_true", help="skip the class of 200")
    args = parser.parse_args()
    disguised_copies(args.rounds, args.threshold)
    false_positives(args.threshold)
    if not args.no_class:
        class_of_200(args.students)


if __name__ == "__main__":
    main()
