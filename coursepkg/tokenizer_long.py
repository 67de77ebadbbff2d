"""Long pre-tokens encoded in about linear time: the engine room above :mod:`coursepkg.tokenizer`.

Why it exists: the plain merge loop (``Tokenizer._encode_pretoken``, what the book shows) rereads
the whole pre-token for every merge, so one chunk without spaces (a URL, base64, DNA, a minified
line) of n bytes costs up to n^2 steps. The ids here are the plain loop's, on every input.

Two routes, chosen by :class:`LongChunkEncoder`:

* :func:`merge_by_heap`, the same merges found by a heap of candidate pairs over a linked list:
  n log n, and correct for any list of merges;
* :class:`Backtracker`, which builds the ids left to right without merging at all (the
  "backtracking" encoder of GitHub's ``bpe`` crate, written afresh here): about one dictionary
  look-up per output token once its tables are warm. It needs a vocabulary where each merge
  ranks after the merges that made its two parts and no token is made twice (true of GPT-2's and
  of :func:`~coursepkg.tokenizer.train_bpe`'s); other vocabularies take the heap, and so do the
  first long pre-tokens (building its tables costs more than the heap spends on a few).

Why backtracking gives BPE's ids. Call two tokens a *valid pair* when BPE on their bytes, one
after the other, gives back exactly these two tokens (no merge across the boundary). The
encoding of a text is the only sequence of *reachable* tokens (BPE on a token's bytes gives the
token) whose neighbours are all valid pairs: a merge across a boundary happens in the whole text
exactly when it happens between those two tokens alone, since until then each token's bytes
merge as they would alone. So a depth-first search that tries, at each position, the tokens that
are a prefix of the rest, longest first, keeps one only if it makes a valid pair with the token
before it, and backs up when nothing fits, finds that sequence; remembering which (position,
token) choices led nowhere keeps it from redoing work.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
from collections.abc import Iterator, Mapping, Sequence
from itertools import pairwise

__all__ = ["BUILD_AFTER", "Backtracker", "LongChunkEncoder", "merge_by_heap"]

#: (left id, right id) -> (rank, merged id, the pair), as ``Tokenizer._ranks`` holds them.
Ranks = Mapping[tuple[int, int], tuple[int, int, tuple[int, int]]]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a backtracker is built.

    Why: the build makes about 100k dicts and lists (GPT-2's trie), and every 700 new ones start
    a collection, whose older generations walk every object of the process, the vocabulary and
    the merges included: about half the build's time. Nothing is lost: the next collection
    after the build looks at them.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def merge_by_heap(ids: list[int], ranks: Ranks, n_merges: int) -> list[int]:
    """The plain merge loop's ids in O(n log n) time, for any list of merges.

    The symbols form a linked list, the candidate pairs a heap by (rank, position); a merge
    touches its neighbours only, stale entries are skipped when popped. One rank merges left to
    right as :func:`~coursepkg.tokenizer.merge_pair` does; a lower rank made meanwhile (merges
    out of order) waits until the rank being merged is done, as in the plain loop.

    Args:
        ids: the pre-token's byte ids.
        ranks: (left id, right id) -> (rank, merged id, the pair).
        n_merges: the number of merges (every rank is below it).

    Returns:
        The merged ids.
    """
    ids = [*ids, -1]  # ids[n] and ids[-1] read as -1: no pair
    n = len(ids) - 1
    after, before = list(range(1, n + 1)), list(range(-1, n))  # the linked list
    none = (n_merges, 0, None)  # a pair that is no merge ranks after them all
    heap = [ranks[p][0] * n + i for i, p in enumerate(pairwise(ids)) if p in ranks]
    heapq.heapify(heap)  # each entry is rank * n + position: one int, quick to compare
    waiting, current = [], -1  # lower-rank pairs made while `current` merges
    while heap or waiting:
        if waiting and (not heap or heap[0] // n != current):  # `current` is done
            for entry in waiting:
                heapq.heappush(heap, entry)
            waiting.clear()
        rank, left = divmod(heapq.heappop(heap), n)
        right = after[left]
        pair = (ids[left], ids[right])
        if ranks.get(pair, none)[0] != rank:
            continue  # stale: a neighbour merged since it was pushed
        current, merged = rank, ranks[pair][1]
        ids[left], ids[right], after[left] = merged, -1, after[right]
        before[after[right]] = left  # before[n] is a spare slot
        for i, pair in (
            (before[left], (ids[before[left]], merged)),
            (left, (merged, ids[after[left]])),
        ):
            new = ranks.get(pair, none)[0]
            if new < current:
                waiting.append(new * n + i)
            elif new < none[0]:
                heapq.heappush(heap, new * n + i)
    return [token for token in ids if token >= 0]


class Backtracker:
    """BPE's ids of a long pre-token, built left to right (see the module's docstring for why).

    ``outputs`` holds the tokens BPE can output (a byte, or a token BPE on whose bytes gives it).
    Built once per vocabulary: each token's rank (its merge's; bytes rank below all) and its two
    parts, a byte trie of the tokens BPE can output, and for each token the longest such token
    that is a proper prefix of it. Valid pairs are worked out on demand and remembered.

    Args:
        vocab: id -> bytes (non-negative ids).
        ranks: (left id, right id) -> (rank, merged id, the pair), as the tokenizer holds them.
        byte_ids: the id of each byte value 0-255.

    Raises:
        ValueError: the merges break the order this needs (a merge ranked before one that makes
            its part, or one token made by two merges): encode such a vocabulary by
            :func:`merge_by_heap`.
    """

    _REMEMBER_AT_MOST = 1 << 20  # how many answers of _first_fit the _Fits keep at most

    @_collector_paused()
    def __init__(self, vocab: Mapping[int, bytes], ranks: Ranks, byte_ids: Sequence[int]) -> None:
        if min(vocab) < 0:
            raise ValueError(f"the backtracker needs ids >= 0, the vocab has {min(vocab)}")
        self._size = size = max(vocab) + 1
        self._pair_rank = {pair: rank for pair, (rank, _, _) in ranks.items()}
        self._no_merge = max((r for r, _, _ in ranks.values()), default=-1) + 1
        self._rank = [self._no_merge] * size  # a token no merge makes is never output
        self._split = [(t, t) for t in range(size)]
        for token in byte_ids:
            self._rank[token] = -1
        outputs = set(byte_ids)  # the tokens BPE can output: bytes and reachable merges
        for rank, merged, (left, right) in sorted(ranks.values()):
            if max(self._rank[left], self._rank[right]) >= rank:
                raise ValueError(
                    f"merge {rank} joins {vocab[left]!r} and {vocab[right]!r}, and one of them "
                    "is made by a later merge or by none (merges out of order)"
                )
            if self._rank[merged] != self._no_merge:
                raise ValueError(f"{vocab[merged]!r} is made by two merges")
            self._rank[merged], self._split[merged] = rank, (left, right)
            if left in outputs and right in outputs and self._pair_ok(left, right, rank):
                outputs.add(merged)  # BPE on its bytes gives it
        self._length = [len(vocab.get(t, b"")) for t in range(size)] + [0]  # [size]: the start
        self.outputs = frozenset(outputs)
        self._first, self._shorter = self._build_trie(vocab, outputs)
        self._fits = [_Fits(self, prev) for prev in range(size + 1)]  # see _Fits
        self._remembered = 0  # how many answers the _Fits hold

    def _build_trie(
        self, vocab: Mapping[int, bytes], outputs: set[int]
    ) -> tuple[list[list], list[int]]:
        """A trie of ``outputs``' bytes and, for each token, the longest output token that is a
        proper prefix of it (-1: none; ``[size]`` is the start of the text).

        Each node knows the longest output token that is a prefix of its path. Nodes are dicts
        (``node[-1]`` is that token) except at depths 1 and 2, the ones every look-up reads:
        there they are lists indexed by the next byte (``[256]``: read past the end, ``[257]``:
        the token), as list indexing costs less than a dict's ``get``. A missing child is None,
        except below depth 1, where it is a childless list holding its parent's token, so that a
        look-up always reads two levels without a test. The root is a list too, whose ``[256]``
        (the end of the text) finds no token (-1).
        """
        root: dict = {-1: -1}
        shorter = [-1] * (self._size + 1)
        for token in sorted(outputs, key=lambda t: len(vocab[t])):  # shorter ones first
            node = root
            for byte in vocab[token]:
                parent, node = node, node.get(byte)
                if node is None:
                    node = parent[byte] = {-1: parent[-1]}
            node[-1], shorter[token] = token, parent[-1]

        def as_list(node: dict, child=lambda node: node, missing=None) -> list:
            row = [missing] * 257 + [node[-1]]
            for byte, below in node.items():
                if byte >= 0:
                    row[byte] = child(below)
            return row

        def depth_one(node: dict) -> list:  # a missing child reads as a leaf with its token
            return as_list(node, as_list, missing=[None] * 257 + [node[-1]])

        past_the_end = depth_one({-1: -1})
        return [depth_one(root[b]) for b in range(256)] + [past_the_end], shorter

    def _pair_ok(self, left: int, right: int, limit: int | None = None) -> bool:
        """Whether BPE on ``left``'s bytes then ``right``'s gives ``[left, right]`` (using merges
        ranked below ``limit`` only), both being reachable.

        Undo the merges in the reverse order BPE made them: the pieces on each side of the
        boundary are, over time, the chain of right parts of ``left`` and of left parts of
        ``right``. A merge across the boundary happens if some pair of pieces that sit there
        together is a merge ranked before either piece is merged away: strictly before on the
        left, and at the same rank on the right too (the left occurrence of a rank merges first).
        """
        rank, split, pair_rank = self._rank, self._split, self._pair_rank
        limit = self._no_merge if limit is None else limit
        while True:
            if pair_rank.get((left, right), limit) < limit:
                return False  # this pair merges across the boundary
            if rank[left] > rank[right]:  # `left` was made last: undo it
                limit = min(limit, rank[left])
                left = split[left][1]
            elif rank[right] >= 0:  # `right` was made last (or in the same pass, after)
                limit = min(limit, rank[right] + 1)
                right = split[right][0]
            else:
                return True  # two bytes, and no merge joined them in time

    def _first_fit(self, prev: int, token: int) -> int:
        """The first of ``token`` and its shorter prefixes that may follow ``prev`` (-1: none);
        anything may follow the start of the text (``prev`` = size). Read it as
        ``self._fits[prev][token]``, which works it out once."""
        if prev != self._size:
            while token >= 0 and not self._pair_ok(prev, token):
                token = self._shorter[token]
        return token

    def _remember(self, prev: int, token: int) -> int:
        """:meth:`_first_fit` of ``prev`` and ``token``, kept in ``self._fits[prev]``; all the
        answers are forgotten past ``_REMEMBER_AT_MOST`` (bounded memory, whatever the texts
        seen)."""
        self._remembered += 1
        if self._remembered > self._REMEMBER_AT_MOST:
            for fits in self._fits:
                fits.clear()
            self._remembered = 1
        fit = self._fits[prev][token] = self._first_fit(prev, token)
        return fit

    def _back_up(
        self, out: list[int], pos: int, candidate: int, failed: set[int], dead: list[bool]
    ) -> tuple[int, int]:
        """The depth-first search where the loop of :meth:`encode` is stuck: after ``out``'s
        last token, ending at ``pos``, try ``candidate`` and its shorter prefixes; where none
        leads anywhere, take that token back and try its own shorter prefixes, and so on,
        remembering each (position, token) that led nowhere. Returns the next ``(pos, token)``
        to try."""
        length, shorter, fits, stride = self._length, self._shorter, self._fits, self._size + 1
        prev = out[-1]
        while True:
            while candidate >= 0:
                token = fits[prev][candidate]
                if token < 0:
                    break
                end = pos + length[token]
                if not (dead[end] and end * stride + token in failed):
                    return pos, token
                candidate = shorter[token]
            if prev == self._size:
                raise RuntimeError("no encoding found: the backtracker's assumptions failed")
            failed.add(pos * stride + prev)
            dead[pos] = True
            out.pop()
            pos -= length[prev]
            candidate, prev = shorter[prev], out[-1]

    def encode(self, data: bytes) -> list[int]:
        """The BPE ids of ``data`` (one pre-token's bytes).

        The loop holds the token chosen last, ending at ``end``, and keeps it only once some
        token may follow it (a look-ahead of one token); when none may, a shorter prefix takes
        its place; deeper dead ends go to :meth:`_back_up`. ``out[-1]`` is the token before it.

        This loop runs once per token, so it is written to do little: each step reads three
        list items to find the longest token at ``end`` (the trie's lists at depths 1 and 2),
        and one answer of ``self._fits``. Positions are added to as little as possible: an int
        above 256 is a new object, so the bytes at ``end + 1`` and ``end + 2`` are read from
        copies of ``codes`` shifted by one and two.

        Args:
            data: the bytes.

        Returns:
            The ids, equal to the plain merge loop's.
        """
        length, shorter, fits, first = self._length, self._shorter, self._fits, self._first
        n, codes = len(data), [*data, 256, 256, 256]  # 256: past the end, no child
        next_codes, after_next_codes = codes[1:], codes[2:]  # [i]: codes[i + 1], codes[i + 2]
        out: list[int] = []  # out[0] will be the start of the text: anything may follow it
        dead = [False] * (n + 1)  # dead[i]: some (i, token) is in `failed`
        failed: set[int] = set()  # end * (size + 1) + token: led nowhere
        token, end = self._size, 0
        while True:
            row = first[codes[end]][next_codes[end]]  # the longest output token at `end`
            node = row[after_next_codes[end]]
            if node is None:
                candidate = row[257]
            else:  # a token of 3 bytes or more starts at `end`: walk the dicts
                i = end + 3
                child = node.get(codes[i])
                while child is not None:
                    node, i = child, i + 1
                    child = node.get(codes[i])
                candidate = node[-1]
            after = fits[token][candidate]  # -1 at the end of the text (no candidate there)
            if after >= 0:
                after_end = end + length[after]
                if not dead[after_end]:
                    out.append(token)
                    token, end = after, after_end
                    continue
            elif end == n:
                out.append(token)
                return out[1:]
            else:  # nothing may follow `token`: a shorter one in its place
                pos = end - length[token]
                shorter_token = fits[out[-1]][shorter[token]]
                if shorter_token >= 0 and not dead[pos + length[shorter_token]]:
                    token, end = shorter_token, pos + length[shorter_token]
                    continue
            out.append(token)
            pos, token = self._back_up(out, end, candidate, failed, dead)
            end = pos + length[token]


class _Fits(dict):
    """``fits[token]``: the first of ``token`` and its shorter prefixes that may follow the
    token ``prev`` (:meth:`Backtracker._first_fit`), worked out on the first look-up.

    Why a dict per token ``prev`` and not one dict keyed by the pair: :meth:`Backtracker.encode`
    reads ``fits[prev][token]`` once per token, two index operations, where a key made of the
    pair would cost arithmetic on large ints or a new tuple on every step.

    Args:
        backtracker: the :class:`Backtracker` that works the answers out.
        prev: the token before.
    """

    __slots__ = ("_backtracker", "_prev")

    def __init__(self, backtracker: Backtracker, prev: int) -> None:
        super().__init__()
        self._backtracker, self._prev = backtracker, prev

    def __missing__(self, token: int) -> int:
        return self._backtracker._remember(self._prev, token)


#: Backtrackers built lately, after copies of what each was built from: tokenizers of one
#: vocabulary (each ``Tokenizer.gpt2()``, a copy with chat tokens added) share one (GPT-2's:
#: ~0.5 s, ~42 MB).
_BUILT: list[tuple[dict, dict, list, Backtracker]] = []

#: The "auto" route merges long pre-tokens by the heap until they add up to this many bytes, then
#: builds the backtracker: its tables cost GPT-2 about what the heap spends on ~200k bytes.
BUILD_AFTER = 100_000


def _shared_backtracker(
    vocab: Mapping[int, bytes], ranks: Ranks, byte_ids: Sequence[int]
) -> Backtracker:
    """The backtracker of this vocabulary, built once (ValueError where the merges forbid it).

    Found by comparing the tables (a dict comparison runs in C: ~20 ms for GPT-2's) rather than
    by a key made of them, whose tuples of 50k items took 40-150 ms to make and hash.
    """
    for built_vocab, built_ranks, built_byte_ids, built in _BUILT:
        if built_byte_ids == list(byte_ids) and built_vocab == vocab and built_ranks == ranks:
            return built
    built = Backtracker(vocab, ranks, byte_ids)
    _BUILT[:] = [*_BUILT[-1:], (dict(vocab), dict(ranks), list(byte_ids), built)]  # the last 2
    return built


class LongChunkEncoder:
    """Encodes long pre-tokens of one vocabulary by the route asked for.

    Args:
        vocab: id -> bytes.
        ranks: (left id, right id) -> (rank, merged id, the pair).
        byte_ids: the id of each byte value 0-255.
        route: ``"heap"``; ``"backtrack"`` (ValueError where the merges forbid it); ``"auto"``:
            the heap until ``build_after`` bytes have come, then the backtracker where the
            merges allow it.
        build_after: see ``route``.

    ``backtracker`` is the :class:`Backtracker` in use, None while the heap is.
    """

    def __init__(
        self,
        vocab: Mapping[int, bytes],
        ranks: Ranks,
        byte_ids: Sequence[int],
        route: str,
        build_after: int = BUILD_AFTER,
    ) -> None:
        if route not in ("auto", "heap", "backtrack"):
            raise ValueError(f'route must be "auto", "heap" or "backtrack", got {route!r}')
        self._vocab, self._ranks, self._byte_ids = vocab, ranks, byte_ids
        self._n_merges = max((r for r, _, _ in ranks.values()), default=0) + 1
        self._seen: int | None = None if route == "heap" else 0  # None: never build
        self._build_after = build_after
        self.backtracker = None
        if route == "backtrack":
            self.backtracker = _shared_backtracker(vocab, ranks, byte_ids)

    def __call__(self, data: bytes) -> list[int]:
        """The ids of one pre-token's bytes."""
        if self.backtracker is None and self._seen is not None:
            self._seen += len(data)
            if self._seen >= self._build_after:
                try:
                    self.backtracker = _shared_backtracker(self._vocab, self._ranks, self._byte_ids)
                except ValueError:  # merges out of order or a token made twice
                    self._seen = None  # the heap copes with both
        if self.backtracker is not None:
            return self.backtracker.encode(data)
        ids = [self._byte_ids[b] for b in data]
        return merge_by_heap(ids, self._ranks, self._n_merges)
