"""Results the book ships instead of training them at build time: a grid too slow for a page's
budget is run once by its command, which writes a small JSON file into
``coursepkg/chapters/results/`` with its provenance (the command, the settings, PyTorch's
version, the date, the CPU and wall seconds it took); the page reads it back here.

A shipped file is ``{"provenance": {...}, "result": {...}}``. :func:`load_results` checks that
the file exists, parses, and holds every field the page reads (:data:`REQUIRED`), and says which
command writes it when it does not.
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import sys
from pathlib import Path
from typing import Any

import torch

__all__ = ["PROVENANCE_FIELDS", "REQUIRED", "RESULTS_DIR", "load_results", "write_results"]

#: Where the shipped results live (package data).
RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: Each shipped result: its name -> (the top-level fields of ``result`` the pages read, the
#: command that writes it).
REQUIRED: dict[str, tuple[tuple[str, ...], str]] = {
    "scaling": (
        ("runs", "law", "budget", "optimal", "check", "settings"),
        "benchmarks/scaling_study.py --widths 32 48 64 --steps 100 200 400 "
        "--write coursepkg/chapters/results/scaling.json",
    ),
    "constraints": (
        ("settings", "baseline", "pairs"),
        "benchmarks/constraint_verdicts.py --write coursepkg/chapters/results/constraints.json",
    ),
    "data_effect": (
        ("bpb", "corpus_bytes", "removed", "details", "settings"),
        "benchmarks/data_effect.py --write coursepkg/chapters/results/data_effect.json",
    ),
    "nanogpt": (
        ("iters", "target", "runs", "init", "settings"),
        "benchmarks/nanogpt_compare.py --iters 2000 --threads 1 --clock cpu "
        "--write coursepkg/chapters/results/nanogpt.json",
    ),
}

#: What every file's provenance holds.
PROVENANCE_FIELDS = (
    "command",
    "settings",
    "torch",
    "python",
    "date",
    "cpu_seconds",
    "wall_seconds",
)


def _plain(value: Any) -> Any:
    """``value`` with tuples as lists and non-finite floats refused (JSON has no inf or nan)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_results(
    path: str | Path,
    result: dict[str, Any],
    *,
    command: str,
    settings: dict[str, Any],
    cpu_seconds: float,
    wall_seconds: float,
) -> dict[str, Any]:
    """Write a result and its provenance as JSON (non-finite numbers become null).

    Args:
        path: the file to write (its folder must exist).
        result: the measured result, plain containers of numbers and strings.
        command: the command line that produced it.
        settings: the arguments the run used.
        cpu_seconds, wall_seconds: what the run cost.

    Returns:
        The written dictionary (``provenance`` and ``result``).
    """
    provenance = dict(
        command=command,
        settings=settings,
        torch=torch.__version__,
        python=platform.python_version(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        cpu_seconds=round(cpu_seconds, 1),
        wall_seconds=round(wall_seconds, 1),
        threads=torch.get_num_threads(),
        platform=f"{platform.machine()} {sys.platform}",
    )
    shipped = _plain(dict(provenance=provenance, result=result))
    Path(path).write_text(json.dumps(shipped, indent=1, sort_keys=True) + "\n")
    return shipped


def load_results(name: str, path: str | Path | None = None) -> dict[str, Any]:
    """Read a shipped result and check it holds what the pages read.

    Args:
        name: a key of :data:`REQUIRED` (``"scaling"``, ``"constraints"``, ``"data_effect"``).
        path: the file (default ``RESULTS_DIR / f"{name}.json"``).

    Returns:
        ``{"provenance": {...}, "result": {...}}``.

    Raises:
        KeyError: ``name`` is not a shipped result.
        FileNotFoundError: the file is missing (the message names the command that writes it).
        ValueError: the file is not JSON, or lacks a field (the message names it).
    """
    if name not in REQUIRED:
        raise KeyError(f"no shipped result {name!r}; known: {sorted(REQUIRED)}")
    fields, command = REQUIRED[name]
    path = Path(path) if path is not None else RESULTS_DIR / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: write it with `python {command}`")
    try:
        shipped = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); rewrite it with `{command}`") from err
    if not isinstance(shipped, dict) or not isinstance(shipped.get("result"), dict):
        raise ValueError(f"{path} has no 'result' object; rewrite it with `{command}`")
    if not isinstance(shipped.get("provenance"), dict):
        raise ValueError(f"{path} has no 'provenance' object; rewrite it with `{command}`")
    missing = [f"result.{f}" for f in fields if f not in shipped["result"]]
    missing += [f"provenance.{f}" for f in PROVENANCE_FIELDS if f not in shipped["provenance"]]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}; rewrite it with `{command}`")
    return shipped
