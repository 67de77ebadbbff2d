"""The capstone's leaderboard: entries ranked by held-out bits per byte over seeds, and the
rule that says when an entry is a new record.

**The record rule.** An entry is a new record when it beats the standing best by more than a
margin (the instructor's, default 0.005 nats per byte, as OpenAI's Parameter Golf) and a
one-sided **Welch's t-test** over the seeds rejects, at ``p < 0.01``, that its true mean is no
better than the best's less the margin. Welch's test, because the two entries' seed spreads
differ (a recipe with a higher learning rate scatters more) and a handful of seeds gives no
ground for pooling their variances; one-sided, because only an improvement counts; shifted by
the margin, so that a tie plus noise never makes a record. Entries are taken in the order they
were submitted; a record becomes the standing best. :func:`record_false_positive_rate`
measures how often the rule calls a record between equal recipes.

**The pages.** :func:`leaderboard_rows` ranks the scored entries; :func:`write_pages` writes the
instructor's page (names, verdicts, every entry), the students' page (names or pseudonyms, the
scored entries only, nothing about another's verdict) and the CSV export.
"""

from __future__ import annotations

import csv
import hashlib
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import mean, stdev

import numpy as np

__all__ = [
    "DEFAULT_MARGIN_NATS",
    "RECORD_P",
    "is_record",
    "leaderboard_rows",
    "pseudonym",
    "record_false_positive_rate",
    "welch_one_sided_p",
    "write_pages",
]

#: The margin a record must beat the standing best by, in nats per byte.
DEFAULT_MARGIN_NATS = 0.005
#: The significance level of the record rule's one-sided test.
RECORD_P = 0.01


def welch_one_sided_p(new, best, margin: float):
    """p-value of Welch's t-test of H0: mean(new) >= mean(best) - margin (lower is better).

    Args:
        new: the candidate's scores over seeds, (..., n) with n >= 2 (a batch of candidates
            along the leading axes).
        best: the standing best's scores, (..., m) with m >= 2.
        margin: the improvement required, in the scores' unit.

    Returns:
        The one-sided p-value(s), shape (...): a float for one pair. Where both spreads are 0
        the difference is exact: 0 when it beats the margin, else 1.
    """
    from scipy.stats import t as student_t

    new, best = np.asarray(new, dtype=float), np.asarray(best, dtype=float)
    n, m = new.shape[-1], best.shape[-1]
    if n < 2 or m < 2:
        raise ValueError(f"Welch's test needs >= 2 seeds each, got {n} and {m}")
    gap = best.mean(-1) - margin - new.mean(-1)  # (...)
    v_new, v_best = new.var(-1, ddof=1) / n, best.var(-1, ddof=1) / m  # (...)
    se2 = v_new + v_best
    exact = se2 == 0
    safe = np.where(exact, 1.0, se2)
    df = safe**2 / (v_new**2 / (n - 1) + v_best**2 / (m - 1) + exact)  # Welch-Satterthwaite
    p = np.where(exact, np.where(gap > 0, 0.0, 1.0), student_t.sf(gap / np.sqrt(safe), df))
    return float(p) if p.ndim == 0 else p


def _records(new, best, margin_nats: float):
    """The record rule on (..., n) and (..., m) scores: a bool per pair."""
    margin = margin_nats / math.log(2)  # nats -> bits
    new, best = np.asarray(new, dtype=float), np.asarray(best, dtype=float)
    beats = new.mean(-1) < best.mean(-1) - margin
    return beats & (welch_one_sided_p(new, best, margin) < RECORD_P)


def is_record(
    new: Sequence[float], best: Sequence[float], margin_nats: float = DEFAULT_MARGIN_NATS
) -> bool:
    """Whether scores ``new`` (bits per byte over seeds) are a record over ``best``."""
    return bool(_records(new, best, margin_nats))


def record_false_positive_rate(
    spread: float,
    seeds: int = 3,
    trials: int = 100_000,
    margin_nats: float = DEFAULT_MARGIN_NATS,
    seed: int = 0,
    true_gain_nats: float = 0.0,
) -> float:
    """How often the rule calls a record between two recipes whose true means differ by
    ``true_gain_nats`` (0: equal recipes), their seed scores normal with sd ``spread`` bits.

    Returns:
        The fraction of ``trials`` simulated pairs the rule called a record.
    """
    rng = np.random.default_rng(seed)
    gain = true_gain_nats / math.log(2)
    best = rng.normal(4.0, spread, (trials, seeds))  # (trials, seeds)
    new = rng.normal(4.0 - gain, spread, (trials, seeds))  # (trials, seeds)
    return float(_records(new, best, margin_nats).mean())


def pseudonym(student: str, secret: str) -> str:
    """A stable pseudonym of ``student`` that only the course's secret links back to them."""
    digest = hashlib.sha256(f"{secret}\0{student}".encode()).hexdigest()
    return f"entrant-{digest[:8]}"


def leaderboard_rows(
    entries: Sequence[Mapping],
    baseline: Sequence[float] | None = None,
    margin_nats: float = DEFAULT_MARGIN_NATS,
) -> list[dict]:
    """Rank the entries and mark the records.

    Args:
        entries: in submission order, each ``{"student", "verdict", "scores", "detail"}``
            (as :func:`coursepkg.grading.classroom.capstone.grade_recipe` gives them).
        baseline: the course recipe's scores, the first standing best (None: the first entry
            scored over >= 2 seeds).
        margin_nats: the record margin.

    Returns:
        One row per entry, best mean first (the unscored last): ``student``, ``verdict``,
        ``mean``, ``spread``, ``seeds``, ``record`` (bool), ``rank`` (None when unscored).
    """
    best = list(baseline) if baseline else None
    rows = []
    for entry in entries:
        scores = list(entry.get("scores") or [])
        row = {"student": entry["student"], "verdict": entry["verdict"], "seeds": len(scores)}
        row["mean"] = mean(scores) if scores else None
        row["spread"] = (stdev(scores) if len(scores) > 1 else 0.0) if scores else None
        row["record"] = False
        if len(scores) >= 2 and entry["verdict"] == "capstone.ok":
            if best is None:
                best = scores
            elif is_record(scores, best, margin_nats):
                row["record"], best = True, scores
        rows.append(row)
    rows.sort(key=lambda r: (r["mean"] is None, r["mean"] or 0.0, r["student"]))
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank if row["mean"] is not None else None
    return rows


_CSV_FIELDS = ("rank", "student", "verdict", "mean", "spread", "seeds", "record")


def _table(rows: list[dict], columns: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for c in columns:
            value = row[c]
            text = f"{value:.4f}" if isinstance(value, float) else "" if value is None else value
            text = (
                "new record" if c == "record" and value is True else "" if c == "record" else text
            )
            cells.append(f"<td>{html.escape(str(text))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def write_pages(
    rows: list[dict], out: str | Path, names: str = "pseudonyms", secret: str = ""
) -> dict[str, Path]:
    """Write ``instructor.html``, ``students.html`` and ``leaderboard.csv`` into ``out``.

    Args:
        rows: :func:`leaderboard_rows`' rows.
        out: the folder.
        names: ``"names"`` or ``"pseudonyms"`` on the students' page.
        secret: the course's secret, salting the pseudonyms.

    Returns:
        The three files by kind (``instructor``, ``students``, ``csv``).
    """
    if names not in ("names", "pseudonyms"):
        raise ValueError(f"names must be 'names' or 'pseudonyms', got {names!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        k: out / f
        for k, f in (
            ("instructor", "instructor.html"),
            ("students", "students.html"),
            ("csv", "leaderboard.csv"),
        )
    }
    with paths["csv"].open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, _CSV_FIELDS)
        writer.writeheader()
        writer.writerows({k: r[k] for k in _CSV_FIELDS} for r in rows)
    unit = "held-out bits per byte over seeds (lower is better); spread = sample sd"
    paths["instructor"].write_text(
        f"<h1>Capstone leaderboard (instructor)</h1><p>{unit}</p>" + _table(rows, _CSV_FIELDS),
        encoding="utf-8",
    )
    public = [
        {**r, "student": r["student"] if names == "names" else pseudonym(r["student"], secret)}
        for r in rows
        if r["mean"] is not None
    ]
    paths["students"].write_text(
        f"<h1>Capstone leaderboard</h1><p>{unit}</p>"
        + _table(public, ("rank", "student", "mean", "spread", "seeds", "record")),
        encoding="utf-8",
    )
    return paths
