"""The late-penalty policy (:class:`coursepkg.grading.policy.late.LatePolicy`).

Its arithmetic, as properties: nothing within the grace period or an extension, a started day
counts whole, the penalty never decreases with lateness and never passes the cap. Due dates are
read only as ISO 8601 with a zone (the forms once misread are refused, with the reason), and the
grade summary states the final mean, the late count and the points off. The graded class with
made-up timestamps is in ``test_course.py``.
"""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from traitlets.config import Config

from coursepkg.grading.classroom.reports import ClassResult, StudentResult
from coursepkg.grading.policy.late import (
    LatePolicy,
    check_due_dates,
    course_zone,
    in_course_time,
    parse_due_date,
)

DAY = 86400.0


def _policy(**fields) -> LatePolicy:
    config = Config()
    for name, value in fields.items():
        setattr(config.LatePolicy, name, value)
    return LatePolicy(config=config)


POLICY = dict(
    grace_minutes=15,
    percent_per_day=10,
    max_percent=50,
    extensions={"alice": 48, "ex06_training": {"bob": 24}},
)


@pytest.mark.parametrize(
    ("assignment", "student", "seconds", "percent"),
    [
        ("ex01", "carol", 0, 0),
        ("ex01", "carol", 15 * 60, 0),  # the grace period, to the second
        ("ex01", "carol", 15 * 60 + 1, 10),  # one started day
        ("ex01", "carol", DAY, 10),
        ("ex01", "carol", DAY + 1, 20),
        ("ex01", "carol", 30 * DAY, 50),  # the cap
        ("ex01", "alice", 47 * 3600, 0),  # within her 48 h extension, for every assignment
        ("ex01", "alice", 48 * 3600 + 16 * 60, 10),
        ("ex06_training", "bob", 20 * 3600, 0),  # his extension for ex06 only
        ("ex01", "bob", 20 * 3600, 10),
    ],
)
def test_the_policy_on_chosen_cases(assignment, student, seconds, percent):
    assert _policy(**POLICY).percent(assignment, student, seconds) == percent


@given(
    a=st.floats(0, 40 * DAY),
    b=st.floats(0, 40 * DAY),
    per_day=st.floats(0, 60),
    cap=st.floats(0, 100),
    grace=st.floats(0, 600),
    score=st.floats(0, 100),
)
def test_the_penalty_grows_with_lateness_up_to_the_cap(a, b, per_day, cap, grace, score):
    policy = _policy(percent_per_day=per_day, max_percent=cap, grace_minutes=grace)
    early, late = sorted((a, b))
    assert policy.percent("ex", "s", early) <= policy.percent("ex", "s", late) <= cap
    penalty = policy.late_submission_penalty("s", score, late)
    assert 0 <= penalty <= score * cap / 100 + 1e-9
    if late <= 60 * grace:
        assert penalty == 0


def test_an_impossible_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="max_percent <= 100"):
        _policy(max_percent=150).late_submission_penalty("s", 1.0, DAY)


@pytest.mark.parametrize(
    ("text", "utc"),
    [
        ("2026-11-20 17:00:00 UTC", "2026-11-20 17:00:00"),  # the old configs' form still works
        ("2026-12-01 17:00 Europe/Berlin", "2026-12-01 16:00:00"),  # winter: UTC+1
        ("2026-07-01 17:00 Europe/Berlin", "2026-07-01 15:00:00"),  # summer: UTC+2
        ("2026-12-01T17:00+01:00", "2026-12-01 16:00:00"),
        ("2026-12-01T17:00Z", "2026-12-01 17:00:00"),
        ("2026-12-01 09:30 -0530", "2026-12-01 15:00:00"),
    ],
)
def test_a_due_date_with_its_zone_is_read_in_utc(text, utc):
    assert parse_due_date(text) == datetime.datetime.fromisoformat(utc)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("01/12/2026 17:00", "year, month, day"),  # day-first: once read as 12 January
        ("2026-11-31 17:00 UTC", "day is out of range for month"),  # the parser's own reason
        ("2026-12-01 17:00 CET", "abbreviation"),  # once dropped, read as UTC
        ("2026-12-01 17:00", "names no time zone"),
        ("17:00 UTC", "YYYY-MM-DD HH:MM"),  # once: today
        ("2026-12-01", "YYYY-MM-DD HH:MM"),  # once: midnight
        ("2026-12-01 17:00 Europe/Berln", "not a time zone known"),
        ("2026-12-01 17:00 +25:00", "out of range"),
    ],
)
def test_an_unclear_due_date_is_refused_with_the_reason_and_what_to_write(text, reason):
    with pytest.raises(ValueError) as err:
        parse_due_date(text, "LatePolicy.due_dates['ex01']")
    message = str(err.value)
    assert reason in message and repr(text) in message
    assert "LatePolicy.due_dates['ex01']" in message and "2026-12-01 17:00 Europe/Berlin" in message


def test_every_due_date_of_the_config_is_checked_and_an_empty_one_means_none():
    config = Config()
    config.LatePolicy.due_dates = {"ex01": "2026-11-20 17:00 UTC", "ex02": ""}
    assert check_due_dates(config) == {"ex01": datetime.datetime(2026, 11, 20, 17)}
    config.LatePolicy.due_dates = {"ex01": "2026-11-20 17:00 UTC", "ex02": "01/12/2026 17:00"}
    with pytest.raises(ValueError, match=r"due_dates\['ex02'\]"):
        check_due_dates(config)
    aware = datetime.datetime(
        2026, 11, 20, 18, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
    )
    assert parse_due_date(aware) == datetime.datetime(2026, 11, 20, 17)
    with pytest.raises(ValueError, match="no time zone"):
        parse_due_date(datetime.datetime(2026, 11, 20, 17))


def _class(*students: tuple[float, float]) -> ClassResult:
    """A graded class of 13-point submissions: (points, late penalty) per student."""
    return ClassResult(
        assignment="ex01",
        students=[
            StudentResult(f"s{i}", score=p, max_score=13, penalty=off, late=off > 0)
            for i, (p, off) in enumerate(students)
        ],
        due="2026-11-24 17:00 UTC",
    )


def test_the_summary_gives_the_final_mean_with_the_penalty_on_the_exports_scale():
    summary = _class((11, 0), (3, 0), (0, 0), (13, 2.6), (11, 0)).summary()
    assert "mean final score 7.08/13 (raw 7.60; 1 late, -2.6)" in summary
    assert "late policy: ex01 due 2026-11-24 17:00 UTC; 1 of 5 late, 2.6 point(s) off" in summary
    assert "WARNING" not in summary
    on_time = _class((11, 0), (3, 0)).summary()
    assert "mean final score 7.00/13," in on_time and "0 of 2 late" in on_time


def test_the_summary_warns_when_more_than_half_the_class_is_late():
    summary = _class((10, 5), (8, 4), (6, 0)).summary()
    assert "WARNING: 2 of 3 students are late, more than half the class" in summary
    assert "WARNING" not in _class((10, 5), (8, 0)).summary()  # half is not more than half


def test_students_graded_again_alone_raise_no_class_warning():
    subset = _class((10, 5))
    subset.subset = True  # coursepkg grade --student dave
    summary = subset.summary()
    assert "1 of 1 graded now late, 5 point(s) off" in summary and "WARNING" not in summary


@pytest.mark.parametrize(
    ("text", "jump"),
    [("2026-03-29 02:30 Europe/Berlin", "03:30"), ("2026-03-08 02:00 America/New_York", "03:00")],
)
def test_a_local_time_the_clocks_skip_is_refused(text, jump):
    with pytest.raises(ValueError, match=f"does not exist in .* jump from before it to {jump}"):
        parse_due_date(text)
    parse_due_date(text.replace("02:", "03:"))  # an hour later exists


def test_times_are_shown_in_the_courses_zone_beside_utc():
    config = Config()
    config.LatePolicy.due_dates = {
        "ex01": "2026-11-29 12:00 Europe/Berlin",
        "ex02": "2026-11-29 12:00 UTC",
        "ex03": "2026-11-29T23:30+01:00",
    }
    due = datetime.datetime(2026, 11, 29, 11, 0)
    assert in_course_time(due, course_zone(config, "ex01")) == (
        "2026-11-29 11:00 UTC (12:00 Europe/Berlin)"
    )
    assert in_course_time(due, course_zone(config, "ex02")) == "2026-11-29 11:00 UTC"
    late = datetime.datetime(2026, 11, 29, 23, 30)
    assert in_course_time(late, course_zone(config, "ex03")) == (
        "2026-11-29 23:30 UTC (2026-11-30 00:30 UTC+0100)"
    )
    assert course_zone(config, "ex04") is None
