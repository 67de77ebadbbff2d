"""Padding and teacher-forcing batches shared by the sequence-to-sequence tasks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from coursepkg.data.vocab import BOS_ID, EOS_ID, PAD_ID

__all__ = ["Seq2SeqBatch", "pad_sequences", "make_seq2seq_batch"]


class Seq2SeqBatch(NamedTuple):
    """A padded teacher-forcing batch; unpacks as ``src, tgt_in, tgt_out, src_mask, tgt_mask``.

    ``tgt_in = [BOS, y_1, ..., y_n]`` and ``tgt_out = [y_1, ..., y_n, EOS]`` (the target shifted
    right by one). Everything is right-padded with ``PAD_ID``; the masks are True = real token,
    with ``tgt_mask`` marking the real positions of both ``tgt_in`` and ``tgt_out``.

    Shape:
        - src, src_mask: (B, S)
        - tgt_in, tgt_out, tgt_mask: (B, T)
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    src_mask: Tensor
    tgt_mask: Tensor

    def to(self, device: torch.device | str) -> Seq2SeqBatch:
        """The same batch on ``device``."""
        return Seq2SeqBatch(*(t.to(device) for t in self))


def pad_sequences(
    seqs: Sequence[Sequence[int]],
    pad_id: int = PAD_ID,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Right-pad id lists into one tensor.

    Args:
        seqs: B lists of ids, of any lengths (at least one list).
        pad_id: Id used for padding.
        device: Where to put the result (default CPU).

    Shape:
        - ids: (B, max length)
        - mask: (B, max length)

    Returns:
        ``(ids, mask)``: a long tensor and a bool mask, True = real token.
    """
    if len(seqs) == 0:
        raise ValueError("seqs must contain at least one sequence, got none")
    width = max(len(s) for s in seqs)
    # One tensor from padded Python lists: a copy per row would cost more than the model's step.
    ids = torch.tensor([[*s, *[pad_id] * (width - len(s))] for s in seqs], dtype=torch.long)
    ids = ids.reshape(len(seqs), width)  # (B, S), also when every sequence is empty
    lengths = torch.tensor([len(s) for s in seqs])  # (B,)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
    return ids.to(device), mask.to(device)


def make_seq2seq_batch(
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    device: torch.device | str | None = None,
) -> Seq2SeqBatch:
    """Pad sources and build the shifted decoder input/output of the targets.

    Args:
        sources: B source id lists (no special tokens added).
        targets: B target id lists, without BOS/EOS (they are added here).
        device: Where to put the tensors (default CPU).

    Shape:
        - src, src_mask: (B, S)
        - tgt_in, tgt_out, tgt_mask: (B, T) with T = 1 + longest target

    Returns:
        A :class:`Seq2SeqBatch`.
    """
    if len(sources) != len(targets):
        raise ValueError(
            f"sources and targets must have the same length, got {len(sources)} and {len(targets)}"
        )
    src, src_mask = pad_sequences(sources, device=device)  # (B, S)
    tgt_in, tgt_mask = pad_sequences([[BOS_ID, *t] for t in targets], device=device)  # (B, T)
    tgt_out, _ = pad_sequences([[*t, EOS_ID] for t in targets], device=device)  # (B, T)
    return Seq2SeqBatch(src, tgt_in, tgt_out, src_mask, tgt_mask)
