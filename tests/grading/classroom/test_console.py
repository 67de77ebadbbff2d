"""``coursepkg grade``'s console (:func:`coursepkg.grading.classroom.console.quiet_console`):
what other libraries and child processes write to stderr goes to the grader's log, while the
console keeps the progress bar and coursepkg's own warnings; stderr is itself again after."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from coursepkg.grading.classroom.console import quiet_console


def test_the_noise_goes_to_the_log_and_the_instructors_lines_to_the_console(tmp_path, capfd):
    log = tmp_path / "reports" / "ex01" / "grade.log"
    with quiet_console(log) as console:
        subprocess.run(
            [sys.executable, "-c", "import sys; sys.stderr.write('a worker said\\n')"], check=True
        )
        os.write(2, b"an SAWarning-like note\n")  # this process's own stderr (fd 2)
        logging.getLogger("distributed.nanny").warning("Closing Nanny")
        logging.getLogger("coursepkg.grading.classroom.gradebook").warning("recorded it")
        console.write("grading ex01: 100%\n")
    print("after", file=sys.stderr)
    shown = capfd.readouterr().err
    kept = log.read_text(encoding="utf-8")
    for noise in ("a worker said", "an SAWarning-like note", "Closing Nanny"):
        assert noise in kept and noise not in shown
    assert "coursepkg grade: recorded it" in shown and "recorded it" in kept
    assert "grading ex01: 100%" in shown and "after" in shown
    assert "after" not in kept


def test_without_a_log_nothing_is_hidden(capfd):
    with quiet_console(None) as console:
        subprocess.run(
            [sys.executable, "-c", "import sys; sys.stderr.write('shown\\n')"], check=True
        )
        assert console is sys.stderr
    assert "shown" in capfd.readouterr().err


def test_an_error_before_any_work_leaves_no_log_behind(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    log = course / "reports" / "ex01" / "grade.log"
    try:
        with quiet_console(log):
            os.write(2, b"could not reach the scheduler\n")
            raise ValueError("cannot reach the Dask scheduler")
    except ValueError:
        pass
    assert sorted(p.name for p in course.iterdir()) == []  # reports/ went with its log


def test_an_error_after_work_began_keeps_the_log(tmp_path):
    log = tmp_path / "reports" / "ex01" / "grade.log"
    try:
        with quiet_console(log):
            (log.parent / "s1.json").write_text("{}")  # a student's report: work was done
            os.write(2, b"a worker died\n")
            raise RuntimeError("stopped")
    except RuntimeError:
        pass
    assert "a worker died" in log.read_text(encoding="utf-8")
    # and a log that was already there (a rerun) is kept whatever happens
    try:
        with quiet_console(log):
            raise ValueError("bad due date")
    except ValueError:
        pass
    assert log.is_file()
