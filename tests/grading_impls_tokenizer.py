"""Independent implementations of the ex10 items (byte-level BPE), written in styles other than
the reference's, used by the grading tests: correct ones must pass, planted mistakes must be named
by evidence whatever the style."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import regex

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PAT = regex.compile(GPT2_PATTERN)


def _pieces(text: str, specials: list[str]) -> list[str]:
    if not specials:
        return [text]
    alternation = "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))
    return re.split(alternation, text)


# ---------------------------------------------------------------------------------------------
# Training, style 1: ints, recount every merge (the "careful naive" student)
# ---------------------------------------------------------------------------------------------


def train_recount(text, vocab_size, special_tokens=None, *, skip_pretokens=False):
    specials = list(special_tokens or [])
    words: Counter = Counter()
    for piece in _pieces(text, specials):
        chunks = [piece] if skip_pretokens else PAT.findall(piece)
        for chunk in chunks:
            if chunk:
                words[tuple(chunk.encode("utf-8"))] += 1
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    while len(vocab) + len(specials) < vocab_size:
        stats: Counter = Counter()
        for word, n in words.items():
            for a, b in zip(word, word[1:], strict=False):
                stats[a, b] += n
        if not stats:
            break
        a, b = max(stats, key=lambda p: (stats[p], vocab[p[0]], vocab[p[1]]))
        new = len(vocab)
        vocab[new] = vocab[a] + vocab[b]
        merges.append((vocab[a], vocab[b]))
        updated: Counter = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i : i + 2] == (a, b):
                    out.append(new)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            updated[tuple(out)] += n
        words = updated
    for s in specials:
        vocab[len(vocab)] = s.encode("utf-8")
    return vocab, merges


def train_across_pretokens(text, vocab_size, special_tokens=None):
    return train_recount(text, vocab_size, special_tokens, skip_pretokens=True)


# ---------------------------------------------------------------------------------------------
# Training, style 2: incremental counts in dicts, max() without a heap
# ---------------------------------------------------------------------------------------------


def train_incremental(text, vocab_size, special_tokens=None, *, smaller_ties=False):
    specials = list(special_tokens or [])
    freq: Counter = Counter()
    for piece in _pieces(text, specials):
        freq.update(PAT.findall(piece))
    words = [[bytes([b]) for b in w.encode("utf-8")] for w in freq]
    counts = list(freq.values())
    pairs: defaultdict = defaultdict(int)
    where: defaultdict = defaultdict(set)
    for k, w in enumerate(words):
        for p in zip(w, w[1:], strict=False):
            pairs[p] += counts[k]
            where[p].add(k)
    merges = []
    while 256 + len(merges) + len(specials) < vocab_size and pairs:
        if smaller_ties:
            best = min(pairs, key=lambda p: (-pairs[p], p))
        else:
            best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        for k in list(where[best]):
            w, n = words[k], counts[k]
            for p in zip(w, w[1:], strict=False):
                pairs[p] -= n
            i, out = 0, []
            while i < len(w):
                if i + 1 < len(w) and w[i] == best[0] and w[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[k] = out
            for p in zip(out, out[1:], strict=False):
                pairs[p] += n
                where[p].add(k)
        for p in [p for p, n in pairs.items() if n <= 0]:
            del pairs[p]
    vocab = {i: bytes([i]) for i in range(256)}
    for a, b in merges:
        vocab[len(vocab)] = a + b
    for s in specials:
        vocab[len(vocab)] = s.encode("utf-8")
    return vocab, merges


def train_smaller_ties(text, vocab_size, special_tokens=None):
    return train_incremental(text, vocab_size, special_tokens, smaller_ties=True)


def train_first_seen_ties(text, vocab_size, special_tokens=None):
    """minbpe's habit: max() over counts only, so a tie goes to the pair seen first."""
    specials = list(special_tokens or [])
    chunks = [list(c.encode("utf-8")) for p in _pieces(text, specials) for c in PAT.findall(p)]
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    while len(vocab) + len(specials) < vocab_size:
        stats: dict = {}
        for ids in chunks:
            for pair in zip(ids, ids[1:], strict=False):
                stats[pair] = stats.get(pair, 0) + 1
        if not stats:
            break
        pair = max(stats, key=stats.get)
        new = len(vocab)
        vocab[new] = vocab[pair[0]] + vocab[pair[1]]
        merges.append((vocab[pair[0]], vocab[pair[1]]))
        chunks = [_merge(ids, pair, new) for ids in chunks]
    for s in specials:
        vocab[len(vocab)] = s.encode("utf-8")
    return vocab, merges


def _merge(ids, pair, new):
    out, i = [], 0
    while i < len(ids):
        if i < len(ids) - 1 and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


# ---------------------------------------------------------------------------------------------
# Tokenizer, style 1: GPT-2's encoder.py (bpe() on a tuple of byte strings, ranks of pairs)
# ---------------------------------------------------------------------------------------------


class GPT2StyleTokenizer:
    def __init__(self, vocab, merges, special_tokens=None, per_token_decode=False):
        self.decoder = dict(vocab)
        self.encoder = {v: k for k, v in vocab.items()}
        self.bpe_ranks = {pair: i for i, pair in enumerate(merges)}
        self.special = sorted(special_tokens or [], key=len, reverse=True)
        self.per_token_decode = per_token_decode
        self.cache = {}

    def bpe(self, token: bytes) -> tuple:
        if token in self.cache:
            return self.cache[token]
        word = tuple(bytes([b]) for b in token)
        while len(word) > 1:
            pairs = set(zip(word, word[1:], strict=False))
            bigram = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
        self.cache[token] = word
        return word

    def encode(self, text):
        ids = []
        if self.special:
            alternation = "(" + "|".join(re.escape(s) for s in self.special) + ")"
            parts = re.split(alternation, text)
        else:
            parts = [text]
        for k, part in enumerate(parts):
            if k % 2:
                ids.append(self.encoder[part.encode("utf-8")])
                continue
            for token in regex.findall(PAT, part):
                ids.extend(self.encoder[b] for b in self.bpe(token.encode("utf-8")))
        return ids

    def decode(self, ids):
        if self.per_token_decode:
            return "".join(self.decoder[i].decode("utf-8", "replace") for i in ids)
        return b"".join(self.decoder[i] for i in ids).decode("utf-8", errors="replace")


class GPT2StylePerTokenDecode(GPT2StyleTokenizer):
    def __init__(self, vocab, merges, special_tokens=None):
        super().__init__(vocab, merges, special_tokens, per_token_decode=True)


# ---------------------------------------------------------------------------------------------
# Tokenizer, style 2: apply every merge in rank order, one after the other (slow, plain)
# ---------------------------------------------------------------------------------------------


class SequentialMergesTokenizer:
    pattern = PAT

    def __init__(self, vocab, merges, special_tokens=None):
        self.vocab = vocab
        self.ids = {v: k for k, v in vocab.items()}
        self.merges = list(merges)
        self.specials = list(special_tokens or [])

    def _word(self, chunk: str) -> list[int]:
        word = [bytes([b]) for b in chunk.encode("utf-8")]
        for a, b in self.merges:
            if len(word) < 2:
                break
            if a not in word:
                continue
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            word = out
        return [self.ids[t] for t in word]

    def encode(self, text):
        out = []
        rest = text
        while rest:
            hits = [(rest.find(s), -len(s), s) for s in self.specials if s in rest]
            if not hits:
                chunk, special, rest = rest, None, ""
            else:
                at, _, special = min(hits)
                chunk, rest = rest[:at], rest[at + len(special) :]
            for piece in self.pattern.findall(chunk):
                out.extend(self._word(piece))
            if special is not None:
                out.append(self.ids[special.encode("utf-8")])
        return out

    def decode(self, ids):
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", "replace")


class SequentialLostWhitespace(SequentialMergesTokenizer):
    pattern = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+""")


class SequentialNoSpecials(SequentialMergesTokenizer):
    def __init__(self, vocab, merges, special_tokens=None):
        super().__init__(vocab, merges, None)
