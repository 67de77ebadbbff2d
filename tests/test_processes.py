"""The tests' own process helpers (``tests/fixtures/processes.py``): a command a test gives up
on is ended with everything it started, even what left its process group; a wait fails only when
nothing progresses, naming the stuck step; the machine factor is measured and >= 1."""

from __future__ import annotations

import math
import sys
import time

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
    value = wait_until(lambda: time.monotonic() - start > 0.5 and "done", "a progressing wait",
                       idle=0.2, progress=lambda: next(ticks))  # fmt: skip
    assert value == "done"


def test_the_machine_factor_is_measured_and_can_be_fixed(monkeypatch):
    assert machine_factor() >= 1.0
    monkeypatch.setenv("COURSE_TIME_FACTOR", "3.5")
    assert machine_factor() == 3.5
    monkeypatch.setenv("COURSE_TIME_FACTOR", "0.5")
    with pytest.raises(ValueError, match="COURSE_TIME_FACTOR must be a number >= 1, got '0.5'"):
        machine_factor()
