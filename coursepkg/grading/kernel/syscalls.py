"""The grading kernel's system-call filter (seccomp, through libseccomp's ctypes binding
``pyseccomp``): the calls a notebook never needs are denied with ``EPERM``, as nsjail and
isolate deny them, on top of the memory cgroup, the private mounts, Landlock and the network
namespace (:mod:`.confine`, :mod:`.mounts`).

Denied: tracing another process (``ptrace``, ``process_vm_readv``/``writev``), mounting and
namespaces (``mount``, ``umount2``, ``pivot_root``, ``unshare``, ``setns``), kernel modules
and kexec, BPF programs and ``perf_event_open``, the kernel keyring, ``reboot``, swap, and raw
or packet sockets. The filter is inherited by every process the kernel starts and cannot be
removed. A denied call raises ``PermissionError`` in the notebook; :func:`denied_note` is the
line the kernel adds under its traceback.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

__all__ = ["DENIED", "SECCOMP_ENV", "denied_note", "filter_syscalls"]

#: Set to "0" to start kernels without the filter (as ``COURSEPKG_SANDBOX_LANDLOCK``).
SECCOMP_ENV = "COURSEPKG_SANDBOX_SECCOMP"

#: Each denied system call and why no notebook needs it.
DENIED: dict[str, str] = {
    "ptrace": "tracing or reading another process",
    "process_vm_readv": "reading another process's memory",
    "process_vm_writev": "writing another process's memory",
    "mount": "mounting file systems",
    "umount2": "unmounting file systems",
    "pivot_root": "changing the root file system",
    "unshare": "new namespaces",
    "setns": "entering other namespaces",
    "init_module": "loading kernel modules",
    "finit_module": "loading kernel modules",
    "delete_module": "unloading kernel modules",
    "kexec_load": "replacing the running kernel",
    "kexec_file_load": "replacing the running kernel",
    "bpf": "BPF programs",
    "perf_event_open": "hardware performance counters",
    "keyctl": "the kernel keyring",
    "add_key": "the kernel keyring",
    "request_key": "the kernel keyring",
    "reboot": "rebooting",
    "swapon": "swap devices",
    "swapoff": "swap devices",
}

#: The families whose every socket is raw: packet sockets see every frame of an interface.
_RAW_FAMILIES = (socket.AF_PACKET,)
#: The families whose SOCK_RAW sockets are denied (ping's datagram sockets stay allowed).
_IP_FAMILIES = (socket.AF_INET, socket.AF_INET6)
_TYPE_MASK = 0xF  # socket's type argument also carries SOCK_NONBLOCK and SOCK_CLOEXEC


def filter_syscalls() -> tuple[int, str]:
    """Load the filter into this process (and so into everything it starts).

    Returns:
        (the number of rules loaded, "" or why there is no filter: the binding or
        libseccomp missing, or the kernel refusing seccomp).
    """
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as err:  # OSError: libseccomp.so.2 not found
        return 0, f"no system-call filter: pyseccomp or libseccomp is missing ({err})"
    deny = seccomp.ERRNO(errno.EPERM)
    try:
        rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        count = 0
        for name in DENIED:
            try:
                rules.add_rule(deny, name)
                count += 1
            except (OSError, ValueError, RuntimeError):
                continue  # a call this architecture does not have
        for family in _RAW_FAMILIES:
            rules.add_rule(deny, "socket", seccomp.Arg(0, seccomp.EQ, family))
            count += 1
        for family in _IP_FAMILIES:
            domain = seccomp.Arg(0, seccomp.EQ, family)
            kind = seccomp.Arg(1, seccomp.MASKED_EQ, _TYPE_MASK, socket.SOCK_RAW)
            rules.add_rule(deny, "socket", domain, kind)
            count += 1
        rules.load()
    except OSError as err:
        return 0, f"no system-call filter: seccomp refused it ({err})"
    os.environ[SECCOMP_ENV + "_LOADED"] = str(count)
    return count, ""


def denied_note(error: Any) -> str:
    """The line under the traceback of a ``PermissionError`` raised in a filtered kernel."""
    if not (isinstance(error, PermissionError) and error.errno == errno.EPERM):
        return ""
    if not os.environ.get(SECCOMP_ENV + "_LOADED"):
        return ""
    return (
        "(The grader's kernel denies some system calls a notebook never needs: "
        + ", ".join(sorted({why for why in DENIED.values()}))
        + ", raw sockets. If your code made one of these calls, that is why it was refused.)"
    )
