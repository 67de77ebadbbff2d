"""The kernel that runs a student's notebook when ``coursepkg grade`` autogrades a class.

nbgrader executes each submission in a Jupyter kernel. ``coursepkg grade`` points nbgrader at a
kernelspec (:func:`write_kernelspec`) whose command is ``python -m
coursepkg.grading.kernel.sandbox``: this module confines the kernel process *before* any student
code runs, then starts an ordinary IPython kernel. The confinement, and what it does and does not
guarantee:

* **Memory**: ``RLIMIT_AS`` caps the kernel's address space, so a memory bomb ends in a
  ``MemoryError`` (or PyTorch's allocation error) inside the student's cell instead of taking the
  machine down. Only the kernel is limited, not nbgrader. As root, a memory cgroup of the same
  size counts what the address space misses (files in ``/dev/shm`` or ``memfd_create``, the page
  cache); a kernel past it is killed, and the grader tells the student it ran out of memory.
* **Files** (:mod:`.mounts`): a mount namespace of the kernel's own with a private ``/dev/shm``
  and, for its working and scratch directories together, a private tmpfs (the working directory
  an overlay of what nbgrader put there): bounded, and gone when the kernel ends.
  ``RLIMIT_FSIZE`` caps each file the kernel writes.
* **Core dumps**: ``RLIMIT_CORE`` is 0, so a crashing notebook leaves no core file behind.
* **CPU time**: ``RLIMIT_CPU`` kills a kernel that computes longer than the notebook's time limit
  even if nbgrader were stuck; nbgrader's per-cell timeout and the grader's wall-clock limit
  act first.
* **File access** (Linux Landlock, kernel >= 5.13): the kernel may *read* only the Python
  installation, the system directories, the ``coursepkg`` package and its own working
  directory, and may *write* only in its working directory (nbgrader's
  ``autograded/<student>/<assignment>/``) and a private scratch directory (``TMPDIR``). So it
  cannot read ``solutions/``, the gradebook or other students' work, and cannot write anywhere
  else in the course (nor in the host's ``/dev/shm``). Without Landlock (other operating
  systems, old kernels) this part is skipped and the grader says so in its log.
* **Signals** (Landlock ABI >= 6): the kernel cannot signal processes outside its sandbox (it
  cannot kill nbgrader or another student's kernel).
* **Orphans**: the kernel dies with its parent (``PR_SET_PDEATHSIG``) and writes its pid where
  the grader can find and kill it.
* **Output**: what the notebook prints is capped (:data:`OUTPUT_LIMIT` bytes per stream and
  cell), the rest is dropped with a note, so printing 100 MB costs nothing.
* **The checks themselves**: :func:`.guard.install_guard` snapshots ``coursepkg`` and the parts of
  PyTorch, ``math``, ``sys`` and ``builtins`` the checks rely on, before the first cell. Before
  every cell, the check names a notebook imported (``check_noam_lr`` ...) are put back to the
  real checks, and if anything in the snapshot was replaced (a monkeypatched check, helper,
  tolerance or ``torch.allclose``), every later check fails with a message saying so.

What this cannot guarantee: the student's code runs in the same Python process as the checks,
so a determined student can still defeat an in-process guard (for example by unregistering the
hook, or by patching objects the snapshot does not cover). The grader also scans the answer
cells for such code and flags the notebook for review (see
:mod:`coursepkg.grading.classroom`); the flag, not the guard, is the last line of defence.
"""

from __future__ import annotations

import io
import json
import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

from .confine import (
    NOT_UNDER_GRADER,
    deny_network,
    die_with_parent,
    limit_memory,
    limit_processes,
    loopback_up,
    readable_roots,
    restrict_files,
)
from .mounts import private_mounts
from .syscalls import SECCOMP_ENV, denied_note, filter_syscalls

__all__ = [
    "KERNEL_NAME",
    "LANDLOCK_ENV",
    "MAX_PROCESSES",
    "NETWORK_ENV",
    "RESOURCES_ENV",
    "NOT_GRADED_ENV",
    "PIDFILE_ENV",
    "launch",
    "STATUS_ENV",
    "OUTPUT_LIMIT",
    "write_kernelspec",
]

#: This module's name (run as ``python -m``, its ``__name__`` is ``"__main__"``).
MODULE = "coursepkg.grading.kernel.sandbox"
#: The kernelspec name nbgrader is told to use.
KERNEL_NAME = "coursepkg-sandbox"
#: Bytes a cell may print to stdout (and again to stderr) before the rest is dropped.
OUTPUT_LIMIT = 1_000_000
#: Environment variable carrying a reason the notebook cannot be graded (set by the grader):
#: every check then fails with this reason.
NOT_GRADED_ENV = "COURSEPKG_NOT_GRADED"
#: Environment variable naming the file where the kernel writes its pid.
PIDFILE_ENV = "COURSEPKG_KERNEL_PIDFILE"
#: Environment variable naming the file where the kernel reports which limits it could set
#: (JSON: ``landlock`` ABI or 0, ``memory`` MiB or 0, ``cpu`` seconds or 0, ``error``).
STATUS_ENV = "COURSEPKG_KERNEL_STATUS"
#: Set to ``0`` to run kernels without Landlock (to test the grader as on a kernel without it).
LANDLOCK_ENV = "COURSEPKG_LANDLOCK"
#: Set to ``0`` to leave kernels their network (only to test the grader without a namespace).
NETWORK_ENV = "COURSEPKG_KERNEL_NETWORK_NAMESPACE"
#: Set to ``0`` to run kernels without their memory cgroup, private mounts and file-size limit
#: (only to measure what they cost, or to test the grader as on a host without them).
RESOURCES_ENV = "COURSEPKG_KERNEL_RESOURCES"
#: Set by the launcher for the kernel: its limits in MiB (JSON), for :func:`limit_note`.
LIMITS_ENV = "COURSEPKG_SANDBOX_LIMITS"
#: Processes and threads a kernel may have in all (a fork bomb stops there).
MAX_PROCESSES = 256
#: Default MiB a kernel's working and scratch directories may hold together (and the largest
#: file it may write).
DISK_MB = 1024
#: Default MiB of a kernel's private ``/dev/shm``.
SHM_MB = 256

# ---------------------------------------------------------------------------------------------
# Inside the kernel: capped output (the guard of the checks is in .guard)
# ---------------------------------------------------------------------------------------------


class _CappedStream(io.TextIOBase):
    """Pass writes through until ``limit`` characters per cell, then drop them with one note."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._written = 0
        self._noted = False

    def reset(self) -> None:
        self._written = 0
        self._noted = False

    def write(self, text: str) -> int:
        room = self._limit - self._written
        if room > 0:
            self._stream.write(text[:room])
        elif not self._noted:
            self._noted = True
            self._stream.write(
                f"\n[coursepkg grade: output truncated; a cell may print {self._limit:,} "
                "characters when graded]\n"
            )
        self._written += len(text)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def limit_note(error: BaseException, limits: dict[str, int]) -> str:
    """The line that tells a student which of the grader's limits ``error`` ran into, or ``""``.

    Args:
        error: an exception that ended a cell.
        limits: the kernel's limits in MiB: ``memory``, ``disk``, ``shm`` (0: not enforced).
    """
    import errno

    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG):
        if limits.get("disk"):
            return (
                f"[coursepkg grade: a notebook may write at most {limits['disk']} MB of files when "
                f"graded (its folder and temporary files together; /dev/shm {limits['shm']} MB)]"
            )
    elif isinstance(error, MemoryError) or "can't allocate memory" in str(error):
        if limits.get("memory"):
            return f"[coursepkg grade: a notebook may use at most {limits['memory']} MB of memory]"
    return ""


def _explain_limits(shell: Any) -> None:
    """After the traceback of a cell that failed at one of the grader's limits, say which."""
    limits = json.loads(os.environ.get(LIMITS_ENV) or "{}")

    def explain(self: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None):
        self.showtraceback((etype, value, tb), tb_offset=tb_offset)
        note = limit_note(value, limits) or denied_note(value)
        if note:
            sys.stderr.write(note + "\n")

    shell.set_custom_exc((OSError, MemoryError, RuntimeError), explain)


def _filter_calls(problems: list[str]) -> int:
    """The system-call filter, unless switched off (``SECCOMP_ENV=0``): its number of rules,
    or 0 and the reason added to ``problems``."""
    if os.environ.get(SECCOMP_ENV, "1") == "0":
        return 0
    loaded, why = filter_syscalls()
    problems.extend([why] if why else [])
    return loaded


def _in_kernel_setup() -> None:
    """Run by the kernel (IPKernelApp.exec_lines) before the notebook's first cell."""
    sys.stdout = _CappedStream(sys.stdout, OUTPUT_LIMIT)
    sys.stderr = _CappedStream(sys.stderr, OUTPUT_LIMIT)
    # Imported for the first time, torch._dynamo replaces torch.manual_seed by a wrapper of its
    # own, and an optimizer's first step imports it (ex15's checks step one before forking their
    # ranks): imported before the guard's snapshot, it is no student's change to the checks.
    # A failed import (a folder it may not write) must not leave the checks unguarded.
    try:
        import torch._dynamo  # noqa: F401
    except Exception:
        pass
    from .guard import install_guard

    streams = (sys.stdout, sys.stderr)
    install_guard(streams=streams, reason=os.environ.get(NOT_GRADED_ENV, ""))
    from IPython import get_ipython

    _explain_limits(get_ipython())


# ---------------------------------------------------------------------------------------------
# The kernel launcher and its kernelspec
# ---------------------------------------------------------------------------------------------


def write_kernelspec(
    directory: str | Path,
    *,
    course_root: str | Path,
    memory_mb: int,
    cpu_seconds: int,
    disk_mb: int = DISK_MB,
    shm_mb: int = SHM_MB,
) -> Path:
    """Write the sandbox kernelspec under ``directory/kernels/`` (put ``directory`` on
    ``JUPYTER_PATH`` and use kernel name :data:`KERNEL_NAME`).

    Args:
        directory: a data directory for Jupyter.
        course_root: the nbgrader course directory the kernel must not read.
        memory_mb: the kernel's memory limit in MiB (a memory cgroup where the system has
            one, and the address space).
        cpu_seconds: the kernel's CPU-time limit.
        disk_mb: MiB its working and scratch directories may hold together, and the largest
            file it may write (``RLIMIT_FSIZE``).
        shm_mb: MiB of its private ``/dev/shm``.

    Returns:
        The kernelspec directory.
    """
    spec_dir = Path(directory) / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [
            sys.executable,
            "-m",
            MODULE,
            f"--protect={Path(course_root).resolve()}",
            f"--memory-mb={memory_mb}",
            f"--cpu-seconds={cpu_seconds}",
            f"--disk-mb={disk_mb}",
            f"--shm-mb={shm_mb}",
            "--",
            "-f",
            "{connection_file}",
        ],
        "display_name": "Python 3 (coursepkg grading sandbox)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    return spec_dir


def _parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split the launcher's command line: ``--name=value`` options (``-`` in a name read as
    ``_``; values such as paths are kept as they are), then ``--`` and the kernel's arguments."""
    split = argv.index("--") if "--" in argv else len(argv)
    options = {}
    for arg in argv[:split]:
        name, sep, value = arg.partition("=")
        if not arg.startswith("--") or not sep:
            raise ValueError(f"the sandbox launcher takes --name=value options, not {arg!r}")
        options[name[2:].replace("-", "_")] = value
    return options, argv[split + 1 :]


def _set_limits(options: dict[str, str], status: dict[str, Any], problems: list[str]) -> None:
    """Memory, core dumps, CPU time and processes: each limit the system allows."""
    try:
        die_with_parent()
    except (OSError, AttributeError) as err:
        problems.append(f"PR_SET_PDEATHSIG: {err}")
    try:
        memory = int(options["memory_mb"]) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        status["memory"] = int(options["memory_mb"])
    except (OSError, ValueError) as err:
        problems.append(f"RLIMIT_AS: {err}")
    if os.environ.get(RESOURCES_ENV, "1") != "0":
        _limit_storage(options, status, problems)
    try:
        # A crashing notebook must not leave a core dump the size of its memory behind.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError) as err:
        problems.append(f"RLIMIT_CORE: {err}")
    try:
        cpu = int(options["cpu_seconds"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        status["cpu"] = cpu
    except (OSError, ValueError) as err:
        problems.append(f"RLIMIT_CPU: {err}")
    why = limit_processes(int(options.get("max_processes", MAX_PROCESSES)))
    placed = not why or why.startswith(NOT_UNDER_GRADER)
    status["processes"] = int(options.get("max_processes", MAX_PROCESSES)) if placed else 0
    if why:
        problems.append(f"process limit: {why}")
    if os.environ.get(NETWORK_ENV, "1") != "0":
        why = deny_network()
        status["network"] = "" if why else "namespace"
        if why:
            problems.append(f"network: {why}")
        else:  # 127.0.0.1 for the kernel's own processes (ranks on gloo), nothing beyond
            why = loopback_up()
            if why:
                problems.append(f"loopback: {why}")


def _limit_storage(options: dict[str, str], status: dict[str, Any], problems: list[str]) -> None:
    """A memory cgroup (the address space misses tmpfs and page cache; the cgroup counts
    them) and the largest file the kernel may write."""
    status["memory_cgroup"], why = limit_memory(int(options["memory_mb"]))
    if why:
        problems.append(f"memory cgroup: {why}")
    try:
        size = int(options.get("disk_mb", DISK_MB)) * 2**20
        if size:
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
            status["file_size"] = size // 2**20
    except (OSError, ValueError) as err:
        problems.append(f"RLIMIT_FSIZE: {err}")


# Devices a kernel may write to (besides its own /dev/shm).
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts")


def _ipc_folder(connection: str | None) -> list[str]:
    """The folder where the kernel must create its Unix sockets (transport ``ipc``)."""
    try:
        info = json.loads(Path(connection or "").read_text())
    except (OSError, ValueError):
        return []
    if info.get("transport") != "ipc":
        return []
    return [os.path.dirname(os.path.abspath(info["ip"]))]


def _scratch_folder() -> Path:
    """A private scratch directory for temporary files and IPython's profile (the kernel's
    working directory is nbgrader's ``autograded/<student>/<assignment>/``), made ``TMPDIR``."""
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"coursepkg-kernel-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    for name in ("TMPDIR", "IPYTHONDIR", "MPLCONFIGDIR"):
        os.environ[name] = str(scratch)
    # tempfile caches the folder it found first (the worker's, which Landlock will not let
    # the kernel write): torch._dynamo's import makes its cache folder there
    tempfile.tempdir = None
    return scratch


def launch(argv: list[str]) -> None:
    """Confine this process, then become an IPython kernel (argv as in the kernelspec).

    Args:
        argv: ``--protect=DIR --memory-mb=N --cpu-seconds=N -- <IPKernelApp arguments>``.
    """
    options, kernel_args = _parse(argv)
    protected = Path(options["protect"]).resolve()
    pidfile = os.environ.get(PIDFILE_ENV)
    if pidfile:
        Path(pidfile).write_text(str(os.getpid()))
    # Each protection is applied if the system offers it; what could not be applied is reported
    # (the grader's summary says so) but never stops the kernel: a grade without a sandbox beats
    # no grade.
    status: dict[str, Any] = {"landlock": 0, "memory": 0, "cpu": 0, "network": "", "error": ""}
    status.update(memory_cgroup="", file_size=0, disk=0, shm=0)
    problems: list[str] = []
    _set_limits(options, status, problems)
    scratch = _scratch_folder()
    if os.environ.get(RESOURCES_ENV, "1") != "0":
        # Its own bounded /dev/shm, scratch and working directories, gone when it ends.
        mounted, why = private_mounts(
            Path(os.getcwd()),
            scratch,
            disk_mb=int(options.get("disk_mb", DISK_MB)),
            shm_mb=int(options.get("shm_mb", SHM_MB)),
        )
        status.update(mounted)
        problems.extend(why)
    connection = kernel_args[kernel_args.index("-f") + 1] if "-f" in kernel_args else None
    readable = readable_roots(protected)
    if connection:
        # The file only: its folder may be a shared one such as /tmp.
        readable.append(os.path.abspath(connection))
    readable += [os.getcwd(), "/dev"]
    # /dev/shm only where it is the kernel's own tmpfs: the host's is the machine's memory.
    devices = [f"/dev/{name}" for name in _DEVICES] + (["/dev/shm"] if status["shm"] else [])
    writable = [os.getcwd(), str(scratch), *devices, *_ipc_folder(connection)]
    # Opened before Landlock applies (which checks at open time): the report is written after.
    report = None
    if os.environ.get(STATUS_ENV):
        try:
            report = open(os.environ[STATUS_ENV], "w", encoding="utf-8")  # noqa: SIM115
        except OSError:
            pass
    if os.environ.get(LANDLOCK_ENV, "1") != "0":
        try:
            # TCP only within a namespace of the kernel's own: its loopback reaches nothing else.
            deny_tcp = status["network"] != "namespace"
            status["landlock"] = restrict_files(readable, writable, deny_tcp=deny_tcp)
        except OSError as err:
            problems.append(f"Landlock: {err}")
    if not status["network"] and status["landlock"] >= 4:
        status["network"] = "landlock-tcp"
    status["seccomp"] = _filter_calls(problems)  # last: the steps above mount and unshare
    status["error"] = "; ".join(problems)
    os.environ["COURSEPKG_SANDBOX_LANDLOCK"] = str(status["landlock"])
    enforced = {"memory": status["memory"], "shm": status["shm"]}  # for limit_note, in MiB
    os.environ[LIMITS_ENV] = json.dumps({**enforced, "disk": status["disk"] or status["file_size"]})
    if report is not None:
        with report:
            report.write(json.dumps(status))
    for name in (PIDFILE_ENV, STATUS_ENV):
        os.environ.pop(name, None)  # nothing for the notebook to find

    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(
        argv=[
            *kernel_args,
            f"--IPKernelApp.exec_lines=['import {MODULE} as _cg_sandbox', "
            "'_cg_sandbox._in_kernel_setup()', 'del _cg_sandbox']",
        ]
    )


if __name__ == "__main__":
    launch(sys.argv[1:])
