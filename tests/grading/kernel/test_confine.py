"""The kernels' confinement leaves nothing behind: the ``pids`` cgroup of a kernel that died
without its cleanup (with its worker) is removed, and a running kernel's is kept; and a kernel's
network namespace gives it a loopback of its own and nothing beyond."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import processes
import pytest
from processes import budget

from coursepkg.grading.kernel import confine

LIMITED = """import os, sys
from coursepkg.grading.kernel.confine import limit_processes
print(os.getpid(), limit_processes(64) or "ok", flush=True)
if sys.argv[1:] == ["stay"]:
    sys.stdin.read()  # alive until its stdin closes
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or confine._cgroup_parent("pids")[0] is None,
    reason="kernels get a pids cgroup only as root, with the pids controller mounted",
)
@pytest.mark.slow  # two processes importing coursepkg, each in a cgroup
def test_the_cgroup_of_a_kernel_gone_without_cleanup_is_removed():
    root = confine._cgroup_parent("pids")[0]  # this process's own pids cgroup, or the root
    # A "kernel" that exits without removing its group, as one killed with its worker does.
    gone = processes.run([sys.executable, "-c", LIMITED], idle=60, check=True)
    gone_pid, status = gone.stdout.split()
    assert status == "ok", gone.stdout
    # One still running, with its group.
    live = subprocess.Popen(
        [sys.executable, "-c", LIMITED, "stay"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        live_pid, status = live.stdout.readline().split()  # waits until it is in its group
        assert status == "ok"
        stale, running = (
            root / f"coursepkg-kernel-{gone_pid}",
            root / f"coursepkg-kernel-{live_pid}",
        )
        assert stale.is_dir() and running.is_dir()

        assert confine.remove_stale_cgroups() >= 1
        assert not stale.exists()
        assert running.is_dir() and live_pid in (running / "cgroup.procs").read_text().split()
    finally:
        live.stdin.close()
        live.wait(timeout=budget(60))
        confine.kill_process_group_cgroup(live.pid)
    assert not (root / f"coursepkg-kernel-{live.pid}").exists()


def test_on_cgroup_v2_kernels_go_beside_the_grader_in_the_nearest_delegated_group(tmp_path):
    """v2's rule (no processes in a group whose children have controllers) cannot be staged on
    this v1 host, so the walk is checked on a folder laid out as v2's files are."""
    root = tmp_path / "cgroup"
    own = root / "grader.slice" / "grader.service" / "leaf"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    for group in (own, own.parent, own.parent.parent):
        (group / "cgroup.subtree_control").write_text("")
    parent, note = confine._v2_parent(root, own)
    assert parent == root and note.startswith(confine.NOT_UNDER_GRADER), (parent, note)
    (own.parent.parent / "cgroup.subtree_control").write_text("memory pids\n")
    (own.parent / "cgroup.subtree_control").write_text("pids\n")  # memory missing: not this one
    assert confine._v2_parent(root, own) == (own.parent.parent, "")
    (own.parent / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert confine._v2_parent(root, own) == (own.parent, "")


# A "kernel" in a network namespace of its own, its loopback up: it serves and reaches itself on
# 127.0.0.1, and neither the host's 127.0.0.1 (the port argv[1], where the test listens) nor any
# other address.
NAMESPACED = """import socket, sys
from coursepkg.grading.kernel.confine import deny_network, loopback_up
why = deny_network()
if why:
    print("no namespace:", why, flush=True)
    sys.exit(0)
print("loopback", loopback_up() or "up", flush=True)
with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    socket.create_connection(server.getsockname(), timeout=10).close()
    print("own loopback: reached", flush=True)
for host, port in (("127.0.0.1", int(sys.argv[1])), ("192.0.2.1", 80)):
    try:
        socket.create_connection((host, port), timeout=10).close()
        print(host, "reached")
    except OSError as err:
        print(host, type(err).__name__)
"""


@pytest.mark.slow  # a confined process of its own
def test_a_namespaced_kernel_has_its_own_loopback_and_nothing_beyond():
    with socket.socket() as host:
        host.bind(("127.0.0.1", 0))  # the grader's side, as PostgreSQL would listen
        host.listen(1)
        done = processes.run(
            [sys.executable, "-c", NAMESPACED, str(host.getsockname()[1])],
            idle=120,
            check=False,
        )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    if lines[0].startswith("no namespace"):
        pytest.skip(lines[0])
    assert lines == [
        "loopback up",
        "own loopback: reached",
        "127.0.0.1 ConnectionRefusedError",  # the host's listener is in another namespace
        "192.0.2.1 OSError",  # no route: the namespace has no other interface
    ]


def test_the_c_library_is_looked_up_once_per_process(monkeypatch):
    # find_library runs `ldconfig -p` in a subprocess; a kernel confining itself asked for the
    # library about five times (forked from the fork server, which had looked it up: none).
    calls = []
    real = confine.ctypes.util.find_library

    def counted(name):
        calls.append(name)
        return real(name)

    monkeypatch.setattr(confine.ctypes.util, "find_library", counted)
    confine.libc.cache_clear()
    try:
        first = confine.libc()
        assert confine.libc() is first and confine.libc() is first
        assert calls == ["c"]
        assert first.getpid() == os.getpid()  # the library still works through the cache
    finally:
        confine.libc.cache_clear()
