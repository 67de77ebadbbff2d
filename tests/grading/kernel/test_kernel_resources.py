"""The mechanisms that keep a grading kernel's memory and files bounded, each on its own, in a
child process as a kernel uses them: a memory cgroup that counts what ``RLIMIT_AS`` misses (an
in-memory file), private size-bounded ``/dev/shm``, working and scratch folders that leave the
host's untouched; the limits' settings (option, ``nbgrader_config.py``, default); and the
summary's warning for each mechanism a host lacks.

A host without a mechanism (not root, no memory cgroup, no mount namespace) skips its test with
the reason, unless ``COURSE_REQUIRE_KERNEL_LIMITS=1`` (set by ``.ci/run`` where the host offers
them): then a missing mechanism fails the test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import processes
import pytest
from processes import budget

from coursepkg.grading.classroom.limits import GradeLimits, course_limits
from coursepkg.grading.classroom.protocol import SandboxStatus
from coursepkg.grading.classroom.reports import sandbox_summary
from coursepkg.grading.kernel import confine
from coursepkg.grading.kernel.sandbox import limit_note

#: Set by ``.ci/run`` where the host offers a memory cgroup and mount namespaces (as root).
REQUIRED = os.environ.get("COURSE_REQUIRE_KERNEL_LIMITS") == "1"


def lacking(reason: str) -> None:
    """Skip a test the host cannot run, with ``reason``; fail it where the host must run it."""
    if REQUIRED:
        pytest.fail(f"COURSE_REQUIRE_KERNEL_LIMITS=1 but {reason}")
    pytest.skip(reason)


# A "kernel" in a memory cgroup of 64 MiB that writes 200 MiB into an in-memory file.
MEMFD_IN_CGROUP = """import os, sys
from coursepkg.grading.kernel.confine import limit_memory
def _memory_cgroup():
    lines = open("/proc/self/cgroup").read().splitlines()
    v1 = [l for l in lines if "memory" in l.split(":")[1].split(",")]
    return (v1 or [l for l in lines if l.startswith("0::")])[0].split(":", 2)[2]
kind, why = limit_memory(64)
print(kind or "none", why, flush=True)
print(_memory_cgroup(), flush=True)
if not kind:
    sys.exit(0)
fd = os.memfd_create("cgres")
for _ in range(200):
    os.write(fd, b"x" * 2**20)
print("not stopped", flush=True)
"""

MOUNTS = """import os, sys
from pathlib import Path
from coursepkg.grading.kernel.mounts import private_mounts
folder, scratch = Path(sys.argv[1]), Path(sys.argv[2])
os.chdir(folder)
done, problems = private_mounts(folder, scratch, disk_mb=16, shm_mb=8)
print(done["disk"], done["shm"], problems, flush=True)
if not (done["disk"] and done["shm"]):
    sys.exit(0)
print(open("given.txt").read().strip())
for where in ("mine.bin", scratch / "tmp.bin", "/dev/shm/cgres.bin"):
    try:
        with open(where, "wb") as f:
            for _ in range(64):
                f.write(b"x" * 2**20)
        print(where, "written")
    except OSError as err:
        print(Path(where).name, err.strerror, os.path.getsize(where) // 2**20)
"""


def _run(code: str, *args: str) -> list[str]:
    done = processes.run([sys.executable, "-c", code, *args], idle=120, check=False)
    return [done.returncode, *done.stdout.splitlines()]


def _own_memory_cgroup() -> str:
    """This process's memory cgroup path, read here rather than through the code under test."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = [line for line in lines if "memory" in line.split(":")[1].split(",")]
    return (v1 or [line for line in lines if line.startswith("0::")])[0].split(":", 2)[2]


@pytest.mark.slow  # a confined process of its own
def test_a_memory_cgroup_stops_an_in_memory_file_and_records_it():
    proc = subprocess.Popen(
        [sys.executable, "-c", MEMFD_IN_CGROUP], stdout=subprocess.PIPE, text=True
    )
    first = proc.stdout.readline().split()
    if first[0] == "none":
        proc.wait(timeout=budget(60))
        lacking(f"no memory cgroup on this host: {' '.join(first[1:])}")
    # Its group is under this (the grader's) own memory cgroup, so the grader's limit holds
    # for it too; only where that cannot be (v2's rule, a read-only group) under the root.
    where = proc.stdout.readline().strip()
    own = _own_memory_cgroup()
    if first[1:] and " ".join(first[1:]).startswith(confine.NOT_UNDER_GRADER):
        assert where == f"/coursepkg-kernel-{proc.pid}", (where, first)
    else:
        assert where == f"{own}/coursepkg-kernel-{proc.pid}".replace("//", "/"), (where, own)
    rest = proc.stdout.read()
    assert proc.wait(timeout=budget(120)) == -9, rest  # the cgroup's out-of-memory killer
    assert "not stopped" not in rest
    confine.kill_process_group_cgroup(proc.pid)
    record = confine.ENDED.pop(proc.pid)
    assert record["oom_kills"] == 1 and 32 < record["peak_mb"] <= 64, record
    left = [r for r in confine._group_parents() if (r / f"coursepkg-kernel-{proc.pid}").exists()]
    assert not left, left


# A "kernel" that joins a memory group and exits without removing it (killed with its worker).
MEMORY_GROUP_LEFT = """import os
from coursepkg.grading.kernel.confine import limit_memory
kind, why = limit_memory(256)
print(os.getpid(), kind or "none", why, sep="|", flush=True)
"""


@pytest.mark.slow  # a confined process of its own
def test_the_memory_group_of_a_kernel_gone_without_cleanup_is_found_and_removed():
    done = processes.run([sys.executable, "-c", MEMORY_GROUP_LEFT], idle=60, check=True)
    pid, kind, why = done.stdout.strip().split("|")
    if kind == "none":
        lacking(f"no memory cgroup on this host: {why}")
    parent, note = confine._cgroup_parent("memory")
    own = confine._cgroup_root("memory") / _own_memory_cgroup().lstrip("/")
    assert parent == own or note.startswith(confine.NOT_UNDER_GRADER), (parent, own, note)
    group = parent / f"coursepkg-kernel-{pid}"
    assert group.is_dir(), sorted(parent.glob("coursepkg-kernel-*"))
    assert confine.remove_stale_cgroups() >= 1
    assert not group.exists()


@pytest.mark.slow  # a confined process of its own
def test_private_mounts_bound_the_kernels_files_and_leave_the_hosts(tmp_path):
    folder, scratch = tmp_path / "folder", tmp_path / "scratch"
    folder.mkdir()
    scratch.mkdir()
    (folder / "given.txt").write_text("the notebook's data\n")
    code, first, *rest = _run(MOUNTS, str(folder), str(scratch))
    assert code == 0, rest
    if first.startswith("0 ") or " 0 " in first:
        lacking(f"no private mounts on this host: {first}")
    assert first.startswith("16 8 []"), first
    # The notebook's files are there; each write stops at its budget; the folder and scratch
    # share one 16 MiB budget, so once the folder's file took it, nothing fits in scratch.
    assert rest == [
        "the notebook's data",
        "mine.bin No space left on device 16",
        "tmp.bin No space left on device 0",
        "cgres.bin No space left on device 8",
    ]
    assert sorted(p.name for p in folder.iterdir()) == ["given.txt"]
    assert not list(scratch.iterdir())
    assert not [n for n in os.listdir("/dev/shm") if "cgres" in n]  # the host's is untouched


def test_limits_come_from_the_option_then_the_course_config_then_the_default(tmp_path):
    (tmp_path / "nbgrader_config.py").write_text(
        "c = get_config()\nc.GradeLimits.memory_mb = 3000\nc.GradeLimits.shm_mb = 32\n"
    )
    limits = course_limits(tmp_path, memory_mb=None, shm_mb=16, disk_mb=None)
    assert limits["memory_mb"] == 3000  # the course's
    assert limits["shm_mb"] == 16  # the option's
    assert limits["disk_mb"] == GradeLimits().disk_mb  # the default
    assert limits["cell_timeout"] is None  # the notebook's own, later
    with pytest.raises(ValueError, match="disk_mb must be a positive number, got 0"):
        course_limits(tmp_path, disk_mb=0)


def test_the_summary_says_what_a_host_without_the_mechanisms_does_not_enforce():
    common = {"landlock": 7, "memory": 4096, "cpu": 960, "network": "namespace", "processes": 256}
    full = SandboxStatus(**common, memory_cgroup="cgroup v2", file_size=1024, disk=1024, shm=256)
    summary = sandbox_summary([full])
    assert "WARNING" not in summary, summary
    assert "memory limited to 4096 MiB per kernel (cgroup v2 memory cgroup" in summary
    assert "a private /dev/shm of 256 MiB" in summary and "bounded to 1024 MiB" in summary
    assert "no network beyond a loopback of their own" in summary
    bare = SandboxStatus(**common, file_size=1024)
    summary = sandbox_summary([full, bare])
    assert "files in a tmpfs and the page cache are NOT counted" in summary
    assert "no private /dev/shm (no mount namespace), so it was read-only" in summary
    assert "folders were NOT bounded (no mount namespace); each file at most 1024 MiB" in summary
    summary = sandbox_summary([SandboxStatus(memory=4096, cpu=960, processes=256)])
    assert "kernels could fill the host's /dev/shm" in summary
    assert "NOT bounded (no mount namespace); nor each file" in summary


@pytest.mark.parametrize(
    ("error", "note"),
    [
        (OSError(28, "No space left on device"), "may write at most 256 MB of files"),
        (OSError(27, "File too large"), "may write at most 256 MB of files"),
        (MemoryError(), "may use at most 2048 MB of memory"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"), "2048 MB of mem"),
        (OSError(2, "No such file or directory"), ""),
        (RuntimeError("shapes do not match"), ""),
    ],
)
def test_a_cell_stopped_by_a_limit_is_told_which(error, note):
    limits = {"memory": 2048, "disk": 256, "shm": 64}
    said = limit_note(error, limits)
    assert (note in said) if note else said == "", said
    assert limit_note(error, {"memory": 0, "disk": 0, "shm": 0}) == ""  # nothing enforced
