"""Tests of coursepkg.tokenizer: GPT-2's ids id for id against Hugging Face ``tokenizers`` and
``tiktoken`` (both built offline from the shipped files), round trips, streaming, training."""

from __future__ import annotations

import hashlib
import io
from collections import Counter
from importlib import resources
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coursepkg.tokenizer import (
    Tokenizer,
    bytes_to_unicode,
    pretokenize,
    split_special,
    train_bpe,
)

tokenizers = pytest.importorskip("tokenizers")
tiktoken = pytest.importorskip("tiktoken")

EOT = "<|endoftext|>"
FIXTURES = [HealthCheck.function_scoped_fixture]
PIECES = [EOT, " ", "a", "\n", "é", "😀"]
GPT2_DIR = resources.files("coursepkg") / "data" / "gpt2"

SAMPLES = {
    "empty": "",
    "english": "Hello, world! The quick brown fox jumps over the lazy dog. It's 2024; we'll see.",
    "german": "Größenwahn über Straßenbahnhaltestellen: Müller's Bücher kosten 12,50 €.",
    "code": 'def f(x):\n    return {"a": [x ** 2, x >> 1]}  # comment\n\tif x != 0:\n\t\tpass\n',
    "emoji": "I 😀 tokenizers 👩‍👩‍👧‍👦 🇩🇪 and ✨ ok",
    "whitespace": "a  b   c\n\n\n d \t\t e    \n    \r\n  ",
    "special": f"first document{EOT}second document {EOT}{EOT} third{EOT}",
    "mixed": "日本語のテキスト 中文 한국어 Ελληνικά русский ١٢٣ 123456789",
}


# ------------------------------------------------------------------ GPT-2, id for id
@pytest.mark.parametrize(
    "text, ids",
    [("Hello, world!", [15496, 11, 995, 0]), (EOT, [50256]), (" the", [262]), ("", [])],
)
def test_known_ids(gpt2, hf_gpt2, tiktoken_gpt2, text: str, ids: list[int]) -> None:
    """Published GPT-2 ids first, so no reference is trusted blindly."""
    assert gpt2.encode(text) == ids
    assert hf_gpt2.encode(text).ids == ids
    assert tiktoken_gpt2.encode(text, allowed_special="all") == ids
    assert len(gpt2) == 50257


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_equals_hf_and_tiktoken(gpt2, hf_gpt2, tiktoken_gpt2, name: str) -> None:
    text = SAMPLES[name]
    ids = gpt2.encode(text)
    assert ids == hf_gpt2.encode(text).ids
    assert ids == tiktoken_gpt2.encode(text, allowed_special="all")
    assert gpt2.decode(ids) == text == hf_gpt2.decode(ids, skip_special_tokens=False)
    assert len(ids) > 0 or text == ""


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURES)
@given(st.text(max_size=60) | st.lists(st.sampled_from(PIECES)).map("".join))
@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_equals_tiktoken_and_hf_on_any_text(gpt2, hf_gpt2, tiktoken_gpt2, text: str) -> None:
    ids = gpt2.encode(text)
    assert ids == tiktoken_gpt2.encode(text, allowed_special="all")
    assert ids == hf_gpt2.encode(text).ids


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURES)
@given(
    st.text(max_size=80) | st.lists(st.sampled_from([EOT, " ", "a", "\n", "é", "😀"])).map("".join)
)
def test_round_trip_any_unicode(gpt2, text: str) -> None:
    assert gpt2.decode(gpt2.encode(text)) == text


def test_partial_utf8_decodes_to_replacement_character(gpt2) -> None:
    ids = gpt2.encode("😀")
    assert len(ids) > 1  # four bytes, more than one token
    assert gpt2.decode(ids[:1]) == "\ufffd"
    assert "".join(gpt2.decode([i]) for i in ids) != "😀"  # token by token breaks it
    assert gpt2.decode(ids) == "😀"


def test_special_tokens_whole_and_longest_wins() -> None:
    vocab, merges = train_bpe("<a> <a><b> abab ab", 300, ["<a>", "<a><b>"])
    tok = Tokenizer(vocab, merges, ["<a>", "<a><b>"])
    ids = tok.encode("x<a><b>y<a>")
    ab_id = tok.encode("<a><b>")
    assert len(ab_id) == 1 and ab_id[0] in ids and tok.encode("<a>")[0] in ids
    assert tok.decode(ids) == "x<a><b>y<a>"
    # without the special, "<a>" is ordinary text of several tokens
    plain = Tokenizer(vocab, merges)
    assert len(plain.encode("<a>")) > 1
    assert split_special("x<a><b>y", ["<a>", "<a><b>"]) == ["x", "<a><b>", "y"]


# ------------------------------------------------------------------ streaming
def test_encode_iterable_on_a_file(gpt2, tmp_path: Path) -> None:
    text = "".join(SAMPLES.values()) * 3
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    with open(path, encoding="utf-8", newline="") as file:
        streamed = list(gpt2.encode_iterable(file))
    assert streamed == gpt2.encode(text)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from(list("ab <|>\n\t'sé")), max_size=12)
        | st.sampled_from(["<|a|>", "<|a|><|b|>", "<|"]),
        max_size=12,
    )
)
def test_encode_iterable_equals_encode_on_any_split(chunks: list[str]) -> None:
    tok = _small_tokenizer(("<|a|>", "<|a|><|b|>"))
    assert list(tok.encode_iterable(chunks)) == tok.encode("".join(chunks))
    assert list(tok.encode_iterable(io.StringIO("".join(chunks)))) == tok.encode("".join(chunks))


def test_encode_iterable_memory_does_not_grow_with_the_stream(gpt2) -> None:
    """Streaming three times the text takes no more memory than streaming it once."""
    import tracemalloc

    lines = "".join(SAMPLES.values()).splitlines(keepends=True) * 200
    expected = len(gpt2.encode("".join(lines)))  # also fills the bounded pre-token cache

    def peak(copies: int) -> int:
        tracemalloc.start()
        n = sum(1 for _ in gpt2.encode_iterable(line for _ in range(copies) for line in lines))
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert n == copies * expected
        return top

    once, thrice = peak(1), peak(3)
    assert thrice < 1.2 * once + 64_000, (once, thrice)


_SMALL: dict = {}


def _small_tokenizer(specials: tuple[str, ...]) -> Tokenizer:
    if specials not in _SMALL:
        text = "ab ab  ab's <|a|> a\n\nb\t bé ba" * 5
        _SMALL[specials] = Tokenizer(*train_bpe(text, 280, specials), specials)
    return _SMALL[specials]


# ------------------------------------------------------------------ files
def test_save_and_load_round_trip(tmp_path: Path) -> None:
    vocab, merges = train_bpe("héllo wörld, hello world! " * 20, 300, [EOT])
    tok = Tokenizer(vocab, merges, [EOT])
    tok.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    back = Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", [EOT])
    assert back.vocab == tok.vocab and back.merges == tok.merges
    text = f"hello wörld{EOT}!"
    assert back.encode(text) == tok.encode(text)


def test_gpt2_files_save_identically(gpt2, tmp_path: Path) -> None:
    gpt2.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    back = Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", [EOT])
    assert back.vocab == gpt2.vocab and back.merges == gpt2.merges


def test_bytes_to_unicode_is_a_printable_bijection() -> None:
    table = bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("a")] == "a"
    assert all(c.isprintable() and not c.isspace() for c in table.values())


# ------------------------------------------------------------------ bad input
def test_bad_input_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"vocab_size must be at least 256 \+ 1 special"):
        train_bpe("abc", 256, [EOT])
    with pytest.raises(ValueError, match="empty string"):
        train_bpe("abc", 300, [""])
    with pytest.raises(ValueError, match="empty string"):
        Tokenizer({i: bytes([i]) for i in range(256)}, [], [""])
    with pytest.raises(TypeError, match="special_tokens must be a list"):
        train_bpe("abc", 300, EOT)
    with pytest.raises(TypeError, match="vocab_size must be an int"):
        train_bpe("abc", 300.0)
    with pytest.raises(TypeError, match="text must be a str"):
        train_bpe(b"abc", 300)
    vocab = {i: bytes([i]) for i in range(256)}
    with pytest.raises(ValueError, match=r"merges\[0\].*b'ab', which is not in the vocab"):
        Tokenizer(vocab, [(b"a", b"b")])
    with pytest.raises(ValueError, match="all 256 single bytes"):
        Tokenizer({0: b"\x00"}, [])
    (tmp_path / "vocab.json").write_text('{"a": 0}', encoding="utf-8")
    (tmp_path / "merges.txt").write_text("a b\n", encoding="utf-8")
    with pytest.raises(ValueError, match="all 256 single bytes"):
        Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    with pytest.raises(ValueError, match="long_above must be None or an int >= 0, got -1"):
        Tokenizer(vocab, [], long_above=-1)
    tok = Tokenizer(vocab, [])
    with pytest.raises(TypeError, match="text must be a str"):
        tok.encode(b"abc")
    with pytest.raises(ValueError, match=r"ids\[1\] = 999 is not an id"):
        tok.decode([97, 999])


def test_merges_file_naming_unknown_tokens(gpt2, tmp_path: Path) -> None:
    gpt2.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    with open(tmp_path / "merges.txt", "a", encoding="utf-8") as file:
        file.write("Ġzzqx Ġzzqy\n")
    with pytest.raises(ValueError, match="not in the vocab"):
        Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")


# ------------------------------------------------------------------ training
def test_training_by_hand() -> None:
    """'aaab' is one pre-token: (a,a) occurs twice and is merged first; then (aa,a) and (a,b)
    tie once each and the greater pair of byte strings, (b'aa', b'a'), wins; then (aaa,b)."""
    vocab, merges = train_bpe("aaab", 259)
    assert merges == [(b"a", b"a"), (b"aa", b"a"), (b"aaa", b"b")]
    assert [vocab[i] for i in (256, 257, 258)] == [b"aa", b"aaa", b"aaab"]
    assert all(vocab[i] == bytes([i]) for i in range(256))


def test_training_respects_pretokens_and_specials() -> None:
    # (a, " ") occurs three times across pre-token boundaries and would win the tie with
    # (" ", a); merges stay inside pre-tokens, so (" ", a) is learned.
    _, merges = train_bpe("a a a a", 257)
    assert merges == [(b" ", b"a")]
    vocab, merges = train_bpe(f"x{EOT}x{EOT}x{EOT}", 300, [EOT])
    assert merges == []  # nothing to merge: the specials are not text
    assert vocab[256] == EOT.encode()
    assert len(vocab) == 257  # stopped early: no pair left


def _naive_bpe(text: str, vocab_size: int) -> list[tuple[bytes, bytes]]:
    """BPE by recounting every pair after every merge: slow, obviously right."""
    words = Counter(tuple(bytes([b]) for b in t.encode()) for t in pretokenize(text))
    merges = []
    while 256 + len(merges) < vocab_size:
        pairs: Counter = Counter()
        for word, n in words.items():
            for pair in pairwise(word):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        new_words: Counter = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words[tuple(out)] += n
        words = new_words
    return merges


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aab b\n'sxé")), max_size=60), st.integers(256, 300))
def test_incremental_training_equals_naive_recount(text: str, vocab_size: int) -> None:
    assert train_bpe(text, vocab_size)[1] == _naive_bpe(text, vocab_size)


def test_training_is_deterministic_and_round_trips(tmp_path: Path) -> None:
    text = "".join(SAMPLES.values()) * 4
    path = tmp_path / "train.txt"
    path.write_text(text, encoding="utf-8")
    first = train_bpe(text, 400, [EOT])
    assert train_bpe(path, 400, [EOT]) == first
    vocab, merges = first
    assert len(vocab) == 400 and len(merges) == 400 - 256 - 1
    tok = Tokenizer(vocab, merges, [EOT])
    for sample in SAMPLES.values():
        assert tok.decode(tok.encode(sample)) == sample
    assert len(tok.encode(SAMPLES["english"])) < len(SAMPLES["english"].encode())


def test_trained_tokenizer_equals_hf_bpe_with_the_same_merges(tmp_path: Path) -> None:
    """Our trained files, loaded by Hugging Face's BPE, give our ids (the save format is right)."""
    from tokenizers import models, pre_tokenizers

    text = "".join(SAMPLES.values()) * 4
    tok = Tokenizer(*train_bpe(text, 400, [EOT]), [EOT])
    tok.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    hf = tokenizers.Tokenizer(
        models.BPE.from_file(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    )
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.add_special_tokens([EOT])
    for sample in SAMPLES.values():
        assert tok.encode(sample) == hf.encode(sample).ids


@pytest.mark.parametrize(
    "name, sha256",
    [
        ("vocab.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
        ("merges.txt", "ac33235097fe06d4a8fff0feac994644809e6eb6ab70669e1e9fd40ae032428e"),
    ],
)
def test_shipped_gpt2_files_are_the_documented_ones(name: str, sha256: str) -> None:
    data = (GPT2_DIR / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha256
    provenance = (resources.files("coursepkg") / "data" / "PROVENANCE.md").read_text()
    assert sha256 in provenance
