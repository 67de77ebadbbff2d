"""The book build's watch over page execution (``book/_ext/execution_watchdog.py``): a cell that
makes no progress (no message, no CPU) is stopped within the stall window, the page runs again in
a new kernel, and a second stall fails it naming the page and the cell; a cell that computes
silently for longer than the window is left alone."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "book" / "_ext"))
import execution_watchdog as watchdog  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
STALL = 6.0  # seconds: the window these tests use (the build's default is 150)


def _notebook(*cells: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    spec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["kernelspec"] = spec
    return nb


@pytest.fixture(autouse=True)
def _short_window(monkeypatch):
    monkeypatch.setattr(watchdog, "STALL_SECONDS", STALL)


def test_a_page_that_stalls_twice_fails_naming_its_cell(tmp_path, capfd):
    nb = _notebook("x = 1", "import time\ntime.sleep(600)  # idle: no output, no CPU")
    token = watchdog._page.set("book/demo.md")
    try:
        result = watchdog.watched_execution(nb, str(tmp_path), timeout=900, allow_errors=False)
    finally:
        watchdog._page.reset(token)
    assert isinstance(result.err, watchdog.PageStalled)
    assert "book/demo.md: cell 1 made no progress" in str(result.err)
    assert "time.sleep(600)" in str(result.err)
    assert result.time < 120  # two windows and two kernel starts, far from the cell's 900 s
    err = capfd.readouterr().err
    assert "executing the page again in a new kernel" in err and "stalled twice" in err


def test_a_page_that_stalls_once_is_executed_again_and_succeeds(tmp_path):
    flag = tmp_path / "stalled-once"
    nb = _notebook(
        "import os, time\n"
        f"if not os.path.exists({str(flag)!r}):\n"
        f"    open({str(flag)!r}, 'w').close()\n"
        "    time.sleep(600)",
        "print('second cell ran')",
    )
    result = watchdog.watched_execution(nb, str(tmp_path), timeout=900, allow_errors=False)
    assert result.err is None, result.exc_string
    assert flag.exists()
    assert nb.cells[1].outputs[0]["text"] == "second cell ran\n"


def test_silent_work_longer_than_the_window_is_not_a_stall(tmp_path):
    nb = _notebook(
        "import time\nstart = time.process_time()\n"
        f"while time.process_time() - start < {2.5 * STALL}:\n    pass",
        "import subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', 'import time\\nt=time.process_time()\\n"
        f"while time.process_time() - t < {1.5 * STALL}: pass'], check=True)",
        "print('done')",
    )
    result = watchdog.watched_execution(nb, str(tmp_path), timeout=900, allow_errors=False)
    assert result.err is None, result.exc_string
    assert nb.cells[2].outputs[0]["text"] == "done\n"


def test_a_cell_error_is_the_pages_own_and_not_retried(tmp_path, capfd):
    nb = _notebook("raise ValueError('a real error in the page')")
    result = watchdog.watched_execution(nb, str(tmp_path), timeout=900, allow_errors=False)
    assert type(result.err).__name__ == "CellExecutionError"
    assert "a real error in the page" in str(result.err)
    assert "again in a new kernel" not in capfd.readouterr().err
