"""The catalogue of ex10_tokenizer: the known mistakes of BPE training and of encoding and
decoding, each a runnable variant with the advice a student gets when their output matches it.

The training mistakes are subclasses of a deliberately plain trainer, :class:`PlainBPE`
(recount every pair after every merge), each overriding the one step it gets wrong; PlainBPE
itself learns the reference's merges, which the tests check. The encoding and decoding mistakes
are subclasses of the reference :class:`~coursepkg.tokenizer.Tokenizer` that change one step.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import regex

from ...tokenizer import GPT2_PATTERN, Tokenizer, merge_pair, pretokenize, split_special
from ..framework import BugVariant

__all__ = ["BPE_BUGS", "BPE_ITEM", "BUGS", "TOKENIZER_BUGS", "TOKENIZER_ITEM"]

BPE_ITEM = "train_bpe"
TOKENIZER_ITEM = "Tokenizer"

Word = tuple[bytes, ...]


def _bytes_of(chunk: str) -> Word:
    """A word as one-byte tokens: the UTF-8 bytes of ``chunk``."""
    return tuple(bytes([b]) for b in chunk.encode("utf-8"))


def _pair_counts(words: Counter) -> Counter:
    pairs: Counter[tuple[bytes, bytes]] = Counter()
    for word, n in words.items():
        for pair in pairwise(word):
            pairs[pair] += n
    return pairs


def _apply(words: Counter, pair: tuple[bytes, bytes]) -> Counter:
    merged: Counter[Word] = Counter()
    for word, n in words.items():
        merged[tuple(merge_pair(list(word), pair, pair[0] + pair[1]))] += n
    return merged


class PlainBPE:
    """BPE training by recounting all pairs after each merge, in three steps (the words, the
    pair counts before a merge, the pair merged) that each wrong trainer below gets wrong one
    of. Its result is the reference's."""

    def words(self, text: str, specials: list[str]) -> Counter:
        """How often each word occurs: the text cut at the special tokens, then pre-tokenised."""
        counts: Counter[Word] = Counter()
        for piece in split_special(text, specials)[::2]:
            for chunk in pretokenize(piece):
                counts[_bytes_of(chunk)] += 1
        return counts

    def counts(self, words: Counter, pairs: Counter) -> Counter:
        """The pair counts before the next merge: recounted over the merged words."""
        return _pair_counts(words)

    def best(self, pairs: Counter) -> tuple[bytes, bytes]:
        """The most frequent pair; a tie goes to the greatest pair (GPT-2's rule)."""
        return max(pairs, key=lambda p: (pairs[p], p))

    def train(
        self, text: str, vocab_size: int, special_tokens: list[str] | None = None
    ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
        """The vocabulary (id -> bytes) and the merges, in order, as ``train_bpe`` returns."""
        specials = list(special_tokens or [])
        words = self.words(text, specials)
        merges: list[tuple[bytes, bytes]] = []
        pairs = _pair_counts(words)
        while 256 + len(merges) + len(specials) < vocab_size:
            pairs = Counter({p: n for p, n in self.counts(words, pairs).items() if n > 0})
            if not pairs:
                break
            best = self.best(pairs)
            merges.append(best)
            words = _apply(words, best)
            pairs.pop(best)  # nothing else changes here: counts() recounts (or, wrongly, not)
        vocab = {i: bytes([i]) for i in range(256)}
        for left, right in merges:
            vocab[len(vocab)] = left + right
        for token in specials:
            vocab[len(vocab)] = token.encode("utf-8")
        return vocab, merges


def plain_train_bpe(
    text: str, vocab_size: int, special_tokens: list[str] | None = None
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """:class:`PlainBPE`'s training, with ``train_bpe``'s signature."""
    return PlainBPE().train(text, vocab_size, special_tokens)


class _AcrossPretokens(PlainBPE):
    def words(self, text: str, specials: list[str]) -> Counter:
        # Cut at the special tokens but never pre-tokenised: a merge may join two words.
        return Counter(_bytes_of(piece) for piece in split_special(text, specials)[::2] if piece)


class _SpecialsTrainedOn(PlainBPE):
    def words(self, text: str, specials: list[str]) -> Counter:
        # Pre-tokenised without cutting the special tokens out: their bytes are trained on.
        return Counter(_bytes_of(chunk) for chunk in pretokenize(text))


class _TiesReversed(PlainBPE):
    def best(self, pairs: Counter) -> tuple[bytes, bytes]:
        # A tie goes to the smallest pair.
        return min(pairs, key=lambda p: (-pairs[p], p))


class _StaleCounts(PlainBPE):
    def counts(self, words: Counter, pairs: Counter) -> Counter:
        # Counted once before the first merge and never updated: only the merged pair is dropped.
        return pairs


def _across_pretokens(text, vocab_size, special_tokens=None):
    return _AcrossPretokens().train(text, vocab_size, special_tokens)


def _specials_trained_on(text, vocab_size, special_tokens=None):
    return _SpecialsTrainedOn().train(text, vocab_size, special_tokens)


def _ties_reversed(text, vocab_size, special_tokens=None):
    return _TiesReversed().train(text, vocab_size, special_tokens)


def _stale_counts(text, vocab_size, special_tokens=None):
    return _StaleCounts().train(text, vocab_size, special_tokens)


BPE_BUGS: list[BugVariant] = [
    BugVariant(
        id="bpe.merges_across_pretokens",
        item=BPE_ITEM,
        description="merges cross pre-token boundaries: pairs are counted over the whole text, "
        "not inside the pre-tokens of GPT-2's pattern",
        advice="Split each piece with regex.findall(GPT2_PATTERN, piece), count the pre-tokens, "
        "and count pairs inside each pre-token only (times its frequency).",
        impl=_across_pretokens,
    ),
    BugVariant(
        id="bpe.special_tokens_merged",
        item=BPE_ITEM,
        description="the special tokens are trained on as ordinary text, so their pieces get "
        "merged with the text around them",
        advice="Cut the text at the special tokens first (e.g. regex.split on their escaped "
        "alternation, longest first) and train on the pieces between them only.",
        impl=_specials_trained_on,
    ),
    BugVariant(
        id="bpe.ties_reversed",
        item=BPE_ITEM,
        description="ties between equally frequent pairs go to the lexicographically smaller pair",
        advice="Of equally frequent pairs take the greater one: max over (count, (left, right)) "
        "with left and right the pairs' byte strings.",
        impl=_ties_reversed,
    ),
    BugVariant(
        id="bpe.stale_pair_counts",
        item=BPE_ITEM,
        description="the pair counts are not updated after a merge: later merges are chosen "
        "from the counts of the original bytes (stale pairs), and pairs with a new token are "
        "never counted",
        advice="After each merge, update the counts: the pairs around each replaced occurrence "
        "lose it, the new pairs with the merged token gain it (or recount the words).",
        impl=_stale_counts,
    ),
]


class _FrequencyOrder(Tokenizer):
    """Encodes each pre-token by merging its most frequent learned pair first."""

    def _encode_pretoken(self, pretoken: str) -> list[int]:
        ids = [self._byte_ids[b] for b in pretoken.encode("utf-8")]
        while len(ids) > 1:
            counts = Counter(p for p in pairwise(ids) if p in self._ranks)
            if not counts:
                break
            pair = max(counts, key=lambda p: (counts[p], -self._ranks[p][0]))
            ids = merge_pair(ids, pair, self._ranks[pair][1])
        return ids


class _SpecialsSplit(Tokenizer):
    """Encodes the special tokens as ordinary text."""

    def __init__(self, vocab, merges, special_tokens=None):
        super().__init__(vocab, merges, None)
        self.special_tokens = list(special_tokens or [])


_NO_WHITESPACE = regex.compile(GPT2_PATTERN.removesuffix(r"|\s+(?!\S)|\s+"))


class _LostWhitespace(Tokenizer):
    """Pre-tokenises with GPT-2's pattern less its whitespace branches: runs of spaces,
    tabs and newlines that no word takes are dropped."""

    def _encode_ordinary(self, text: str, out: list[int]) -> None:
        for pretoken in _NO_WHITESPACE.findall(text):
            out.extend(self._encode_pretoken(pretoken))


class _DecodePerToken(Tokenizer):
    """Decodes each token's bytes on its own and joins the strings."""

    def decode(self, ids):
        return "".join(self.vocab[i].decode("utf-8", errors="replace") for i in ids)


TOKENIZER_BUGS: list[BugVariant] = [
    BugVariant(
        id="tokenizer.frequency_order",
        item=TOKENIZER_ITEM,
        description="encode applies the merges in order of how often their pair occurs in the "
        "pre-token, not in rank order (the order they were learned)",
        advice="Within a pre-token, repeatedly merge the adjacent pair whose merge has the "
        "lowest rank (learned first), whatever the counts in the text being encoded.",
        impl=_FrequencyOrder,
    ),
    BugVariant(
        id="tokenizer.special_tokens_split",
        item=TOKENIZER_ITEM,
        description="encode treats the special tokens as ordinary text and splits them into "
        "several tokens",
        advice="Cut the text at the special tokens before pre-tokenising (the longer first "
        "where they overlap) and emit each special token's own id.",
        impl=_SpecialsSplit,
    ),
    BugVariant(
        id="tokenizer.lost_whitespace",
        item=TOKENIZER_ITEM,
        description="encode loses whitespace: runs of spaces, tabs or newlines that no word "
        "takes are dropped",
        advice="Use GPT2_PATTERN whole: its last branches (\\s+(?!\\S)|\\s+) keep every run of "
        "whitespace as a pre-token, so the pre-tokens join back to the text.",
        impl=_LostWhitespace,
    ),
    BugVariant(
        id="tokenizer.decode_per_token",
        item=TOKENIZER_ITEM,
        description="decode turns each token into a string on its own, which breaks characters "
        "whose UTF-8 bytes span two tokens",
        advice="Join all the tokens' bytes first, then decode once: "
        'b"".join(...).decode("utf-8", errors="replace").',
        impl=_DecodePerToken,
    ),
]

#: The whole catalogue, as every assignment's mistakes module has it.
BUGS: list[BugVariant] = [*BPE_BUGS, *TOKENIZER_BUGS]
