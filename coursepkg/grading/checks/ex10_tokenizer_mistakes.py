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


class _ShorterSpecialWins(PlainBPE):
    def words(self, text: str, specials: list[str]) -> Counter:
        # Cut at the special tokens in the order given, so "<s>" wins over "<s></s>" when it
        # comes first: what follows it ("</s>") is trained on as text.
        cut = regex.compile("(" + "|".join(regex.escape(t) for t in specials) + ")")
        pieces = cut.split(text)[::2] if specials else [text]
        return Counter(_bytes_of(chunk) for piece in pieces for chunk in pretokenize(piece))


class _TiesByIds(PlainBPE):
    """A tie goes to the greater pair of token ids (a merged token's id is 256 + its rank),
    not to the greater pair of byte strings."""

    def __init__(self) -> None:
        self.learned: list[bytes] = []

    def _id(self, token: bytes) -> int:
        return token[0] if len(token) == 1 else 256 + self.learned.index(token)

    def best(self, pairs: Counter) -> tuple[bytes, bytes]:
        pair = max(pairs, key=lambda p: (pairs[p], self._id(p[0]), self._id(p[1])))
        self.learned.append(pair[0] + pair[1])
        return pair


def _shorter_special_wins(text, vocab_size, special_tokens=None):
    return _ShorterSpecialWins().train(text, vocab_size, special_tokens)


def _ties_by_ids(text, vocab_size, special_tokens=None):
    return _TiesByIds().train(text, vocab_size, special_tokens)


def _specials_not_counted(text, vocab_size, special_tokens=None):
    # The merges fill vocab_size - 256 places and the special tokens come on top of them.
    specials = list(special_tokens or [])
    return PlainBPE().train(text, vocab_size + len(specials), specials)


def _specials_before_merges(text, vocab_size, special_tokens=None):
    # The right merges, but the special tokens take ids 256, 257, ... before the merged tokens.
    vocab, merges = PlainBPE().train(text, vocab_size, special_tokens)
    order = [vocab[i] for i in range(256)] + [t.encode("utf-8") for t in special_tokens or []]
    return dict(enumerate(order + [left + right for left, right in merges])), merges


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
    BugVariant(
        id="bpe.special_shorter_wins",
        item=BPE_ITEM,
        description='where two special tokens overlap ("<s>" and "<s></s>"), the shorter '
        "one wins when it is listed first, so the rest of the longer one is trained on as text",
        advice="Sort the special tokens longest first before joining them into the pattern "
        "(sorted(special_tokens, key=len, reverse=True)): the longer one must win.",
        impl=_shorter_special_wins,
    ),
    BugVariant(
        id="bpe.ties_by_ids",
        item=BPE_ITEM,
        description="ties between equally frequent pairs go to the greater pair of token ids "
        "(a merged token's id is its rank plus 256), not to the greater pair of byte strings",
        advice="Break ties on the tokens' bytes: max over (count, (vocab[a], vocab[b])), "
        "never over the ids themselves.",
        impl=_ties_by_ids,
    ),
    BugVariant(
        id="bpe.specials_not_counted",
        item=BPE_ITEM,
        description="the special tokens are not counted in vocab_size: vocab_size - 256 merges "
        "are learned and the special tokens come on top, so the vocabulary is too large",
        advice="Learn vocab_size - 256 - len(special_tokens) merges at most: the bytes, the "
        "merges and the special tokens together make vocab_size.",
        impl=_specials_not_counted,
    ),
    BugVariant(
        id="bpe.specials_before_merges",
        item=BPE_ITEM,
        description="the special tokens take the ids right after the 256 bytes, before the "
        "merged tokens",
        advice="Give the merged tokens ids 256, 257, ... in the order learned, then the "
        "special tokens the ids after the last merge.",
        impl=_specials_before_merges,
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


class _ShorterSpecialWinsTokenizer(Tokenizer):
    """Cuts the text at the special tokens in the order given, so "<s>" wins over "<s></s>"
    when it comes first."""

    def __init__(self, vocab, merges, special_tokens=None):
        super().__init__(vocab, merges, special_tokens)
        if self.special_tokens:
            alternatives = "|".join(regex.escape(t) for t in self.special_tokens)
            self._splitter = regex.compile(f"({alternatives})")


class _DecodeDropsBadBytes(Tokenizer):
    """Decodes the joined bytes with errors="ignore": a cut character vanishes."""

    def decode(self, ids):
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="ignore")


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
    BugVariant(
        id="tokenizer.special_shorter_wins",
        item=TOKENIZER_ITEM,
        description='where two special tokens overlap ("<s>" and "<s></s>"), encode lets '
        "the shorter one win when it is listed first, and encodes the rest of the longer one "
        "as text",
        advice="Build the special-token pattern from the tokens sorted longest first "
        "(sorted(special_tokens, key=len, reverse=True)), so the longer one wins.",
        impl=_ShorterSpecialWinsTokenizer,
    ),
    BugVariant(
        id="tokenizer.decode_drops_bad_bytes",
        item=TOKENIZER_ITEM,
        description='decode drops the bytes that are not valid UTF-8 (errors="ignore"), so a '
        "character cut in the middle vanishes instead of becoming U+FFFD",
        advice='Decode with errors="replace": a cut character becomes "\\ufffd", as the '
        "exercise asks.",
        impl=_DecodeDropsBadBytes,
    ),
]

#: The whole catalogue, as every assignment's mistakes module has it.
BUGS: list[BugVariant] = [*BPE_BUGS, *TOKENIZER_BUGS]
