"""The dashboard's end-of-term sections: open and answered regrade requests (from
``reports/regrades.json``, which :func:`coursepkg.grading.term.regrade.write_snapshot` writes)
and the links to each assignment's list of similar submissions
(``reports/<assignment>/similarity.html``, written by ``coursepkg similarity``).

Only files are read here, so the dashboard (:mod:`coursepkg.grading.classroom.dashboard`) shows
what the instructor's commands wrote without importing them."""

from __future__ import annotations

import html
import json
from pathlib import Path

__all__ = ["change", "term_sections"]


def _trail(log: list[dict]) -> str:
    return "<br>".join(html.escape(f"{e['at']}, {e['who']}: {change(e)}. {e['why']}") for e in log)


def change(entry: dict) -> str:
    """An audit entry's score change: ``old \u2192 new``, or ``old (unchanged)``."""
    if entry["new"] is None:
        return f"{entry['old']:g} (unchanged)"
    return f"{entry['old']:g} \u2192 {entry['new']:g}"


def _regrades(rows: list[dict]) -> str:
    opened = [r for r in rows if r["status"] == "open"]
    answered = [r for r in rows if r["status"] != "open"]
    parts = [
        f"<h2 id='regrades'>Regrade requests</h2><p>{len(opened)} open, "
        f"{len(answered)} answered.</p>"
    ]
    if opened:
        cells = "".join(
            f"<tr class='open-request'><td>{r['id']}</td><td>{html.escape(r['student'])}</td>"
            f"<td>{html.escape(r['assignment'])}</td><td><code>{html.escape(r['part'])}</code>"
            f"</td><td>{html.escape(r['requested_at'])}</td><td>{html.escape(r['reason'])}</td>"
            f"<td><code>coursepkg regrade answer {r['id']} --why ... [--score X]</code></td></tr>"
            for r in opened
        )
        parts.append(
            "<h3>Open</h3><table><tr><th>id</th><th>student</th><th>assignment</th>"
            f"<th>part</th><th>asked</th><th>reason</th><th>to answer</th></tr>{cells}</table>"
        )
    if answered:
        cells = "".join(
            f"<tr class='answered-request'><td>{r['id']}</td><td>{html.escape(r['student'])}"
            f"</td><td>{html.escape(r['assignment'])}</td><td><code>{html.escape(r['part'])}"
            f"</code></td><td>{html.escape(r['reason'])}</td><td>{_trail(r['log'])}</td></tr>"
            for r in answered
        )
        parts.append(
            "<h3>Answered</h3><table><tr><th>id</th><th>student</th><th>assignment</th>"
            f"<th>part</th><th>reason</th><th>who, when, old \u2192 new, why</th></tr>{cells}"
            "</table>"
        )
    return "".join(parts)


def term_sections(course: Path) -> str:
    """The HTML of the sections (empty when there is nothing to show)."""
    reports = Path(course) / "reports"
    parts = []
    pages = sorted(reports.glob("*/similarity.html"))
    if pages:
        links = "".join(
            f"<li><a class='similarity-link' href='{html.escape(p.parent.name)}/similarity.html'>"
            f"{html.escape(p.parent.name)}</a></li>"
            for p in pages
        )
        parts.append(
            "<h2 id='similarity'>Similar submissions</h2><p>Pairs of submissions whose answer "
            f"cells are much alike, for a person to read side by side:</p><ul>{links}</ul>"
        )
    snapshot = reports / "regrades.json"
    if snapshot.is_file():
        rows = json.loads(snapshot.read_text(encoding="utf-8"))
        if rows:
            parts.append(_regrades(rows))
    return "".join(parts)
