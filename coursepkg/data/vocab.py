"""A character vocabulary with the four special tokens every task of the course uses."""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["CharVocab", "PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID", "SPECIAL_TOKENS"]

PAD_ID = 0  # padding, ignored by losses and masks
BOS_ID = 1  # beginning of sequence, the first decoder input
EOS_ID = 2  # end of sequence, the last decoder target
UNK_ID = 3  # a character outside the alphabet
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0..3, in this order


class CharVocab:
    """Characters <-> ids; ids 0-3 are ``<pad> <bos> <eos> <unk>`` (notes: tokens -> input IDs).

    The characters get ids 4, 5, ... in the order they first appear in ``alphabet``.

    Args:
        alphabet: The characters of the vocabulary (a string, or an iterable of 1-char strings);
            duplicates are ignored.

    Example:
        >>> v = CharVocab("ab")
        >>> v.encode("ba", add_eos=True)
        [5, 4, 2]
    """

    pad_id = PAD_ID
    bos_id = BOS_ID
    eos_id = EOS_ID
    unk_id = UNK_ID

    def __init__(self, alphabet: str | Iterable[str]) -> None:
        chars: list[str] = []
        for ch in alphabet:
            if not isinstance(ch, str) or len(ch) != 1:
                raise ValueError(f"alphabet must contain single characters, got {ch!r}")
            if ch not in chars:
                chars.append(ch)
        if not chars:
            raise ValueError("alphabet must contain at least one character, got none")
        self.itos: list[str] = list(SPECIAL_TOKENS) + chars  # id -> token
        self.stoi: dict[str, int] = {ch: i + len(SPECIAL_TOKENS) for i, ch in enumerate(chars)}

    @classmethod
    def from_corpus(cls, text: str) -> CharVocab:
        """Vocabulary of the distinct characters of ``text``, in sorted order (reproducible)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return cls(sorted(set(text)))

    @property
    def chars(self) -> str:
        """The alphabet (without the special tokens), in id order."""
        return "".join(self.itos[len(SPECIAL_TOKENS) :])

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, ch: object) -> bool:
        return ch in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharVocab) and self.itos == other.itos

    def __hash__(self) -> int:
        return hash(tuple(self.itos))

    def __repr__(self) -> str:
        return f"CharVocab({self.chars!r})  # {len(self)} ids incl. 4 special"

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of the characters of ``text``; characters outside the alphabet map to ``<unk>``.

        Args:
            text: The string to encode.
            add_bos: Prepend ``<bos>``.
            add_eos: Append ``<eos>``.

        Returns:
            A list of ``len(text) + add_bos + add_eos`` ids.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = [self.stoi.get(ch, UNK_ID) for ch in text]
        if add_bos:
            ids.insert(0, BOS_ID)
        if add_eos:
            ids.append(EOS_ID)
        return ids

    def decode(self, ids: Iterable[int] | torch.Tensor, strip_special: bool = True) -> str:
        """The string of ``ids``.

        Args:
            ids: A sequence of ids, or a 1-D tensor.
            strip_special: Drop the four special tokens; when False they appear as ``<pad>``,
                ``<bos>``, ``<eos>``, ``<unk>``.

        Returns:
            The decoded string.
        """
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"ids must be 1-D, got a tensor of shape {tuple(ids.shape)}")
            if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
                raise TypeError(f"ids must be an integer tensor, got {ids.dtype}")
            ids = ids.tolist()
        out = []
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool):
                raise TypeError(f"ids must be ints, got {i!r} of type {type(i).__name__}")
            if not 0 <= i < len(self.itos):
                raise ValueError(f"ids must lie in [0, {len(self.itos)}), got {i}")
            if strip_special and i < len(SPECIAL_TOKENS):
                continue
            out.append(self.itos[i])
        return "".join(out)
