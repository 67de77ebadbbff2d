"""Assignment ex10_tokenizer: a byte-level BPE tokenizer, trained and applied (chapter "Tokens")."""

from __future__ import annotations

from collections import Counter  # noqa: F401  (you will need them)

import regex  # noqa: F401

from coursepkg.tokenizer import GPT2_PATTERN  # noqa: F401  (GPT-2's pre-tokenisation pattern)


def train_bpe(
    text: str, vocab_size: int, special_tokens: list[str] | None = None
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Learn a byte-level BPE vocabulary from ``text``, GPT-2's way.

    1. Cut ``text`` at the special tokens (``special_tokens``); they are not trained on, and no
       merge crosses them. Where two special tokens overlap, the longer one wins.
    2. Split each remaining piece into pre-tokens with ``regex.findall(GPT2_PATTERN, piece)``
       and count how often each pre-token occurs. Merges never cross a pre-token boundary.
    3. Start every pre-token as its UTF-8 bytes and repeat: find the most frequent adjacent
       pair of tokens (counted over all pre-tokens, times their frequencies), merge it
       everywhere, record it. **Ties**: of equally frequent pairs, take the lexicographically
       greater pair of byte strings, i.e. ``max`` over ``(count, (bytes_left, bytes_right))``.
       Stop when the vocabulary is full or no pair is left.

    The vocabulary: ids 0-255 are the single bytes (``bytes([i])``), then one id per merge in
    the order learned, then the special tokens (their UTF-8 bytes) in the order given.

    Args:
        text: the training text.
        vocab_size: the size of the vocabulary, at least 256 + len(special_tokens).
        special_tokens: strings kept whole (e.g. ``["<|endoftext|>"]``), or None.

    Returns:
        ``(vocab, merges)``: ``vocab`` maps each id (int) to its bytes; ``merges`` is the list
        of merged pairs ``(bytes_left, bytes_right)`` in the order they were learned.
    """
    raise NotImplementedError


class Tokenizer:
    """Encodes text to ids and decodes ids to text with a vocabulary and merges from
    ``train_bpe`` (or GPT-2's).

    Args:
        vocab: id -> bytes; it holds all 256 single bytes and the special tokens' bytes.
        merges: the merged pairs ``(bytes_left, bytes_right)`` in the order they were learned
            (their *rank*: the first learned has rank 0).
        special_tokens: strings to encode as one id each (their id is the one of their bytes
            in ``vocab``), or None.
    """

    def __init__(
        self,
        vocab: dict[int, bytes],
        merges: list[tuple[bytes, bytes]],
        special_tokens: list[str] | None = None,
    ) -> None:
        self.vocab = dict(vocab)
        self.merges = list(merges)
        self.special_tokens = list(special_tokens or [])
        # Build here any look-up tables encode and decode need.
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``.

        Cut the text at special tokens (each becomes its one id; the longer wins where two
        overlap), split the rest into pre-tokens with ``GPT2_PATTERN``, and turn each pre-token's
        bytes into tokens by applying the merges **in rank order**: repeatedly merge the adjacent
        pair whose merge was learned first, until no learned merge applies.

        Args:
            text: any string.

        Returns:
            The list of ids (ints).
        """
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``: join the tokens' bytes, then decode the whole as UTF-8. Bytes
        that are not valid UTF-8 (a character cut in the middle) become U+FFFD, the replacement
        character ``"\\ufffd"``: use ``errors="replace"``.

        Args:
            ids: token ids of this vocabulary.

        Returns:
            The decoded string.
        """
        raise NotImplementedError
