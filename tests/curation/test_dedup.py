"""Exact line deduplication and MinHash with LSH banding, on generated held-out inputs; the
signatures equal datasketch's, the estimates lie within binomial error of the true Jaccard."""

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg.curation.dedup import (
    MinHasher,
    band_keys,
    exact_line_dedup,
    hash32,
    jaccard,
    near_duplicate_clusters,
    normalise_line,
    shingles,
)

_line = st.text(alphabet="abcdefgh ", min_size=1, max_size=20).filter(str.strip)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(_line, min_size=1, max_size=6), min_size=1, max_size=6))
def test_exact_dedup_keeps_exactly_the_lines_seen_once(docs):
    texts = ["\n".join(lines) for lines in docs]
    kept, removed = exact_line_dedup(texts)
    counts = {}
    for lines in docs:
        for line in lines:
            counts[normalise_line(line)] = counts.get(normalise_line(line), 0) + 1
    for lines, out in zip(docs, kept, strict=True):
        expected = [line for line in lines if counts[normalise_line(line)] == 1]
        assert out.splitlines() == expected  # order kept, only repeats removed
    assert removed == sum(c for c in counts.values() if c > 1)
    assert exact_line_dedup(kept)[1] == 0  # idempotent: nothing repeats any more


def test_a_line_with_trailing_whitespace_is_the_same_line():
    kept, removed = exact_line_dedup(["Accept cookies\nfirst story", "Accept cookies  \t\nsecond"])
    assert (kept, removed) == (["first story", "second"], 2)


@settings(max_examples=25, deadline=None)
@given(st.sets(st.text(alphabet="abcdefghij", min_size=1, max_size=6), min_size=1, max_size=60))
def test_signatures_equal_datasketch(items):
    datasketch = pytest.importorskip("datasketch")
    hasher = MinHasher(num_perm=64, seed=3)
    theirs = datasketch.MinHash(
        num_perm=64, hashfunc=hash32, permutations=(hasher.a, hasher.b), scheme="legacy"
    )
    theirs.update_batch(list(items))
    np.testing.assert_array_equal(hasher.signature(items), theirs.hashvalues)


@pytest.mark.parametrize("seed", range(8))
def test_estimates_lie_within_binomial_error_of_the_true_jaccard(seed):
    rng = random.Random(seed)
    shared = {f"s{rng.random()}" for _ in range(rng.randrange(0, 300))}
    a = shared | {f"a{rng.random()}" for _ in range(rng.randrange(1, 300))}
    b = shared | {f"b{rng.random()}" for _ in range(rng.randrange(1, 300))}
    true, k = jaccard(a, b), 256
    hasher = MinHasher(num_perm=k, seed=seed + 100)
    estimate = MinHasher.estimate_jaccard(hasher.signature(a), hasher.signature(b))
    # the number of agreeing positions is Binomial(K, J): 4.5 standard deviations, plus one
    # position's worth for the hash family not being exactly min-wise independent
    assert abs(estimate - true) <= 4.5 * math.sqrt(true * (1 - true) / k) + 1 / k


def test_identical_sets_agree_everywhere_and_disjoint_almost_nowhere():
    hasher = MinHasher(num_perm=128)
    a, b = {f"x{i}" for i in range(200)}, {f"y{i}" for i in range(200)}
    assert MinHasher.estimate_jaccard(hasher.signature(a), hasher.signature(set(a))) == 1.0
    assert MinHasher.estimate_jaccard(hasher.signature(a), hasher.signature(b)) <= 0.05


@pytest.mark.parametrize("bands", [1, 2, 4, 8, 16, 32])
def test_bands_partition_the_signature(bands):
    signature = MinHasher(num_perm=32).signature({"a b c"})
    keys = band_keys(signature, bands)
    assert [index for index, _ in keys] == list(range(bands))
    assert b"".join(key for _, key in keys) == signature.tobytes()


@pytest.mark.parametrize("bands", [0, 3, 5, 33])
def test_bands_that_do_not_divide_the_signature_are_refused(bands):
    with pytest.raises(ValueError, match="bands must divide"):
        band_keys(np.zeros(32, dtype=np.uint64), bands)


def _article(seed: int, n: int = 120) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice("abcdefghijklmnopqrstuvwxyz") * rng.randint(2, 6) for _ in range(n))


def test_near_duplicates_are_grouped_and_distinct_documents_are_not():
    base = _article(0)
    words = base.split()
    edited = " ".join(words[:60] + ["changed"] + words[61:])  # one word of 120 changed
    docs = [base, _article(1), edited, _article(2), base.upper() + "!"]
    assert near_duplicate_clusters(docs) == [[0, 2, 4]]


def test_shingles_ignore_case_accents_and_punctuation():
    assert (
        shingles("Café, au LAIT!", n=2)
        == shingles("cafe au lait", n=2)
        == {
            "cafe au",
            "au lait",
        }
    )
    assert shingles("", n=3) == set() and shingles("two words", n=5) == {"two words"}


def test_short_lines_are_spared_by_min_chars():
    docs = ["ROMEO:\nBut soft, what light through yonder window breaks", "ROMEO:\nIt is the east"]
    assert exact_line_dedup(docs, min_chars=10) == (docs, 0)
    assert exact_line_dedup(docs)[1] == 2
