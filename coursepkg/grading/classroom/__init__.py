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

from ..._lazy import lazy_attributes
from ..kernel import skip_iri_grammar

skip_iri_grammar()  # before nbformat and nbgrader are imported (see its docstring)

# Imported when first used (PEP 562), as coursepkg.grading's checks are: a Dask worker imports
# .worker (and so this package) but never the client's reports and dashboard, whose catalogue of
# mistakes imports every check and torch (~2 s of CPU in each worker of each `coursepkg grade`).
_HOMES = {
    "ClassResult": ".reports",
    "DefuseHiddenMarkers": ".preprocessors",
    "DropEmptyMetadata": ".preprocessors",
    "GradeLimits": ".limits",
    "GraderNotes": ".preprocessors",
    "StudentResult": ".reports",
    "build_dashboard": ".dashboard",
    "checker_failure_flag": ".reports",
    "grade_class": ".orchestrate",
    "review_flags": ".reports",
    "sandbox_summary": ".reports",
}

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


__getattr__ = lazy_attributes(__name__, _HOMES, globals())
