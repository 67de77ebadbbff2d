"""The late-penalty policy, set in ``nbgrader_config.py`` and applied by ``coursepkg grade``.

It is an nbgrader late-submission plugin (nbgrader's ``AssignLatePenalties`` calls it for each
notebook, from the submission's timestamp and the assignment's due date in the gradebook), so
``nbgrader autograde`` applies the same policy::

    c.AssignLatePenalties.plugin_class = "coursepkg.grading.policy.late.LatePolicy"
    c.LatePolicy.due_dates = {"ex01_attention": "2026-11-20 17:00:00 UTC"}
    c.LatePolicy.grace_minutes = 15        # forgiven entirely if no later than this
    c.LatePolicy.percent_per_day = 10      # of the points earned, per started day late
    c.LatePolicy.max_percent = 50          # the penalty's cap
    c.LatePolicy.extensions = {"alice": 48, "ex06_training": {"bob": 24}}  # hours
    # private ones: extensions.csv in the course folder (ignored by git), written by
    # `coursepkg extension grant bob 24 --assignment ex06_training`: see .extensions

A submission is late by the time between the due date (plus any extension: the policy's, and
one granted in nbgrader's gradebook) and its timestamp (``timestamp.txt``, written by
``nbgrader collect``/``submit``). Within the grace period it costs nothing; beyond it, each day
counts from the due date, a started day as a whole one (as Canvas's automatic late policy
counts), and the penalty is that many times ``percent_per_day`` of the points earned in the
notebook, at most ``max_percent``. The feedback says so (:class:`LateNote`), and nbgrader's
score, the one ``coursepkg export`` writes, is the points less the penalty.

A course configured before the policies moved here names ``coursepkg.grading.term.late``
instead; that module is an alias of this one.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

from nbgrader.plugins import LateSubmissionPlugin
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Dict, Float, List, Unicode

from .extensions import EXTENSIONS_FILE, extensions_path, read_extensions

__all__ = [
    "LateNote",
    "LatePolicy",
    "ReassessPenalty",
    "apply_due_date",
    "check_due_dates",
    "course_zone",
    "describe_lateness",
    "final_score",
    "in_course_time",
    "parse_due_date",
    "reassess_penalties",
    "seconds_late",
]

LATE_MARK = "**Late submission** (coursepkg grade)"


class LatePolicy(LateSubmissionPlugin):
    """Grace period, percent per started day late, a cap, per-student extensions."""

    grace_minutes = Float(0.0, help="minutes after the due date that cost nothing").tag(config=True)
    percent_per_day = Float(0.0, help="percent of the points earned lost per started day").tag(
        config=True
    )
    max_percent = Float(100.0, help="the most a late submission can lose, in percent").tag(
        config=True
    )
    extensions = Dict(
        help="extensions in hours: {student: hours} for every assignment, or {assignment: "
        "{student: hours}} for one (the assignment's entry wins)"
    ).tag(config=True)
    extensions_file = Unicode(
        EXTENSIONS_FILE,
        help="the course's private extensions (student, assignment, hours, note), relative to "
        "the course folder and ignored by git; its entries win over `extensions`'",
    ).tag(config=True)
    due_dates = Dict(
        help="{assignment: due date}, ISO 8601 with a zone: '2026-11-20 17:00 UTC', "
        "'2026-11-20 17:00 Europe/Berlin' or '2026-11-20T17:00+01:00'; written into the "
        "gradebook by coursepkg grade (else the gradebook's due date is used)"
    ).tag(config=True)

    def extension_hours(self, assignment: str | None, student: str) -> float:
        """The policy's extension of ``student`` for ``assignment``, in hours: the extensions
        file's (:mod:`.extensions`) or else the ``extensions`` setting's, an assignment's own
        entry before one for every assignment."""
        private = read_extensions(extensions_path(self.config, self.extensions_file))
        for table in (private, self.extensions):
            per_assignment = table.get(assignment)
            if isinstance(per_assignment, dict) and student in per_assignment:
                return float(per_assignment[student])
        for table in (private, self.extensions):
            value = table.get(student)
            if isinstance(value, int | float):
                return float(value)
        return 0.0

    def days_late(self, assignment: str | None, student: str, seconds_late: float) -> int:
        """Started days late after the extension, or 0 within the grace period."""
        seconds = seconds_late - 3600 * self.extension_hours(assignment, student)
        if seconds <= 60 * self.grace_minutes:
            return 0
        return math.ceil(seconds / 86400)

    def percent(self, assignment: str | None, student: str, seconds_late: float) -> float:
        """The percent of the points earned that the lateness costs."""
        days = self.days_late(assignment, student, seconds_late)
        return min(self.max_percent, days * self.percent_per_day)

    def late_submission_penalty(
        self, student_id: str, score: float, total_seconds_late: float
    ) -> float:
        """nbgrader's hook: the points taken off one notebook's ``score``."""
        if not 0 <= self.max_percent <= 100 or self.percent_per_day < 0 or self.grace_minutes < 0:
            raise ValueError(
                "LatePolicy: expected 0 <= max_percent <= 100, percent_per_day >= 0 and "
                f"grace_minutes >= 0, got {self.max_percent}, {self.percent_per_day} and "
                f"{self.grace_minutes}"
            )
        assignment = getattr(self.parent, "assignment_id", None)
        return score * self.percent(assignment, student_id, total_seconds_late) / 100

    def describe(self) -> str:
        """The policy in one sentence, for the feedback."""
        grace = f"a grace period of {self.grace_minutes:g} minutes, then "
        grace = grace if self.grace_minutes else ""
        return (
            f"{grace}{self.percent_per_day:g}% of the points earned per started day late, at "
            f"most {self.max_percent:g}%"
        )


def final_score(submission: Any) -> float:
    """The one grade every page shows: the points (autograded, by hand, by a regrade answer)
    less the late penalty, never below 0.

    Args:
        submission: an nbgrader ``SubmittedAssignment`` whose penalty is current
            (:func:`reassess_penalties`).
    """
    return max(0.0, float(submission.score) - float(submission.late_submission_penalty or 0.0))


def reassess_penalties(
    config: Any, gb: Any, assignment: str, students: list[str] | None = None
) -> list[str]:
    """Compute each submitted notebook's late penalty again from its points now.

    nbgrader computes the penalty once, when ``autograde`` (or ``coursepkg grade``) records the
    autograder's points; a hand score saved in the formgrader or a regrade answer changes the
    points afterwards. The penalty is a function of the points, the submission's time, its due
    date and extension, and the policy (``AssignLatePenalties.plugin_class`` and its settings),
    so it is recomputed, as nbgrader's ``AssignLatePenalties`` would, wherever a grade is shown:
    at the end of ``coursepkg grade``, before the feedback (:class:`ReassessPenalty`), in
    ``coursepkg regrade answer`` and ``coursepkg export``.

    Args:
        config: the course's traitlets configuration (``nbgrader_config.py``).
        gb: the open nbgrader ``Gradebook``; changes are committed.
        assignment: the assignment id.
        students: only these students (None: every submission).

    Returns:
        The students whose penalty changed, sorted.
    """
    from nbgrader.preprocessors import AssignLatePenalties

    nbgrader_step = AssignLatePenalties(config=config)
    nbgrader_step.assignment_id = assignment  # what LatePolicy reads from its parent
    nbgrader_step.init_plugin()
    changed = set()
    for submission in gb.find_assignment(assignment).submissions:
        sid = submission.student.id
        if students is not None and sid not in students:
            continue
        late = submission.total_seconds_late
        for nb in submission.notebooks:
            new = None
            if late > 0:
                new = nbgrader_step.plugin_inst.late_submission_penalty(sid, nb.score, late)
                new = None if new is None else min(max(float(new), 0.0), float(nb.score))
            if (nb.late_submission_penalty or 0.0) != (new or 0.0):
                changed.add(sid)
            nb.late_submission_penalty = new
    gb.db.commit()
    return sorted(changed)


def seconds_late(config: Any, submission: Any) -> float:
    """How late a submission is by the course's rules: after its due date, the gradebook's
    extension and the policy's (:meth:`LatePolicy.extension_hours`, the extensions file too);
    0 when on time. The grace period is the policy's to forgive, not counted here.

    Args:
        config: the course's traitlets configuration (None: the gradebook's extension only).
        submission: an nbgrader ``SubmittedAssignment``.
    """
    late = float(submission.total_seconds_late or 0.0)
    plugin = config.get("AssignLatePenalties", {}).get("plugin_class") if config else None
    if late > 0 and plugin and str(plugin).endswith("LatePolicy"):
        hours = LatePolicy(config=config).extension_hours(
            submission.assignment.name, submission.student.id
        )
        late -= 3600 * hours
    return max(0.0, late)


def _span(seconds: float) -> str:
    days, rest = divmod(int(round(seconds)), 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    parts = [f"{days} day(s)"] if days else []
    return " ".join([*parts, f"{hours} h {minutes:02d} min"])


def describe_lateness(config: Any, submission: Any) -> str:
    """The feedback's note on a late submission (nbgrader ``SubmittedAssignment``), or ``""``
    when it was on time."""
    late = submission.total_seconds_late
    if late <= 0:
        return ""
    penalty = submission.late_submission_penalty or 0.0
    zone = course_zone(config, submission.assignment.name)
    lines = [
        f"{LATE_MARK}",
        "",
        f"- Handed in {in_course_time(submission.timestamp, zone)}, {_span(late)} after the due "
        f"date ({in_course_time(submission.duedate, zone)}"
        + (", with the extension granted in the gradebook" if submission.extension else "")
        + ").",
    ]
    plugin = config.AssignLatePenalties.get("plugin_class")
    if plugin and str(plugin).endswith("LatePolicy"):
        policy = LatePolicy(config=config)
        hours = policy.extension_hours(submission.assignment.name, submission.student.id)
        if hours:
            lines.append(f"- Your extension for this assignment: {hours:g} hours.")
        lines.append(f"- The course's policy: {policy.describe()}.")
    lines.append(
        f"- Penalty: {penalty:g} point(s) off (your score: {final_score(submission):g}"
        f" of {submission.max_score:g})."
    )
    return "\n".join(lines)


class LateNote(NbGraderPreprocessor):
    """Put the note on lateness (:func:`describe_lateness`) at the top of the feedback."""

    # nbconvert hands every preprocessor its display_data_priority setting; declared as a
    # setting here (nbgrader's base has it as a plain trait), it is taken without a warning.
    display_data_priority = List(NbGraderPreprocessor().display_data_priority).tag(config=True)

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        import nbformat
        from nbgrader.api import Gradebook, MissingEntry

        info = resources.get("nbgrader", {})
        try:
            with Gradebook(info["db_url"]) as gb:
                submission = gb.find_submission(info["assignment"], info["student"])
                text = describe_lateness(self.config, submission)
        except (KeyError, MissingEntry):
            text = ""
        if text:
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(text))
        return nb, resources


class ReassessPenalty(NbGraderPreprocessor):
    """Before the feedback is made: the student's late penalty computed again from their points
    now (:func:`reassess_penalties`), so that hand scores saved in the formgrader after
    grading count. Listed first, before nbgrader's ``GetGrades`` reads the scores."""

    display_data_priority = List(NbGraderPreprocessor().display_data_priority).tag(config=True)

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        from nbgrader.api import Gradebook, MissingEntry

        info = resources.get("nbgrader", {})
        try:
            with Gradebook(info["db_url"]) as gb:
                reassess_penalties(self.config, gb, info["assignment"], [info["student"]])
        except (KeyError, MissingEntry):
            pass
        return nb, resources


#: A due date: ISO 8601's date and time (``T`` or a space between), then the zone.
_DUE_DATE = re.compile(
    r"(?P<when>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)\s*(?P<zone>.*)"
)
_EXAMPLES = "'2026-12-01 17:00 UTC', '2026-12-01 17:00 Europe/Berlin' or '2026-12-01T17:00+01:00'"


def _zone(zone: str) -> datetime.tzinfo:
    """The zone a due date names: ``UTC``/``Z``, an offset, or an IANA name (Area/City)."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if zone in ("UTC", "Z"):
        return datetime.UTC
    offset = re.fullmatch(r"([+-])(\d{2}):?(\d{2})", zone)
    if offset:
        sign = 1 if offset[1] == "+" else -1
        hours, minutes = int(offset[2]), int(offset[3])
        if hours > 23 or minutes > 59:
            raise ValueError(f"the offset {zone} is out of range (at most +-23:59)")
        return datetime.timezone(sign * datetime.timedelta(hours=hours, minutes=minutes))
    if not zone:
        raise ValueError("it names no time zone, so the moment it ends is not known")
    if "/" not in zone:  # CET, EST, GMT, ...: abbreviations that are ambiguous or not zones
        raise ValueError(
            f"{zone!r} is an abbreviation, not a zone with its summer time rules (write UTC, an "
            "offset such as +01:00, or the IANA name such as Europe/Berlin)"
        )
    try:
        return ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise ValueError(f"{zone!r} is not a time zone known to this system ({err})") from None


def parse_due_date(value: Any, where: str = "the due date") -> datetime.datetime:
    """A due date, strictly: ISO 8601 ``YYYY-MM-DD HH:MM[:SS]`` with an explicit zone.

    Day-first or month-first dates (``01/12/2026``), a time alone, a date alone and zone
    abbreviations (``CET``) are refused: each was once read silently as something else.

    Args:
        value: the text (``'2026-12-01 17:00 Europe/Berlin'``, ``'2026-12-01 17:00 UTC'``,
            ``'2026-12-01T17:00+01:00'``), or a :class:`datetime.datetime` with a zone.
        where: what the value is, for the error (``LatePolicy.due_dates['ex01']``).

    Returns:
        The moment in UTC, without a zone (as nbgrader's gradebook keeps it).

    Raises:
        ValueError: naming ``where``, the value, the parser's reason and what to write.
    """
    try:
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None or value.utcoffset() is None:
                raise ValueError("the datetime has no time zone")
            when = value
        elif not isinstance(value, str):
            raise ValueError(f"it is a {type(value).__name__}, not a text")
        else:
            match = _DUE_DATE.fullmatch(value.strip())
            if not match:
                raise ValueError(
                    "it is not ISO 8601's YYYY-MM-DD HH:MM (year, month, day: 2026-12-01 is "
                    "1 December) followed by a zone"
                )
            naive = datetime.datetime.fromisoformat(match["when"])  # its own reason: no 31 Nov
            when = naive.replace(tzinfo=_zone(match["zone"].strip()))
            there = when.astimezone(datetime.UTC).astimezone(when.tzinfo).replace(tzinfo=None)
            if there != naive:  # the clocks jumped over it (summer time begins)
                raise ValueError(
                    f"{naive:%Y-%m-%d %H:%M} does not exist in {match['zone'].strip()}: the "
                    f"clocks jump from before it to {there:%H:%M} that night"
                )
    except ValueError as err:
        raise ValueError(
            f"{where} must be an ISO 8601 date and time with a zone, such as {_EXAMPLES}; got "
            f"{value!r}: {err}"
        ) from None
    return when.astimezone(datetime.UTC).replace(tzinfo=None)


def course_zone(config: Any, assignment: str) -> datetime.tzinfo | None:
    """The zone ``LatePolicy.due_dates`` gives ``assignment``'s due date in (None: none, or
    UTC), to show times in the course's zone too."""
    due = (config.get("LatePolicy", {}).get("due_dates", {}) or {}).get(assignment)
    match = _DUE_DATE.fullmatch(due.strip()) if isinstance(due, str) else None
    if match is None or match["zone"].strip() in ("", "UTC", "Z"):
        return None
    try:
        return _zone(match["zone"].strip())
    except ValueError:
        return None


def in_course_time(when: datetime.datetime, zone: datetime.tzinfo | None) -> str:
    """A moment of the gradebook (UTC, without a zone) as ``2026-11-29 11:00 UTC``, followed by
    the course's local time when it has a zone: ``(12:00 Europe/Berlin)``, the date too when it
    differs."""
    text = f"{when:%Y-%m-%d %H:%M} UTC"
    if zone is None:
        return text
    local = when.replace(tzinfo=datetime.UTC).astimezone(zone)
    name = getattr(zone, "key", None) or local.strftime("UTC%z")
    day = "" if local.date() == when.date() else f"{local:%Y-%m-%d} "
    return f"{text} ({day}{local:%H:%M} {name})"


def check_due_dates(config: Any) -> dict[str, datetime.datetime]:
    """Every due date of the course's ``LatePolicy.due_dates``, checked before any grading.

    Args:
        config: the course's traitlets configuration (``nbgrader_config.py``).

    Returns:
        {assignment: due date in UTC, without a zone}.

    Raises:
        ValueError: the first date that :func:`parse_due_date` refuses, with its reason.
    """
    dates = config.get("LatePolicy", {}).get("due_dates", {}) or {}
    if not isinstance(dates, dict):
        raise ValueError(
            f"LatePolicy.due_dates must be a dict {{assignment: due date}}, got {dates!r}"
        )
    return {  # an empty entry means no due date, as it always did
        name: parse_due_date(due, f"LatePolicy.due_dates[{name!r}]")
        for name, due in dates.items()
        if due not in (None, "")
    }


def apply_due_date(course: Any, assignment: str) -> datetime.datetime | None:
    """Write the policy's due date of ``assignment`` (``LatePolicy.due_dates``) into the
    course's gradebook, where nbgrader and its formgrader read it. Nothing without one.

    The policy wins: a different due date in the gradebook (set in the formgrader's *Manage
    Assignments*) is replaced, and returned so that the summary says so.

    Returns:
        The gradebook's earlier due date when it differed (UTC, without a zone), else None.
    """
    from nbgrader.api import MissingEntry

    when = check_due_dates(course.config).get(assignment)
    if when is None:
        return None
    with course.gradebook() as gb:
        try:
            before = gb.find_assignment(assignment).duedate
        except MissingEntry:
            before = None
        gb.update_or_create_assignment(assignment, duedate=when)
    return before if before is not None and before != when else None
