"""What a Dask worker of ``coursepkg grade``, and its main process, import before grading.

Dask unpickles the grading task (:func:`coursepkg.grading.classroom.worker.grade`) and its
plugin in each worker process, importing ``coursepkg.grading.classroom.worker`` and its package.
The notebooks run in kernels forked from the fork server, which imports torch for them; the
worker itself only drives nbgrader, so it must not import torch (~2 s of CPU in each worker of
every ``coursepkg grade``), as it did through the package's reports and dashboard.
The main process starts the cluster before it imports torch and the checks: the reports and the
dashboard need them only at the end, and it loads them in a thread while the workers grade
(``reports.load_checks``; ~2.5 s of one core at the start of every run before).
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


MAIN_PROBE = """
import sys
from coursepkg.grading.classroom import grade_class, build_dashboard, review_flags
heavy = sorted(m for m in ("torch", "matplotlib") if m in sys.modules)
print(",".join(heavy) or "none")
from coursepkg.grading.classroom.reports import diagnoses_in, checker_failure_flag
named = diagnoses_in("x (known mistake: sdpa.no_scaling) y")
print([d["id"] for d in named], "torch" in sys.modules)
print(checker_failure_flag("test_x", "the checker itself failed: KeyError"))
"""


def test_the_main_process_loads_the_checks_on_first_use_only():
    out = subprocess.run(
        [sys.executable, "-c", MAIN_PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    before, named, flag = out.stdout.strip().splitlines()
    assert before == "none", out.stdout + out.stderr
    assert named == "['sdpa.no_scaling'] True"
    assert flag == "the checker itself failed on test_x: grade that cell by hand"


def test_loading_ahead_in_a_thread_leaves_the_reports_the_same():
    import threading

    from coursepkg.grading.classroom.reports import diagnoses_in, load_checks

    thread = threading.Thread(target=load_checks)
    thread.start()
    thread.join()
    load_checks()  # again: nothing changes
    assert [d["id"] for d in diagnoses_in("(known mistake: sdpa.no_scaling)")] == [
        "sdpa.no_scaling"
    ]


def test_the_package_names_resolve_to_their_homes():
    import coursepkg.grading.classroom as classroom
    from coursepkg.grading.classroom import dashboard, orchestrate, reports

    assert classroom.build_dashboard is dashboard.build_dashboard
    assert classroom.grade_class is orchestrate.grade_class
    assert classroom.review_flags is reports.review_flags
    assert set(classroom.__all__) == set(classroom._HOMES)
    with pytest.raises(AttributeError, match="no_such_name"):
        classroom.no_such_name  # noqa: B018
