"""Keeping a trained run on disk: the file its settings key, loading it back, saving it whole,
and what it keeps of a trained model (its weights and the history of its training).

The recipes of :mod:`coursepkg.chapters.recipes` use it so that a later chapter can open the model
an earlier chapter trained instead of training it again. A file is reused only when everything
that could change the weights is the same, and deleting the folder is always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from .train import History

__all__ = [
    "CACHE_ENV",
    "CACHE_MODES",
    "TrainedRun",
    "cache_file",
    "check_cache_mode",
    "restore_run",
    "reuse_run",
    "run_record",
    "save_run",
]

#: Where the recipes keep trained runs (override with the environment variable
#: ``COURSEPKG_CACHE_DIR``; the default is ``~/.cache/coursepkg``).
CACHE_ENV = "COURSEPKG_CACHE_DIR"

#: What a recipe's ``cache`` argument may be.
CACHE_MODES = (None, "save", "reuse")


def check_cache_mode(cache: str | None) -> None:
    """Fail unless ``cache`` is one of :data:`CACHE_MODES`."""
    if cache not in CACHE_MODES:
        raise ValueError(f"cache must be None, 'save' or 'reuse', got {cache!r}")


def cache_file(settings: dict, name: str) -> Path:
    """The cache file of a training run: a hash of its settings, the thread count, the CPU
    kernels PyTorch dispatches to, PyTorch's version and the source of every coursepkg module it
    could depend on, so that a change to any of them means a new run rather than a stale one.

    The kernels matter: ``ATEN_CPU_CAPABILITY=avx2`` on a CPU with AVX-512 selects other
    vectorised kernels, whose rounding differs in the last bits, and after a thousand steps the
    weights differ too.

    Args:
        settings: every argument that shapes the run (JSON-serialisable).
        name: the recipe, the start of the file's name.

    Returns:
        ``<cache folder>/<name>-<20 hex digits>.pt``.
    """
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "coursepkg")
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    digest.update(
        f"{torch.__version__} threads={torch.get_num_threads()} "
        f"cpu={torch.backends.cpu.get_cpu_capability()}".encode()
    )
    package = Path(__file__).resolve().parents[1]  # all of coursepkg, not only chapters/
    for source in sorted(package.rglob("*.py")):
        if "grading" not in source.relative_to(package).parts:
            digest.update(source.relative_to(package).as_posix().encode() + source.read_bytes())
    return root / f"{name}-{digest.hexdigest()[:20]}.pt"


def reuse_run(path: Path | None, restore: Callable[[dict[str, Any]], None]) -> bool:
    """Load a saved run into the caller's objects, if there is one that can be read.

    Args:
        path: the run's :func:`cache_file` (None: nothing to reuse).
        restore: puts the saved dictionary's contents in place (weights, history, ...).

    Returns:
        Whether the run was restored; a file that cannot be read or restored only costs a
        warning (the caller trains again).
    """
    if path is None or not path.is_file():
        return False
    try:
        restore(torch.load(path, weights_only=True))
    except Exception as err:  # noqa: BLE001 - a cache that cannot be read is retrained
        warnings.warn(f"ignoring the unreadable cache {path}: {err}", stacklevel=3)
        return False
    return True


def save_run(path: Path, saved: dict[str, Any], what: str) -> None:
    """Save a run whole or not at all (a partial file is renamed into place when complete).

    Args:
        path: the run's :func:`cache_file`.
        saved: tensors, numbers and plain containers (``torch.load(weights_only=True)`` reads
            them back).
        what: the run, for the warning when the folder cannot be written.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        torch.save(saved, partial)
        partial.replace(path)  # whole or not at all
    except OSError as err:
        warnings.warn(f"could not save {what} to {path}: {err}", stacklevel=3)


class TrainedRun(Protocol):
    """A trained run as the cache keeps it: a model and the :class:`History` of its training
    (the chapters' result classes, which keep more, add their own keys)."""

    model: nn.Module
    history: History


def run_record(run: TrainedRun) -> dict[str, Any]:
    """What the cache keeps of a trained run: its model's weights and its history.

    Args:
        run: the trained run.

    Returns:
        ``{"model": state_dict, "history": dict}``, plain enough for
        ``torch.load(weights_only=True)``; a caller adds the keys of its other measurements.
    """
    return {"model": run.model.state_dict(), "history": asdict(run.history)}


def restore_run(run: TrainedRun, saved: dict[str, Any]) -> None:
    """Put a saved run's weights and history in place, the model in eval mode (the inverse of
    :func:`run_record`).

    Args:
        run: the run to fill in, its model built with the saved run's configuration.
        saved: a dictionary :func:`run_record` made (extra keys are left to the caller).
    """
    run.model.load_state_dict(saved["model"])
    run.history = History(**saved["history"])
    run.model.eval()
