"""Checkpoints written atomically and read back verified.

A checkpoint is one file: a magic line, the SHA-256 of the payload, then the payload
(``torch.save`` of a dict of tensors, numbers and strings). It is written to a temporary file
in the same folder, flushed to disk (``fsync``), then renamed over the old one: a process killed
at any moment leaves either the previous checkpoint or the new one, never half of one. Reading
checks the digest, so a damaged file is reported as such instead of loading garbage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch

from coursepkg.config import TransformerConfig, upgrade_options

__all__ = ["CheckpointError", "load_checkpoint", "save_checkpoint"]

MAGIC = b"coursepkg-checkpoint 1\n"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed: damaged, or from another run's settings."""


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, rename, fsync folder)."""
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest().encode()
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + digest + b"\n" + data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself reaches the disk
    finally:
        os.close(folder)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`, verifying its digest.

    Raises:
        CheckpointError: when the file is not a coursepkg checkpoint or is damaged.
    """
    path = Path(path)
    raw = path.read_bytes()
    if not raw.startswith(MAGIC):
        raise CheckpointError(f"{path} is not a coursepkg checkpoint (its header is wrong)")
    header_end = len(MAGIC) + 64
    expected, data = raw[len(MAGIC) : header_end], raw[header_end + 1 :]
    actual = hashlib.sha256(data).hexdigest().encode()
    if actual != expected:
        raise CheckpointError(
            f"{path} is damaged: its content's SHA-256 is {actual.decode()}, the file says "
            f"{expected.decode(errors='replace')} ({len(raw)} bytes); delete it to start over"
        )
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def check_compatible(saved: dict[str, Any], current: dict[str, Any], path: str | Path) -> None:
    """Raise :class:`CheckpointError` naming each setting where ``saved`` and ``current`` differ.

    Nested settings (the model's config) are compared key by key, so the message names only
    the keys that differ (``config.d_model: checkpoint 64, now 32``). A checkpoint written
    before the config's groups (``hf``, ``moe``, ``latent``) is read as if written after, and
    one written before a config option existed is read as having that option's default (an
    option added later with its default changes nothing the old run did).
    """
    saved, current = _upgraded(saved, path), _upgraded(current, path)
    saved, current = _flatten(saved), _flatten(current)
    missing = object()
    keys = [
        k
        for k in sorted(set(saved) | set(current))
        if saved.get(k, missing) != current.get(k, missing)
    ]
    diffs = [f"{k}: checkpoint {_show(saved, k)}, now {_show(current, k)}" for k in keys]
    if diffs:
        raise CheckpointError(
            f"{path} belongs to a run with other settings ({'; '.join(diffs)}); use the same "
            "settings to resume, or another --out for a new run"
        )


def _upgraded(settings: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """``settings`` with the model's config and options in today's form
    (:meth:`~coursepkg.TransformerConfig.from_dict`): every option, defaults included, each
    group nested, whatever form the checkpoint wrote."""
    out = dict(settings)
    if isinstance(settings.get("model"), dict):
        out["model"] = upgrade_options(settings["model"])
    if isinstance(settings.get("config"), dict):
        try:
            out["config"] = dataclasses.asdict(TransformerConfig.from_dict(settings["config"]))
        except (TypeError, ValueError) as err:
            message = f"{path} holds a model config that cannot be read: {err}"
            raise CheckpointError(message) from err
    return out


def _flatten(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"config": {"d_model": 64}}`` -> ``{"config.d_model": 64}``."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _show(settings: dict[str, Any], key: str) -> str:
    return repr(settings[key]) if key in settings else "absent"
