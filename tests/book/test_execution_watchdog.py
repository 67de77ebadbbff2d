"""The book build's watch over page execution (``book/_ext/execution_watchdog.py``): a cell that
makes no progress (no message, no CPU) is stopped within the stall window, the page runs again in
a new kernel, and a second stall fails it naming the page and the cell; a cell that computes
silently for longer than the window is left alone."""

from __future__ import annotations

import atexit
import json
import sys
from pathlib import Path

import nbformat
import pytest
from flaky_kernel import dying_kernelspec
from nbclient import NotebookClient

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
    # Where the kernel waited: its main thread's stack, down to the sleeping line of cell 1.
    stacks = str(result.err).split("the kernel's threads when it was stopped:\n", 1)[1]
    assert "Current thread" in stacks or "Thread 0x" in stacks, stacks
    assert "line 2 in <module>" in stacks, stacks


def test_a_page_that_stalls_once_is_executed_again_and_succeeds(tmp_path, monkeypatch):
    runs = tmp_path / "page_runs.jsonl"
    monkeypatch.setenv(watchdog.PAGE_RUNS, str(runs))
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
    # The record keeps the attempt given up apart: its seconds and why.
    (row,) = [json.loads(line) for line in runs.read_text().splitlines()]
    (given_up,) = row["given_up"]
    assert STALL <= given_up["seconds"] < row["seconds"], row
    assert "cell 0 made no progress" in given_up["why"], row
    assert row["succeeded"] is True


def test_the_stack_signal_leaves_the_pages_namespace_and_counts_alone(tmp_path):
    nb = _notebook("print(sorted(n for n in dir() if not n.startswith('_')))")
    client = watchdog.WatchedClient(
        nb, resources={"metadata": {"path": str(tmp_path)}}, config=watchdog.KERNEL_CONFIG
    )
    client.execute()
    assert not Path(client._stacks).exists()  # the file the stacks would go to is gone
    # IPython's own names only: the registration left none, and the first cell is cell 1.
    names = nb.cells[0].outputs[0]["text"]
    assert "faulthandler" not in names and "signal" not in names, names
    assert nb.cells[0].execution_count == 1


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


def test_kernels_talk_over_unix_sockets_not_tcp_ports(tmp_path):
    # Two readers start kernels at once: with TCP, two can be handed the same free port.
    nb = _notebook(
        "import json, ipykernel.connect as c\n"
        "print(json.loads(c.get_connection_info())['transport'])"
    )
    result = watchdog.watched_execution(nb, str(tmp_path), timeout=900, allow_errors=False)
    assert result.err is None, result.exc_string
    assert nb.cells[0].outputs[0]["text"] == "ipc\n"


def _kernel_dying_first(tmp_path, monkeypatch, times: int) -> tuple[nbformat.NotebookNode, Path]:
    """A notebook on a kernelspec whose process exits at once its first ``times`` starts, then
    is ipykernel; and the file counting its starts."""
    starts = dying_kernelspec(tmp_path / "share", times, name="dying")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share"))
    nb = _notebook("print('ran')")
    nb.metadata["kernelspec"] = {"name": "dying", "display_name": "dying", "language": "python"}
    return nb, starts


def test_a_kernel_that_dies_before_answering_is_started_once_more(tmp_path, monkeypatch, capfd):
    nb, starts = _kernel_dying_first(tmp_path, monkeypatch, times=1)
    token = watchdog._page.set("book/demo.md")
    try:
        result = watchdog.watched_execution(nb, str(tmp_path), timeout=900, allow_errors=False)
    finally:
        watchdog._page.reset(token)
    assert result.err is None, result.exc_string
    assert nb.cells[0].outputs[0]["text"] == "ran\n"
    assert starts.read_text() == "2"
    err = capfd.readouterr().err
    assert "book/demo.md: the kernel died before it answered" in err
    assert "starting the page again in a new kernel" in err


def test_a_kernel_that_never_answers_fails_the_page(tmp_path, monkeypatch):
    nb, starts = _kernel_dying_first(tmp_path, monkeypatch, times=5)
    registered, unregistered = [], []
    monkeypatch.setattr(atexit, "register", lambda f, *a, **k: registered.append(f) or f)
    monkeypatch.setattr(atexit, "unregister", unregistered.append)
    with pytest.raises(watchdog.KernelNeverAnswered, match="died before it answered"):
        watchdog.watched_execution(nb, str(tmp_path), timeout=900, allow_errors=False)
    assert starts.read_text() == "2"  # one retry, no more
    # nbclient's clean-up at exit of each client, which would fail again on its dead kernel and
    # print a bare AssertionError when the build ends, is taken off
    cleanups = [f for f in registered if isinstance(getattr(f, "__self__", None), NotebookClient)]
    assert len(cleanups) == 2, registered
    assert all(f in unregistered for f in cleanups), (cleanups, unregistered)


def test_each_execution_appends_its_page_and_time_when_asked(tmp_path, monkeypatch):
    runs = tmp_path / "page_runs.jsonl"
    pages = {"book/ok.md": "x = 1", "book/raises.md": "raise ValueError('on purpose')"}
    for page, code in pages.items():
        token = watchdog._page.set(page)
        try:
            if page == "book/ok.md":  # unset: nothing is recorded
                watchdog.watched_execution(_notebook(code), str(tmp_path), 900, False)
                assert not runs.exists()
                monkeypatch.setenv(watchdog.PAGE_RUNS, str(runs))
            result = watchdog.watched_execution(_notebook(code), str(tmp_path), 900, False)
        finally:
            watchdog._page.reset(token)
        assert (result.err is None) == (page == "book/ok.md"), result.exc_string
    rows = [json.loads(line) for line in runs.read_text().splitlines()]
    assert [(r["page"], r["succeeded"]) for r in rows] == [
        ("book/ok.md", True),
        ("book/raises.md", False),
    ]
    assert all(r["seconds"] > 0 for r in rows) and rows[0]["end"] <= rows[1]["end"], rows


def test_output_widgets_in_many_cells_never_stall_the_page(tmp_path):
    # Each output into an Output widget makes nbclient send a comm message on the shell socket
    # while it waits for the cell's reply there: the race behind jupyter/nbclient#312, which
    # the pages' client (coursepkg.grading.kernel.replies) survives. nbclient's own client
    # stalled here on 2 runs of 2.
    cell = "out = widgets.Output()\nwith out:\n    print('x' * 1_000_000)\nout"
    nb = _notebook("import ipywidgets as widgets", *[cell] * 20)
    result = watchdog.watched_execution(nb, str(tmp_path), timeout=900, allow_errors=False)
    assert result.err is None, result.exc_string
    # nbclient kept each print in its widget's state, not in the cell's outputs
    assert all(c.outputs[0]["output_type"] == "execute_result" for c in nb.cells[1:])
