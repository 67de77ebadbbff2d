"""``coursepkg grade`` keeps the grading host's memory and disk: notebooks that fill ``/dev/shm``,
their folder or ``$TMPDIR``, that allocate 30 GB through a tmpfs (``memfd_create``) or through
``torch.empty``, or that leave threads writing after their cells end, graded in ONE batch beside
a correct submission, on the default LocalCluster and on a Dask cluster with PostgreSQL.

Each hostile notebook gets its message and no credit it did not earn, the correct one full
marks; the limits stop each of them early (a 2 GB ``/dev/shm`` fill fails at the 64 MiB of its
private ``/dev/shm``, a 3 GB folder at the 256 MiB budget, a 30 GB tmpfs at the kernel's memory
cgroup of 2 GiB), so no kernel takes more of the host than its limits. After the batch nothing
of a kernel's is left: no file in ``/dev/shm`` or the workers' folders, no process, no cgroup, and
the host's shared memory, ``/dev/shm`` and the bytes in the grading workers' folders (where a
kernel's folder and ``$TMPDIR`` are) are where they started (within 100 MB). The machine's
available memory is printed (``pytest -s``), not asserted: anything else on the machine moves it,
while all a kernel could keep is counted above (its processes, cgroups, tmpfs and files).

Entries whose outcome needs what the host lacks (a memory cgroup, a mount namespace) are left out,
and the summary must then warn, unless ``COURSE_REQUIRE_KERNEL_LIMITS=1`` (set by ``.ci/run`` where
the host offers them): then a missing mechanism fails the test.
``tests/grading/kernel/test_kernel_resources.py`` tests the mechanisms themselves.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import processes
import pytest
import test_cluster as _real_parts
from grading_hostile import (
    ALL,
    NONE,
    OTHER,
    Hostile,
    _edit_target,
    _prefix,
    expected_score,
    points,
    write_submissions,
)
from processes import budget, files_under

from coursepkg.grading.kernel import confine

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
AID = "ex01_attention"
MEMORY_MB, DISK_MB, SHM_MB = 2048, 256, 64
MARK = "cgres"  # in every file name a hostile notebook writes, to find leftovers by
GB = 2**30
DISK = "bytes in the grading workers' folders (where kernels write), the graded course aside"
MEMORY = "available memory, the cluster's growth aside (printed, not asserted)"

# serial: the batch measures the machine's shared memory and the graders' folders in /tmp, which
# another test running beside it (`make test` runs two at a time) would move.
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(1200)]

# Set by .ci/run where the host offers the limits (as in grading/kernel/test_kernel_resources.py).
LIMITS_REQUIRED = os.environ.get("COURSE_REQUIRE_KERNEL_LIMITS") == "1"
# The real parts of tests/e2e/test_cluster.py: a PostgreSQL server, a Dask scheduler with two
# workers, and ex01's release (fixtures of this module too).
cluster, postgres, release = _real_parts.cluster, _real_parts.postgres, _real_parts.release

# Each writer goes on in 64 MiB steps until the limit stops it (the error ends the cell).
_FILL = """import os as _os
_chunk = b"x" * 2**26
for _i in range({total} // len(_chunk)):
    with open(_os.path.join({folder}, "{mark}-%d.bin" % (_i // 2)), "ab") as _f:
        _f.write(_chunk)
"""
# A new in-memory file every 128 MiB: each stays under the largest file a kernel may write.
_MEMFD = """import os as _os
_fds, _chunk = [], b"x" * 2**26
for _i in range(30 * 2**30 // len(_chunk)):
    if _i % 2 == 0:
        _fds.append(_os.memfd_create("{mark}"))
    _os.write(_fds[-1], _chunk)
"""
_THREADS = """import os as _os, tempfile as _tempfile, threading as _threading, time as _time

def _write_forever(folder):
    _chunk = b"x" * 2**20
    _n = 0
    while True:
        try:
            with open(_os.path.join(folder, "{mark}-thread-%d.bin" % (_n // 64)), "ab") as _f:
                _f.write(_chunk)
        except OSError:
            _time.sleep(0.01)
        _n += 1

for _where in (".", _tempfile.gettempdir(), "/dev/shm"):
    _threading.Thread(target=_write_forever, args=(_where,), daemon=True).start()
"""
NO_SPACE = "No space left on device"
# What the kernel adds after the traceback of a cell stopped by a limit, for each such student.
NOTES = {
    "r_fills_shm": f"/dev/shm {SHM_MB} MB",
    "r_fills_folder": f"a notebook may write at most {DISK_MB} MB of files when graded",
    "r_fills_tmpdir": f"a notebook may write at most {DISK_MB} MB of files when graded",
    "r_torch_30gb": f"a notebook may use at most {MEMORY_MB} MB of memory",
}


def catalogue() -> list[tuple[Hostile, str]]:
    """The hostile notebooks, each with what the host must offer for it (``memory_cgroup``,
    ``mounts``)."""

    def fill(folder: str) -> str:
        return _FILL.format(total=3 * GB, folder=folder, mark=MARK)

    return [
        (
            Hostile(
                "r_fills_shm",
                "writes 2 GB into /dev/shm",
                _edit_target(_prefix(_FILL.format(total=2 * GB, folder="'/dev/shm'", mark=MARK))),
                OTHER,
                NO_SPACE,
            ),
            "mounts",
        ),
        (
            Hostile(
                "r_fills_folder",
                "writes 3 GB into its folder",
                _edit_target(_prefix(fill("'.'"))),
                OTHER,
                NO_SPACE,
            ),
            "mounts",
        ),
        (
            Hostile(
                "r_fills_tmpdir",
                "writes 3 GB into $TMPDIR",
                _edit_target(_prefix("import tempfile as _t\n" + fill("_t.gettempdir()"))),
                OTHER,
                NO_SPACE,
            ),
            "mounts",
        ),
        (
            Hostile(
                "r_tmpfs_30gb",
                "writes 30 GB into an in-memory file (memfd_create: a tmpfs no mount bounds)",
                _edit_target(_prefix(_MEMFD.format(mark=MARK))),
                NONE,
                f"ran out of memory (limit {MEMORY_MB} MB",
                graded=False,
            ),
            "memory_cgroup",
        ),
        (
            Hostile(
                "r_torch_30gb",
                "asks torch.empty for 30 GB and fills it",
                _edit_target(
                    _prefix("import torch\n\ntorch.empty(30 * 2**30, dtype=torch.uint8).fill_(1)")
                ),
                OTHER,
                "can't allocate memory",
            ),
            "",
        ),
        (
            Hostile(
                "r_threads_write_on",
                "correct, and threads that write into its folder, $TMPDIR and /dev/shm forever",
                _edit_target(lambda text, item: text + "\n\n" + _THREADS.format(mark=MARK)),
                ALL,
                "check_scaled_dot_product_attention passed",
            ),
            "mounts",
        ),
    ]


# ---------------------------------------------------------------------------------------------
# What the host offers, and what a batch leaves
# ---------------------------------------------------------------------------------------------

PROBE = """import os, sys
from pathlib import Path
from coursepkg.grading.kernel.confine import limit_memory
from coursepkg.grading.kernel.mounts import private_mounts
kind, why = limit_memory(512)
folder, scratch = Path(sys.argv[1]) / "folder", Path(sys.argv[1]) / "scratch"
folder.mkdir()
scratch.mkdir()
os.chdir(folder)
done, problems = private_mounts(folder, scratch, disk_mb=8, shm_mb=8)
print((kind or "-").replace(" ", "_"), "mounts" if done["disk"] and done["shm"] else "-")
"""


def _offered(tmp: Path) -> set[str]:
    """What a kernel gets on this host: ``memory_cgroup``, ``mounts`` (probed in a child)."""
    out = processes.run([sys.executable, "-c", PROBE, str(tmp)], idle=120, check=True)
    out = out.stdout.split()
    confine.remove_stale_cgroups()
    names = ("memory_cgroup", "mounts")
    offered = {""} | {name for name, got in zip(names, out, strict=True) if got != "-"}
    if LIMITS_REQUIRED and offered != {"", *names}:
        pytest.fail(f"COURSE_REQUIRE_KERNEL_LIMITS=1 but a kernel gets only {sorted(offered)}")
    return offered


def _meminfo(name: str) -> int:
    text = Path("/proc/meminfo").read_text()
    return int(re.search(rf"^{name}:\s+(\d+) kB", text, re.MULTILINE).group(1)) * 1024


def _used(path: str) -> int:
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def _resident(roots: list[int]) -> int:
    """Resident memory of processes ``roots`` and all their descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass
    total, todo = 0, list(roots)
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            total += int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024
        except (OSError, AttributeError):
            pass
    return total


def _measure(graders: list[int]) -> dict[str, int]:
    return {
        # The grader's own processes that outlive a batch (a running cluster's scheduler and
        # workers, and their fork servers) may grow; that is not a kernel's.
        MEMORY: _meminfo("MemAvailable") + _resident(graders),
        "shared memory": _meminfo("Shmem"),
        "/dev/shm used": _used("/dev/shm"),
        DISK: sum(_size(home) for home in Path("/tmp").glob("cg-w-*")),
    }


def _ours(path: str) -> bool:
    return f"/{MARK}" in path or "/autograded/r_" in path or "/submitted/r_" in path


def _leftovers() -> list[str]:
    """Files, processes and cgroups of this test's kernels still on the host."""
    left = [str(p) for p in Path("/dev/shm").glob(f"*{MARK}*")]
    for home in Path("/tmp").glob("cg-w-*"):  # grading workers' folders (others' too)
        try:
            left += [str(p) for p in home.glob("*/*/r_*")] + [str(p) for p in home.glob("r_*")]
            left += [str(p) for p in home.rglob(f"{MARK}*")]
        except OSError:
            pass  # a worker removing its folder meanwhile
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if _ours(os.readlink(proc / "cwd")):
                left.append(f"process {proc.name} in {os.readlink(proc / 'cwd')}")
        except OSError:
            pass
    return left


def _stale_cgroups() -> list[str]:
    """Kernels' cgroups whose kernel is gone (this test's or, briefly, another grader's)."""
    return [
        str(group)
        for root in confine._group_parents()
        for group in root.glob("coursepkg-kernel-*")
        if not confine.process_alive(int(group.name.rsplit("-", 1)[1]))
    ]


def _until(condition, seconds: float = 60.0):
    """``condition()``'s value once truthy, or its last value after ``seconds`` (scaled by the
    machine's measured pace: a guard, far above the normal wait)."""
    deadline = time.monotonic() + budget(seconds)
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def _feedback(course: Path, student: str) -> str:
    import html

    page = (course / "feedback" / student / AID / f"{AID}.html").read_text(encoding="utf-8")
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())


def _grade(course: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    run = processes.run(
        [
            str(BIN / "coursepkg"),
            "grade",
            AID,
            "--root",
            str(course),
            "--no-progress",
            "--cell-timeout",
            "120",
            "--notebook-timeout",
            "300",
            "--memory-mb",
            str(MEMORY_MB),
            "--disk-mb",
            str(DISK_MB),
            "--shm-mb",
            str(SHM_MB),
            *args,
        ],
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **env},
        idle=480,
        check=False,
        progress=lambda: files_under(course),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _batch(release: Path, tmp: Path, *args: str, graders: list[int] = ()) -> dict:
    """Grade the catalogue beside a correct submission; what each got and what the host kept.
    On a running cluster, the correct one is graded first, alone: the workers' fork servers
    (the grader's, not a kernel's) are running when the measure starts, as they are after."""
    offered = _offered(tmp)
    course = tmp / "course"
    shutil.copytree(release, course)
    entries = [e for e, needs in catalogue() if needs in offered]
    write_submissions(course, AID, entries)
    source = nbformat.read(str(course / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    (course / "submitted" / "r_correct" / AID).mkdir(parents=True)
    nbformat.write(source, str(course / "submitted" / "r_correct" / AID / f"{AID}.ipynb"))
    if "--scheduler" in args:
        _grade(course, *args, "--student", "r_correct")
    stale = set(_stale_cgroups())
    before = _measure(graders)
    run = _grade(course, *args)
    clean = _until(lambda: not _leftovers() and not set(_stale_cgroups()) - stale)
    left = [] if clean else _leftovers() + sorted(set(_stale_cgroups()) - stale)
    waited = time.monotonic()
    after, waited = _measure(graders), time.monotonic() - waited
    expected = {e.id: (expected_score(e, source), e.phrase) for e in entries}
    expected["r_correct"] = (points(source), "check_scaled_dot_product_attention passed")
    return {
        "course": course,
        "out": run.stdout + run.stderr,
        "expected": expected,
        "before": before,
        "after": after,
        "left": left,
        "offered": offered,
        "waited": waited,
    }


def _judge(batch: dict, scores: dict[str, float]) -> None:
    course, out = batch["course"], batch["out"]
    report = "\n".join(
        f"{k}: {batch['before'][k] / 2**20:.0f} MiB before, {batch['after'][k] / 2**20:.0f} after"
        for k in batch["before"]
    )
    # The figures, for the record (pytest -s).
    print(f"{report}\n(after: {batch['waited']:.0f} s after the kernels' leftovers were gone)")
    missing = {"memory_cgroup", "mounts"} - batch["offered"]
    assert scores == {s: want for s, (want, _) in batch["expected"].items()}, out
    for student, (_, phrase) in batch["expected"].items():
        assert phrase in _feedback(course, student), (student, phrase)
        assert NOTES.get(student, "") in _feedback(course, student), (student, NOTES[student])
    assert not batch["left"], f"left behind: {batch['left']}"
    for name in ("shared memory", "/dev/shm used"):
        grew = batch["after"][name] - batch["before"][name]
        assert grew < 100 * 2**20, f"{name} grew by {grew / 2**20:.0f} MiB\n{report}"
    # What a kernel could keep of the host after its batch is all accounted for above and here:
    # its processes and cgroups (none left), what it wrote into /dev/shm or any tmpfs (shared
    # memory, back where it was) and into the folders it could write (the workers' folders,
    # $TMPDIR among them: back where they were). The machine's available memory is printed
    # only: anything else on the machine moves it (CI once failed by 0.02 MiB over 100 MiB).
    grew = batch["after"][DISK] - batch["before"][DISK]
    assert grew < 100 * 2**20, f"{DISK} grew by {grew / 2**20:.0f} MiB\n{report}"
    if not missing:
        assert f"a private /dev/shm of {SHM_MB} MiB" in out, out
        assert f"bounded to {DISK_MB} MiB" in out, out
        assert "memory cgroup: tmpfs and page cache count" in out, out
    else:
        assert "WARNING" in out, out


def _csv(course: Path) -> dict[str, float]:
    import csv

    with open(course / "reports" / AID / "grades.csv", newline="") as f:
        return {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}


def test_hostile_storage_on_a_local_cluster(release, tmp_path):
    batch = _batch(release, tmp_path, "--workers", "2")
    _judge(batch, _csv(batch["course"]))
    # As on a host without the mechanisms: the correct notebook still gets its marks, and the
    # summary says, limit by limit, what was not enforced.
    run = _grade(
        batch["course"], "--workers", "1", "--student", "r_correct", COURSEPKG_KERNEL_RESOURCES="0"
    )
    assert _csv(batch["course"])["r_correct"] == batch["expected"]["r_correct"][0]
    for warning in (
        "files in a tmpfs and the page cache are NOT counted",
        "/dev/shm (no mount namespace",
        "working and scratch folders were NOT bounded",
    ):
        assert warning in run.stdout, run.stdout


def test_hostile_storage_on_a_dask_cluster_with_postgresql(cluster, postgres, release, tmp_path):
    client = cluster["client"]
    # The cluster's own processes (the scheduler; each worker's nanny, with the worker and its
    # fork server under it) outlive the batch: what they grow is the grader's, not a kernel's.
    workers = [client.run_on_scheduler(os.getpid), *client.run(os.getppid).values()]
    batch = _batch(
        release,
        tmp_path,
        "--scheduler",
        cluster["address"],
        "--db",
        postgres["url"],
        graders=workers,
    )
    _judge(batch, {s: scores[0] for s, scores in _real_parts._rows(postgres["url"]).items()})
