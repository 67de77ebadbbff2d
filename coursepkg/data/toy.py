"""Copy and reverse: synthetic sequence-to-sequence tasks with a known right answer.

Reversal is the textbook stress test of the bottleneck (notes 1.1): the first target token depends
on the last source token and vice versa, so an attention model learns it quickly (its alignment
heatmap is the anti-diagonal) while a fixed-vector model degrades as sequences get longer.
"""

from __future__ import annotations

import torch

from coursepkg.data.batching import Seq2SeqBatch
from coursepkg.data.vocab import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS

__all__ = ["FIRST_TOKEN_ID", "make_copy_batch"]

FIRST_TOKEN_ID = len(SPECIAL_TOKENS)  # ids below this are <pad> <bos> <eos> <unk>


def make_copy_batch(
    batch_size: int,
    length: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
    reverse: bool = False,
    min_length: int | None = None,
    device: torch.device | str | None = None,
) -> Seq2SeqBatch:
    """A random batch of the copy task (target = source) or the reverse task (target = reversed).

    Tokens are uniform over the ids ``4 .. vocab_size - 1`` (never a special token). With
    ``min_length`` each row's length is uniform in ``[min_length, length]`` and rows are
    right-padded to ``length``; reversal is within each row's real tokens.

    Args:
        batch_size: Number of sequences B.
        length: Source length S (the maximum, when ``min_length`` is given).
        vocab_size: Vocabulary size V including the 4 special ids (so at least 5).
        generator: A CPU ``torch.Generator`` for reproducible batches (default: global RNG).
        reverse: Reverse instead of copy.
        min_length: Shortest row length for variable-length batches (default: all ``length``).
        device: Where to put the tensors (default CPU); sampling always happens on the CPU, so a
            seed gives the same batch on every device.

    Shape:
        - src, src_mask: (B, S)
        - tgt_in, tgt_out, tgt_mask: (B, S + 1)

    Returns:
        A :class:`~coursepkg.data.batching.Seq2SeqBatch` ``(src, tgt_in, tgt_out, src_mask,
        tgt_mask)``: ``tgt_in = [BOS, y...]``, ``tgt_out = [y..., EOS]``, masks True = real token.
    """
    for name, value in (("batch_size", batch_size), ("length", length)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(vocab_size, int) or vocab_size <= FIRST_TOKEN_ID:
        raise ValueError(
            f"vocab_size must be an int > {FIRST_TOKEN_ID} (4 special ids + at least one token), "
            f"got {vocab_size!r}"
        )
    if min_length is None:
        min_length = length
    if not isinstance(min_length, int) or not 1 <= min_length <= length:
        raise ValueError(f"min_length must be an int in [1, length={length}], got {min_length!r}")
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator, got device {generator.device}")

    tokens = torch.randint(
        FIRST_TOKEN_ID, vocab_size, (batch_size, length), generator=generator
    )  # (B, S)
    lengths = torch.randint(min_length, length + 1, (batch_size,), generator=generator)  # (B,)
    pos = torch.arange(length).unsqueeze(0)  # (1, S)
    src_mask = pos < lengths.unsqueeze(1)  # (B, S)
    src = tokens.masked_fill(~src_mask, PAD_ID)  # (B, S)
    if reverse:
        # Row b reads its real tokens backwards: target position i <- source position len_b-1-i.
        index = (lengths.unsqueeze(1) - 1 - pos).clamp(min=0)  # (B, S)
        tgt = src.gather(1, index).masked_fill(~src_mask, PAD_ID)  # (B, S)
    else:
        tgt = src  # (B, S)

    pad_col = torch.full((batch_size, 1), PAD_ID, dtype=torch.long)  # (B, 1)
    tgt_in = torch.cat([torch.full_like(pad_col, BOS_ID), tgt], dim=1)  # (B, S + 1)
    tgt_out = torch.cat([tgt, pad_col], dim=1)  # (B, S + 1)
    tgt_out.scatter_(1, lengths.unsqueeze(1), EOS_ID)  # EOS right after the last real token
    tgt_mask = torch.arange(length + 1).unsqueeze(0) <= lengths.unsqueeze(1)  # (B, S + 1)
    return Seq2SeqBatch(src, tgt_in, tgt_out, src_mask, tgt_mask).to(device or "cpu")
