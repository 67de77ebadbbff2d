"""Tests of coursepkg.tokenizer_long: long pre-tokens give the plain merge loop's ids by either
route (the backtracker, the heap), on GPT-2's vocabulary (against Hugging Face ``tokenizers`` and
``tiktoken`` too), on trained vocabularies and on random merges where the backtracker's
assumptions may fail."""

from __future__ import annotations

import copy
import gc
import pickle
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from coursepkg.data import load_tinyshakespeare
from coursepkg.tokenizer import Tokenizer, merge_pair, train_bpe
from coursepkg.tokenizer_long import BUILD_AFTER, Backtracker, LongChunkEncoder, merge_by_heap

pytest.importorskip("tokenizers")
pytest.importorskip("tiktoken")

EOT = "<|endoftext|>"
FIXTURES = [HealthCheck.function_scoped_fixture]
LETTERS = st.text(alphabet=st.sampled_from("abcdefghij"), min_size=1, max_size=300)
FEW_LETTERS = st.text(alphabet=st.sampled_from("ab"), min_size=1, max_size=300)


def plain_merges(ids: list[int], ranks) -> list[int]:
    """The plain loop on any ids: merge the lowest-ranked pair everywhere, until none is left."""
    while best := min((ranks[p] for p in pairwise(ids) if p in ranks), default=None):
        ids = merge_pair(ids, best[2], best[1])
    return ids


def backtracker_of(tok: Tokenizer) -> Backtracker:
    return Backtracker(tok.vocab, tok._ranks, tok._byte_ids)


@pytest.fixture(scope="module")
def routes(gpt2: Tokenizer) -> dict[str, Tokenizer]:
    """GPT-2's tokenizer by each route for every pre-token, and by the plain loop; no cache."""
    return {
        name: Tokenizer(gpt2.vocab, gpt2.merges, [EOT], cache_size=0, **options)
        for name, options in {
            "backtracker": dict(long_above=0, long_route="backtrack"),
            "heap": dict(long_above=0, long_route="heap"),
            "plain": dict(long_above=None),
        }.items()
    }


@pytest.fixture(scope="module")
def gpt2_backtracker(gpt2: Tokenizer) -> Backtracker:
    return LongChunkEncoder(gpt2.vocab, gpt2._ranks, gpt2._byte_ids, "backtrack").backtracker


# ------------------------------------------------------------------ GPT-2
@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURES)
@given(
    LETTERS | FEW_LETTERS | st.binary(max_size=200).map(lambda b: b.decode("latin-1")) | st.text()
)
def test_both_routes_equal_the_plain_loop(routes, tiktoken_gpt2, text: str) -> None:
    ids = routes["plain"].encode(text)
    assert routes["backtracker"].encode(text) == ids
    assert routes["heap"].encode(text) == ids
    assert ids == tiktoken_gpt2.encode(text, allowed_special="all")


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURES)
@given(
    st.binary(max_size=300) | LETTERS.map(str.encode) | st.text(alphabet=" ab\n").map(str.encode)
)
def test_backtracker_equals_plain_loop_on_any_bytes(gpt2, gpt2_backtracker, data: bytes) -> None:
    """Any bytes, not only one pre-token: spaces and newlines inside, invalid UTF-8."""
    ids = [gpt2._byte_ids[b] for b in data]
    assert gpt2_backtracker.encode(data) == plain_merges(ids, gpt2._ranks)


@settings(max_examples=15, deadline=None, suppress_health_check=FIXTURES)
@given(st.text(alphabet=st.sampled_from("abcdefghij+/="), min_size=65, max_size=3000))
def test_long_spaceless_chunks_equal_hf_and_tiktoken(gpt2, hf_gpt2, tiktoken_gpt2, text) -> None:
    ids = gpt2.encode(text)  # one pre-token longer than long_above: the backtracker
    assert ids == hf_gpt2.encode(text).ids
    assert ids == tiktoken_gpt2.encode(text, allowed_special="all")
    assert gpt2.decode(ids) == text


@pytest.mark.parametrize("unit", ["a", "ab", "aab", "abc", "0", "=", "ACGT", "-", "é"])
def test_long_runs_equal_hf(gpt2, hf_gpt2, unit: str) -> None:
    text = unit * (5000 // len(unit))
    assert gpt2.encode(text) == hf_gpt2.encode(text).ids


def test_held_out_text_equal_by_every_route_and_hf(routes, hf_gpt2) -> None:
    text = load_tinyshakespeare()[-20_000:]  # the end, which the chapter holds out
    ids = hf_gpt2.encode(text).ids
    assert all(tok.encode(text) == ids for tok in routes.values())


def test_every_gpt2_token_is_reachable(gpt2, gpt2_backtracker) -> None:
    """BPE on each token's bytes gives the token, as the backtracker found: it may use them all
    (checked here by the plain loop on every third token, to stay quick)."""
    merged = sorted({merged for _, merged, _ in gpt2._ranks.values()})
    assert gpt2_backtracker.outputs == set(merged) | set(gpt2._byte_ids)
    for token in merged[::3]:
        ids = [gpt2._byte_ids[b] for b in gpt2.vocab[token]]
        assert plain_merges(ids, gpt2._ranks) == [token]


def assert_answers_are_the_longest_fits(tok: Tokenizer, backtracker: Backtracker, prevs) -> None:
    """Each answer kept for a token ``prev`` (candidate -> fit) is the longest of the candidate
    and its shorter output prefixes that the plain loop, run on prev's bytes then its own,
    gives back apart from ``prev``; -1 where none is."""
    for prev in prevs:
        for candidate, fit in backtracker._fits[prev].items():
            if prev == backtracker._size:  # the start of the text: anything may follow it
                assert fit == candidate
                continue
            token = candidate
            while token != fit:  # the longer prefixes: BPE merges across the boundary
                assert token >= 0, (prev, candidate, fit)
                pair = [tok._byte_ids[b] for b in tok.vocab[prev] + tok.vocab[token]]
                assert plain_merges(pair, tok._ranks) != [prev, token]
                shorter = backtracker._shorter[token]
                assert shorter < 0 or tok.vocab[token].startswith(tok.vocab[shorter])
                token = shorter
            if fit >= 0:
                pair = [tok._byte_ids[b] for b in tok.vocab[prev] + tok.vocab[fit]]
                assert plain_merges(pair, tok._ranks) == [prev, fit]


@settings(max_examples=20, deadline=None, suppress_health_check=FIXTURES)
@given(LETTERS.map(str.encode) | st.binary(min_size=1, max_size=100))
def test_gpt2_answers_kept_are_the_longest_fits(gpt2, gpt2_backtracker, data: bytes) -> None:
    ids = gpt2_backtracker.encode(data)
    assert_answers_are_the_longest_fits(gpt2, gpt2_backtracker, {gpt2_backtracker._size, *ids})


# ------------------------------------------------------------------ other vocabularies
@pytest.fixture(scope="module")
def trained() -> Tokenizer:
    text = "abba abab baab aabb ab ba " * 30 + "abcabc cab bca aaa bbb " * 20
    return Tokenizer(*train_bpe(text, 320), cache_size=0, long_above=None)


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURES)
@given(st.text(alphabet=st.sampled_from("abc"), min_size=1, max_size=400))
def test_trained_vocab_backtracker_equals_plain_loop(trained: Tokenizer, text: str) -> None:
    """train_bpe's merges rank after their parts and make each token once: the backtracker
    takes them, and finds every token BPE can output."""
    backtracker = backtracker_of(trained)
    data = text.encode()
    assert backtracker.encode(data) == trained.encode(text)
    for token in {merged for _, merged, _ in trained._ranks.values()}:
        ids = [trained._byte_ids[b] for b in trained.vocab[token]]
        assert (plain_merges(ids, trained._ranks) == [token]) == (token in backtracker.outputs)


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURES)
@given(st.text(alphabet=st.sampled_from("abc"), min_size=1, max_size=400), st.integers(1, 6))
def test_answers_forgotten_past_the_bound_keep_the_ids(trained: Tokenizer, text: str, most) -> None:
    """A backtracker that may keep ``most`` answers forgets them all when it would keep more,
    even in the middle of a text: the ids stay the plain loop's and its memory stays bounded."""
    backtracker = backtracker_of(trained)
    backtracker._REMEMBER_AT_MOST = most
    assert backtracker.encode(text.encode()) == trained.encode(text)
    assert 0 < sum(map(len, backtracker._fits)) <= most
    fresh = backtracker_of(trained)
    fresh.encode(text.encode())
    assert_answers_are_the_longest_fits(trained, fresh, range(len(fresh._fits)))


def random_merges(data, permute: bool) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Random merges of a, b and what they made: in the order made, or shuffled."""
    tokens, merges = [b"a", b"b"], []
    for _ in range(data.draw(st.integers(1, 12))):
        left, right = data.draw(st.sampled_from(tokens)), data.draw(st.sampled_from(tokens))
        merges.append((left, right))
        tokens += [left + right] if left + right not in tokens else []
    merges = data.draw(st.permutations(merges)) if permute else merges
    vocab = {i: bytes([i]) for i in range(256)} | {256 + i: t for i, t in enumerate(tokens[2:])}
    return vocab, merges


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_merges_in_order_backtracker_equals_plain_loop(data) -> None:
    """Merges in order may still make tokens BPE never outputs (a+b, b+c, then a+bc: 'abc'
    gives ab, c): the backtracker must leave them out. A token made twice sends it to the heap."""
    vocab, merges = random_merges(data, permute=False)
    tok = Tokenizer(vocab, merges, long_above=None)
    text = data.draw(st.text(alphabet="ab", max_size=40))
    products = [a + b for a, b in dict.fromkeys(merges)]
    if len(set(products)) < len(products):
        with pytest.raises(ValueError, match="made by two merges"):
            backtracker_of(tok)
        assume(False)
    assert backtracker_of(tok).encode(text.encode()) == tok.encode(text)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_merges_out_of_order_every_route_equals_plain_loop(data) -> None:
    """A merge may rank before the merge that makes its part: the backtracker refuses such
    merges, and the heap must finish the rank it is merging before the lower rank it made,
    exactly as the plain loop does."""
    vocab, merges = random_merges(data, permute=True)
    text = b"".join(data.draw(st.lists(st.sampled_from([b"a", b"b", *list(vocab.values())[256:]]))))
    tokens = [Tokenizer(vocab, merges, long_above=0, long_route=r) for r in ("auto", "heap")]
    plain = Tokenizer(vocab, merges, long_above=None).encode(text.decode())
    assert all(tok.encode(text.decode()) == plain for tok in tokens)


def test_ab_ab_with_out_of_order_merges_by_hand() -> None:
    """'abab': the plain loop merges both (a, b) first, then nothing ranks (ab, a)."""
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"aba"}
    merges = [(b"ab", b"a"), (b"a", b"b")]
    for above in (0, None):
        assert Tokenizer(vocab, merges, long_above=above).encode("abab") == [256, 256]
    tok = Tokenizer(vocab, merges)
    with pytest.raises(ValueError, match="merges out of order"):
        backtracker_of(tok)
    assert merge_by_heap([97, 98, 97, 98], tok._ranks, 2) == [256, 256]


def test_unreachable_token_never_output_by_hand() -> None:
    """a+b ranks first, so 'abc' becomes ab, c and the merge a+bc never applies."""
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"bc", 258: b"abc"}
    tok = Tokenizer(vocab, [(b"a", b"b"), (b"b", b"c"), (b"a", b"bc")], long_above=0)
    assert 258 not in backtracker_of(tok).outputs
    assert tok.encode("abc" * 30) == [256, 99] * 30


def test_bad_long_route() -> None:
    with pytest.raises(
        ValueError, match="long_route must be .auto., .heap. or .backtrack., got 'fast'"
    ):
        Tokenizer({i: bytes([i]) for i in range(256)}, [], long_route="fast")


def test_one_vocabulary_builds_its_backtracker_once(gpt2) -> None:
    copy = Tokenizer(dict(gpt2.vocab), list(gpt2.merges), [EOT])
    first, again = (
        LongChunkEncoder(tok.vocab, tok._ranks, tok._byte_ids, "backtrack") for tok in (gpt2, copy)
    )
    assert isinstance(first.backtracker, Backtracker) and first.backtracker is again.backtracker
    heap = LongChunkEncoder(gpt2.vocab, gpt2._ranks, gpt2._byte_ids, "heap")
    assert heap(b"abcabc" * 500) == first(b"abcabc" * 500)
    assert heap.backtracker is None


def test_auto_route_takes_the_heap_until_enough_bytes_came(trained: Tokenizer) -> None:
    auto, heap = (
        LongChunkEncoder(trained.vocab, trained._ranks, trained._byte_ids, route, 1000)
        for route in ("auto", "heap")
    )
    chunk = b"abcab" * 50
    for _ in range(3):
        assert auto(chunk) == heap(chunk) and auto.backtracker is None
    assert auto(chunk) == heap(chunk)  # the fourth reaches 1000 bytes
    assert isinstance(auto.backtracker, Backtracker) and heap.backtracker is None
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"aba"}
    tok = Tokenizer(vocab, [(b"ab", b"a"), (b"a", b"b")])  # merges out of order: the heap stays
    auto = LongChunkEncoder(tok.vocab, tok._ranks, tok._byte_ids, "auto", 1000)
    assert auto(b"ab" * 500) == [256] * 500 and auto.backtracker is None
    with pytest.raises(ValueError, match="merges out of order"):
        LongChunkEncoder(tok.vocab, tok._ranks, tok._byte_ids, "backtrack")
    assert BUILD_AFTER > 1000  # the default waits longer


def test_tokenizer_pickles_after_a_long_chunk(trained: Tokenizer) -> None:
    """The encoder of long chunks (the backtracker is large) stays out of the pickle."""
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"aba"}
    text = "abab" * 40
    made = (
        Tokenizer(trained.vocab, trained.merges, long_route="backtrack"),
        Tokenizer(vocab, [(b"ab", b"a"), (b"a", b"b")]),
    )
    for tok in made:  # by the backtracker, by the heap (merges out of order)
        ids = tok.encode(text)
        again = pickle.loads(pickle.dumps(tok))
        assert again.encode(text) == copy.deepcopy(tok).encode(text) == ids


def test_backtrackers_are_shared_by_equal_tables_only(trained: Tokenizer) -> None:
    def built(vocab, merges) -> Backtracker:
        tok = Tokenizer(vocab, merges)
        return LongChunkEncoder(tok.vocab, tok._ranks, tok._byte_ids, "backtrack").backtracker

    first = built(trained.vocab, trained.merges)
    assert built(dict(reversed(trained.vocab.items())), list(trained.merges)) is first
    fewer = built(trained.vocab, trained.merges[:3])
    assert fewer is not first
    text = "abcab abcabc" * 20
    plain = Tokenizer(trained.vocab, trained.merges[:3], long_above=None)
    assert fewer.encode(text.encode()) == plain.encode(text) != trained.encode(text)


def test_the_collector_is_left_as_found_after_a_build(trained: Tokenizer) -> None:
    """Building pauses Python's garbage collector, and restores it, even when the merges refuse
    a backtracker or when it was off already."""
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"aba"}
    out_of_order = Tokenizer(vocab, [(b"ab", b"a"), (b"a", b"b")])
    assert gc.isenabled()
    backtracker_of(trained)
    assert gc.isenabled()
    with pytest.raises(ValueError, match="merges out of order"):
        backtracker_of(out_of_order)
    assert gc.isenabled()
    gc.disable()
    try:
        backtracker_of(trained)
        assert not gc.isenabled()
    finally:
        gc.enable()
