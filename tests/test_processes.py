"""The tests' own process helpers (``tests/fixtures/processes.py``): a command a test gives up
on is ended with everything it started, even what left its process group; a wait fails only when
nothing progresses, naming the stuck step; the machine factor is measured and >= 1."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import psutil
import pytest
from processes import Command, Stuck, budget, machine_factor, run, wait_until

# A parent that starts a child in its own session (as Jupyter starts a kernel), says both pids,
# then waits forever, printing nothing more: a stuck command.
STUCK = """import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                         start_new_session=True)
print(os.getpid(), child.pid, flush=True)
time.sleep(3600)
"""


def test_a_stuck_command_is_ended_with_its_whole_tree_and_the_failure_names_it():
    with Command([sys.executable, "-c", STUCK], what="the stuck example") as cmd:
        pids = wait_until(lambda: cmd.output()[0].split(), "the example's pids", idle=60)
        tree = [psutil.Process(int(p)) for p in pids]
        assert tree[1].pid in [p.pid for p in cmd.descendants()]
        with pytest.raises(Stuck, match="stuck waiting for the stuck example: no progress"):
            cmd.wait(idle=0.5)
        _gone, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive, f"left running: {alive}"


def test_a_command_that_keeps_progressing_outlives_its_idle_bound():
    # It prints every 0.05 s for two idle bounds (at least): never idle, so never stopped.
    ticks = math.ceil(2 * budget(1.0) / 0.05)
    ticking = (
        f"import time\nfor i in range({ticks}):\n    print(i, flush=True)\n    time.sleep(0.05)"
    )
    done = run([sys.executable, "-c", ticking], what="the ticking example", idle=1.0, check=True)
    assert done.stdout.split() == [str(i) for i in range(ticks)]


def test_wait_until_restarts_its_clock_on_progress_and_names_the_step():
    ticks = iter(range(10**9))
    with pytest.raises(Stuck, match="stuck waiting for nothing at all"):
        wait_until(lambda: False, "nothing at all", idle=0.2)
    start = time.monotonic()
    value = wait_until(
        lambda: time.monotonic() - start > 0.5 and "done",
        "a progressing wait",
        idle=0.2,
        progress=lambda: next(ticks),
    )
    assert value == "done"


def test_the_machine_factor_is_measured_and_can_be_fixed(monkeypatch):
    assert machine_factor() >= 1.0
    monkeypatch.setenv("COURSE_TIME_FACTOR", "3.5")
    assert machine_factor() == 3.5
    monkeypatch.setenv("COURSE_TIME_FACTOR", "0.5")
    with pytest.raises(ValueError, match="COURSE_TIME_FACTOR must be a number >= 1, got '0.5'"):
        machine_factor()


# A test that starts a command (in a session of its own) and says both pids, then waits forever,
# deaf to Ctrl-C (as a test is in a step that handles SIGINT itself): execnet's own answer to a
# vanished controller (SIGINT, then os._exit 15 s later) would end the worker but not the command.
WAITS = """import os, signal, sys, time
from processes import Command

def test_waits(tmp_path):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cmd = Command([sys.executable, "-c", "import time; time.sleep(3600)"], what="a sleeper")
    (tmp_path.parent.parent / "pids").write_text(f"{os.getpid()} {cmd.proc.pid}")
    time.sleep(3600)
"""


@pytest.mark.slow  # two pytest processes start (torch imported twice)
@pytest.mark.timeout(300)
def test_an_xdist_worker_and_what_its_test_started_end_when_pytest_is_killed(tmp_path):
    """SIGKILL to pytest's main process (a CI job killed): its worker gets SIGTERM at once (the
    course's conftest arms it, :func:`processes.die_with_parent`), stops as on Ctrl-C and ends
    the command its test started."""
    tests = Path(__file__).resolve().parent
    (tmp_path / "test_waits.py").write_text(WAITS)
    pids = tmp_path / "base" / "pids"
    path = os.pathsep.join([str(tests), str(tests / "fixtures"), os.environ.get("PYTHONPATH", "")])
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        os.devnull,
        "--rootdir",
        str(tmp_path),
        "-p",
        "conftest",
        "-p",
        "no:cacheprovider",
        "-n",
        "1",
        "-q",
        f"--basetemp={tmp_path / 'base'}",
        str(tmp_path / "test_waits.py"),
    ]
    with Command(args, what="pytest -n 1", env={**os.environ, "PYTHONPATH": path}) as main:
        text = wait_until(
            lambda: pids.is_file() and pids.read_text(),
            "the worker's pids",
            idle=120,
            progress=main.sizes,
        )
        started = [psutil.Process(int(p)) for p in text.split()]
        main.proc.kill()
        _gone, alive = psutil.wait_procs(started, timeout=budget(60))
        assert not alive, f"left running after pytest was killed: {alive}"
