"""The grading kernel's system-call filter (``grading/kernel/syscalls.py``): in a child process
that loads it, every denied call fails with EPERM (the same call made before the filter fails
otherwise or succeeds, so the filter is what refused it), raw and packet sockets are refused,
what a notebook does (TCP and UDP sockets, files, processes) still works, and the student's
traceback gets its note. Mandatory where the host offers seccomp (``/proc/self/status`` has a
``Seccomp`` line): there a missing ``pyseccomp`` or ``libseccomp.so.2`` fails, it never skips.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
from pathlib import Path

import pytest

from coursepkg.grading.kernel.syscalls import DENIED, SECCOMP_ENV, denied_note, filter_syscalls

HOST_OFFERS_SECCOMP = "Seccomp:" in Path("/proc/self/status").read_text()


def _call_numbers() -> dict[str, int]:
    import pyseccomp

    numbers = {name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) for name in DENIED}
    return {name: nr for name, nr in numbers.items() if nr >= 0}


def _errno_of(nr: int) -> int:
    """The errno of the raw call with every argument -1: an invalid request, fd or pointer
    for each denied call, so that none does anything even where a rule were missing."""
    libc = ctypes.CDLL(None, use_errno=True)
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *([ctypes.c_long(-1)] * 6))
    return 0 if result != -1 else ctypes.get_errno()


def _socket_errno(family: int, kind: int) -> int:
    try:
        socket.socket(family, kind).close()
    except OSError as err:
        return err.errno
    return 0


def _probe(tmp: Path) -> dict:
    """In a forked child: every denied call's errno before and after the filter, sockets and
    ordinary work after it, the note under a refused call's traceback."""
    numbers = _call_numbers()
    before = {name: _errno_of(nr) for name, nr in numbers.items()}
    loaded, why = filter_syscalls()
    after = {name: _errno_of(nr) for name, nr in numbers.items()}
    sockets = {
        "packet": _socket_errno(socket.AF_PACKET, socket.SOCK_RAW),
        "raw_ip": _socket_errno(socket.AF_INET, socket.SOCK_RAW),
        "raw_ip_nonblocking": _socket_errno(socket.AF_INET, socket.SOCK_RAW | socket.SOCK_NONBLOCK),
        "raw_ip6": _socket_errno(socket.AF_INET6, socket.SOCK_RAW),
        "tcp": _socket_errno(socket.AF_INET, socket.SOCK_STREAM),
        "udp": _socket_errno(socket.AF_INET, socket.SOCK_DGRAM),
    }
    (tmp / "written").write_text("ok")
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    works = (tmp / "written").read_text() == "ok" and os.waitpid(pid, 0)[1] >> 8 == 7
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        note = ""
    except PermissionError as err:
        note = denied_note(err)
    return dict(
        loaded=loaded, why=why, before=before, after=after, sockets=sockets, works=works, note=note
    )


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict:
    if not HOST_OFFERS_SECCOMP:
        pytest.skip("this kernel has no seccomp (no Seccomp line in /proc/self/status)")
    tmp = tmp_path_factory.mktemp("seccomp")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child loads the filter: the test process stays unfiltered
        os.close(read)
        try:
            result = _probe(tmp)
        except BaseException as err:  # noqa: BLE001 - reported to the parent
            result = {"crash": f"{type(err).__name__}: {err}"}
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(result))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as source:
        text = source.read()
    os.waitpid(pid, 0)
    result = json.loads(text)
    assert "crash" not in result, result.get("crash")
    return result


def test_the_filter_loads_where_the_host_offers_seccomp(probed):
    assert probed["why"] == "", probed["why"]  # pyseccomp and libseccomp.so.2 are needed
    assert probed["loaded"] >= len(probed["after"]) + 3  # each call, and the 3 socket rules


def test_every_denied_call_fails_with_eperm_because_of_the_filter(probed):
    assert set(probed["after"]) >= {"ptrace", "mount", "unshare", "setns", "init_module", "bpf"}
    assert probed["after"] == {name: errno.EPERM for name in probed["after"]}
    # Made before the filter, most of the same calls fail otherwise (bad request, fd, pointer):
    # the EPERM after it is the filter's.
    assert sum(e != errno.EPERM for e in probed["before"].values()) >= len(probed["before"]) // 2


def test_raw_and_packet_sockets_are_refused_and_ordinary_ones_are_not(probed):
    sockets = probed["sockets"]
    for kind in ("packet", "raw_ip", "raw_ip_nonblocking", "raw_ip6"):
        assert sockets[kind] == errno.EPERM, (kind, sockets)
    assert sockets["tcp"] == 0 and sockets["udp"] == 0


def test_a_notebook_s_ordinary_work_goes_on(probed):
    assert probed["works"]  # files written and read, a child process started and waited on


def test_the_student_is_told_why_a_call_was_refused(probed, monkeypatch):
    assert "denies some system calls a notebook never needs" in probed["note"]
    assert "raw sockets" in probed["note"] and "kernel modules" in probed["note"]
    monkeypatch.delenv(SECCOMP_ENV + "_LOADED", raising=False)  # unfiltered: nothing to say
    assert denied_note(PermissionError(errno.EPERM, "Operation not permitted")) == ""
