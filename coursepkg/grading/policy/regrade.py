"""Regrade requests: their store in the gradebook, their audit trail, and their scores put back
after every run of ``coursepkg grade``.

A student asks for a regrade of one graded part (cell) with a reason: ``coursepkg regrade
request`` writes the request file, or the link next to that part in the feedback downloads it
(:func:`request_file`). The instructor's commands (:mod:`coursepkg.grading.term.regrade`)
record the files (:func:`add_requests`) and the answers (:func:`record_answer`).

Requests and every change live in two tables of their own in nbgrader's gradebook database
(SQLite or PostgreSQL), next to nbgrader's: ``coursepkg_regrade_request`` and
``coursepkg_regrade_log`` (who, when, old score, new score, why). A new score is nbgrader's
manual score of that part, so nbgrader, its formgrader and the export count it; the class
grader puts it back after every run of ``coursepkg grade`` (:func:`reapply`), so a rerun never
undoes it, and the feedback shows each request with its answer (:class:`RegradeNote`).

A course configured before this module moved here names
``coursepkg.grading.term.regrade.RegradeNote``; that name is this same class.
"""

from __future__ import annotations

import datetime
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import List, Unicode

from .late import reassess_penalties

__all__ = [
    "REGRADE_MARK",
    "RegradeNote",
    "Request",
    "add_requests",
    "feedback_text",
    "reapply",
    "record_answer",
    "request_file",
    "requests",
    "store_requests",
]

KIND = "coursepkg-regrade-request"
REGRADE_MARK = "**Regrade requests** (coursepkg)"


def _tables() -> tuple[Any, Any, Any]:
    import sqlalchemy as sa

    Column, Table = sa.Column, sa.Table  # noqa: N806 - SQLAlchemy's own names read best
    metadata = sa.MetaData()
    request = Table(
        "coursepkg_regrade_request",
        metadata,
        Column("id", sa.Integer, primary_key=True, autoincrement=True),
        Column("uid", sa.String(64), unique=True, nullable=False),
        Column("assignment", sa.String(128), nullable=False),
        Column("student", sa.String(128), nullable=False),
        Column("part", sa.String(128), nullable=False),
        Column("reason", sa.Text, nullable=False),
        Column("requested_at", sa.DateTime, nullable=False),
        Column("status", sa.String(16), nullable=False),
    )
    log = Table(
        "coursepkg_regrade_log",
        metadata,
        Column("id", sa.Integer, primary_key=True, autoincrement=True),
        Column("request_id", sa.Integer, sa.ForeignKey(f"{request.name}.id"), nullable=False),
        Column("who", sa.String(128), nullable=False),
        Column("at", sa.DateTime, nullable=False),
        Column("old_score", sa.Float),
        Column("new_score", sa.Float),
        Column("why", sa.Text, nullable=False),
    )
    return metadata, request, log


@dataclass
class Request:
    """One regrade request and its trail (``log``: dicts with who, at, old, new, why; ``new``
    is None for an answer that only comments)."""

    id: int
    assignment: str
    student: str
    part: str
    reason: str
    requested_at: datetime.datetime
    status: str
    log: list[dict]

    def as_dict(self) -> dict:
        return {**self.__dict__, "requested_at": f"{self.requested_at:%Y-%m-%d %H:%M} UTC"}


def _engine(url: str, create: bool = True) -> Any:
    from sqlalchemy import create_engine

    engine = create_engine(url)
    if create:
        _tables()[0].create_all(engine)
    return engine


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None, microsecond=0)


def request_file(assignment: str, student: str, part: str, reason: str) -> dict:
    """The content of a request file (JSON), as the student's command writes it."""
    if not reason.strip():
        raise ValueError("a regrade request needs a reason (got an empty --reason)")
    return {
        "kind": KIND,
        "version": 1,
        "id": uuid.uuid4().hex,
        "assignment": assignment,
        "student": student,
        "part": part,
        "reason": reason.strip(),
        "requested_at": _now().isoformat(),
    }


def _part(gb: Any, assignment: str, student: str, part: str) -> Any:
    """nbgrader's grade of ``part`` in the student's submission."""
    from nbgrader.api import MissingEntry

    try:
        submission = gb.find_submission(assignment, student)
    except MissingEntry as err:
        raise ValueError(f"{student!r} has no graded submission of {assignment!r}") from err
    grades = {g.name: g for nb in submission.notebooks for g in nb.grades}
    if part not in grades:
        raise ValueError(
            f"{assignment!r} has no graded part {part!r} (expected one of: "
            f"{', '.join(sorted(grades))})"
        )
    return grades[part]


def add_requests(course: Any, files: list[Path]) -> list[int]:
    """Record the request files in the gradebook; a file recorded before is skipped.

    Args:
        course: the course (:class:`~coursepkg.grading.classroom.gradebook.Course`: its
            ``url`` and ``gradebook()``).
        files: the request files the students sent.

    Returns:
        The ids of the requests (new or already there), in the files' order.

    Raises:
        ValueError: a file that is not a request, or names no graded part of a submission.
    """
    from sqlalchemy import insert, select

    _, table, _ = _tables()
    ids = []
    engine = _engine(course.url)
    try:
        for path in files:
            try:
                data = json.loads(Path(path).read_text(encoding="utf-8"))
                assert data.get("kind") == KIND
                fields = {k: str(data[k]) for k in ("id", "assignment", "student", "part")}
                reason = str(data["reason"]).strip()
                when = datetime.datetime.fromisoformat(data["requested_at"])
            except (OSError, ValueError, KeyError, AssertionError, TypeError) as err:
                raise ValueError(
                    f"{path} is not a regrade request file (expected the JSON that `coursepkg "
                    f"regrade request` writes): {err or type(err).__name__}"
                ) from err
            if not reason:
                raise ValueError(f"{path}: the request gives no reason")
            with course.gradebook() as gb:
                _part(gb, fields["assignment"], fields["student"], fields["part"])
            with engine.begin() as conn:
                found = conn.execute(select(table.c.id).where(table.c.uid == fields["id"]))
                known = found.scalar()
                if known is None:
                    row = dict(
                        uid=fields["id"],
                        assignment=fields["assignment"],
                        student=fields["student"],
                        part=fields["part"],
                        reason=reason,
                        requested_at=when.replace(tzinfo=None),
                        status="open",
                    )
                    known = conn.execute(insert(table).values(**row)).inserted_primary_key[0]
            ids.append(int(known))
    finally:
        engine.dispose()
    return ids


def requests(url: str, assignment: str | None = None, student: str | None = None) -> list[Request]:
    """Every request (optionally of one assignment or student) with its trail, oldest first.
    An empty list when the gradebook has never had one."""
    from sqlalchemy import inspect, select

    _, table, log = _tables()
    engine = _engine(url, create=False)
    try:
        if not inspect(engine).has_table(table.name):
            return []
        query = select(table).order_by(table.c.id)
        if assignment:
            query = query.where(table.c.assignment == assignment)
        if student:
            query = query.where(table.c.student == student)
        with engine.connect() as conn:
            found = [
                Request(
                    r.id, r.assignment, r.student, r.part, r.reason, r.requested_at, r.status, []
                )
                for r in conn.execute(query)
            ]
            for entry in conn.execute(select(log).order_by(log.c.id)):
                for r in found:
                    if r.id == entry.request_id:
                        r.log.append(
                            {
                                "who": entry.who,
                                "at": f"{entry.at:%Y-%m-%d %H:%M} UTC",
                                "old": entry.old_score,
                                "new": entry.new_score,
                                "why": entry.why,
                            }
                        )
    finally:
        engine.dispose()
    return found


def store_requests(url: str, assignment: str, student: str, found: list[Request]) -> None:
    """Make the gradebook at ``url`` hold exactly ``found`` as ``student``'s requests on
    ``assignment``, with their ids and trails: how a grading worker's private gradebook learns
    what the course's holds (:func:`requests` there), so that its feedback and
    :func:`reapply` read the same requests."""
    from sqlalchemy import delete, insert, select

    _, table, log = _tables()
    engine = _engine(url)
    try:
        with engine.begin() as conn:
            mine = select(table.c.id).where(
                (table.c.assignment == assignment) & (table.c.student == student)
            )
            old = [row.id for row in conn.execute(mine)] + [r.id for r in found]
            conn.execute(delete(log).where(log.c.request_id.in_(old)))
            conn.execute(delete(table).where(table.c.id.in_(old)))
            for r in found:
                conn.execute(
                    insert(table).values(
                        id=r.id,
                        uid=f"copy-{r.id}",
                        assignment=r.assignment,
                        student=r.student,
                        part=r.part,
                        reason=r.reason,
                        requested_at=r.requested_at,
                        status=r.status,
                    )
                )
                for e in r.log:
                    at = datetime.datetime.strptime(e["at"], "%Y-%m-%d %H:%M UTC")
                    conn.execute(
                        insert(log).values(
                            request_id=r.id,
                            who=e["who"],
                            at=at,
                            old_score=e["old"],
                            new_score=e["new"],
                            why=e["why"],
                        )
                    )
    finally:
        engine.dispose()


def record_answer(
    course: Any, request_id: int, *, why: str, who: str, score: float | None = None
) -> tuple[str, str]:
    """Record the answer to a request: a new score for its part (None: a comment only) as
    nbgrader's manual score, and who, when, the old and new scores and why in the trail.

    Returns:
        The request's assignment and student (whose feedback and reports then change).

    Raises:
        ValueError: no such request, no reason given, a score outside the part's range.
    """
    from sqlalchemy import insert, select, update

    if not why.strip():
        raise ValueError("an answer needs a reason (--why): it goes into the audit trail")
    _, table, log = _tables()
    engine = _engine(course.url)
    try:
        with engine.connect() as conn:
            row = conn.execute(select(table).where(table.c.id == request_id)).first()
        if row is None:
            raise ValueError(
                f"there is no regrade request {request_id} (see `coursepkg regrade list`)"
            )
        with course.gradebook() as gb:
            grade = _part(gb, row.assignment, row.student, row.part)
            old = float(grade.score or 0.0)  # a part never graded counts 0
            if score is not None:
                if not 0 <= score <= grade.max_score:
                    raise ValueError(
                        f"--score must be between 0 and {grade.max_score:g} (the points of "
                        f"{row.part}), got {score:g}"
                    )
                grade.manual_score, grade.needs_manual_grade = score, False
                gb.db.commit()
                # the penalty is a share of the points: it follows the new score
                reassess_penalties(course.config, gb, row.assignment, [row.student])
        with engine.begin() as conn:
            conn.execute(
                insert(log).values(
                    request_id=request_id,
                    who=who,
                    at=_now(),
                    old_score=old,
                    new_score=score,
                    why=why.strip(),
                )
            )
            conn.execute(update(table).where(table.c.id == request_id).values(status="answered"))
    finally:
        engine.dispose()
    return row.assignment, row.student


def reapply(course: Any, assignment: str, student: str) -> bool:
    """After ``coursepkg grade`` recorded ``student`` again: put each answered request's last
    score back as nbgrader's manual score (a rerun would otherwise flag it for grading again).

    Returns:
        Whether the student has any request (their feedback then has to show it).
    """
    found = requests(course.url, assignment, student)
    if not found:
        return False
    with course.gradebook() as gb:
        for r in found:
            scores = [e["new"] for e in r.log if e["new"] is not None]  # not the comments
            if scores:
                grade = _part(gb, assignment, student, r.part)
                grade.manual_score, grade.needs_manual_grade = scores[-1], False
        gb.db.commit()
    return True


#: What the reason's box does as the student types: the request file its link downloads (the
#: link's own data URL, UTF-8 JSON in base64) gets the reason.
_FILL_REASON = (
    "var a=this.parentNode.querySelector('a');var h=a.getAttribute('href').split(',');"
    "var d=JSON.parse(decodeURIComponent(escape(atob(h[1]))));d.reason=this.value.trim();"
    "a.setAttribute('href',h[0]+','+btoa(unescape(encodeURIComponent(JSON.stringify(d)))));"
)


def _request_link(assignment: str, student: str, part: str) -> str:
    """A box for the reason and an HTML link that downloads a request file for ``part``: what
    is typed in the box becomes the file's reason (without JavaScript the reason is left empty,
    to write in the file)."""
    import base64
    import html

    data = {**request_file(assignment, student, part, "-"), "reason": ""}
    packed = base64.b64encode(json.dumps(data, separators=(",", ":")).encode()).decode()
    href = "data:application/json;base64," + packed
    name = f"regrade-{student}-{assignment}-{part}.json"  # two students' files never collide
    box = (
        f'<textarea class="regrade-reason" rows="2" cols="60" aria-label="your reason for '
        f'{html.escape(part)}" placeholder="Why this part deserves another look" '
        f'oninput="{html.escape(_FILL_REASON)}"></textarea>'
    )
    link = f'<a download="{html.escape(name)}" href="{html.escape(href)}">{html.escape(part)}</a>'
    return f'<span class="regrade-request">{box} {link}</span>'


def feedback_text(found: list[Request], assignment: str, student: str, parts: list[str]) -> str:
    """The feedback's section on regrades: each request with its answer, then how to ask."""
    lines = [REGRADE_MARK, ""]
    for r in found:
        asked = f"- `{r.part}`, asked {r.requested_at:%Y-%m-%d %H:%M} UTC: \u201c{r.reason}\u201d "
        if not r.log:
            lines.append(asked + "(not answered yet).")
            continue
        last = r.log[-1]
        change = (
            f"score unchanged ({last['old']:g})"
            if last["new"] is None
            else f"score {last['old']:g} \u2192 {last['new']:g}"
        )
        lines.append(asked + f"Answered by {last['who']} on {last['at']}: {change}. {last['why']}")
    lines += [
        "" if found else "You have asked for no regrade of this assignment.",
        "",
        "To ask for a regrade of one part, write your reason in the box beside it below, click "
        "the part's name to download its request file, and send that file to your instructor "
        "(or run `coursepkg regrade request "
        f'{assignment} PART --student {student} --reason "..."`, which writes the same file):',
        "",
        *(f"- {_request_link(assignment, student, p)}" for p in parts),
    ]
    return "\n".join(lines)


class RegradeNote(NbGraderPreprocessor):
    """Add the regrade section (:func:`feedback_text`) at the end of the feedback."""

    # nbconvert hands every preprocessor its display_data_priority setting; declared as a
    # setting here (nbgrader's base has it as a plain trait), it is taken without a warning.
    display_data_priority = List(NbGraderPreprocessor().display_data_priority).tag(config=True)
    answered_by = Unicode(
        "",
        help="the name regrade answers are signed with (`coursepkg regrade answer`'s --by "
        "default), as students read it in their feedback; empty: the instructor's login",
    ).tag(config=True)

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        import nbformat

        info = resources.get("nbgrader", {})
        if not {"db_url", "assignment", "student"} <= set(info):
            return nb, resources
        parts = [
            c.metadata["nbgrader"]["grade_id"]
            for c in nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("grade")
        ]
        found = requests(info["db_url"], info["assignment"], info["student"])
        text = feedback_text(found, info["assignment"], info["student"], parts)
        nb.cells.append(nbformat.v4.new_markdown_cell(text))
        return nb, resources
