"""``coursepkg similarity``: which submissions of an assignment are much alike, ranked, for a
person to read side by side.

The comparison is Dolos's (https://dolos.ugent.be, the similarity engine of the Dodona
platform: tree-sitter tokens, winnowed k-gram fingerprints), run by ``node``: ``make install``
installs the npm packages pinned by ``dolos/package-lock.json`` beside this module into
``.venv/dolos`` (:data:`DOLOS_DIR`; ``COURSEPKG_DOLOS_DIR`` names another folder).

Only what a student wrote is compared: the answer cells and the code cells they added. The
release's answer cells (the stubs every student was given) are Dolos's template, whose
fingerprints never count, and the locked cells (given code, tests) are left out altogether.

The result is a list, ranked by similarity, in ``reports/<assignment>/similarity.csv`` and
``similarity.html`` (the pairs above the threshold, at most ``top`` of them, shown side by side,
the shared fragments marked), linked from the dashboard. Pairs that share nothing are left out,
two answers equal but for blank lines and spacing at the ends of lines are named identical, and
the submissions that could not be read are listed. A high similarity says two answers share
long stretches of code; it is not a verdict on how that came about.
"""

from __future__ import annotations

import csv
import html
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

__all__ = ["DOLOS_DIR", "Pair", "Similarity", "answer_code", "compare", "similarity_report"]

#: Where ``npm ci`` installed Dolos (its ``node_modules/``): the environment's ``dolos/``.
DOLOS_DIR = Path(os.environ.get("COURSEPKG_DOLOS_DIR") or Path(sys.prefix) / "dolos")
#: The node script that drives Dolos, and the package files ``npm ci`` installs from.
SCRIPT = Path(__file__).with_name("dolos") / "compare.mjs"
_LIB = Path("node_modules") / "@dodona" / "dolos-lib" / "dist" / "index.js"
DEFAULT_THRESHOLD = 0.7
#: The most pairs the page shows side by side (the table and the CSV list them all).
DEFAULT_TOP = 50


@dataclass
class Pair:
    """Two students' answers and how much of them Dolos found shared."""

    left: str
    right: str
    similarity: float
    longest: int  # the longest shared fragment, in k-grams
    left_covered: int
    right_covered: int
    left_total: int
    right_total: int
    fragments: list[tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=list)


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


def compare(sources: dict[str, str], template: str = "") -> list[Pair]:
    """Every pair of ``sources`` (label -> Python code) compared by Dolos, most similar first.

    Args:
        sources: the code of each student (or implementation), by label.
        template: code everyone was given; its fingerprints never count.

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
        manifest = {"files": list(names), "ignore": str(ignore) if ignore else None,
                    "language": "python"}  # fmt: skip
        run = subprocess.run(
            [node, str(SCRIPT)], input=json.dumps(manifest), capture_output=True, text=True,
            timeout=1800, env={**os.environ, "DOLOS_LIB": (DOLOS_DIR / _LIB).as_uri()},
        )  # fmt: skip
    if run.returncode != 0:
        raise ValueError(f"Dolos failed (exit status {run.returncode}): {run.stderr[-1500:]}")
    pairs = []
    for p in json.loads(run.stdout)["pairs"]:
        fragments = [
            ((f["left"]["startRow"], f["left"]["endRow"]),
             (f["right"]["startRow"], f["right"]["endRow"]))
            for f in p["fragments"]
        ]  # fmt: skip
        pairs.append(Pair(names[p["left"]], names[p["right"]], p["similarity"], p["longest"],
                          p["leftCovered"], p["rightCovered"], p["leftTotal"], p["rightTotal"],
                          fragments))  # fmt: skip
    pairs.sort(key=lambda p: (-p.similarity, -p.longest, p.left, p.right))
    return pairs


@dataclass
class Similarity:
    """What :func:`similarity_report` wrote and found.

    Attributes:
        table: the CSV file. page: the HTML page.
        pairs: the pairs sharing some code, most similar first.
        identical: the pairs whose answers are equal (but for blank lines and line ends).
        unreadable: {student: why} for the submissions that could not be read.
    """

    table: Path
    page: Path
    pairs: list[Pair]
    identical: set[tuple[str, str]] = field(default_factory=set)
    unreadable: dict[str, str] = field(default_factory=dict)


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


def _marked(code: str, rows: list[tuple[int, int]]) -> str:
    """``code`` as HTML lines, those inside a shared fragment marked."""
    shared = {r for start, end in rows for r in range(start, end + 1)}
    return "".join(
        f"<span class='line{' shared' if i in shared else ''}'>{i + 1:>4}  {html.escape(line)}"
        "</span>\n"
        for i, line in enumerate(code.splitlines())
    )


_STYLE = (
    "body{font-family:sans-serif;max-width:1400px;margin:auto}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}.sides{display:flex;gap:12px}"
    ".sides>div{flex:1;min-width:0}pre{background:#f7f7f7;padding:6px;overflow-x:auto;"
    "font-size:12px}.shared{background:#ffe08a}.line{display:block}"
)


def _page(assignment: str, found: Similarity, sources: dict[str, str], threshold: float,
          top: int) -> str:  # fmt: skip
    pairs = found.pairs
    above = [p for p in pairs if p.similarity >= threshold]
    shown = {id(p) for p in above[:top]}

    def score(p: Pair) -> str:
        same = (p.left, p.right) in found.identical
        return f"{p.similarity:.3f}" + (" (identical answers)" if same else "")

    rows = "".join(
        f"<tr class='pair{' above' if p.similarity >= threshold else ''}'><td>{i}</td>"
        f"<td>{html.escape(p.left)}</td><td>{html.escape(p.right)}</td>"
        f"<td>{score(p)}</td><td>{p.longest}</td>"
        + (f"<td><a href='#pair-{i}'>side by side</a></td>" if id(p) in shown
           else "<td></td>")
        + "</tr>"
        for i, p in enumerate(pairs[:300], start=1)
    )  # fmt: skip
    details = "".join(
        f"<section id='pair-{i}' class='side-by-side'><h3>{i}. {html.escape(p.left)} and "
        f"{html.escape(p.right)}: similarity {score(p)}</h3><div class='sides'>"
        f"<div><h4>{html.escape(p.left)}</h4><pre>"
        f"{_marked(sources[p.left], [f[0] for f in p.fragments])}</pre></div>"
        f"<div><h4>{html.escape(p.right)}</h4><pre>"
        f"{_marked(sources[p.right], [f[1] for f in p.fragments])}</pre></div></div></section>"
        for i, p in enumerate(pairs, start=1)
        if id(p) in shown
    )
    items = "".join(
        f"<li>{html.escape(sid)}: {html.escape(why)}</li>" for sid, why in found.unreadable.items()
    )
    unread = f"<p>Not compared (could not be read):</p><ul class='unreadable'>{items}</ul>"
    unread = unread if items else ""
    capped = (
        f" The {top} most similar of them are shown side by side (--top)." if len(above) > top
        else ""
    )  # fmt: skip
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Similar submissions: "
        f"{html.escape(assignment)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Similar submissions: {html.escape(assignment)}</h1>"
        f"<p>{len(sources)} submissions, {len(pairs)} pairs sharing some code, "
        f"{len(above)} at or above the threshold {threshold:g}.{capped} Compared by Dolos: only "
        "what each student wrote (answer cells and added cells; the stubs and given code are left "
        "out). The similarity is the share of the two answers' fingerprints they have in "
        "common. A pair high on this list is worth reading side by side; short exercises "
        "have few ways to be written, so two independent answers can be alike.</p>"
        "<table><tr><th>rank</th><th>student</th><th>student</th><th>similarity</th>"
        f"<th>longest shared fragment (k-grams)</th><th></th></tr>{rows}</table>{unread}"
        f"{details}</body></html>"
    )


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
        The files, the pairs sharing code (most similar first), the identical ones and the
        submissions that could not be read (:class:`Similarity`).

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
    pairs = [p for p in compare(sources, template) if p.similarity > 0]  # sharing something
    same = {
        (p.left, p.right) for p in pairs if _normal(sources[p.left]) == _normal(sources[p.right])
    }
    found = Similarity(Path(), Path(), pairs, same, unreadable)
    out = root / "reports" / assignment
    out.mkdir(parents=True, exist_ok=True)
    table = out / "similarity.csv"
    with table.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["rank", "student_a", "student_b", "similarity", "longest_fragment", "covered_a",
                    "covered_b", "total_a", "total_b", "at_or_above_threshold",
                    "identical"])  # fmt: skip
        for i, p in enumerate(pairs, start=1):
            w.writerow([i, p.left, p.right, f"{p.similarity:.4f}", p.longest, p.left_covered,
                        p.right_covered, p.left_total, p.right_total,
                        int(p.similarity >= threshold),
                        int((p.left, p.right) in same)])  # fmt: skip
    page = out / "similarity.html"
    page.write_text(_page(assignment, found, sources, threshold, top), encoding="utf-8")
    build_dashboard(root)
    found.table, found.page = table, page
    return found
