"""The misconception dashboard: ``<course>/reports/dashboard.html``, from the per-student JSON
reports of every assignment graded so far."""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

from ..policy.pages import term_sections

__all__ = ["build_dashboard"]


def _figure_png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figures(aid: str, scores: list[float], top: float, hits: Counter) -> str:
    """The score histogram and the named mistakes' bars of one assignment, as a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    axes[0].hist(scores, bins=min(20, max(int(top), 1) + 1), range=(-0.5, top + 0.5))
    axes[0].set(xlabel="autograded points", ylabel="students", title=f"{aid}: score distribution")
    if hits:
        names = sorted(hits, key=lambda k: (-hits[k], k))
        axes[1].barh(names[::-1], [hits[k] for k in names[::-1]], color="#c62828")
        axes[1].set(xlabel="students", title="named mistakes")
        axes[1].xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        axes[1].text(0.5, 0.5, "no named mistake", ha="center", va="center")
        axes[1].set_axis_off()
    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    image = _figure_png(fig)
    plt.close(fig)
    return image


def _final_grades(reports: list[dict]) -> str:
    """The table of each student's grade as the exports write it: the points (hand scores
    and regrade answers included) less the late penalty (none for reports without one)."""
    reports = [r for r in reports if "final_score" in r]
    if not reports:
        return ""
    rows = "".join(
        f"<tr class='final-grade'><td>{html.escape(r['student'])}</td><td>{r['score']:g}</td>"
        f"<td>{r['late_penalty']:g}</td><td>{r['final_score']:g}</td></tr>"
        for r in reports
    )
    return (
        "<h3>Final grades</h3><p>As <code>coursepkg export</code> writes them, of "
        f"{max(r['max_score'] for r in reports):g} points.</p><table><tr><th>student</th>"
        f"<th>points</th><th>late penalty</th><th>final</th></tr>{rows}</table>"
    )


def build_dashboard(course: str | Path) -> Path:
    """Write ``<course>/reports/dashboard.html``: per assignment graded so far, how many students
    hit each named mistake, the score distribution, and who needs a look.

    Args:
        course: the nbgrader course directory (its ``reports/<assignment>/*.json``).

    Returns:
        The HTML file (figures embedded as PNG, so it is one self-contained file).
    """
    from .. import catalogue  # the checks import torch: see reports.load_checks

    course = Path(course)
    descriptions = {bug.id: bug.description for bug in catalogue()}
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Misconception dashboard</title>"
        "<style>body{font-family:sans-serif;max-width:1000px;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:left}img{max-width:100%;height:auto}</style></head><body>"
        "<h1>Misconception dashboard</h1>"
    ]
    for folder in sorted(p for p in (course / "reports").glob("*") if p.is_dir()):
        reports = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
        if not reports:
            continue
        aid = folder.name
        scores = [r["autograded_points"] for r in reports]
        top = max(r["autograded_max_points"] for r in reports)
        hits = Counter(d for r in reports for d in r["diagnoses"])
        image = _figures(aid, scores, top, hits)
        mean = sum(scores) / len(scores)
        parts.append(
            f"<h2>{html.escape(aid)}</h2><p>{len(reports)} students, mean {mean:.2f} of "
            f"{top:g} autograded points, {sum(s == top for s in scores)} with full marks, "
            f"{sum(not r['graded'] for r in reports)} not gradable.</p>"
            f"<img alt='score distribution and named mistakes of {html.escape(aid)}' "
            f"src='data:image/png;base64,{image}'>"
        )
        rows = "".join(
            f"<tr><td><code>{html.escape(k)}</code></td>"
            f"<td>{html.escape(descriptions.get(k, ''))}</td><td>{hits[k]}</td>"
            f"<td>{html.escape(', '.join(r['student'] for r in reports if k in r['diagnoses']))}"
            "</td></tr>"
            for k in sorted(hits, key=lambda k: (-hits[k], k))
        )
        parts.append(
            "<h3>Named mistakes</h3><table><tr><th>mistake</th><th>what it is</th>"
            f"<th>students</th><th>who</th></tr>{rows}</table>"
            if rows
            else "<p>No catalogued mistake was named.</p>"
        )
        parts.append(_final_grades(reports))
        attention = [r for r in reports if not r["graded"] or r["review_flags"] or r["notes"]]
        if attention:
            rows = "".join(
                f"<tr><td>{html.escape(r['student'])}</td><td>{r['autograded_points']:g}</td>"
                f"<td>{html.escape(r['reason'] or '; '.join(r['notes']))}</td>"
                f"<td>{html.escape('; '.join(r['review_flags']))}</td></tr>"
                for r in attention
            )
            parts.append(
                "<h3>Needs a look</h3><table><tr><th>student</th><th>points</th>"
                f"<th>not graded / notes</th><th>review flags</th></tr>{rows}</table>"
            )
    parts.append(term_sections(course))  # similar submissions, regrade requests
    parts.append("</body></html>")
    out = course / "reports" / "dashboard.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(parts), encoding="utf-8")
    return out
