"""The watch of a kernel that trains a model (ex09_training_run): what the kernel did after the
notebook's setup cell.

:func:`watch_training` installs, once per kernel and for good (audit hooks cannot be removed),
an audit hook and a global optimiser-step hook. They record every optimiser step (its learning
rate and a copy of the parameters it updated), every file opened for reading outside Python's
and the installed packages' own files, every new process and network connection, and, while
the grader runs the student's decoder, any look at call frames or the garbage collector's
objects. :mod:`coursepkg.grading.checks.ex09_training_run` grades from that record;
:func:`kernel_cpu_seconds` is the CPU budget's clock.
"""

from __future__ import annotations

import importlib.util
import math
import os
import resource
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook

__all__ = [
    "CPU_BUDGET_SECONDS",
    "TrainingWatch",
    "current_watch",
    "kernel_cpu_seconds",
    "watch_training",
]

#: CPU seconds the whole kernel may have used when grading starts (imports, training, the
#: visible checks). Measured: a correct solution trains to >= 99 % in about a third of it.
CPU_BUDGET_SECONDS = 300

# ---------------------------------------------------------------------------------------------
# The watch: what the kernel did after the setup cell
# ---------------------------------------------------------------------------------------------

_PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system")
_PROCESS_EVENTS += ("subprocess.Popen", "pty.spawn")
_NETWORK_EVENTS = ("socket.connect", "socket.getaddrinfo", "urllib.Request")
_SNOOP_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames")
# Ways to reach another function's frame; flagged only while the grader runs student code.
_FRAME_ATTRS = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back")


def _trusted_roots() -> tuple[str, ...]:
    """Directories whose files any Python program reads: the interpreter, the installed
    packages (coursepkg's source included, its cache of trained models not), system data."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.__file__)}
    paths.update(p for p in sysconfig.get_paths().values() if p)
    paths.update(("/proc", "/sys", "/dev", "/etc", "/usr/share", "/usr/lib", "/lib"))
    return tuple(os.path.realpath(p) + os.sep for p in paths)


def _matplotlib_dirs() -> tuple[str, ...]:
    """Where matplotlib keeps its font cache and settings (read when a student plots)."""
    home = Path.home()
    paths = [str(home / d / "matplotlib") for d in (".cache", ".config")]
    paths += [os.environ["MPLCONFIGDIR"]] if os.environ.get("MPLCONFIGDIR") else []
    return tuple(os.path.realpath(p) + os.sep for p in paths)


def _compiled_module(path: str) -> bool:
    """Whether ``path`` is Python's bytecode cache of a module whose source sits beside it
    (``pkg/__pycache__/mod.cpython-311.pyc`` of ``pkg/mod.py``): what an import reads."""
    try:
        source = importlib.util.source_from_cache(path)
    except ValueError:  # not a __pycache__/*.pyc path
        return False
    return os.path.isfile(source)


def kernel_cpu_seconds() -> float:
    """CPU time this process and its finished children have used (user + system, all
    threads), as the kernel sees it: nothing a notebook does in Python can lower it."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class TrainingWatch:
    """What the kernel did since :func:`watch_training` (read it, do not write it).

    Attributes:
        violations: what disqualifies the run (a file read, a process started, ...), in order.
        steps: optimiser steps taken.
        lrs: the learning rate of each step (of the first parameter group).
    """

    violations: list[str] = field(default_factory=list)
    steps: int = 0
    lrs: list[float] = field(default_factory=list)
    _after_step: dict[int, Tensor] = field(default_factory=dict, repr=False)
    _grading: list[bool] = field(default_factory=lambda: [False], repr=False)

    def weights_after_last_step(self, param: Tensor) -> Tensor | None:
        """The value ``param`` had right after the last optimiser step that updated it."""
        return self._after_step.get(id(param))


_WATCH: list[TrainingWatch] = []
_LOCK = threading.Lock()


def current_watch() -> TrainingWatch | None:
    """The kernel's :class:`TrainingWatch`, or None before the setup cell ran."""
    return _WATCH[0] if _WATCH else None


def watch_training(interrupt_after: float | None = None) -> TrainingWatch:
    """Start recording (the notebook's locked setup cell calls this); idempotent per kernel.

    Args:
        interrupt_after: kernel CPU seconds after which the kernel is interrupted (default
            1.5 times :data:`CPU_BUDGET_SECONDS`); only the first call's value counts.

    Returns:
        The kernel's :class:`TrainingWatch` (the same object on every call).
    """
    with _LOCK:
        if _WATCH:
            return _WATCH[0]
        watch = TrainingWatch()
        limit = 1.5 * CPU_BUDGET_SECONDS if interrupt_after is None else float(interrupt_after)
        _install(watch, limit)
        _WATCH.append(watch)
        return watch


def _install(watch: TrainingWatch, limit: float) -> None:
    roots = _trusted_roots()
    ipykernel_tmp = os.path.join(os.path.realpath(tempfile.gettempdir()), "ipykernel_")
    package = os.path.realpath(Path(__file__).parents[2]) + os.sep  # .../coursepkg/
    plotting = _matplotlib_dirs()
    # Library code that reads its caller's frame for its own purposes, not to snoop.
    frame_users = tuple(
        os.path.join(os.path.dirname(os.__file__), f)
        for f in (
            "logging/__init__.py",
            "typing.py",
            "warnings.py",
            "enum.py",
            "collections/__init__.py",
        )
    )
    busy = threading.local()  # the hook's own work must not re-enter it

    def flag(message: str) -> None:
        if message not in watch.violations:
            watch.violations.append(message)

    def on_open(path: Any, mode: Any, flags: Any) -> None:
        if isinstance(path, int) or path is None:
            return  # an already open descriptor
        writing = isinstance(mode, str) and any(c in mode for c in "wax")
        writing |= isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_CREAT))
        if writing and not (isinstance(mode, str) and "+" in mode):
            return
        real = os.path.realpath(os.fsdecode(path))
        if real.startswith(roots):
            return
        name = os.path.basename(real)
        if real.startswith(plotting) and (name.startswith("fontlist-") or name == "matplotlibrc"):
            return
        if real.endswith(".py") and real.startswith((ipykernel_tmp, package)):
            # Source for tracebacks and warnings: IPython's copies of the notebook's cells,
            # and coursepkg's own modules (an editable install lives outside site-packages).
            return
        if real.startswith(package) and _compiled_module(real):
            # coursepkg's own modules imported after the setup cell (its imports are lazy)
            return
        flag(f"read the file {real}")

    def hook(event: str, args: tuple) -> None:
        if getattr(busy, "on", False):
            return
        busy.on = True
        try:
            if event == "open":
                on_open(*args[:3])
            elif event.startswith(_PROCESS_EVENTS):
                flag(f"started another process ({event})")
            elif event in _NETWORK_EVENTS:
                flag(f"opened a network connection ({event})")
            elif event in _SNOOP_EVENTS:
                flag(f"searched the interpreter's memory ({event})")
            elif watch._grading[0] and event == "sys._getframe":
                caller = sys._getframe(1).f_code.co_filename  # who called sys._getframe
                if caller not in frame_users:
                    flag("looked at the grader's call frames while being graded")
            elif watch._grading[0] and event == "object.__getattr__" and args[1] in _FRAME_ATTRS:
                flag("looked at the grader's call frames while being graded")
        finally:
            busy.on = False

    def after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        watch.steps += 1
        watch.lrs.append(float(optimizer.param_groups[0].get("lr", math.nan)))
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    watch._after_step[id(p)] = p.detach().clone()

    sys.addaudithook(hook)
    register_optimizer_step_post_hook(after_step)
    threading.Thread(target=_watchdog, args=(watch, limit), daemon=True, name="ex09-budget").start()


def _watchdog(watch: TrainingWatch, limit: float) -> None:
    """Interrupt the kernel (as the Stop button does) once it has used half as much CPU again
    as the budget: such a run earns nothing, and an endless training should not have to wait
    for the grader's per-cell timeout. Repeats every 10 s while the kernel keeps computing
    (an idle kernel is left alone)."""
    import _thread
    import time

    while kernel_cpu_seconds() < limit:
        time.sleep(1.0)
    watch.violations.append(
        f"used more than {limit:.0f} CPU seconds and was interrupted (restart the kernel "
        "before the run you want graded)"
    )
    while True:
        before = kernel_cpu_seconds()
        _thread.interrupt_main()
        time.sleep(10.0)
        while kernel_cpu_seconds() - before < 5.0:  # idle: wait for computing to resume
            before = kernel_cpu_seconds()
            time.sleep(10.0)
