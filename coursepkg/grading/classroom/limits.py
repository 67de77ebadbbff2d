"""The limits of each student's kernel when ``coursepkg grade`` grades a class, and where they
are set: ``coursepkg grade``'s options, else the course's ``nbgrader_config.py``
(``c.GradeLimits.memory_mb = 4096`` ...), else the defaults below, chosen for the course's
notebooks (ex09 trains a small model for minutes in well under 1 GiB).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traitlets import Int
from traitlets.config import Configurable

from ..kernel.sandbox import DISK_MB, SHM_MB

__all__ = ["GradeLimits", "course_limits"]


class GradeLimits(Configurable):
    """Per-kernel limits of ``coursepkg grade`` (set them in ``nbgrader_config.py`` as
    ``c.GradeLimits.<name> = value``; a command-line option wins over them)."""

    cell_timeout = Int(
        None,
        allow_none=True,
        help="Seconds one cell may run (default: what the notebook asks for in "
        "metadata.coursepkg.cell_timeout, 900 for ex09's training, else 120).",
    ).tag(config=True)
    notebook_timeout = Int(900, help="Seconds a whole notebook may take.").tag(config=True)
    memory_mb = Int(
        4096,
        help="MiB of memory per kernel: a memory cgroup (files in /dev/shm and other tmpfs, page "
        "cache included) where the host has one, and the address space (RLIMIT_AS).",
    ).tag(config=True)
    disk_mb = Int(
        DISK_MB,
        help="MiB a kernel's working and scratch folders may hold together (a private tmpfs), "
        "and the largest file it may write (RLIMIT_FSIZE).",
    ).tag(config=True)
    shm_mb = Int(SHM_MB, help="MiB of a kernel's private /dev/shm.").tag(config=True)


def course_limits(root: str | Path, **given: int | None) -> dict[str, Any]:
    """The limits to grade with: those ``given`` (not None), else the course's
    ``nbgrader_config.py``, else :class:`GradeLimits`' defaults.

    Args:
        root: the course directory.
        **given: limits by trait name (``memory_mb=...``); None means "not given".

    Returns:
        Every limit by trait name.

    Raises:
        ValueError: a limit is not positive (the name, the value).
    """
    from traitlets.config.loader import PyFileConfigLoader

    path = Path(root) / "nbgrader_config.py"
    config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    configured = GradeLimits(config=config)
    limits = {
        name: given[name] if given.get(name) is not None else getattr(configured, name)
        for name in GradeLimits.class_trait_names(config=True)
    }
    for name, value in limits.items():
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be a positive number, got {value}")
    return limits
