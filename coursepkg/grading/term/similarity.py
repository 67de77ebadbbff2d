"""``coursepkg similarity``: which submissions of an assignment are much alike, ranked, for a
person to read side by side.

The comparison is Dolos's (https://dolos.ugent.be, the similarity engine of the Dodona
platform: tree-sitter tokens, winnowed k-gram fingerprints), run by ``node``: ``make install``
installs the npm packages pinned by ``dolos/package-lock.json`` beside this module into
``.venv/dolos`` (:data:`DOLOS_DIR`; ``COURSEPKG_DOLOS_DIR`` names another folder).

Only what a student wrote is compared: the answer cells and the code cells they added. The
release's answer cells (the stubs every student was given) are Dolos's template, whose
fingerprints never count, and the locked cells (given code, tests) are left out altogether.

A second signal sees through rewrites that keep the meaning (reordered or respelled
expressions, code that does nothing, names changed): the share of token n-grams two answers
have in common once each is put in a normal form (:mod:`.similarity_normalise`). A pair's
similarity is the higher of the two, Dolos's and the normal form's: each is evidence of
shared code on its own, and on the project's independent whole submissions the higher of the
two reaches the threshold no more often than Dolos alone (``benchmarks/similarity.py``
measures both, and the copies each finds).

The result is a list, ranked by similarity, in ``reports/<assignment>/similarity.csv`` and
``similarity.html`` (:mod:`.similarity_page`: the groups of students linked by pairs above the
threshold, the pairs above it, at most ``top`` of them, side by side, the code Dolos matched
marked and the given code greyed), linked from the dashboard. Pairs that share nothing are left
out, two answers equal but for blank lines and spacing at the ends of lines are named
identical, and the submissions that could not be read are listed. A high similarity says two
answers share code; it is not a verdict on how that came about.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from .similarity_normalise import normal_similarity
from .similarity_page import page as _render

__all__ = [
    "DOLOS_DIR",
    "Pair",
    "Similarity",
    "answer_code",
    "clusters",
    "compare",
    "similarity_report",
]

#: Where ``npm ci`` installed Dolos (its ``node_modules/``): the environment's ``dolos/``.
DOLOS_DIR = Path(os.environ.get("COURSEPKG_DOLOS_DIR") or Path(sys.prefix) / "dolos")
#: The node script that drives Dolos, and the package files ``npm ci`` installs from.
SCRIPT = Path(__file__).with_name("dolos") / "compare.mjs"
_LIB = Path("node_modules") / "@dodona" / "dolos-lib" / "dist" / "index.js"
DEFAULT_THRESHOLD = 0.7
#: The most pairs the page shows side by side (the CSV lists them all).
DEFAULT_TOP = 50


@dataclass
class Pair:
    """Two students' answers and how much of them is shared.

    Attributes:
        similarity: the higher of ``dolos`` and ``normal``, in [0, 1].
        dolos: Dolos's similarity (0 when Dolos found no shared fingerprint).
        normal: the normal form's similarity (:func:`.similarity_normalise.normal_similarity`).
        longest: Dolos's longest shared fragment, in k-grams.
        fragments: Dolos's shared fragments, a (start row, start column, end row, end column)
            region (0-based, the end column excluded) in each answer.
    """

    left: str
    right: str
    similarity: float
    longest: int = 0
    left_covered: int = 0
    right_covered: int = 0
    left_total: int = 0
    right_total: int = 0
    fragments: list[tuple[tuple[int, int, int, int], tuple[int, int, int, int]]] = field(
        default_factory=list
    )
    dolos: float = 0.0
    normal: float = 0.0


def _meta(cell: Any) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def answer_code(nb: Any) -> str:
    """What a student wrote in a notebook: its answer cells and the code cells it added (no
    nbgrader marks), in order; locked and test cells are left out."""
    return "\n\n".join(
        cell.source
        for cell in nb.cells
        if cell.cell_type == "code"
        and (_meta(cell).get("solution") or not _meta(cell))
        and not _meta(cell).get("locked")
    )


def _release_answers(nb: Any) -> str:
    """The template: the release's answer cells (the stubs)."""
    return "\n\n".join(
        c.source for c in nb.cells if c.cell_type == "code" and _meta(c).get("solution")
    )


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise ValueError(
            "coursepkg similarity runs Dolos with Node.js, and `node` is not on PATH (expected "
            "Node.js 18 or newer: on Debian `apt-get install nodejs npm`, then `make install`)"
        )
    if not (DOLOS_DIR / _LIB).is_file():
        raise ValueError(
            f"Dolos is not installed in {DOLOS_DIR} (expected {_LIB} there): run `make "
            f"install`, or copy {SCRIPT.parent}/package*.json there and run `npm ci` in it"
        )
    return node


def compare(sources: dict[str, str], template: str = "", normalised: bool = True) -> list[Pair]:
    """Every pair of ``sources`` (label -> Python code) that shares something, compared by
    Dolos and by the normal form, most similar first.

    Args:
        sources: the code of each student (or implementation), by label.
        template: code everyone was given; its fingerprints never count.
        normalised: also compare the normal forms (``False``: Dolos alone).

    Raises:
        ValueError: fewer than two sources, node or Dolos missing, Dolos failed.
    """
    if len(sources) < 2:
        raise ValueError(f"need at least two submissions to compare, got {len(sources)}")
    node = _node()
    with tempfile.TemporaryDirectory(prefix="coursepkg-similarity-") as scratch:
        names = {}
        for i, (label, code) in enumerate(sources.items()):
            path = Path(scratch) / f"s{i:05d}.py"
            path.write_text(code + "\n", encoding="utf-8")
            names[str(path)] = label
        ignore = None
        if template.strip():
            ignore = Path(scratch) / "template.py.txt"
            ignore.write_text(template + "\n", encoding="utf-8")
        manifest = {
            "files": list(names),
            "ignore": str(ignore) if ignore else None,
            "language": "python",
        }
        run = subprocess.run(
            [node, str(SCRIPT)],
            input=json.dumps(manifest),
            capture_output=True,
            text=True,
            timeout=1800,
            env={**os.environ, "DOLOS_LIB": (DOLOS_DIR / _LIB).as_uri()},
        )
    if run.returncode != 0:
        raise ValueError(f"Dolos failed (exit status {run.returncode}): {run.stderr[-1500:]}")
    order = {label: i for i, label in enumerate(sources)}
    found: dict[tuple[str, str], Pair] = {}
    for p in json.loads(run.stdout)["pairs"]:
        fragments = [(_region(f["left"]), _region(f["right"])) for f in p["fragments"]]
        pair = Pair(
            names[p["left"]],
            names[p["right"]],
            p["similarity"],
            p["longest"],
            p["leftCovered"],
            p["rightCovered"],
            p["leftTotal"],
            p["rightTotal"],
            fragments,
            dolos=p["similarity"],
        )
        if order[pair.left] > order[pair.right]:
            pair = _swapped(pair)
        found[(pair.left, pair.right)] = pair
    for key, score in (normal_similarity(sources, template) if normalised else {}).items():
        pair = found.setdefault(key, Pair(key[0], key[1], 0.0))
        pair.normal = score
        pair.similarity = max(pair.dolos, score)
    pairs = [p for p in found.values() if p.similarity > 0]
    pairs.sort(key=lambda p: (-p.similarity, -p.longest, p.left, p.right))
    return pairs


def _region(r: dict) -> tuple[int, int, int, int]:
    return (r["startRow"], r["startCol"], r["endRow"], r["endCol"])


def _swapped(p: Pair) -> Pair:
    return Pair(
        p.right,
        p.left,
        p.similarity,
        p.longest,
        p.right_covered,
        p.left_covered,
        p.right_total,
        p.left_total,
        [(b, a) for a, b in p.fragments],
        p.dolos,
        p.normal,
    )


def clusters(pairs: list[Pair], threshold: float) -> list[list[str]]:
    """The groups of students linked by pairs at or above ``threshold`` (the connected
    components: A ~ B ~ C when A-B and B-C are), largest first, each sorted.

    Args:
        pairs: compared pairs (:func:`compare`).
        threshold: the similarity from which two students are linked.

    Returns:
        The groups of two or more students.
    """
    parent: dict[str, str] = {}

    def root(s: str) -> str:
        while parent.setdefault(s, s) != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    for p in pairs:
        if p.similarity >= threshold:
            parent[root(p.left)] = root(p.right)
    groups: dict[str, list[str]] = {}
    for s in parent:
        groups.setdefault(root(s), []).append(s)
    return sorted((sorted(g) for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g))


@dataclass
class Similarity:
    """What :func:`similarity_report` wrote and found.

    Attributes:
        table: the CSV file. page: the HTML page.
        pairs: the pairs sharing some code, most similar first.
        identical: the pairs whose answers are equal (but for blank lines and line ends).
        unreadable: {student: why} for the submissions that could not be read.
        clusters: the groups of students linked by pairs at or above the threshold.
    """

    table: Path
    page: Path
    pairs: list[Pair]
    identical: set[tuple[str, str]] = field(default_factory=set)
    unreadable: dict[str, str] = field(default_factory=dict)
    clusters: list[list[str]] = field(default_factory=list)


def _normal(code: str) -> str:
    """The code without blank lines and trailing spaces: equal for a byte-for-byte copy."""
    return "\n".join(line.rstrip() for line in code.splitlines() if line.strip())


def _submissions(root: Path, assignment: str) -> tuple[dict[str, str], str, dict[str, str]]:
    """Each student's answer code in ``submitted/``, the release's template, and the
    submissions that could not be read (student: why)."""
    release = root / ("exercises" if (root / "exercises").is_dir() else "release") / assignment
    notebooks = sorted(release.glob("*.ipynb"))
    if not notebooks:
        raise ValueError(f"no release of {assignment!r} in {release} (expected its notebooks)")
    template = "\n\n".join(_release_answers(nbformat.read(str(p), as_version=4)) for p in notebooks)
    sources, unreadable = {}, {}
    for folder in sorted((root / "submitted").glob(f"*/{assignment}")):
        parts = []
        for p in notebooks:
            try:
                parts.append(answer_code(nbformat.read(str(folder / p.name), as_version=4)))
            except (OSError, ValueError, AttributeError) as err:  # nothing of it to compare
                why = "missing" if isinstance(err, FileNotFoundError) else "not a readable notebook"
                unreadable[folder.parent.name] = f"{p.name}: {why}"
        if any(part.strip() for part in parts):
            sources[folder.parent.name] = "\n\n".join(parts)
    return sources, template, unreadable


def similarity_report(
    course: str | Path,
    assignment: str,
    threshold: float = DEFAULT_THRESHOLD,
    top: int = DEFAULT_TOP,
) -> Similarity:
    """Compare the submissions of ``assignment`` and write ``reports/<assignment>/
    similarity.csv`` and ``similarity.html``, then the dashboard (which links the page).

    Args:
        course: the nbgrader course directory (``submitted/`` and the release).
        assignment: the assignment id.
        threshold: pairs at or above this similarity (0 to 1) are marked and shown side by
            side.
        top: the most pairs shown side by side (the most similar ones).

    Returns:
        The files, the pairs sharing code (most similar first), the identical ones, the
        submissions that could not be read and the groups of similar students
        (:class:`Similarity`).

    Raises:
        ValueError: a threshold outside [0, 1], a ``top`` below 1, fewer than two
            submissions, Dolos missing.
    """
    from ..classroom.dashboard import build_dashboard

    if not 0 <= threshold <= 1:
        raise ValueError(f"--threshold must be between 0 and 1, got {threshold:g}")
    if top < 1:
        raise ValueError(f"--top must be at least 1, got {top}")
    root = Path(course).resolve()
    sources, template, unreadable = _submissions(root, assignment)
    pairs = compare(sources, template)  # the pairs sharing something
    same = {
        (p.left, p.right) for p in pairs if _normal(sources[p.left]) == _normal(sources[p.right])
    }
    found = Similarity(Path(), Path(), pairs, same, unreadable, clusters(pairs, threshold))
    out = root / "reports" / assignment
    out.mkdir(parents=True, exist_ok=True)
    table = out / "similarity.csv"
    _write_table(table, pairs, same, threshold)
    page = out / "similarity.html"
    page.write_text(_render(assignment, found, sources, template, threshold, top), encoding="utf-8")
    build_dashboard(root)
    found.table, found.page = table, page
    return found


def _write_table(table: Path, pairs: list, same: set, threshold: float) -> None:
    # similarity.csv: one row per pair sharing code, most similar first.
    with table.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "rank",
                "student_a",
                "student_b",
                "similarity",
                "dolos",
                "normal_form",
                "longest_fragment",
                "covered_a",
                "covered_b",
                "total_a",
                "total_b",
                "at_or_above_threshold",
                "identical",
            ]
        )
        for i, p in enumerate(pairs, start=1):
            w.writerow(
                [
                    i,
                    p.left,
                    p.right,
                    f"{p.similarity:.4f}",
                    f"{p.dolos:.4f}",
                    f"{p.normal:.4f}",
                    p.longest,
                    p.left_covered,
                    p.right_covered,
                    p.left_total,
                    p.right_total,
                    int(p.similarity >= threshold),
                    int((p.left, p.right) in same),
                ]
            )
