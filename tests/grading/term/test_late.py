"""The late-penalty policy (:class:`coursepkg.grading.term.late.LatePolicy`).

Its arithmetic, as properties: nothing within the grace period or an extension, a started day
counts whole, the penalty never decreases with lateness and never passes the cap. The graded
class with made-up timestamps is in ``test_term_course.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from traitlets.config import Config

from coursepkg.grading.term.late import LatePolicy

DAY = 86400.0


def _policy(**fields) -> LatePolicy:
    config = Config()
    for name, value in fields.items():
        setattr(config.LatePolicy, name, value)
    return LatePolicy(config=config)


POLICY = dict(grace_minutes=15, percent_per_day=10, max_percent=50,
              extensions={"alice": 48, "ex06_training": {"bob": 24}})  # fmt: skip


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
