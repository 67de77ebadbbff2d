"""Byte-level byte-pair encoding (BPE), GPT-2's scheme: train a vocabulary, encode, decode.

Text becomes ids in three steps. Special tokens (``<|endoftext|>``) are cut out first and map to
their own ids. The rest is split into *pre-tokens* by GPT-2's regular expression
(:data:`GPT2_PATTERN`: contractions, runs of letters, of digits, of other symbols, each with at
most one leading space, and whitespace). Each pre-token's UTF-8 bytes start as byte tokens
(256 of them, so any string can be encoded) and the learned merges join adjacent tokens in the
order they were learned. Merges never cross a pre-token boundary.

:func:`train_bpe` learns the merges from a text; :class:`Tokenizer` applies them, and reads and
writes GPT-2's ``vocab.json`` + ``merges.txt`` format, so GPT-2's own files (shipped in
``coursepkg/data/gpt2/``, see :meth:`Tokenizer.gpt2`) load into it and give GPT-2's ids.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import operator
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from itertools import pairwise

import regex
from tqdm.auto import tqdm

from coursepkg.tokenizer_long import LongChunkEncoder

__all__ = [
    "GPT2_PATTERN",
    "Tokenizer",
    "bytes_to_unicode",
    "merge_pair",
    "pretokenize",
    "split_special",
    "train_bpe",
]

#: GPT-2's pre-tokenisation pattern (``encoder.py`` in openai/gpt-2). Without it BPE would learn
#: tokens such as ``"dog."`` and ``"dog!"`` separately; with it, words, numbers and punctuation
#: stay apart and a leading space belongs to the word that follows it.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

_PRETOKEN = regex.compile(GPT2_PATTERN)


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, used to write tokens into ``vocab.json``.

    Printable Latin-1 bytes stand for themselves; the other 68 (control characters, space, ...)
    get the code points from 256 upwards, so a space is written ``Ġ`` and a newline ``Ċ``.

    Returns:
        A dict from each byte value (0-255) to a one-character string.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    others = [byte for byte in range(256) if byte not in printable]  # numbered in order
    return {b: chr(b) if b in printable else chr(256 + others.index(b)) for b in range(256)}


def _check_special_tokens(special_tokens: Iterable[str] | None) -> list[str]:
    """The special tokens as a list, or a clear error for an empty, repeated or non-str one."""
    if special_tokens is None:
        return []
    if isinstance(special_tokens, (str, bytes)):
        raise TypeError(
            "special_tokens must be a list of strings, got the single "
            f"{type(special_tokens).__name__} {special_tokens!r} (wrap it in a list)"
        )
    tokens = list(special_tokens)
    for token in tokens:
        if not isinstance(token, str):
            raise TypeError(
                f"special_tokens must hold strings, got {type(token).__name__} {token!r}"
            )
        if not token:
            raise ValueError("special_tokens holds an empty string: a special token needs a text")
    repeated = sorted(t for t, n in Counter(tokens).items() if n > 1)
    if repeated:
        raise ValueError(f"special_tokens lists {repeated} more than once")
    return tokens


def _special_splitter(special_tokens: Sequence[str]) -> regex.Pattern | None:
    """A pattern whose capturing group finds special tokens, the longest first where they
    overlap (``<|a|><|b|>`` wins over ``<|a|>`` when both are special)."""
    if not special_tokens:
        return None
    ordered = sorted(special_tokens, key=len, reverse=True)
    return regex.compile("(" + "|".join(regex.escape(t) for t in ordered) + ")")


def split_special(text: str, special_tokens: Sequence[str]) -> list[str]:
    """Cut ``text`` at its special tokens, keeping them as their own pieces.

    Args:
        text: any string.
        special_tokens: the special tokens (the longest wins where two overlap).

    Returns:
        Pieces whose concatenation is ``text``; the odd positions (1, 3, ...) are special tokens.
    """
    splitter = _special_splitter(_check_special_tokens(special_tokens))
    return [text] if splitter is None else splitter.split(text)


def pretokenize(text: str) -> list[str]:
    """Split ``text`` (without special tokens) into GPT-2's pre-tokens; they concatenate to it."""
    return _PRETOKEN.findall(text)


#: Maps byte b to the character 255 - b: strings made with it sort in the reverse order of the
#: byte strings, once each ends with a character above them all (see :func:`_descending`).
_FLIP = {b: chr(255 - b) for b in range(256)}


def _descending(token: bytes) -> str:
    """A string that sorts before another exactly when ``token`` is the greater byte string,
    so a min-heap of ``(-count, _descending(a) + _descending(b))`` pops the tie rule's pair."""
    return token.decode("latin-1").translate(_FLIP) + "\u0100"


def _read_corpus(text_or_path: str | os.PathLike) -> str:
    """The training text: a str is the text itself, a path (``pathlib.Path``) names a file."""
    if isinstance(text_or_path, os.PathLike):
        with open(text_or_path, encoding="utf-8", newline="") as file:  # keep "\r\n" as is
            return file.read()
    if not isinstance(text_or_path, str):
        raise TypeError(
            "text must be a str (the text) or a pathlib.Path (a UTF-8 file), "
            f"got {type(text_or_path).__name__}"
        )
    return text_or_path


def _count_pretokens(
    text: str, special_tokens: Sequence[str], pattern: regex.Pattern
) -> Counter[str]:
    """How often each pre-token occurs; the special tokens separate the text and are not counted."""
    counts: Counter[str] = Counter()
    pieces = split_special(text, special_tokens)
    for piece in pieces[::2]:  # even positions: ordinary text
        counts.update(pattern.findall(piece))
    return counts


class _PairCounts:
    """The pair counts of a corpus of words, updated in place as merges are applied.

    ``words[i]`` is a list of token ids occurring ``freq[i]`` times; ``count[pair]`` the number
    of times ``pair`` occurs adjacently, ``where[pair]`` the words it may occur in (a superset:
    a word is only re-read when a merge touches it), and ``heap`` a lazy max-heap of counts.
    """

    def __init__(self, words: list[list[int]], freq: list[int], vocab: dict[int, bytes]) -> None:
        self.words, self.freq, self.vocab = words, freq, vocab
        self.order = {i: _descending(token) for i, token in vocab.items()}
        self.count: Counter[tuple[int, int]] = Counter()
        self.where: dict[tuple[int, int], set[int]] = {}
        for index, word in enumerate(words):
            for pair in pairwise(word):
                self.count[pair] += freq[index]
                self.where.setdefault(pair, set()).add(index)
        self.heap = [self._entry(pair, n) for pair, n in self.count.items()]
        heapq.heapify(self.heap)

    def _entry(self, pair: tuple[int, int], n: int) -> tuple[int, str, tuple[int, int]]:
        return (-n, self.order[pair[0]] + self.order[pair[1]], pair)

    def best(self) -> tuple[int, int] | None:
        """The most frequent pair, ties to the lexicographically greater (bytes, bytes)."""
        while self.heap:
            negative, _, pair = heapq.heappop(self.heap)
            if self.count.get(pair, 0) == -negative > 0:  # not a stale entry
                return pair
        return None

    def merge(self, pair: tuple[int, int], new_id: int) -> None:
        """Replace ``pair`` by ``new_id`` in every word holding it and update the counts of
        the pairs of those words only (no recount of the corpus)."""
        self.order[new_id] = _descending(self.vocab[new_id])
        changed = set()
        for index in self.where.pop(pair, ()):
            word, n = self.words[index], self.freq[index]
            merged = merge_pair(word, pair, new_id)
            if len(merged) == len(word):
                continue  # the pair left this word in an earlier merge
            delta = Counter(pairwise(merged))  # pairs gained (> 0) and lost (< 0)
            delta.subtract(pairwise(word))
            for p, d in delta.items():
                if d:
                    self.count[p] += d * n
                    changed.add(p)
                    if d > 0:
                        self.where.setdefault(p, set()).add(index)
            self.words[index] = merged
        for p in changed:
            n = self.count[p]
            if n > 0:
                heapq.heappush(self.heap, self._entry(p, n))
            else:
                del self.count[p]


def merge_pair(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """One merge applied to one pre-token: ``word`` with each occurrence of ``pair``, scanned left
    to right without overlaps, replaced by ``new_id``.

    Args:
        word: the pre-token's ids.
        pair: the two ids to merge.
        new_id: the id of the merged token.

    Returns:
        The new list of ids (``word`` is left unchanged).
    """
    first, second = pair
    out, i, last = [], 0, len(word) - 1
    while i <= last:
        if i < last and word[i] == first and word[i + 1] == second:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def train_bpe(
    text: str | os.PathLike,
    vocab_size: int,
    special_tokens: Iterable[str] | None = None,
    *,
    pattern: str = GPT2_PATTERN,
    progress: bool = False,
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Learn a byte-level BPE vocabulary (Sennrich et al., 2016; GPT-2's byte-level variant).

    Ids 0-255 are the single bytes, then one id per merge in the order learned, then the special
    tokens. Each step merges the most frequent adjacent pair inside pre-tokens; **ties go to the
    lexicographically greater pair** ``(bytes_a, bytes_b)`` (compared as a tuple of byte strings),
    so training is deterministic. Pair counts are updated incrementally after each merge. Training
    stops early if no pair is left to merge.

    Args:
        text: the training text (a str), or a ``pathlib.Path`` to a UTF-8 file.
        vocab_size: the size of the vocabulary returned, at least 256 + len(special_tokens).
        special_tokens: strings kept whole: they separate the text and are never merged.
        pattern: the regular expression whose matches are the pre-tokens (GPT-2's by default;
            :class:`Tokenizer` always uses GPT-2's, so change it only to study its effect).
        progress: show a progress bar over the merges.

    Returns:
        ``(vocab, merges)``: ``vocab`` maps each id to its bytes; ``merges`` lists the merged
        pairs of byte strings in the order they were learned.
    """
    specials = _check_special_tokens(special_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < 256 + len(specials):
        raise ValueError(
            f"vocab_size must be at least 256 + {len(specials)} special tokens = "
            f"{256 + len(specials)}, got {vocab_size}"
        )
    splitter = _PRETOKEN if pattern == GPT2_PATTERN else regex.compile(pattern)
    counts = _count_pretokens(_read_corpus(text), specials, splitter)
    vocab = {i: bytes([i]) for i in range(256)}
    pairs = _PairCounts([list(t.encode("utf-8")) for t in counts], list(counts.values()), vocab)
    merges: list[tuple[bytes, bytes]] = []
    n_merges = vocab_size - 256 - len(specials)
    for _ in tqdm(range(n_merges), desc="BPE merges", disable=not progress, mininterval=0.5):
        pair = pairs.best()
        if pair is None:
            break
        new_id = len(vocab)
        vocab[new_id] = vocab[pair[0]] + vocab[pair[1]]
        merges.append((vocab[pair[0]], vocab[pair[1]]))
        pairs.merge(pair, new_id)
    for token in specials:
        vocab[len(vocab)] = token.encode("utf-8")
    return vocab, merges


class Tokenizer:
    """Encodes text to ids and decodes ids to text with a byte-level BPE vocabulary.

    Encoding applies the merges in **rank order** (the order they were learned), whatever the
    pair frequencies of the text at hand, exactly as GPT-2 does; a cache from pre-token to ids
    (bounded by ``cache_size``) makes repeated words cost one dictionary look-up.

    Args:
        vocab: id -> bytes; it must hold every single byte (byte-level fallback).
        merges: the merged pairs in rank order; both parts and their join must be in ``vocab``.
        special_tokens: strings encoded as one id each; those missing from ``vocab`` get new ids.
        cache_size: how many pre-tokens the encode cache keeps.
        long_above: pre-tokens of more characters than this are encoded by :meth:`_encode_long`
            (about linear time) rather than by the plain loop (n^2, quicker when short); None:
            never.
        long_route: ``"auto"``: long pre-tokens are merged by a heap
            (:func:`~coursepkg.tokenizer_long.merge_by_heap`) until they add up to
            :data:`~coursepkg.tokenizer_long.BUILD_AFTER` bytes, then built left to right by
            :class:`~coursepkg.tokenizer_long.Backtracker` where the merges allow it; ``"heap"``,
            ``"backtrack"``: always that route (the second fails where the merges forbid it).
    """

    def __init__(
        self,
        vocab: dict[int, bytes],
        merges: Sequence[tuple[bytes, bytes]],
        special_tokens: Iterable[str] | None = None,
        *,
        cache_size: int = 1 << 16,
        long_above: int | None = 64,
        long_route: str = "auto",
    ) -> None:
        self.vocab = dict(vocab)
        self.merges = list(merges)
        self.special_tokens = _check_special_tokens(special_tokens)
        self._id_of = self._invert_vocab()
        for token in self.special_tokens:
            if token.encode("utf-8") not in self._id_of:
                new_id = max(self.vocab, default=-1) + 1
                self.vocab[new_id] = token.encode("utf-8")
                self._id_of[token.encode("utf-8")] = new_id
        self._special_ids = {t: self._id_of[t.encode("utf-8")] for t in self.special_tokens}
        self._splitter = _special_splitter(self.special_tokens)
        self._longest_special = max(map(len, self.special_tokens), default=0)
        self._byte_ids = [self._id_of[bytes([b])] for b in range(256)]
        self._ranks = self._rank_merges()
        self._cache: dict[str, list[int]] = {}
        self._cache_size = cache_size
        if long_above is not None and (not isinstance(long_above, int) or long_above < 0):
            raise ValueError(f"long_above must be None or an int >= 0, got {long_above!r}")
        if long_route not in ("auto", "heap", "backtrack"):
            raise ValueError(
                f'long_route must be "auto", "heap" or "backtrack", got {long_route!r}'
            )
        self._long_above = math.inf if long_above is None else long_above
        self._long_route, self._long = long_route, None

    def _invert_vocab(self) -> dict[bytes, int]:
        id_of: dict[bytes, int] = {}
        for index, token in self.vocab.items():
            if not isinstance(index, int) or not isinstance(token, bytes):
                raise TypeError(
                    f"vocab must map int ids to bytes, got {type(index).__name__} -> "
                    f"{type(token).__name__} ({index!r}: {token!r})"
                )
            if token in id_of:
                raise ValueError(f"vocab gives {token!r} two ids: {id_of[token]} and {index}")
            id_of[token] = index
        missing = [b for b in range(256) if bytes([b]) not in id_of]
        if missing:
            raise ValueError(
                f"vocab must hold all 256 single bytes (byte-level fallback); it lacks "
                f"{len(missing)} of them, e.g. {bytes([missing[0]])!r}"
            )
        return id_of

    def _rank_merges(self) -> dict[tuple[int, int], tuple[int, int, tuple[int, int]]]:
        """(left id, right id) -> (rank, merged id, the pair), checking each merge's tokens."""
        ranks = {}
        for rank, merge in enumerate(self.merges):
            if not (isinstance(merge, tuple) and len(merge) == 2):
                raise TypeError(f"merges[{rank}] must be a pair of bytes, got {merge!r}")
            left, right = merge
            for part in (left, right, left + right):
                if part not in self._id_of:
                    raise ValueError(
                        f"merges[{rank}] = {merge!r} names {part!r}, which is not in the vocab"
                    )
            pair = (self._id_of[left], self._id_of[right])
            ranks.setdefault(pair, (rank, self._id_of[left + right], pair))
        return ranks

    @classmethod
    def from_files(
        cls,
        vocab_path: str | os.PathLike,
        merges_path: str | os.PathLike,
        special_tokens: Iterable[str] | None = None,
    ) -> Tokenizer:
        """Load GPT-2's format: ``vocab.json`` (token -> id, bytes written with
        :func:`bytes_to_unicode`) and ``merges.txt`` (one ``left right`` pair a line, an optional
        ``#version`` first line).

        Args:
            vocab_path: the ``vocab.json`` file.
            merges_path: the ``merges.txt`` file.
            special_tokens: tokens to treat as special (e.g. ``["<|endoftext|>"]`` for GPT-2).

        Returns:
            The tokenizer.
        """
        to_byte = {char: byte for byte, char in bytes_to_unicode().items()}

        def decode_token(token: str, where: str) -> bytes:
            try:
                return bytes(to_byte[char] for char in token)
            except KeyError as error:
                raise ValueError(
                    f"{where}: {token!r} holds {error.args[0]!r}, not one of GPT-2's 256 byte "
                    "characters (bytes_to_unicode)"
                ) from None

        with open(vocab_path, encoding="utf-8") as file:
            raw_vocab = json.load(file)
        vocab = {index: decode_token(token, str(vocab_path)) for token, index in raw_vocab.items()}
        merges = []
        with open(merges_path, encoding="utf-8") as file:
            for number, line in enumerate(file, start=1):
                line = line.rstrip("\n")
                if (number == 1 and line.startswith("#version")) or not line:
                    continue
                parts = line.split(" ")
                if len(parts) != 2:
                    raise ValueError(
                        f"{merges_path}, line {number}: expected two tokens separated by one "
                        f"space, got {line!r}"
                    )
                where = f"{merges_path}, line {number}"
                merges.append((decode_token(parts[0], where), decode_token(parts[1], where)))
        return cls(vocab, merges, special_tokens)

    @classmethod
    def gpt2(cls) -> Tokenizer:
        """GPT-2's own tokenizer, from the files shipped in ``coursepkg/data/gpt2/``
        (50,257 ids, ``<|endoftext|>`` = 50256; provenance in ``coursepkg/data/PROVENANCE.md``)."""
        folder = resources.files("coursepkg") / "data" / "gpt2"
        with resources.as_file(folder / "vocab.json") as vocab_path:
            with resources.as_file(folder / "merges.txt") as merges_path:
                return cls.from_files(vocab_path, merges_path, ["<|endoftext|>"])

    def save(self, vocab_path: str | os.PathLike, merges_path: str | os.PathLike) -> None:
        """Write ``vocab.json`` and ``merges.txt`` in GPT-2's format (see :meth:`from_files`)."""
        table = bytes_to_unicode()

        def text(token: bytes) -> str:
            return "".join(table[b] for b in token)

        vocab = {text(token): index for index, token in sorted(self.vocab.items())}
        if len(vocab) != len(self.vocab):
            raise ValueError("vocab holds the same bytes twice; GPT-2's format cannot store it")
        with open(vocab_path, "w", encoding="utf-8") as file:
            json.dump(vocab, file, ensure_ascii=False)
        with open(merges_path, "w", encoding="utf-8") as file:
            file.write("#version: 0.2\n")
            file.writelines(f"{text(a)} {text(b)}\n" for a, b in self.merges)

    def _encode_pretoken(self, pretoken: str) -> list[int]:
        """The ids of one pre-token: its bytes, merged by rank until no merge applies."""
        if len(pretoken) > self._long_above:  # each pass below reads the whole pre-token: n^2
            return self._encode_long(pretoken)
        ids = [self._byte_ids[b] for b in pretoken.encode("utf-8")]
        ranks = self._ranks
        while len(ids) > 1:
            best = min(
                (ranks[pair] for pair in pairwise(ids) if pair in ranks),
                default=None,
            )
            if best is None:
                break
            ids = merge_pair(ids, best[2], best[1])
        if len(self._cache) < self._cache_size:
            self._cache[pretoken] = ids
        return ids

    def _encode_long(self, pretoken: str) -> list[int]:
        """:meth:`_encode_pretoken`'s ids for a long pre-token, in about linear time.

        Why it exists: the loop above rereads the pre-token for each merge, so one chunk without
        spaces (a URL, base64, DNA) of n bytes costs up to n^2 steps. The encoder that avoids it
        lives in :mod:`coursepkg.tokenizer_long`, built for this vocabulary on first use.
        """
        if self._long is None:
            self._long = LongChunkEncoder(self.vocab, self._ranks, self._byte_ids, self._long_route)
        return self._long(pretoken.encode("utf-8"))

    def _encode_ordinary(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (no special tokens in it) to ``out``."""
        cache, encode = self._cache, self._encode_pretoken
        for pretoken in _PRETOKEN.findall(text):
            ids = cache.get(pretoken)
            out.extend(encode(pretoken) if ids is None else ids)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``: special tokens one id each, the rest pre-tokenised and merged.

        Args:
            text: any string (all of Unicode encodes, through its UTF-8 bytes).

        Returns:
            The list of ids.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        out: list[int] = []
        if self._splitter is None:
            self._encode_ordinary(text, out)
            return out
        for position, piece in enumerate(self._splitter.split(text)):
            if position % 2:
                out.append(self._special_ids[piece])
            elif piece:
                self._encode_ordinary(piece, out)
        return out

    def encode_iterable(self, lines: Iterable[str]) -> Iterator[int]:
        """Encode a stream of strings (e.g. an open file, line by line) in bounded memory.

        The ids are those of :meth:`encode` on the concatenation: the last pre-token of what has
        been read, and any tail that could start a special token, wait for the next string.

        Args:
            lines: strings to concatenate.

        Yields:
            The ids, one at a time.
        """
        pending = ""
        for line in lines:
            if not isinstance(line, str):
                raise TypeError(f"lines must yield str, got {type(line).__name__}")
            pending += line
            ready, pending = self._split_ready(pending)
            yield from self.encode(ready)
        yield from self.encode(pending)

    def _split_ready(self, text: str) -> tuple[str, str]:
        """Split ``text`` into a head whose ids cannot change whatever follows, and the rest.

        The rest starts at the last pre-token (more text could extend it) or earlier, at the
        longest tail that could be the start of a special token.
        """
        end = len(text)
        for size in range(min(len(text), self._longest_special), 0, -1):
            tail = text[-size:]
            if any(t.startswith(tail) and t != tail for t in self.special_tokens):
                end -= size
                break
        start = 0
        if self._splitter is not None:
            for start_match in self._splitter.finditer(text, 0, end):
                start = start_match.end()
        cut = end
        for pretoken in _PRETOKEN.finditer(text, start, end):
            cut = pretoken.start()
        return text[:cut], text[cut:]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; bytes that are not valid UTF-8 (a character cut in the middle)
        become U+FFFD, the replacement character, rather than an error.

        Args:
            ids: token ids of this vocabulary (ints, or anything with ``__index__``).

        Returns:
            The decoded string.
        """
        vocab = self.vocab
        pieces = []
        for position, token in enumerate(ids):
            try:
                pieces.append(vocab[operator.index(token)])
            except (TypeError, KeyError):
                raise ValueError(
                    f"ids[{position}] = {token!r} is not an id of this vocabulary "
                    f"(ints in [0, {max(vocab) + 1}))"
                ) from None
        return b"".join(pieces).decode("utf-8", errors="replace")

    def __getstate__(self) -> dict:
        """Pickled (or deep-copied) without the long-chunk encoder (its backtracker is large):
        it is made again on first use."""
        return self.__dict__ | {"_long": None}

    def __len__(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab={len(self.vocab)} ids, merges={len(self.merges)}, "
            f"special_tokens={self.special_tokens})"
        )
