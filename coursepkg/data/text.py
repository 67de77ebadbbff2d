"""Tiny Shakespeare, shipped inside the package, and batches for character-level language models.

See ``coursepkg/data/PROVENANCE.md`` for where the text comes from. Nothing is downloaded.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from coursepkg.data.vocab import CharVocab

__all__ = [
    "TINYSHAKESPEARE_BYTES",
    "TINYSHAKESPEARE_SHA256",
    "char_lm_batches",
    "load_tinyshakespeare",
    "read_verified_text",
    "tinyshakespeare_bytes",
]

TINYSHAKESPEARE_BYTES = 1_115_394
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


class _Readable(Protocol):
    def read_bytes(self) -> bytes: ...


def read_verified_text(path: _Readable | str | Path, sha256: str) -> str:
    """Read a UTF-8 text file and check its SHA-256, so a damaged copy fails loudly.

    Args:
        path: A file path, or any object with ``read_bytes()`` (e.g. an importlib resource).
        sha256: Expected hex digest of the file's bytes.

    Returns:
        The decoded text.

    Raises:
        RuntimeError: The file's digest differs from ``sha256``.
    """
    source = Path(path) if isinstance(path, str) else path
    data = source.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256.lower():
        raise RuntimeError(
            f"{path} is corrupted: expected sha256 {sha256.lower()}, got {digest} "
            f"({len(data)} bytes). Reinstall coursepkg to restore the file."
        )
    return data.decode("utf-8")


@functools.lru_cache(maxsize=1)
def load_tinyshakespeare() -> str:
    """The Tiny Shakespeare corpus (1,115,394 characters, 65 distinct), checked by SHA-256.

    The file is read and verified on the first call only; later calls return the cached string.

    Returns:
        The whole corpus as one string.
    """
    resource = resources.files("coursepkg.data").joinpath("tinyshakespeare.txt")
    return read_verified_text(resource, TINYSHAKESPEARE_SHA256)


def tinyshakespeare_bytes(heldout_bytes: int) -> tuple[Tensor, Tensor]:
    """Tiny Shakespeare's bytes for a byte-level model: the first 90% to train on, and the
    first ``heldout_bytes`` of the last 10% to score.

    Args:
        heldout_bytes: how much of the held-out 10% is kept.

    Returns:
        ``(train, heldout)``, long tensors of byte values 0-255.

    Shape:
        (0.9 N,) and (min(heldout_bytes, 0.1 N),), N = :data:`TINYSHAKESPEARE_BYTES`.
    """
    data = torch.tensor(list(load_tinyshakespeare().encode("utf-8")), dtype=torch.long)  # (N,)
    split = int(0.9 * len(data))
    return data[:split], data[split:][:heldout_bytes]


def char_lm_batches(
    text: str | Tensor,
    vocab: CharVocab,
    block_size: int,
    batch_size: int,
    generator: torch.Generator | None = None,
    num_batches: int | None = None,
    device: torch.device | str | None = None,
) -> Iterator[tuple[Tensor, Tensor]]:
    """Random windows of the text for next-character prediction (nanoGPT's ``get_batch``).

    Each row is ``block_size`` consecutive characters starting at a uniformly random offset;
    its target is the same window shifted one character to the left.

    Args:
        text: The corpus, or its ids already encoded as a 1-D long tensor.
        vocab: Vocabulary used to encode ``text`` (characters outside it become ``<unk>``).
        block_size: Context length L.
        batch_size: Rows per batch B.
        generator: A CPU ``torch.Generator`` for reproducible offsets (default: global RNG).
        num_batches: Stop after this many batches (default: never stop).
        device: Where to put the batches (default CPU).

    Shape:
        - x: (B, L) long
        - y: (B, L) long, ``y[:, i] == x[:, i + 1]`` and ``y[:, -1]`` the character after ``x``

    Returns:
        An iterator of ``(x, y)`` pairs.
    """
    if isinstance(text, str):
        data = torch.tensor(vocab.encode(text), dtype=torch.long)  # (N,)
    elif isinstance(text, Tensor):
        if text.dim() != 1 or text.dtype != torch.long:
            raise TypeError(
                f"text as a tensor must be 1-D torch.long ids, got {text.dtype} of shape "
                f"{tuple(text.shape)}"
            )
        data = text.cpu()  # (N,)
    else:
        raise TypeError(f"text must be a str or a 1-D long tensor, got {type(text).__name__}")
    for name, value in (("block_size", block_size), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if num_batches is not None and (not isinstance(num_batches, int) or num_batches < 0):
        raise ValueError(f"num_batches must be a non-negative int or None, got {num_batches!r}")
    if len(data) < block_size + 1:
        raise ValueError(
            f"text must be longer than block_size + 1 = {block_size + 1} characters, "
            f"got {len(data)}"
        )
    return _windows(data, block_size, batch_size, generator, num_batches, device)


def _windows(
    data: Tensor,
    block_size: int,
    batch_size: int,
    generator: torch.Generator | None,
    num_batches: int | None,
    device: torch.device | str | None,
) -> Iterator[tuple[Tensor, Tensor]]:
    offsets = torch.arange(block_size + 1)  # (L + 1,)
    produced = 0
    while num_batches is None or produced < num_batches:
        starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)  # (B,)
        chunk = data[starts.unsqueeze(1) + offsets]  # (B, L + 1)
        yield chunk[:, :-1].to(device), chunk[:, 1:].to(device)  # (B, L), (B, L)
        produced += 1
