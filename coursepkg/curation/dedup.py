"""Deduplication: exact repeated lines, and near-duplicate documents by MinHash with LSH banding.

Exact lines (the boilerplate of a site: menus, cookie notices, footers) are found by hashing each
line *after normalising it*, so that trailing spaces or another Unicode form of the same text do
not make it new. Near-duplicate documents (the same article with another date or signature) are
found by MinHash (Broder, 1997): ``K`` hash functions, each keeping the smallest value over the
document's word n-grams; two documents agree at one position with probability equal to the
Jaccard similarity of their n-gram sets. Locality-sensitive hashing splits the signature into
``b`` bands of ``r`` rows (``b * r == K``); documents that agree on a whole band become
candidates, and the candidates whose true Jaccard similarity reaches the threshold are merged.
"""

from __future__ import annotations

import hashlib
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "MERSENNE_PRIME",
    "MinHasher",
    "band_keys",
    "exact_line_dedup",
    "hash32",
    "jaccard",
    "near_duplicate_clusters",
    "normalise_line",
    "shingles",
]

#: The modulus of the hash family h(x) = (a x + b) mod p, a Mersenne prime (2^61 - 1).
MERSENNE_PRIME = (1 << 61) - 1
_MAX_HASH = (1 << 32) - 1


def normalise_line(line: str) -> str:
    """The form of a line that is hashed: Unicode NFKC, inner spaces collapsed, ends stripped."""
    return " ".join(unicodedata.normalize("NFKC", line).split())


def _line_key(line: str) -> bytes:
    """A 16-byte digest of a normalised line (a dictionary of digests costs less than of lines)."""
    return hashlib.blake2b(normalise_line(line).encode("utf-8"), digest_size=16).digest()


def exact_line_dedup(documents: Sequence[str], *, min_chars: int = 0) -> tuple[list[str], int]:
    """Remove every copy of each line that occurs more than once in the whole corpus.

    A line's identity is its normalised form (:func:`normalise_line`); empty lines are kept.
    Every copy goes, so a site's boilerplate leaves no trace (a page crawled twice is the
    near-duplicate step's work, before this one). ``min_chars`` spares short lines, which repeat
    in good text too (a play's speaker names, "Yes.").

    Args:
        documents: the corpus.
        min_chars: only lines of at least this many characters (normalised) are removed.

    Returns:
        The documents without their repeated lines, and the number of lines removed.
    """
    counts = Counter(
        _line_key(line) for doc in documents for line in doc.splitlines() if line.strip()
    )
    kept, removed = [], 0
    for doc in documents:
        lines = []
        for line in doc.splitlines():
            repeated = line.strip() and counts[_line_key(line)] > 1
            if repeated and len(normalise_line(line)) >= min_chars:
                removed += 1
            else:
                lines.append(line)
        kept.append("\n".join(lines))
    return kept, removed


def shingles(text: str, n: int = 5) -> set[str]:
    """The set of word n-grams of ``text`` after normalising it (lower case, no accents, no
    punctuation, single spaces); a text of fewer than ``n`` words is one shingle."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    text = unicodedata.normalize("NFD", text.casefold())
    text = "".join(char for char in text if not unicodedata.combining(char))
    words = re.sub(r"[^\w\s]", " ", text).split()
    if len(words) <= n:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def hash32(shingle: str) -> int:
    """A shingle's 32-bit hash: the first 4 bytes of its SHA-1, little-endian (datasketch's too)."""
    return int.from_bytes(hashlib.sha1(shingle.encode("utf-8")).digest()[:4], "little")


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b|, and 1.0 for two empty sets."""
    union = len(a | b)
    return len(a & b) / union if union else 1.0


class MinHasher:
    """``num_perm`` hash functions h_i(x) = ((a_i x + b_i) mod p) mod 2^32, drawn once from a seed.

    ``a_i`` and ``b_i`` are below 2^32, so ``a_i x + b_i`` (x a 32-bit hash) fits in 64 bits and
    NumPy computes it exactly.

    Args:
        num_perm: K, the length of a signature.
        seed: the seed the coefficients are drawn from.
    """

    def __init__(self, num_perm: int = 128, seed: int = 1) -> None:
        if num_perm < 1:
            raise ValueError(f"num_perm must be at least 1, got {num_perm}")
        rng = random.Random(seed)
        self.num_perm = num_perm
        self.a = np.array([rng.randrange(1, _MAX_HASH) for _ in range(num_perm)], dtype=np.uint64)
        self.b = np.array([rng.randrange(0, _MAX_HASH) for _ in range(num_perm)], dtype=np.uint64)

    def signature(self, items: Iterable[str]) -> np.ndarray:
        """The MinHash signature of a set of shingles.

        Args:
            items: the shingles (strings).

        Shape:
            returns (K,), uint64 values below 2^32; an empty set gives 2^32 - 1 everywhere.

        Returns:
            For each hash function, its smallest value over the items.
        """
        hashes = np.array([hash32(item) for item in items], dtype=np.uint64)  # (N,)
        if hashes.size == 0:
            return np.full(self.num_perm, _MAX_HASH, dtype=np.uint64)
        values = (np.outer(hashes, self.a) + self.b) % MERSENNE_PRIME  # (N, K)
        return (values & _MAX_HASH).min(axis=0)  # (K,)

    @staticmethod
    def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
        """The fraction of positions where two signatures agree: an unbiased estimate of the
        Jaccard similarity, with variance J (1 - J) / K."""
        if sig_a.shape != sig_b.shape:
            raise ValueError(f"signatures differ in shape: {sig_a.shape} and {sig_b.shape}")
        return float(np.mean(sig_a == sig_b))


def band_keys(signature: np.ndarray, bands: int) -> list[tuple[int, bytes]]:
    """Split a signature into ``bands`` bands of equal length and key each by (band, its values).

    Args:
        signature: a MinHash signature of length K.
        bands: b, which must divide K so that the bands partition the signature.

    Shape:
        signature: (K,).

    Returns:
        ``b`` keys; two documents are candidates when they share one.
    """
    k = len(signature)
    if bands < 1 or k % bands:
        raise ValueError(f"bands must divide the signature's length {k}, got {bands}")
    rows = k // bands
    return [(i, signature[i * rows : (i + 1) * rows].tobytes()) for i in range(bands)]


def near_duplicate_clusters(
    documents: Sequence[str],
    *,
    num_perm: int = 128,
    bands: int = 16,
    threshold: float = 0.8,
    ngram: int = 5,
    seed: int = 1,
) -> list[list[int]]:
    """Group near-duplicate documents: LSH candidates whose true n-gram Jaccard >= ``threshold``.

    Args:
        documents: the corpus.
        num_perm: K, the signature length.
        bands: b, the number of bands (it must divide K; r = K / b rows each). A pair of
            similarity s becomes a candidate with probability 1 - (1 - s^r)^b.
        threshold: the Jaccard similarity from which two documents are duplicates.
        ngram: the shingles' length in words.
        seed: the hash functions' seed.

    Returns:
        The clusters of two documents or more, each a sorted list of indices, sorted by first index.
    """
    hasher = MinHasher(num_perm, seed)
    sets = [shingles(doc, ngram) for doc in documents]
    buckets: dict[tuple[int, bytes], list[int]] = {}
    for index, items in enumerate(sets):
        if items:
            for key in band_keys(hasher.signature(items), bands):
                buckets.setdefault(key, []).append(index)
    parent = list(range(len(documents)))  # union-find over the verified pairs

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    checked = set()
    for members in buckets.values():
        for i in members:
            for j in members:
                # a pair already in one group needs no comparison (a page crawled 1,000 times
                # costs 999 comparisons, not half a million)
                if i < j and root(i) != root(j) and (i, j) not in checked:
                    checked.add((i, j))
                    if jaccard(sets[i], sets[j]) >= threshold:
                        parent[root(j)] = root(i)
    clusters: dict[int, list[int]] = {}
    for i in range(len(documents)):
        clusters.setdefault(root(i), []).append(i)
    return sorted((c for c in clusters.values() if len(c) > 1), key=lambda c: c[0])
