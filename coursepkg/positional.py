"""Positional information: the fixed sinusoidal table and a learned table (Vaswani et al. 3.5),
both added to the embeddings, and rotary positions (RoPE), which turn queries and keys instead."""

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


_ROPE_PAIRS = ("halves", "interleaved")


def rope_frequencies(head_dim: int, theta: float = 10000.0) -> Tensor:
    """The angular speed of each RoPE pair: w_i = theta^(-2i/Dh), i = 0 .. Dh/2 - 1.

    Computed as 1 / theta^(2i/Dh) in float32, exactly as Hugging Face's Llama does, so that
    loaded models agree to the last bits.

    Args:
        head_dim: Dh, the width of one head's queries and keys (even).
        theta: the base (10000 in the paper, 500000 in Llama 3, 1000000 in Qwen3).

    Shape:
        -> (Dh/2,).
    """
    if head_dim % 2 != 0:
        raise ValueError(f"RoPE needs an even head width, got head_dim={head_dim}")
    two_i = torch.arange(0, head_dim, 2, dtype=torch.int64).float()  # (Dh/2,)
    return 1.0 / (theta ** (two_i / head_dim))  # (Dh/2,)


class RopeAngles:
    """The cos and sin of the RoPE angles pos * w_i of some positions, computed once per forward
    pass and used by every layer to rotate its queries and keys (:meth:`rotate`).

    Args:
        positions: the absolute position of each row (with a KV cache: the offset plus 0..L-1;
            with left padding: how many real tokens precede it).
        freqs: :func:`rope_frequencies`.
        pairs: ``"halves"`` pairs column i with column i + Dh/2 (Hugging Face's rotate-half
            layout: Llama, Qwen); ``"interleaved"`` pairs columns 2i and 2i+1 (the paper).

    Shape:
        positions (L,) or (B, L), freqs (Dh/2,); ``cos`` and ``sin`` are (L, Dh/2) or
        (B, 1, L, Dh/2), broadcasting over the heads.
    """

    def __init__(self, positions: Tensor, freqs: Tensor, pairs: str = "halves") -> None:
        if pairs not in _ROPE_PAIRS:
            raise ValueError(f"pairs must be 'halves' or 'interleaved', got {pairs!r}")
        angles = positions.to(torch.float32).unsqueeze(-1) * freqs  # (L, Dh/2) or (B, L, Dh/2)
        if angles.dim() == 3:
            angles = angles.unsqueeze(1)  # (B, 1, L, Dh/2): the same angles for every head
        self.cos, self.sin = angles.cos(), angles.sin()
        self.pairs = pairs

    def rotate(self, x: Tensor) -> Tensor:
        """Turn each 2-D pair (a, b) of ``x`` by its angle: (a cos - b sin, a sin + b cos).

        Shape:
            x (B, H, L, Dh) -> (B, H, L, Dh), in ``x``'s dtype.
        """
        half = x.shape[-1] // 2
        if self.pairs == "halves":
            a, b = x[..., :half], x[..., half:]  # (B, H, L, Dh/2) each
        else:
            a, b = x[..., 0::2], x[..., 1::2]  # (B, H, L, Dh/2) each
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        ra, rb = a * cos - b * sin, a * sin + b * cos  # (B, H, L, Dh/2): each pair rotated
        if self.pairs == "halves":
            return torch.cat([ra, rb], dim=-1)  # (B, H, L, Dh)
        return torch.stack([ra, rb], dim=-1).flatten(-2)  # (B, H, L, Dh/2, 2) -> (B, H, L, Dh)


def apply_rope(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """Rotary position embedding (Su et al., 2021): rotate each 2-D pair of ``x`` by pos * w_i.

    Pair i turns by the angle pos * theta^(-2i/Dh), i = 0 .. Dh/2 - 1, so the dot product of a
    rotated query at position m and a rotated key at position n depends on m - n only. Apply it
    to queries and keys, never to values. (The models compute the angles once per pass with
    :class:`RopeAngles` and rotate every layer's queries and keys with them.)

    Args:
        x: queries or keys, one row of width Dh per head and position.
        positions: the absolute position of each row (with a KV cache: the offset plus 0..L-1).
        theta: the base of the frequencies (10000 in the paper, 500000 in Llama 3).
        pairs: ``"halves"`` pairs column i with column i + Dh/2 (Hugging Face's rotate-half
            layout: Llama, Qwen); ``"interleaved"`` pairs columns 2i and 2i+1 (the paper).

    Shape:
        x (B, H, L, Dh) with Dh even, positions (L,) or (B, L) -> (B, H, L, Dh).

    Returns:
        ``x`` rotated, in ``x``'s dtype.
    """
    dh = x.shape[-1]
    if dh % 2 != 0:
        raise ValueError(f"apply_rope needs an even head width, got x.shape[-1]={dh}")
    freqs = rope_frequencies(dh, theta).to(x.device)  # (Dh/2,)
    return RopeAngles(positions, freqs, pairs).rotate(x)  # (B, H, L, Dh)


def positions_from_mask(token_mask: Tensor) -> Tensor:
    """The position of each token counting real tokens only, as Hugging Face's ``generate``
    derives ``position_ids`` from the attention mask: left padding then shifts nothing, and a
    row's first real token is at position 0 however much padding precedes it.

    Args:
        token_mask: bool, True = real token.

    Shape:
        token_mask (B, L) -> (B, L) int64; padding gets position 0 (or the last real one's).
    """
    return (token_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)
