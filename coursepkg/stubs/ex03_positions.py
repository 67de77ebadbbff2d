"""Assignment ex03_positions: the sinusoidal positional encoding (chapter 5)."""

from __future__ import annotations

import math  # noqa: F401  (you will need it)

import torch  # noqa: F401
from torch import Tensor


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> Tensor:
    """The fixed table of sines and cosines (Vaswani et al., Sec. 3.5):

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

    Positions count from 0. Column pair (2i, 2i+1) shares one frequency; even columns hold the
    sines and odd columns the cosines (interleaved, not one half then the other).

    Args:
        max_len: number of positions (rows), >= 1.
        d_model: width D (columns), even.

    Shape:
        -> (max_len, d_model).

    Returns:
        A floating-point tensor (float32 is fine); row ``pos`` is what gets added to the
        embedding at position ``pos``.
    """
    raise NotImplementedError
