"""Positional information: the fixed sinusoidal table and a learned table (Vaswani et al. 3.5)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(max_len: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)).

    Args:
        max_len: number of positions (rows).
        d_model: width D (columns); odd widths keep the sine of the last pair.
        layout: ``"interleaved"`` puts the sine and cosine of frequency i in columns 2i and
            2i+1 (the paper's formula); ``"halves"`` puts all sines first, then all cosines
            (tensor2tensor and Marian). Both hold the same numbers, in another column order.

    Shape:
        -> (max_len, D).

    Returns:
        The float32 table; row ``pos`` is added to the embedding at position ``pos``.
    """
    if max_len < 1 or d_model < 1:
        raise ValueError(f"max_len and d_model must be >= 1, got {max_len} and {d_model}")
    if layout not in ("interleaved", "halves"):
        raise ValueError(f"layout must be 'interleaved' or 'halves', got {layout!r}")
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    # 1 / 10000^(2i/D), computed in log space and float64 so the table is exact to float32.
    inv_freq = torch.exp(-math.log(10000.0) * two_i / d_model)  # (ceil(D/2),)
    angles = position * inv_freq  # (max_len, ceil(D/2))
    table = torch.empty(max_len, d_model, dtype=torch.float64)
    n_sin = angles.size(1)  # ceil(D/2) sines, floor(D/2) cosines
    sin_cols, cos_cols = (
        (slice(0, None, 2), slice(1, None, 2))
        if layout == "interleaved"
        else (slice(0, n_sin), slice(n_sin, None))
    )
    table[:, sin_cols] = torch.sin(angles)
    table[:, cos_cols] = torch.cos(angles[:, : d_model // 2])
    return table.float()  # (max_len, D)


def _check_length(length: int, offset: int, max_len: int, kind: str) -> None:
    if offset + length > max_len:
        raise ValueError(
            f"sequence of length {length} (starting at position {offset}) is longer than "
            f"max_len={max_len} of the {kind} positional table; raise max_len in the config"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to its input (no trainable parameters).

    Args:
        d_model: width D.
        max_len: longest sequence supported; the table is a non-persistent buffer.
        layout: column order of the table, see :func:`sinusoidal_table`.
    """

    def __init__(self, d_model: int, max_len: int, layout: str = "interleaved") -> None:
        super().__init__()
        self.max_len = max_len
        table = sinusoidal_table(max_len, d_model, layout)  # (max_len, D)
        self.register_buffer("table", table, persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Add positions ``offset .. offset+L-1``.

        Shape:
            x (B, L, D) -> (B, L, D).
        """
        _check_length(x.size(1), offset, self.max_len, "sinusoidal")
        return x + self.table[offset : offset + x.size(1)].to(x.dtype)  # (B, L, D)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a trained position table (``weight``, one row per position), as in BERT and GPT.

    Args:
        d_model: width D.
        max_len: number of positions it can represent; longer inputs raise ``ValueError``.
    """

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Add positions ``offset .. offset+L-1``.

        Shape:
            x (B, L, D) -> (B, L, D).
        """
        _check_length(x.size(1), offset, self.max_len, "learned")
        return x + self.weight[offset : offset + x.size(1)]  # (B, L, D)
