"""Batches of tokenised conversations: padded side by side, or packed end to end.

**Padding** (:func:`pad_batch`) puts one example per row and fills each row's end with
``pad_id``; the token mask says which tokens are real, and the loss mask is False on padding.

**Packing** (:func:`pack_examples`) puts several examples one after the other in a window, so no
compute is spent on padding. Each token gets its example's *segment* number; the
**document mask** (:func:`document_mask`) lets a token attend only to earlier tokens of its own
segment (True = may attend, as everywhere in the course), and
:func:`~coursepkg.masks.segment_positions` restarts the positions at each segment. With both, a
packed example's logits are those it gets alone (:func:`packed_logits`; exactly so for rotary
positions, which take any position per token).

Dimension legend: B rows, L (or W, the window) positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ..decoder_only import DecoderOnlyLM
from ..masks import causal_mask, segment_positions  # the packed rows' positions live there
from .chat import ChatExample

__all__ = [
    "Batch",
    "PackedBatch",
    "document_mask",
    "pack_examples",
    "packed_logits",
    "pad_batch",
]


class Batch(NamedTuple):
    """Padded examples, one per row.

    Attributes:
        tokens: (B, L) long, ``pad_id`` after each example's end.
        loss_mask: (B, L) bool, True on the response tokens (never on padding).
        token_mask: (B, L) bool, True on real tokens.
    """

    tokens: Tensor
    loss_mask: Tensor
    token_mask: Tensor


class PackedBatch(NamedTuple):
    """Examples packed end to end into windows.

    Attributes:
        tokens: (B, W) long, ``pad_id`` where a window is not full.
        loss_mask: (B, W) bool, True on the response tokens.
        segments: (B, W) long, the example's number within its window (0, 1, ...), -1 on padding.
    """

    tokens: Tensor
    loss_mask: Tensor
    segments: Tensor


def _check_examples(examples: Sequence[ChatExample], longest: int | None, what: str) -> None:
    if len(examples) == 0:
        raise ValueError("examples is empty: there is nothing to batch")
    for index, example in enumerate(examples):
        if not isinstance(example, ChatExample):
            raise TypeError(
                f"examples[{index}] must be a ChatExample, got {type(example).__name__}"
            )
        if len(example) == 0:
            raise ValueError(f"examples[{index}] has no tokens")
        if longest is not None and len(example) > longest:
            raise ValueError(
                f"examples[{index}] has {len(example)} tokens, more than the {what}={longest}"
            )


def pad_batch(examples: Sequence[ChatExample], pad_id: int, max_len: int | None = None) -> Batch:
    """Stack examples into rows, right-padded to the longest one.

    Args:
        examples: tokenised conversations (:func:`~coursepkg.posttrain.chat.encode_chat`).
        pad_id: the id written after each example's end.
        max_len: the model's context; a longer example raises.

    Returns:
        A :class:`Batch`, tensors of shape (B, L) with L the longest example.
    """
    _check_examples(examples, max_len, "max_len")
    length = max(map(len, examples))
    tokens = torch.full((len(examples), length), pad_id, dtype=torch.long)  # (B, L)
    loss_mask = torch.zeros(len(examples), length, dtype=torch.bool)  # (B, L)
    token_mask = torch.zeros(len(examples), length, dtype=torch.bool)  # (B, L)
    for row, example in enumerate(examples):
        n = len(example)
        tokens[row, :n] = torch.tensor(example.ids)
        loss_mask[row, :n] = torch.tensor(example.response_mask)
        token_mask[row, :n] = True
    return Batch(tokens, loss_mask, token_mask)


def pack_examples(examples: Sequence[ChatExample], window: int, pad_id: int) -> PackedBatch:
    """Pack examples in order into windows of ``window`` tokens: an example that does not fit in
    what is left of the current window starts the next one (none is ever cut).

    Args:
        examples: tokenised conversations.
        window: the tokens per row (the model's context).
        pad_id: the id filling the end of a window no example fits in.

    Returns:
        A :class:`PackedBatch`, tensors of shape (B, W), B the number of windows used.
    """
    _check_examples(examples, window, "window")
    rows: list[list[ChatExample]] = [[]]
    used = 0
    for example in examples:
        if used + len(example) > window:
            rows.append([])
            used = 0
        rows[-1].append(example)
        used += len(example)
    tokens = torch.full((len(rows), window), pad_id, dtype=torch.long)  # (B, W)
    loss_mask = torch.zeros(len(rows), window, dtype=torch.bool)  # (B, W)
    segments = torch.full((len(rows), window), -1, dtype=torch.long)  # (B, W)
    for row, packed in enumerate(rows):
        start = 0
        for segment, example in enumerate(packed):
            end = start + len(example)
            tokens[row, start:end] = torch.tensor(example.ids)
            loss_mask[row, start:end] = torch.tensor(example.response_mask)
            segments[row, start:end] = segment
            start = end
    return PackedBatch(tokens, loss_mask, segments)


def document_mask(segments: Tensor) -> Tensor:
    """The attention mask of packed windows: causal, and only within one segment.

    Args:
        segments: long, each token's segment number, -1 on padding (which sees nothing: a
            fully masked row, whose attention output is zeros).

    Shape:
        segments (B, W) -> (B, 1, W, W), broadcast over the heads.

    Returns:
        Bool, True where query i may attend key j: j <= i, same segment, not padding.
    """
    if segments.dim() != 2 or segments.dtype.is_floating_point:
        raise ValueError(
            f"segments must be integer segment numbers of shape (B, W), got {segments.dtype} "
            f"of shape {tuple(segments.shape)}"
        )
    same = segments[:, :, None] == segments[:, None, :]  # (B, W, W)
    real = (segments >= 0)[:, :, None]  # (B, W, 1)
    causal = causal_mask(segments.size(1), device=segments.device)  # (W, W)
    return (same & real & causal)[:, None]  # (B, 1, W, W)


def packed_logits(model: DecoderOnlyLM, tokens: Tensor, segments: Tensor) -> Tensor:
    """Next-token logits of packed windows, each segment seeing only itself.

    The model runs with :func:`document_mask` in place of its causal mask and, for rotary
    positions, :func:`~coursepkg.masks.segment_positions`. A model with a position table (learned or
    sinusoidal) adds positions 0..W-1 along the window whatever the segments: attention still
    stays inside each segment, but a later segment's logits then differ from its logits alone.

    Args:
        model: a :class:`~coursepkg.decoder_only.DecoderOnlyLM`.
        tokens: long ids.
        segments: long segment numbers (:class:`PackedBatch`), -1 on padding.

    Shape:
        tokens (B, W), segments (B, W) -> logits (B, W, V).
    """
    if tokens.shape != segments.shape:
        raise ValueError(
            f"tokens and segments must have the same shape, got {tuple(tokens.shape)} and "
            f"{tuple(segments.shape)}"
        )
    if tokens.size(1) > model.config.max_len and model.positions is not None:
        raise ValueError(
            f"a window of {tokens.size(1)} tokens is longer than max_len={model.config.max_len}"
        )
    rope = model.rope_freqs is not None
    positions = segment_positions(segments) if rope else None  # (B, W)
    # The document mask takes the place of the causal one forward() would build.
    return model(tokens, positions=positions, attn_mask=document_mask(segments))  # (B, W, V)
