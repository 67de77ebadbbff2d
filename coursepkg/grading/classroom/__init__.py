"""Autograde a whole class with nbgrader on Dask distributed: ``coursepkg grade``.

Everything a grade depends on is nbgrader's own work, through its Python API. The pieces:

* :mod:`.orchestrate` -- :func:`grade_class`: the client; checks the gradebook and the cluster,
  ships the jobs, records the answers, writes the reports.
* :mod:`.protocol` -- the typed messages between client and workers.
* :mod:`.limits` -- :class:`GradeLimits`: each kernel's limits, settable in ``nbgrader_config.py``.
* :mod:`.worker` -- what runs on each Dask worker: a private nbgrader course, the fork server
  and sandbox kernels of :mod:`coursepkg.grading.kernel`.
* :mod:`.gradebook` -- the client's side of the gradebook (SQLite or PostgreSQL).
* :mod:`.preprocessors` -- the grader's notes and two workarounds, inside nbgrader.
* :mod:`.reports` and :mod:`.dashboard` -- results, JSON reports, the misconception dashboard.
"""

from ..kernel import skip_iri_grammar

skip_iri_grammar()  # before nbformat and nbgrader are imported (see its docstring)

from .dashboard import build_dashboard  # noqa: E402
from .limits import GradeLimits  # noqa: E402
from .orchestrate import grade_class  # noqa: E402
from .preprocessors import DefuseHiddenMarkers, DropEmptyMetadata, GraderNotes  # noqa: E402
from .reports import (  # noqa: E402
    ClassResult,
    StudentResult,
    checker_failure_flag,
    review_flags,
    sandbox_summary,
)

__all__ = [
    "ClassResult",
    "DefuseHiddenMarkers",
    "DropEmptyMetadata",
    "GradeLimits",
    "GraderNotes",
    "StudentResult",
    "build_dashboard",
    "checker_failure_flag",
    "grade_class",
    "review_flags",
    "sandbox_summary",
]
