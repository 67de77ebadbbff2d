"""Size-bounded, private file systems for a grading kernel, in a mount namespace of its own.

A kernel writes in three places: its working directory (nbgrader's
``autograded/<student>/<assignment>/``), its scratch directory (``TMPDIR``) and ``/dev/shm``.
:func:`private_mounts` gives it its own copy of each, so nothing it writes reaches the host's
disk or the host's ``/dev/shm``, everything it writes is counted and bounded, and all of it is
gone when its last process ends (the namespace, and its tmpfs, go with it):

* ``/dev/shm``: a new tmpfs of ``shm_mb`` MiB.
* The scratch directory: a new tmpfs of ``disk_mb`` MiB.
* The working directory: an overlay whose lower layer is the folder nbgrader prepared (the
  notebook and its data files, read as they are) and whose upper layer, where every write goes,
  lives in that same tmpfs: the working and scratch directories share one budget.

The pages of a tmpfs are memory: they are charged to the kernel's memory cgroup
(:func:`~coursepkg.grading.kernel.confine.limit_memory`) as well. A write past a budget fails
with ``OSError: [Errno 28] No space left on device`` in the student's cell.

As root the namespace is made directly; as another user inside a new user namespace (where the
system allows unprivileged ones, and overlays in them: Linux 5.11 or newer). Where neither is
possible nothing is mounted and the caller reports what is not enforced.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .confine import libc, map_own_ids

__all__ = ["private_mounts"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18


def _mount(source: str, target: str | Path, fstype: str | None, flags: int, data: str) -> None:
    lib = libc()
    done = lib.mount(
        source.encode(),
        str(target).encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if done != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'bind'} on {target}: {os.strerror(err)}")


def _own_namespace() -> str:
    """Move this process into a new mount namespace whose mounts stay its own."""
    lib = libc()
    if lib.unshare(_CLONE_NEWNS) != 0:
        first = os.strerror(ctypes.get_errno())
        uid, gid = os.getuid(), os.getgid()
        if lib.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
            second = os.strerror(ctypes.get_errno())
            return f"unshare(CLONE_NEWNS) failed ({first}; in a user namespace: {second})"
        map_own_ids(uid, gid)
    try:
        # Nothing mounted here propagates back to the host's namespace.
        _mount("none", "/", None, _MS_REC | _MS_PRIVATE, "")
    except OSError as err:
        return str(err)
    return ""


def private_mounts(folder: Path, scratch: Path, *, disk_mb: int, shm_mb: int) -> tuple[dict, list]:
    """Give this process (and its future children) private, bounded ``/dev/shm``, ``scratch``
    and ``folder`` (see the module's docstring). Call it in the kernel before any student code
    runs, after joining its memory cgroup (so the tmpfs pages are charged there), before
    Landlock; it changes the working directory to ``folder`` again (now the overlay).

    Args:
        folder: the working directory (its files stay readable; writes go to the overlay).
        scratch: an empty directory for temporary files (``TMPDIR``).
        disk_mb: MiB the working and scratch directories may hold together (0: leave them).
        shm_mb: MiB of ``/dev/shm`` (0: leave it).

    Returns:
        ``({"disk": MiB or 0, "shm": MiB or 0}, problems)``: what was bounded, and why the
        rest was not.
    """
    done = {"disk": 0, "shm": 0}
    if not (disk_mb or shm_mb):
        return done, []
    why = _own_namespace()
    if why:
        return done, [f"private mounts: {why}"]
    problems = []
    if shm_mb:
        try:
            bounded = f"size={shm_mb}m,mode=1777"
            _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, bounded)
            done["shm"] = shm_mb
        except OSError as err:
            problems.append(f"/dev/shm: {err}")
    if disk_mb:
        try:
            _mount("tmpfs", scratch, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={disk_mb}m,mode=700")
            for part in ("tmp", "upper", "work"):
                (scratch / part).mkdir()
            layers = f"lowerdir={folder},upperdir={scratch}/upper,workdir={scratch}/work"
            _mount("overlay", folder, "overlay", _MS_NOSUID | _MS_NODEV, layers)
            # The scratch directory shows its "tmp" part only (the overlay's layers hide below).
            _mount(str(scratch / "tmp"), scratch, None, _MS_BIND, "")
            os.chdir(folder)
            done["disk"] = disk_mb
        except OSError as err:
            problems.append(f"working and scratch directories: {err}")
    return done, problems
