"""Check of ex03 (the sinusoidal positional encoding); the catalogue of mistakes it recognises
is in :mod:`.ex03_positions_mistakes`.

Dimension legend: D d_model; the table has one row per position.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...positional import sinusoidal_table
from ..framework import (
    BugVariant,
    CheckReport,
    call_student,
    configs,
    describe,
    diagnose,
    expect_close,
    expect_tensor,
    forbidden_calls,
    public_check,
    register_configs,
)
from .ex03_positions_mistakes import PE_BUGS, PE_ITEM, pe_halves_not_interleaved

__all__ = ["check_positional_encoding"]

#: ``(rtol, atol)`` for the table, compared in float64. A correct float32 implementation
#: computes the angle pos * freq with a relative error of ~6e-8, so its absolute error grows
#: with the position: measured against the reference, 3e-7 at max_len=50, 2.4e-6 at 200 and
#: 2.8e-5 at 512 (either way of computing the frequencies). The largest table a check builds
#: has max_len=200; 2e-4 leaves a wide margin there and stays far below the effect of every
#: catalogued mistake (> 1e-2).
PE_TOLERANCE = (0.0, 2e-4)

_FORMULA = (
    "PE(pos, 2i) = sin(pos / 10000^(2i/d_model)) in the even columns and PE(pos, 2i+1) = "
    "cos(pos / 10000^(2i/d_model)) in the odd ones, positions counted from 0."
)


def _sample(rng: random.Random) -> dict[str, int]:
    return {"max_len": rng.randint(1, 120), "d_model": 2 * rng.randint(1, 16)}


register_configs(
    "positional_encoding",
    visible=[
        {"max_len": 7, "d_model": 8},
        {"max_len": 1, "d_model": 4},
        {"max_len": 50, "d_model": 6},
    ],
    extra=[{"max_len": 200, "d_model": 16}, {"max_len": 3, "d_model": 2}],
    sample=_sample,
)

#: A table on which every catalogued mistake differs from the reference.
_PROBE = (12, 8)


def _halves_layout(student: Callable[[int, int], Any], size: tuple[int, int]) -> BugVariant | None:
    """Recognise the sines-then-cosines layout (tensor2tensor's timing signal) by its shape
    alone, whatever frequencies it uses: row 0 (position 0) is D/2 zeros then D/2 ones, and
    the first half's columns are odd functions of the position."""
    max_len, d_model = max(size[0], 4), max(size[1], 4)
    d_model += d_model % 2
    try:
        table = student(max_len, d_model)
    except Exception:  # noqa: BLE001 - a table that cannot be built has no layout
        return None
    if not isinstance(table, Tensor) or tuple(table.shape) != (max_len, d_model):
        return None
    table = table.detach().to(torch.float64)
    half = d_model // 2
    row0 = torch.cat([torch.zeros(half), torch.ones(half)]).to(torch.float64)  # (D,)
    if not torch.allclose(table[0], row0, atol=1e-4):
        return None
    bug = next(b for b in PE_BUGS if b.id == "pe.halves_not_interleaved")
    paper = pe_halves_not_interleaved(max_len, d_model).to(torch.float64)
    if torch.allclose(table, paper, atol=PE_TOLERANCE[1]):
        return bug
    return BugVariant(
        bug.id,
        bug.item,
        bug.description + " (tensor2tensor's layout); the frequencies differ from the "
        "paper's as well (tensor2tensor spaces them by log(10000) / (D/2 - 1), the paper by "
        "2·log(10000) / D)",
        bug.advice + " Use the frequencies 1 / 10000^(2i/d_model) for column pair i.",
        bug.impl,
    )


@public_check(
    assignment="ex03_positions",
    implements="sinusoidal_positional_encoding",
    bugs=PE_BUGS,
    kind="function",
)
def check_positional_encoding(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check ``sinusoidal_positional_encoding(max_len, d_model) -> (max_len, d_model)``.

    Compares the table with :func:`coursepkg.positional.sinusoidal_table` for several sizes
    (a single position, narrow and wide tables), checks that it is a floating-point tensor of
    the right shape with values in [-1, 1], and that it is computed rather than taken from the
    reference.
    """
    if not callable(impl):
        report.fail(f"expected your function {PE_ITEM}, got {type(impl).__name__}.")

    def student(max_len: int, d_model: int) -> Any:
        return call_student(impl, max_len, d_model, item=PE_ITEM)

    def diagnosis(size: tuple[int, int]) -> BugVariant | None:
        layout = _halves_layout(student, size)
        if layout is not None:
            return layout
        for probe in (size, _PROBE):
            bug = diagnose(student, PE_BUGS, probe, reference_output=sinusoidal_table(*probe))
            if bug is not None:
                return bug
        return None

    cfgs = configs("positional_encoding", thorough, seed)
    with forbidden_calls(PE_ITEM):
        for cfg in cfgs:
            max_len, d_model = cfg["max_len"], cfg["d_model"]
            where = describe(cfg)
            table = expect_tensor(
                student(max_len, d_model), f"your table ({where})", (max_len, d_model)
            )
            if not table.is_floating_point():
                report.fail(
                    f"your table has dtype {table.dtype}; it should be floating point "
                    "(build the positions with dtype=torch.float32 or convert them)."
                )
            if bool((~torch.isfinite(table)).any()) or bool((table.abs() > 1 + 1e-6).any()):
                report.fail(
                    f"your table ({where}) holds values outside [-1, 1] (or NaN/inf); every "
                    f"entry is a sine or a cosine. {_FORMULA}",
                    diagnosis((max_len, d_model)),
                )
            expect_close(
                report,
                table.detach().to(torch.float64),
                sinusoidal_table(max_len, d_model).to(torch.float64),
                f"your table ({where})",
                diagnosis=lambda size=(max_len, d_model): diagnosis(size),
                hint=f"Expected {_FORMULA}",
                rtol=PE_TOLERANCE[0],
                atol=PE_TOLERANCE[1],
            )
    report.ok(f"matches the reference table for {len(cfgs)} sizes")
    report.ok("sines in even columns, cosines in odd ones, positions from 0")
