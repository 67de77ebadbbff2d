"""Confinement helpers for the kernels that run students' notebooks (Linux), shared by the
sandbox launcher (:mod:`coursepkg.grading.kernel.sandbox`), the fork server and the grading
worker.

Each helper applies one protection if the system offers it and says what it could not do; none
of them stops a kernel (a grade without a sandbox beats no grade, and the grader's summary says
what was missing):

* :func:`restrict_files` -- Landlock: read only the listed trees, write only the listed ones,
  optionally no TCP at all (ABI >= 4), no signals out of the sandbox (ABI >= 6).
* :func:`deny_network` -- a network namespace of the kernel's own (``unshare(CLONE_NEWNET)``,
  as root, or inside a new user namespace otherwise): no interface but a loopback of its own,
  brought up (:func:`loopback_up`), so 127.0.0.1 reaches only the kernel and its children (the
  two ranks an exercise on data parallelism starts, say) while every other connection, to the
  grader's PostgreSQL on the host's 127.0.0.1 or anywhere, fails.
* :func:`limit_processes` -- a fork bomb is contained: a ``pids`` cgroup with a ceiling (as root,
  where ``RLIMIT_NPROC`` does not apply) and ``RLIMIT_NPROC`` (as any other user);
  :func:`remove_stale_cgroups` removes the groups of kernels that died with their worker.
* :func:`limit_memory` -- a memory cgroup (v2 where writable, else v1) that counts tmpfs and page
  cache too, not only the address space ``RLIMIT_AS`` sees.
* :func:`kernel_environment` -- the environment a kernel may see: no database URL, password,
  token or key of the grader.
* :func:`die_with_parent` -- ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import functools
import os
import re
import resource
import signal
import socket
import struct
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ENDED",
    "PR_SET_PDEATHSIG",
    "die_with_parent",
    "deny_network",
    "kernel_environment",
    "kill_process_group_cgroup",
    "landlock_abi",
    "libc",
    "limit_memory",
    "limit_processes",
    "loopback_up",
    "map_own_ids",
    "NOT_UNDER_GRADER",
    "readable_roots",
    "process_alive",
    "remove_stale_cgroups",
    "restrict_files",
]

# ---------------------------------------------------------------------------------------------
# Landlock (Linux): an unprivileged file-system sandbox, via its three system calls
# ---------------------------------------------------------------------------------------------
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # same on x86-64/arm64
_RULE_PATH_BENEATH = 1
_CREATE_RULESET_VERSION = 1
_PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_READ = _EXECUTE | _READ_FILE | _READ_DIR
# The rights a rule on a single file may carry: execute, write, read, truncate (3), ioctl (5).
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | (1 << 14) | (1 << 15)
# Landlock's rights by the ABI that introduced them (1: 13 rights; 2: REFER; 3: TRUNCATE;
# 5: IOCTL_DEV). A ruleset may only name rights its kernel knows.
_ALL_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_SCOPE_SIGNAL = 1 << 1  # ABI 6
_NET_TCP = (1 << 0) | (1 << 1)  # ABI 4: bind and connect TCP


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@functools.cache
def libc() -> Any:
    """The C library, through ctypes (errno kept), found once per process: ``find_library``
    runs ``ldconfig -p`` in a subprocess at each call, and a kernel called this five times
    as it confined itself (forked from the fork server, which found it already: none)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def landlock_abi() -> int:
    """The Landlock ABI version the running kernel offers (0 when there is none)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        version = libc().syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def _handled(abi: int) -> int:
    return max(mask for version, mask in _ALL_BY_ABI.items() if version <= abi)


def restrict_files(
    read: Iterable[str | Path], write: Iterable[str | Path], *, deny_tcp: bool = False
) -> int:
    """Confine this process (and its future children) to reading ``read`` and writing ``write``.

    Paths that do not exist are skipped. Every right Landlock knows is restricted: outside
    the listed directories, files can be neither read, written, created nor removed.

    Args:
        read: directories (with everything under them) that may be read and executed, or
            single files that may be read.
        write: directories that may also be written, created in and removed from.
        deny_tcp: also forbid binding and connecting TCP sockets (Landlock ABI >= 4;
            ignored below it).

    Returns:
        The Landlock ABI used, or 0 when the kernel has no Landlock (nothing was restricted).
    """
    abi = landlock_abi()
    if abi < 1:
        return 0
    lib = libc()
    handled = _handled(abi)
    # struct landlock_ruleset_attr grew with the ABI: fs (1), net (4), scoped (6).
    net = _NET_TCP if deny_tcp and abi >= 4 else 0
    fields = (
        [handled, net, _SCOPE_SIGNAL] if abi >= 6 else [handled, net] if abi >= 4 else [handled]
    )
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    ruleset = lib.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, access in ((read, _READ), (write, handled)):
            for path in paths:
                if not os.path.exists(path):
                    continue
                rights = access if os.path.isdir(path) else access & _FILE_RIGHTS & handled
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    rule = _PathBeneath(rights, fd)
                    if lib.syscall(
                        _SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0
                    ):
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
                finally:
                    os.close(fd)
        if lib.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if lib.syscall(_SYS_RESTRICT_SELF, ruleset, 0):
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def readable_roots(protected: Path) -> list[str]:
    """Directories the kernel needs to read: the interpreter, libraries, system files.

    A directory that contains ``protected`` (the course root) is left out, so granting it
    cannot expose ``solutions/``; the course's own virtual environment or package, which sit
    *inside* the course directory, are fine.
    """
    import coursepkg

    candidates = [
        "/usr",
        "/lib",
        "/lib64",
        "/lib32",
        "/bin",
        "/sbin",
        "/etc",
        "/opt",
        "/proc",
        "/sys",
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        os.path.dirname(os.path.abspath(coursepkg.__file__)),
        *(p for p in sys.path if p and os.path.isabs(p)),
    ]
    roots = []
    for path in candidates:
        real = Path(os.path.realpath(path))
        if real == protected or protected.is_relative_to(real):
            continue
        roots.append(str(real))
    return sorted(set(roots))


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent dies.

    Raises:
        OSError: the call failed.
    """
    if libc().prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


# ---------------------------------------------------------------------------------------------
# Network: a namespace of the kernel's own
# ---------------------------------------------------------------------------------------------

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000


def map_own_ids(uid: int, gid: int) -> None:
    """In a user namespace just made, map ``uid``/``gid`` (the ids outside) to themselves, so
    files keep their owner."""
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError:
        pass  # unmapped ids only change how owners are shown, not what may be opened


_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH22x"  # struct ifreq: the interface's name, then its flags (40 bytes in all)


def loopback_up() -> str:
    """Bring up the loopback interface ``lo`` of this process' network namespace.

    A new namespace's loopback is down, so even 127.0.0.1 is unreachable. Up, it joins only the
    processes of the same namespace: the host's 127.0.0.1 is another interface. Setting the
    flag needs ``CAP_NET_ADMIN`` over the namespace, which the process has just after
    :func:`deny_network` made it (as root, or as the owner of the new user namespace).

    Returns:
        ``""`` when ``lo`` is up, else why it could not be brought up.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            asked = struct.pack(_IFREQ, b"lo", 0)
            flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, asked))[1]
            fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))
    except OSError as err:
        return f"could not bring the loopback interface up: {err}"
    return ""


def deny_network() -> str:
    """Move this process (and its future children) into a new network namespace, whose only
    interface is a loopback of its own, down until :func:`loopback_up`.

    Must be called while the process has a single thread (a user namespace demands it). The
    kernel then talks to its manager over Unix sockets (``KernelManager.transport = "ipc"``),
    which a network namespace does not cut.

    Returns:
        ``""`` when done, else why it could not be done.
    """
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (this is {sys.platform})"
    lib = libc()
    if lib.unshare(_CLONE_NEWNET) == 0:
        return ""
    first = os.strerror(ctypes.get_errno())
    uid, gid = os.getuid(), os.getgid()
    if lib.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
        map_own_ids(uid, gid)
        return ""
    second = os.strerror(ctypes.get_errno())
    return f"unshare(CLONE_NEWNET) failed ({first}; in a user namespace: {second})"


# ---------------------------------------------------------------------------------------------
# Processes: a ceiling against fork bombs
# ---------------------------------------------------------------------------------------------

#: Where the grader's cgroups live: cgroup v1 hierarchies (one per controller), then v2's unified
#: one (mounted at /sys/fs/cgroup, or at /sys/fs/cgroup/unified on a hybrid layout).
_V1 = Path("/sys/fs/cgroup")
_V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
_CGROUP_PREFIX = "coursepkg-kernel-"
#: What the memory cgroups of ended kernels recorded (by kernel pid), read when their group is
#: removed: ``{"oom_kills": N, "peak_mb": M}``. The worker pops its kernel's entry.
ENDED: dict[int, dict[str, int]] = {}


def _cgroup_root(controller: str) -> Path | None:
    """The hierarchy where this process may make groups with ``controller`` (``pids``,
    ``memory``): cgroup v1's own, else v2's when the controller is (or can be) enabled for
    children of its root. None when there is none."""
    v1 = _V1 / controller
    if (v1 / "cgroup.procs").is_file() and not (v1 / "cgroup.controllers").exists():
        return v1
    for root in _V2_ROOTS:
        if not (root / "cgroup.controllers").is_file():
            continue
        if controller in _read(root / "cgroup.subtree_control").split():
            return root
        if controller in _read(root / "cgroup.controllers").split():
            try:  # root may enable it for the groups under the root
                (root / "cgroup.subtree_control").write_text(f"+{controller}")
                return root
            except OSError:
                continue
    return None


#: How a reason begins when the limit is in place but the grader's own limit does not cover it
#: (the group had to go under the hierarchy's root, or v1 does not charge it to the grader).
NOT_UNDER_GRADER = "in place, but not under the grader's own cgroup"


def _own_path(root: Path, controller: str) -> str:
    """This process's cgroup in hierarchy ``root``, relative to it (``""``: the root), from
    ``/proc/self/cgroup`` (v1: the line ``N:...,controller,...:/path``; v2: ``0::/path``).

    A kernel's own group at the end is left out: on v2 ``pids`` and ``memory`` share one
    hierarchy, and a kernel that joined its ``pids`` group must make its ``memory`` group in
    the same parent, the one its worker computes too."""
    v2 = (root / "cgroup.controllers").is_file()
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        number, names, path = (line.split(":", 2) + ["", ""])[:3]
        if (number == "0" and not names) if v2 else controller in names.split(","):
            parts = [part for part in path.split("/") if part]
            while parts and parts[-1].startswith(_CGROUP_PREFIX):
                parts.pop()
            return "/".join(parts)
    return ""


def _v2_parent(root: Path, own: Path) -> tuple[Path, str]:
    """On cgroup v2: the nearest group, from this process's own up, whose
    ``cgroup.subtree_control`` already has both ``pids`` and ``memory``.

    v2's "no internal processes" rule: a group other than the root that has processes in it
    (this grader) cannot enable a controller for its children (EBUSY), nor can a process join a
    group that has. So the grader's own group can hold no limited kernels; the way v2 is meant
    to be used is a delegated group (systemd ``Delegate=yes``, a container's) with the
    controllers enabled, the grader in a leaf of it, the kernels beside that leaf: that
    group's limits hold for them (a limit set on the grader's leaf alone would not). A kernel
    is in one group per v2 hierarchy, so ``pids`` and ``memory`` share that group, and both
    controllers are asked of it. Without such a group: the root, with a note. Nothing is
    enabled here in groups the grader does not own."""
    group = own
    while group != root:
        enabled = _read(group / "cgroup.subtree_control").split()
        if {"pids", "memory"} <= set(enabled) and os.access(group, os.W_OK | os.X_OK):
            return group, ""
        group = group.parent
    why = f"no group above {own} has pids and memory in its cgroup.subtree_control"
    return root, f"{NOT_UNDER_GRADER} ({why}): under {root}"


def _cgroup_parent(controller: str) -> tuple[Path | None, str]:
    """Where the kernels' groups of ``controller`` go: under this process's own cgroup, so the
    grader's limits (a systemd slice's, a container's) hold for its kernels too, else under
    the hierarchy's root (v2: see :func:`_v2_parent`). Returns ``(folder or None, note)``;
    the note, when the grader's own limits do not cover the folder, starts with
    :data:`NOT_UNDER_GRADER`. The kernel (before it joins) and its worker are in the same
    cgroup, so both compute the same folder."""
    root = _cgroup_root(controller)
    if root is None:
        return None, ""
    own = root / _own_path(root, controller)
    if own == root:
        return root, ""
    if not (own.is_dir() and os.access(own, os.W_OK | os.X_OK)):
        return root, f"{NOT_UNDER_GRADER} ({own} is not writable): under {root}"
    if (root / "cgroup.controllers").is_file():
        return _v2_parent(root, own)
    if controller == "memory" and _read(own / "memory.use_hierarchy").strip() == "0":
        # v1 with use_hierarchy=0 (kernels before 5.16 allowed it): a child's usage is not
        # charged to its parent and the parent's limit does not apply to it, so the kernel's
        # own limit holds but the grader's does not cover its kernels; the note says so.
        return own, f"{NOT_UNDER_GRADER} (memory.use_hierarchy is 0 in {own})"
    return own, ""


def _group_parents() -> list[Path]:
    """Every folder the kernels' groups may be in (each once): this process's own cgroup in
    each hierarchy, and each hierarchy's root (the fallback, and where earlier versions put
    them)."""
    folders = set()
    for controller in ("pids", "memory"):
        parent, _ = _cgroup_parent(controller)
        folders |= {parent, _cgroup_root(controller)} - {None}
    return sorted(folders)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _join(controller: str, settings: dict[str, int]) -> str:
    """Put this process into its group ``coursepkg-kernel-<pid>`` of ``controller`` (under
    :func:`_cgroup_parent`) with ``settings`` (file name -> value; a file the kernel lacks is
    skipped, the first must exist). Returns ``""``, a note starting with
    :data:`NOT_UNDER_GRADER` (the limit is in place), or why not."""
    parent, note = _cgroup_parent(controller)
    if parent is None:
        return f"no {controller} cgroup controller is mounted or can be enabled"
    group = parent / f"{_CGROUP_PREFIX}{os.getpid()}"
    first = True
    try:
        group.mkdir(exist_ok=True)
        for name, value in settings.items():
            if first or (group / name).exists():
                (group / name).write_text(str(value))
            first = False
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as err:
        return f"{controller} cgroup {group}: {err}"
    return note


def _processes_of(uid: int) -> int:
    """How many processes (threads included) the user ``uid`` has now (Linux ``/proc``)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                pass
    return count


def limit_processes(most: int) -> str:
    """Let this process and its descendants have at most ``most`` processes (and threads).

    As root, ``RLIMIT_NPROC`` is not enforced, so the process moves into a ``pids`` cgroup of
    its own (``coursepkg-kernel-<pid>``; :func:`kill_process_group_cgroup` kills what is left
    in it and removes it). As another user ``RLIMIT_NPROC`` counts that user's processes.

    Args:
        most: the ceiling (PyTorch's and ZeroMQ's threads count too).

    Returns:
        ``""`` when a ceiling is in place (or a note starting with :data:`NOT_UNDER_GRADER`),
        else why not.
    """
    if os.geteuid() != 0:
        try:
            # RLIMIT_NPROC counts all of the user's processes, so the ceiling is above those.
            most += _processes_of(os.getuid())
            resource.setrlimit(resource.RLIMIT_NPROC, (most, most))
            return ""
        except (OSError, ValueError) as err:
            return f"RLIMIT_NPROC: {err}"
    why = _join("pids", {"pids.max": most})
    return f"{why}, and RLIMIT_NPROC does not bind root" if why.startswith("no ") else why


def limit_memory(megabytes: int) -> tuple[str, str]:
    """Put this process and its descendants in a memory cgroup of ``megabytes`` MiB.

    Everything the kernel charges counts: its anonymous memory, the files it writes into a
    tmpfs (``/dev/shm``, ``memfd_create``) and the page cache of what it reads and writes,
    with no swap (cgroup v2's ``memory.max`` and ``memory.swap.max`` = 0; v1's
    ``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``). At the limit the kernel's
    out-of-memory killer stops the notebook's kernel; :func:`kill_process_group_cgroup`
    records that in :data:`ENDED`. Needs write access to the hierarchy (root).

    Args:
        megabytes: the limit in MiB.

    Returns:
        ``(mechanism, why_not)``: ``("cgroup v1", "")`` or ``("cgroup v2", "")`` when the
        limit is in place (with a note starting with :data:`NOT_UNDER_GRADER` instead of
        ``""`` when the grader's own cgroup does not cover it), else ``("", the reason)``.
    """
    limit = megabytes * 2**20
    root = _cgroup_root("memory")
    if root == _V1 / "memory":
        settings = {"memory.limit_in_bytes": limit, "memory.memsw.limit_in_bytes": limit}
        why = _join("memory", settings)
        return ("", why) if why and not why.startswith(NOT_UNDER_GRADER) else ("cgroup v1", why)
    why = _join("memory", {"memory.max": limit, "memory.swap.max": 0})
    return ("", why) if why and not why.startswith(NOT_UNDER_GRADER) else ("cgroup v2", why)


def _memory_record(group: Path) -> dict[str, int]:
    """Out-of-memory kills and peak use recorded by a memory group (v1 or v2)."""
    events = _read(group / "memory.events") or _read(group / "memory.oom_control")
    kills = re.search(r"^oom_kill (\d+)", events, re.MULTILINE)
    peak = _read(group / "memory.peak") or _read(group / "memory.max_usage_in_bytes")
    return {
        "oom_kills": int(kills.group(1)) if kills else 0,
        "peak_mb": int(peak.split()[0]) // 2**20 if peak.strip().isdigit() else 0,
    }


def kill_process_group_cgroup(pid: int) -> None:
    """Kill every process left in the cgroups of kernel ``pid`` (``pids``, ``memory``) and
    remove them (root only; nothing to do elsewhere), recording a memory group's out-of-memory
    kills in :data:`ENDED`. Safe to call when there is no such cgroup."""
    import time

    for parent in _group_parents():
        group = parent / f"{_CGROUP_PREFIX}{pid}"
        for _ in range(100):
            if not group.is_dir():
                break
            left = [int(p) for p in _read(group / "cgroup.procs").split()]
            for other in left:
                try:
                    os.kill(other, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if (group / "memory.oom_control").exists() or (group / "memory.events").exists():
                ENDED[pid] = _memory_record(group)
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)  # killed processes leave the cgroup when they are reaped


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    return bool(stat) and stat.rsplit(")", 1)[-1].split()[0] != "Z"


def remove_stale_cgroups() -> int:
    """Remove the cgroups of kernels that are gone, killing what is left in them.

    A kernel normally has its groups removed by :func:`kill_process_group_cgroup` when it
    ends; one that died with its worker (a worker killed, or a notebook that kills its grader)
    leaves empty groups behind. Groups whose kernel still runs (this grader's or another's on
    the same machine) are left alone. Root only, as the groups are; nothing to do elsewhere.

    Returns:
        How many groups were removed.
    """
    if os.geteuid() != 0:
        return 0
    removed = 0
    for parent in _group_parents():
        for group in parent.glob(f"{_CGROUP_PREFIX}*"):
            pid = group.name.removeprefix(_CGROUP_PREFIX)
            if not pid.isdigit() or process_alive(int(pid)):
                continue
            kill_process_group_cgroup(int(pid))
            ENDED.pop(int(pid), None)
            removed += not group.exists()
    return removed


# ---------------------------------------------------------------------------------------------
# Environment: nothing secret reaches a kernel
# ---------------------------------------------------------------------------------------------

# Names a kernel needs; anything else of the grader's environment is dropped.
_KEEP = re.compile(
    r"^(PATH|HOME|USER|LOGNAME|LANG|LANGUAGE|TZ|TERM|TMPDIR|LC_\w+|JPY_\w+|JUPYTER_\w+|"
    r"IPYTHONDIR|MPLBACKEND|MPLCONFIGDIR|OMP_NUM_THREADS|MKL_NUM_THREADS|PYTHONHASHSEED|"
    r"PYTHONUNBUFFERED|PYTHONIOENCODING|VIRTUAL_ENV|COURSEPKG_\w+)$"
)
# Even among those, values that look like a connection string with credentials go.
_SECRET_VALUE = re.compile(r"://[^/@\s]*:[^/@\s]*@|postgres(ql)?(\+\w+)?://", re.IGNORECASE)


def kernel_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The part of ``env`` a student's kernel may see.

    An allow-list, not a deny-list: the grader's database URL, ``PGPASSWORD``, cloud and
    scheduler credentials, tokens... never reach student code, whatever their names, and a
    value that looks like a database URL is dropped even under an allowed name.

    Args:
        env: the environment the kernel would otherwise inherit.

    Returns:
        A new dict.
    """
    return {
        key: value
        for key, value in env.items()
        if _KEEP.match(key) and not _SECRET_VALUE.search(value)
    }
