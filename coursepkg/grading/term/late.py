"""An alias of :mod:`coursepkg.grading.policy.late`, kept for one term.

The late policy lived here until its move below the class grader. A course's
``nbgrader_config.py`` written before it names the classes by this dotted path
(``c.AssignLatePenalties.plugin_class = "coursepkg.grading.term.late.LatePolicy"``,
``"coursepkg.grading.term.late.LateNote"`` in ``c.GenerateFeedback.preprocessors``); these
names are the very same classes, so such a course grades as before. New configurations name
``coursepkg.grading.policy.late``.
"""

from __future__ import annotations

from ..policy.late import (
    LateNote,
    LatePolicy,
    apply_due_date,
    check_due_dates,
    describe_lateness,
    parse_due_date,
)

__all__ = [
    "LateNote",
    "LatePolicy",
    "apply_due_date",
    "check_due_dates",
    "describe_lateness",
    "parse_due_date",
]
