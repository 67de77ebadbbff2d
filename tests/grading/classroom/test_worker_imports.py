"""What a Dask worker of ``coursepkg grade`` imports before it grades anyone.

Dask unpickles the grading task (:func:`coursepkg.grading.classroom.worker.grade`) and its
plugin in each worker process, importing ``coursepkg.grading.classroom.worker`` and its package.
The notebooks run in kernels forked from the fork server, which imports torch for them; the
worker itself only drives nbgrader, so it must not import torch (~2 s of CPU in each worker of
every ``coursepkg grade``), as it did through the package's reports and dashboard.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
import coursepkg.grading.classroom.worker as worker
from coursepkg.grading.classroom import GradeLimits  # a name of the package, resolved lazily
heavy = sorted(m for m in ("torch", "transformers", "matplotlib") if m in sys.modules)
print(",".join(heavy) or "none")
"""


def test_a_worker_imports_no_torch():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip() == "none", out.stdout + out.stderr


def test_the_package_names_resolve_to_their_homes():
    import coursepkg.grading.classroom as classroom
    from coursepkg.grading.classroom import dashboard, orchestrate, reports

    assert classroom.build_dashboard is dashboard.build_dashboard
    assert classroom.grade_class is orchestrate.grade_class
    assert classroom.review_flags is reports.review_flags
    assert set(classroom.__all__) == set(classroom._HOMES)
    with pytest.raises(AttributeError, match="no_such_name"):
        classroom.no_such_name  # noqa: B018
