"""The catalogue of ex03_positions: the known mistakes of the sinusoidal positional encoding.
Each is a wrong function with the stub's signature ``(max_len, d_model) -> (max_len, D)`` (the
evidence: the check builds the same table and compares it with the student's), its id, and the
story and advice a student reads when their table matches it.

Dimension legend: D d_model; a table has one row per position.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..framework import BugVariant

__all__ = ["BUGS", "PE_BUGS", "PE_ITEM"]

PE_ITEM = "sinusoidal_positional_encoding"


def _positions(max_len: int, start: int = 0) -> Tensor:
    return torch.arange(start, start + max_len, dtype=torch.float64)[:, None]  # (max_len, 1)


def _pairs(d_model: int) -> Tensor:
    return torch.arange(d_model // 2, dtype=torch.float64)  # (D/2,): column pair i


def _angles(pos: Tensor, exponent: Tensor, sign: float = -1.0) -> Tensor:
    """pos / 10000^exponent (``sign`` -1), or pos * 10000^exponent (``sign`` +1)."""
    return pos * torch.exp(sign * math.log(10000.0) * exponent)  # (max_len, D/2)


def _interleave(even: Tensor, odd: Tensor) -> Tensor:
    """Columns 0, 2, 4, ... from ``even`` and 1, 3, 5, ... from ``odd``."""
    max_len, half = even.shape
    return torch.stack([even, odd], dim=2).reshape(max_len, 2 * half).float()  # (max_len, D)


def _paper_angles(max_len: int, d_model: int) -> Tensor:
    return _angles(_positions(max_len), 2 * _pairs(d_model) / d_model)  # (max_len, D/2)


def pe_sin_cos_swapped(max_len: int, d_model: int) -> Tensor:
    """Cosines in the even columns, sines in the odd ones."""
    angles = _paper_angles(max_len, d_model)
    return _interleave(torch.cos(angles), torch.sin(angles))


def pe_halves_not_interleaved(max_len: int, d_model: int) -> Tensor:
    """All sines, then all cosines."""
    angles = _paper_angles(max_len, d_model)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()  # (max_len, D)


def pe_exponent_i_over_d(max_len: int, d_model: int) -> Tensor:
    """10000^(i/D) for column pair i."""
    angles = _angles(_positions(max_len), _pairs(d_model) / d_model)
    return _interleave(torch.sin(angles), torch.cos(angles))


def pe_exponent_per_column(max_len: int, d_model: int) -> Tensor:
    """10000^(j/D) for column j: a cosine column has its own frequency."""
    pos, pair = _positions(max_len), _pairs(d_model)
    sines = torch.sin(_angles(pos, 2 * pair / d_model))
    return _interleave(sines, torch.cos(_angles(pos, (2 * pair + 1) / d_model)))


def pe_integer_exponent(max_len: int, d_model: int) -> Tensor:
    """2i // D = 0: one frequency for every column."""
    exponent = torch.div(2 * _pairs(d_model), d_model, rounding_mode="floor")
    angles = _angles(_positions(max_len), exponent)
    return _interleave(torch.sin(angles), torch.cos(angles))


def pe_multiplied_by_frequency_power(max_len: int, d_model: int) -> Tensor:
    """pos * 10000^(2i/D)."""
    angles = _angles(_positions(max_len), 2 * _pairs(d_model) / d_model, sign=1.0)
    return _interleave(torch.sin(angles), torch.cos(angles))


def pe_positions_from_one(max_len: int, d_model: int) -> Tensor:
    """Positions 1 .. max_len."""
    angles = _angles(_positions(max_len, start=1), 2 * _pairs(d_model) / d_model)
    return _interleave(torch.sin(angles), torch.cos(angles))


PE_BUGS: list[BugVariant] = [
    BugVariant(
        "pe.sin_cos_swapped",
        PE_ITEM,
        "sine and cosine are swapped (cosines in the even columns, sines in the odd ones)",
        "Put sin in columns 0, 2, 4, ... (pe[:, 0::2]) and cos in columns 1, 3, 5, ... "
        "(pe[:, 1::2]); row 0 is then 0, 1, 0, 1, ...",
        pe_sin_cos_swapped,
    ),
    BugVariant(
        "pe.halves_not_interleaved",
        PE_ITEM,
        "the sines fill the first half of the columns and the cosines the second half, "
        "instead of alternating",
        "Interleave them: sines in the even columns (pe[:, 0::2]), cosines in the odd ones "
        "(pe[:, 1::2]).",
        pe_halves_not_interleaved,
    ),
    BugVariant(
        "pe.exponent_i_over_d",
        PE_ITEM,
        "the frequencies use 10000^(i/d_model) instead of 10000^(2i/d_model)",
        "For column pair i (columns 2i and 2i+1) the exponent is 2i/d_model: use "
        "torch.arange(0, d_model, 2) / d_model.",
        pe_exponent_i_over_d,
    ),
    BugVariant(
        "pe.exponent_per_column",
        PE_ITEM,
        "each column gets its own exponent j/d_model, so a cosine column does not share the "
        "frequency of the sine column before it",
        "Columns 2i and 2i+1 share one frequency 1/10000^(2i/d_model): compute it once per "
        "pair from torch.arange(0, d_model, 2).",
        pe_exponent_per_column,
    ),
    BugVariant(
        "pe.integer_exponent",
        PE_ITEM,
        "the exponent 2i/d_model is computed with integer division, so it is 0 and every "
        "column has the same frequency",
        "Use true division (2 * i / d_model, with float tensors), not //.",
        pe_integer_exponent,
    ),
    BugVariant(
        "pe.multiplied_by_frequency_power",
        PE_ITEM,
        "the position is multiplied by 10000^(2i/d_model) instead of divided by it",
        "The angle is pos / 10000^(2i/d_model) (equivalently pos * exp(-2i * ln(10000) / "
        "d_model)).",
        pe_multiplied_by_frequency_power,
    ),
    BugVariant(
        "pe.positions_from_one",
        PE_ITEM,
        "positions are counted from 1 instead of 0",
        "Use torch.arange(max_len) for the positions; row 0 must be 0, 1, 0, 1, ...",
        pe_positions_from_one,
    ),
]

BUGS: list[BugVariant] = [*PE_BUGS]
