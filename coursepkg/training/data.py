"""Text -> token ids on disk, once; random training windows read from there.

The corpus is tokenised a single time into two ``numpy.memmap`` files (``train.bin``,
``val.bin``: the last ``val_fraction`` of the stream is held out) with a ``meta.json`` that
records the source's SHA-256 and the vocabulary. A later run on the same text reuses them; a
changed text or tokenizer writes them anew. Batches are read from the memory map, so a corpus
larger than memory trains all the same.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from coursepkg.data.vocab import CharVocab
from coursepkg.tokenizer import Tokenizer

__all__ = [
    "TOKENIZER_FILES",
    "TokenData",
    "get_batch",
    "is_tokenizer_folder",
    "make_tokenizer",
    "prepare_tokens",
    "read_corpus",
    "recorded_tokenizer",
]

log = logging.getLogger(__name__)

_FORMAT = 1  # bump when the files' layout changes
#: A learned tokenizer's folder: :meth:`~coursepkg.tokenizer.Tokenizer.save`'s two files.
TOKENIZER_FILES = ("vocab.json", "merges.txt")
_END_OF_TEXT = "<|endoftext|>"


def read_corpus(path: str | Path) -> str:
    """A text file, or the ``*.txt`` files of a folder (recursively, sorted, joined by a blank
    line), as one string.

    Raises:
        ValueError: when the path does not exist, or the folder holds no ``.txt`` file.
    """
    path = Path(path)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise ValueError(f"data folder {str(path)!r} holds no .txt file")
        return "\n\n".join(p.read_text(encoding="utf-8") for p in files)
    raise ValueError(f"data must be a text file or a folder, got {str(path)!r} (not found)")


def is_tokenizer_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a saved BPE (:data:`TOKENIZER_FILES`)."""
    return all((Path(path) / name).is_file() for name in TOKENIZER_FILES)


def _load_folder(folder: Path) -> Tokenizer:
    """The BPE saved in ``folder``; ``<|endoftext|>`` is special when its vocabulary has it."""
    vocab, merges = (folder / name for name in TOKENIZER_FILES)
    special = [_END_OF_TEXT] if _END_OF_TEXT in json.loads(vocab.read_text("utf-8")) else []
    return Tokenizer.from_files(vocab, merges, special)


def make_tokenizer(name: str, text: str) -> CharVocab | Tokenizer:
    """The tokenizer a run uses: the one seam where another tokenizer plugs in.

    Args:
        name: ``"char"``: the corpus' characters (:class:`~coursepkg.data.vocab.CharVocab`);
            ``"bpe"``: GPT-2's byte-level BPE (:meth:`coursepkg.tokenizer.Tokenizer.gpt2`, the
            course's tokenizer loaded with GPT-2's shipped vocabulary and merges: 50,257 ids);
            otherwise a folder holding a BPE learned on a corpus (``vocab.json`` and
            ``merges.txt``, as :meth:`~coursepkg.tokenizer.Tokenizer.save` writes them).
        text: the corpus (the characters' vocabulary is built from it).

    Returns:
        An object with ``encode(str) -> list[int]``, ``decode(list[int]) -> str`` and ``len``.
    """
    if name == "char":
        return CharVocab.from_corpus(text)
    if name == "bpe":
        return Tokenizer.gpt2()
    if is_tokenizer_folder(name):
        return _load_folder(Path(name))
    raise ValueError(
        f"tokenizer must be 'char', 'bpe' or a folder holding {' and '.join(TOKENIZER_FILES)}, "
        f"got {name!r}"
    )


def recorded_tokenizer(name: str, checkpoint: str | Path) -> Tokenizer:
    """The BPE tokenizer a checkpoint's run recorded (its identity's ``tokenizer``).

    A learned tokenizer travels with its run: :func:`prepare_tokens` copies its files into the
    run's ``tokens/`` folder, read first; the folder the run was given is the fallback.

    Args:
        name: ``"bpe"`` (GPT-2's) or the learned tokenizer's folder, as the run recorded it.
        checkpoint: the checkpoint file whose run recorded ``name``.

    Raises:
        ValueError: ``"char"`` or another name whose vocabulary is not saved, or a learned
            tokenizer found neither beside the checkpoint nor where the run read it.
    """
    if name == "bpe":
        return Tokenizer.gpt2()
    if name == "char":
        raise ValueError(
            f"{str(checkpoint)!r} was trained with the 'char' tokenizer, whose vocabulary is "
            "not saved with it; train with --tokenizer bpe or a learned tokenizer's folder"
        )
    for folder in (Path(checkpoint).parent / "tokens", Path(name)):
        if is_tokenizer_folder(folder):
            return _load_folder(folder)
    raise ValueError(
        f"{str(checkpoint)!r} was trained with the tokenizer {name!r}, found neither in "
        f"{str(Path(checkpoint).parent / 'tokens')!r} nor at {name!r}"
    )


@dataclass
class TokenData:
    """The memory-mapped token ids of a corpus and its vocabulary.

    Attributes:
        train: the training ids, (N_train,) uint16.
        val: the held-out ids, (N_val,) uint16.
        vocab: the tokenizer (``encode``/``decode``).
        digest: SHA-256 of the source text and tokenizer (a checkpoint must agree with it).
    """

    train: np.memmap
    val: np.memmap
    vocab: CharVocab | Tokenizer
    digest: str


def _write_array(path: Path, ids: np.ndarray) -> None:
    """Write ``ids`` to ``path`` as a memmap-able array, atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # machines may share the folder
    array = np.memmap(tmp, dtype=np.uint16, mode="w+", shape=ids.shape)
    array[:] = ids
    array.flush()
    del array
    os.replace(tmp, path)


def prepare_tokens(
    data: str | Path, folder: str | Path, tokenizer: str, val_fraction: float, write: bool
) -> TokenData:
    """Tokenise ``data`` into ``folder`` (unless it is there already) and map it.

    Args:
        data: the text file or folder.
        folder: where ``train.bin``, ``val.bin`` and ``meta.json`` live.
        tokenizer: see :func:`make_tokenizer`.
        val_fraction: the held-out share of the stream.
        write: whether this process may write the files (local rank 0 of each machine does;
            the others call this after it, behind a barrier).

    Returns:
        The :class:`TokenData`.
    """
    text = read_corpus(data)
    vocab = make_tokenizer(tokenizer, text)
    learned = b"".join(
        (Path(tokenizer) / n).read_bytes()
        for n in TOKENIZER_FILES
        if tokenizer not in ("char", "bpe")
    )  # a learned tokenizer's files: its name alone would not see them change
    digest = hashlib.sha256(f"{tokenizer}\0{val_fraction}\0{text}".encode() + learned).hexdigest()
    if len(vocab) > 2**16:
        raise ValueError(
            f"the token files hold uint16 ids: vocab size must be <= 65536, got {len(vocab)}"
        )
    folder = Path(folder)
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if meta.get("digest") != digest or meta.get("format") != _FORMAT:
        if not write:
            raise RuntimeError(
                f"the tokens in {folder} are missing or stale (local rank 0 writes them)"
            )
        ids = np.asarray(vocab.encode(text), dtype=np.uint16)  # (N,)
        split = int(len(ids) * (1.0 - val_fraction))
        folder.mkdir(parents=True, exist_ok=True)
        _write_array(folder / "train.bin", ids[:split])
        _write_array(folder / "val.bin", ids[split:])
        if learned:  # the run carries its tokenizer (recorded_tokenizer reads it there)
            vocab.save(*(folder / n for n in TOKENIZER_FILES))
        meta = {"format": _FORMAT, "digest": digest, "train": split, "val": len(ids) - split}
        tmp = meta_path.with_name(f".meta.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, meta_path)
        log.info("tokenised %s: %d training and %d held-out tokens", data, split, len(ids) - split)
    train = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r", shape=(meta["train"],))
    val = np.memmap(folder / "val.bin", dtype=np.uint16, mode="r", shape=(meta["val"],))
    return TokenData(train, val, vocab, digest)


def get_batch(
    ids: np.ndarray,
    block_size: int,
    batch_size: int,
    generator: torch.Generator,
    rows: Tensor | slice | None = None,
) -> tuple[Tensor, Tensor]:
    """Random windows of ``ids`` and the same windows shifted by one (the next tokens).

    The generator draws all ``batch_size`` starts; ``rows`` then picks the part this process
    reads. Every rank draws with the same generator, so the ranks' parts together are exactly
    the batch one process would read: the data does not depend on the number of processes.

    Args:
        ids: the token stream (a memmap).
        block_size: L.
        batch_size: B, the windows drawn.
        generator: a CPU generator, advanced by one draw.
        rows: the indices (or a slice) of the windows to read (default all).

    Shape:
        x, y: (B', L) long, with B' the length of ``rows``; ``y[:, i] == x[:, i + 1]``.

    Returns:
        ``(x, y)``.
    """
    if len(ids) < block_size + 2:
        raise ValueError(
            f"the token stream ({len(ids)} tokens) must be longer than block_size + 1 = "
            f"{block_size + 1}; use more text or a smaller block_size"
        )
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)  # (B,)
    picked = starts[rows] if rows is not None else starts  # (B',)
    windows = np.stack([ids[s : s + block_size + 1] for s in picked.tolist()])  # (B', L + 1)
    chunk = torch.from_numpy(windows.astype(np.int64))  # (B', L + 1)
    return chunk[:, :-1], chunk[:, 1:]  # (B', L), (B', L)
