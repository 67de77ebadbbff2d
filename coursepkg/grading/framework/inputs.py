"""Inputs and configurations of the checks: the shape tables each check registers (fixed ones,
plus seeded random ones in thorough mode) and seeded random tensors and masks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

# ---------------------------------------------------------------------------------------------
# Shape configurations
# ---------------------------------------------------------------------------------------------

_CONFIGS: dict[
    str,
    tuple[
        list[dict[str, Any]], list[dict[str, Any]], Callable[[random.Random], dict[str, Any]] | None
    ],
] = {}

#: How many randomised configurations thorough mode adds.
N_RANDOM_CONFIGS = 3


def register_configs(
    item: str,
    visible: Sequence[dict[str, Any]],
    extra: Sequence[dict[str, Any]] = (),
    sample: Callable[[random.Random], dict[str, Any]] | None = None,
) -> None:
    """Declare the shape configurations of an item (each check module does this once).

    Args:
        item: the exercise item, e.g. ``"multi_head_attention"``.
        visible: the fixed small set every (visible) check run uses; at least 3.
        extra: fixed configurations added in thorough mode.
        sample: ``sample(rng)`` draws one randomised configuration for thorough mode.
    """
    _CONFIGS[item] = (list(visible), list(extra), sample)


def configs(item: str, thorough: bool = False, seed: int | None = None) -> list[dict[str, Any]]:
    """The shape configurations a check tries for ``item``.

    Args:
        item: a registered item.
        thorough: add the extra configurations and :data:`N_RANDOM_CONFIGS` randomised ones
            (hidden tests); visible mode uses only the fixed small set.
        seed: seed of the randomised configurations (thorough mode; None means 0).

    Returns:
        A list of dicts of sizes; thorough mode never repeats a visible configuration.
    """
    if item not in _CONFIGS:
        raise KeyError(f"no configurations registered for {item!r}; known: {sorted(_CONFIGS)}")
    visible, extra, sample = _CONFIGS[item]
    out = [dict(c) for c in visible]
    if not thorough:
        return out
    out += [dict(c) for c in extra if c not in out]
    if sample is not None:
        rng = random.Random(0 if seed is None else seed)
        added = 0
        for _ in range(50 * N_RANDOM_CONFIGS):
            c = sample(rng)
            if c not in out:
                out.append(c)
                added += 1
                if added == N_RANDOM_CONFIGS:
                    break
    return out


def describe(config: dict[str, Any]) -> str:
    """A configuration as ``B=2, L=5, ...`` for messages."""
    return ", ".join(f"{k}={v}" for k, v in config.items())


def generator(seed: int | None, salt: int = 0) -> torch.Generator:
    """A CPU generator for a check's inputs: the same seed gives the same inputs."""
    return torch.Generator().manual_seed(10_007 * (0 if seed is None else seed) + salt)


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard normal values drawn in float64 and cast, so float32 and float64 runs of one
    configuration see the same numbers."""
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def random_keep(gen: torch.Generator, batch: int, length: int) -> Tensor:
    """A token mask (B, S), True = real: every row keeps at least one position and, when
    ``length >= 2``, hides at least one, so an inverted mask never hides a whole row."""
    keep = torch.rand(batch, length, generator=gen) < 0.6  # (B, S)
    if length >= 2:
        for b in range(batch):
            hide = int(torch.randint(length, (1,), generator=gen))
            keep[b, hide] = False
            show = (hide + 1 + int(torch.randint(length - 1, (1,), generator=gen))) % length
            keep[b, show] = True
    else:
        keep[:] = True
    return keep


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` as ``float32``, for messages."""
    return str(dtype).replace("torch.", "")


def shape_text(t: Tensor | torch.Size | Sequence[int]) -> str:
    """A shape as a tuple literal: ``(3,)``, ``(2, 4)``."""
    dims = tuple(t.shape) if isinstance(t, Tensor) else tuple(t)
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"
