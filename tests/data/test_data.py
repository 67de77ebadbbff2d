"""Tests of coursepkg.data: vocabulary, date task, copy/reverse task, Tiny Shakespeare."""

from __future__ import annotations

import hashlib
import re
from datetime import date, datetime
from importlib import resources

import pytest
import torch
from torch.utils.data import DataLoader

from coursepkg.data import (
    BOS_ID,
    DATE_FORMATS,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    CharVocab,
    DateDataset,
    char_lm_batches,
    date_split,
    date_vocabs,
    encode_batch,
    format_date,
    load_tinyshakespeare,
    make_copy_batch,
    make_date_pairs,
    pad_sequences,
    read_verified_text,
)
from coursepkg.data.text import (
    TINYSHAKESPEARE_BYTES,
    TINYSHAKESPEARE_SHA256,
    tinyshakespeare_bytes,
)


# ---------------------------------------------------------------------- vocabulary
@pytest.mark.parametrize("text", ["", "hello world", "abc\ncba", "zz top!"])
def test_vocab_round_trip(text: str) -> None:
    vocab = CharVocab("abcdefghijklmnopqrstuvwxyz !\n")
    ids = vocab.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID and len(ids) == len(text) + 2
    assert all(i >= 4 for i in ids[1:-1])
    assert vocab.decode(ids) == text
    assert vocab.decode(torch.tensor(ids)) == text


def test_vocab_specials_and_unknowns() -> None:
    vocab = CharVocab("abca")  # duplicates ignored, first-appearance order
    assert len(vocab) == 4 + 3 and vocab.chars == "abc"
    assert vocab.itos[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2, 3)
    assert vocab.encode("ax") == [4, UNK_ID]
    assert vocab.decode([BOS_ID, 4, UNK_ID, EOS_ID, PAD_ID], strip_special=False) == (
        "<bos>a<unk><eos><pad>"
    )
    assert vocab.decode([BOS_ID, 5, EOS_ID, PAD_ID]) == "b"


def test_vocab_from_corpus_is_sorted_and_complete() -> None:
    vocab = CharVocab.from_corpus("the cat sat")
    assert vocab.chars == "".join(sorted(set("the cat sat")))
    assert UNK_ID not in vocab.encode("the cat sat")


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda v: v.decode([99]), ValueError, r"ids must lie in \[0, 6\), got 99"),
        (lambda v: v.decode([1.0]), TypeError, "ids must be ints"),
        (lambda v: v.decode(torch.ones(2, 2, dtype=torch.long)), ValueError, "ids must be 1-D"),
        (lambda v: v.decode(torch.ones(2)), TypeError, "integer tensor"),
        (lambda v: v.encode(["a"]), TypeError, "text must be a str"),
        (lambda v: CharVocab(["ab"]), ValueError, "single characters"),
        (lambda v: CharVocab(""), ValueError, "at least one character"),
    ],
)
def test_vocab_bad_inputs(call, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call(CharVocab("ab"))


# ---------------------------------------------------------------------- dates
# An independent parser for every format: datetime.strptime (English names in the C locale).
STRPTIME = {
    "D Mon YYYY": "%d %b %Y",
    "Month D, YYYY": "%B %d, %Y",
    "DD/MM/YYYY": "%d/%m/%Y",
    "Weekday, D Month YYYY": "%A, %d %B %Y",
    "YYYY Mon D": "%Y %b %d",
    "DD.MM.YYYY": "%d.%m.%Y",
    "Mon D, YYYY": "%b %d, %Y",
    "D Month YYYY": "%d %B %Y",
    "Dth of Month YYYY": "%d of %B %Y",
    "Wkd D Mon YYYY": "%a %d %b %Y",
    "YYYY/MM/DD": "%Y/%m/%d",
    "DD-Mon-YYYY": "%d-%b-%Y",
    "Weekday, Month D, YYYY": "%A, %B %d, %Y",
    "d mon yyyy": "%d %b %Y",
}


def test_at_least_eight_formats_each_parsed_by_the_oracle() -> None:
    assert len(DATE_FORMATS) >= 8
    assert set(STRPTIME) == set(DATE_FORMATS)


@pytest.mark.parametrize("fmt", sorted(DATE_FORMATS))
def test_every_format_round_trips(fmt: str) -> None:
    pairs = make_date_pairs(60, seed=7, start_year=1900, end_year=2099, formats=[fmt])
    for human, iso in pairs:
        parsed = datetime.strptime(re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", human), STRPTIME[fmt])
        assert parsed.date() == date.fromisoformat(iso), (human, iso)
        if "Wkd" in fmt or "Weekday" in fmt:  # strptime ignores the weekday: check it here
            assert human.split()[0].rstrip(",") == parsed.strftime(
                "%A" if "Weekday" in fmt else "%a"
            )


def test_reference_examples() -> None:
    d = date(2026, 11, 22)  # a Sunday
    assert format_date(d, "D Mon YYYY") == "22 Nov 2026"
    assert format_date(d, "Month D, YYYY") == "November 22, 2026"
    assert format_date(d, "DD/MM/YYYY") == "22/11/2026"
    assert format_date(d, "Weekday, D Month YYYY") == "Sunday, 22 November 2026"
    assert format_date(d, "YYYY Mon D") == "2026 Nov 22"
    assert [format_date(date(2026, 1, k), "Dth of Month YYYY")[:4] for k in (1, 2, 3, 11, 21)] == [
        "1st ",
        "2nd ",
        "3rd ",
        "11th",
        "21st",
    ]


def test_dates_valid_in_range_and_cover_formats() -> None:
    pairs = make_date_pairs(3000, seed=0, start_year=1999, end_year=2001)
    days = [date.fromisoformat(iso) for _, iso in pairs]  # raises on an invalid date
    assert all(1999 <= d.year <= 2001 for d in days)
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", iso) for _, iso in pairs)
    leap_year = {date.fromisoformat(iso) for _, iso in make_date_pairs(3000, 1, 2000, 2000)}
    assert len(leap_year) == 366 and date(2000, 2, 29) in leap_year  # every day, Feb 29 too
    src_vocab, tgt_vocab = date_vocabs()
    assert all(UNK_ID not in src_vocab.encode(h) for h, _ in pairs)  # alphabet is complete
    assert all(UNK_ID not in tgt_vocab.encode(iso) for _, iso in pairs)


def test_date_pairs_deterministic_by_seed() -> None:
    assert make_date_pairs(50, seed=3) == make_date_pairs(50, seed=3)
    assert make_date_pairs(50, seed=3) != make_date_pairs(50, seed=4)
    state = torch.random.get_rng_state()
    make_date_pairs(5, seed=1)
    assert torch.equal(state, torch.random.get_rng_state())


def test_date_split_disjoint_and_deterministic() -> None:
    train, test = date_split(2000, 300, seed=5)
    assert len(train) == 2000 and len(test) == 300
    test_days = {iso for _, iso in test}
    assert len(test_days) == 300  # distinct test dates
    assert test_days.isdisjoint(iso for _, iso in train)
    assert date_split(2000, 300, seed=5) == (train, test)
    # Also when nearly every day of the range is held out.
    train, test = date_split(100, 364, seed=0, start_year=2001, end_year=2001)
    assert {iso for _, iso in train} == {
        f"2001-{m:02d}-{d:02d}" for m in range(1, 13) for d in range(1, 32) if _valid(2001, m, d)
    } - {iso for _, iso in test}


def _valid(y: int, m: int, d: int) -> bool:
    try:
        date(y, m, d)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: make_date_pairs(-1, seed=0), "n must be a non-negative int"),
        (lambda: make_date_pairs(3, seed=0, start_year=2000, end_year=1999), "start_year"),
        (lambda: make_date_pairs(3, seed=0, formats=["nope"]), "formats must be names"),
        (lambda: date_split(10, 365, seed=0, start_year=2001, end_year=2001), "n_test must be"),
        (lambda: format_date(date(2000, 1, 1), "bad"), "fmt must be one of"),
    ],
)
def test_date_bad_inputs(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_encode_batch_teacher_forcing_layout() -> None:
    src_vocab, tgt_vocab = date_vocabs()
    pairs = make_date_pairs(16, seed=2)
    src, tgt_in, tgt_out, src_mask, tgt_mask = encode_batch(pairs, src_vocab, tgt_vocab)
    assert src.shape == (16, max(len(h) for h, _ in pairs)) and src.dtype == torch.long
    assert tgt_in.shape == tgt_out.shape == tgt_mask.shape == (16, 11)
    assert torch.all(tgt_in[:, 0] == BOS_ID) and torch.all(tgt_out[:, -1] == EOS_ID)
    assert torch.equal(tgt_in[:, 1:], tgt_out[:, :-1])  # right shift by one
    assert torch.equal(src_mask, src != PAD_ID) and tgt_mask.all()
    for row, (human, iso) in enumerate(pairs):
        assert src_vocab.decode(src[row]) == human
        assert tgt_vocab.decode(tgt_out[row]) == iso
        assert int(src_mask[row].sum()) == len(human)


def test_date_dataset_with_dataloader() -> None:
    ds = DateDataset(make_date_pairs(10, seed=0))
    loader = DataLoader(ds, batch_size=4, shuffle=False, collate_fn=ds.collate)
    batches = list(loader)
    assert len(ds) == 10 and len(batches) == 3
    assert batches[-1].src.shape[0] == 2 and batches[0].tgt_out.shape == (4, 11)
    assert ds.src_vocab.decode(batches[0].src[1]) == ds[1][0]


def test_encode_batch_bad_inputs() -> None:
    src_vocab, tgt_vocab = date_vocabs()
    with pytest.raises(ValueError, match="at least one"):
        encode_batch([], src_vocab, tgt_vocab)
    with pytest.raises(TypeError, match="tgt_vocab must be a CharVocab"):
        encode_batch([("1 Jan 2000", "2000-01-01")], src_vocab, "0123456789-")


def test_pad_sequences() -> None:
    ids, mask = pad_sequences([[5, 6, 7], [8], []])
    assert torch.equal(ids, torch.tensor([[5, 6, 7], [8, 0, 0], [0, 0, 0]]))
    assert torch.equal(mask, ids != 0)


# ---------------------------------------------------------------------- copy / reverse
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("min_length", [None, 1])
def test_copy_batch_targets(reverse: bool, min_length: int | None) -> None:
    g = torch.Generator().manual_seed(0)
    b = make_copy_batch(32, 7, 10, g, reverse=reverse, min_length=min_length)
    assert b.src.shape == b.src_mask.shape == (32, 7)
    assert b.tgt_in.shape == b.tgt_out.shape == b.tgt_mask.shape == (32, 8)
    lengths = b.src_mask.sum(1)
    if min_length is None:
        assert torch.all(lengths == 7)
    else:
        assert len(set(lengths.tolist())) > 1  # variable lengths really occur
    for row in range(32):
        n = int(lengths[row])
        real = b.src[row, :n]
        assert torch.all((real >= 4) & (real < 10)) and torch.all(b.src[row, n:] == PAD_ID)
        expected = real.flip(0) if reverse else real
        assert torch.equal(b.tgt_in[row, : n + 1], torch.cat([torch.tensor([BOS_ID]), expected]))
        assert torch.equal(b.tgt_out[row, : n + 1], torch.cat([expected, torch.tensor([EOS_ID])]))
        assert torch.all(b.tgt_in[row, n + 1 :] == PAD_ID)
        assert torch.all(b.tgt_out[row, n + 1 :] == PAD_ID)
        assert int(b.tgt_mask[row].sum()) == n + 1 and bool(b.tgt_mask[row, : n + 1].all())


def test_copy_batch_deterministic_by_generator() -> None:
    a = make_copy_batch(4, 5, 9, torch.Generator().manual_seed(1), min_length=2)
    b = make_copy_batch(4, 5, 9, torch.Generator().manual_seed(1), min_length=2)
    c = make_copy_batch(4, 5, 9, torch.Generator().manual_seed(2), min_length=2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a.src, c.src)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"vocab_size": 4}, "vocab_size must be an int > 4"),
        ({"length": 0}, "length must be a positive int"),
        ({"min_length": 6}, r"min_length must be an int in \[1, length=5\]"),
        ({"batch_size": 2.0}, "batch_size must be a positive int"),
    ],
)
def test_copy_batch_bad_inputs(kwargs: dict, match: str) -> None:
    args = {"batch_size": 2, "length": 5, "vocab_size": 9}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_copy_batch(**args)


# ---------------------------------------------------------------------- Tiny Shakespeare
def test_tinyshakespeare_is_intact_and_cached() -> None:
    text = load_tinyshakespeare()
    assert len(text) == TINYSHAKESPEARE_BYTES  # ASCII: one byte per character
    assert text.startswith("First Citizen:")
    assert len(set(text)) == 65
    assert load_tinyshakespeare() is text  # read and verified once
    raw = resources.files("coursepkg.data").joinpath("tinyshakespeare.txt").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == TINYSHAKESPEARE_SHA256


@pytest.mark.parametrize("heldout_bytes", [1, 16_384, TINYSHAKESPEARE_BYTES])
def test_the_byte_split_is_the_texts_bytes_cut_at_90_percent(heldout_bytes) -> None:
    train, heldout = tinyshakespeare_bytes(heldout_bytes)
    raw = list(load_tinyshakespeare().encode("utf-8"))
    split = int(0.9 * TINYSHAKESPEARE_BYTES)
    assert train.dtype == heldout.dtype == torch.long
    assert train.tolist() == raw[:split]
    assert heldout.tolist() == raw[split:][:heldout_bytes]  # the rest, cut to heldout_bytes


def test_provenance_documented() -> None:
    doc = resources.files("coursepkg.data").joinpath("PROVENANCE.md").read_text()
    assert TINYSHAKESPEARE_SHA256 in doc and "1,115,394" in doc
    assert "karpathy/char-rnn" in doc and "public domain" in doc


def test_corrupted_file_is_refused(tmp_path) -> None:
    raw = resources.files("coursepkg.data").joinpath("tinyshakespeare.txt").read_bytes()
    damaged = tmp_path / "tinyshakespeare.txt"
    damaged.write_bytes(raw[:-1] + b"?")
    with pytest.raises(RuntimeError, match=f"corrupted: expected sha256 {TINYSHAKESPEARE_SHA256}"):
        read_verified_text(damaged, TINYSHAKESPEARE_SHA256)
    intact = tmp_path / "intact.txt"
    intact.write_bytes(raw)
    assert read_verified_text(str(intact), TINYSHAKESPEARE_SHA256) == load_tinyshakespeare()


def test_char_lm_batches_are_shifted_windows() -> None:
    text = load_tinyshakespeare()[:5000]
    vocab = CharVocab.from_corpus(text)
    batches = list(char_lm_batches(text, vocab, 16, 8, torch.Generator().manual_seed(0), 3))
    assert len(batches) == 3
    for x, y in batches:
        assert x.shape == y.shape == (8, 16) and x.dtype == torch.long
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row in range(8):
            window = vocab.decode(x[row]) + vocab.decode(y[row, -1:])
            assert window in text
    again = list(char_lm_batches(text, vocab, 16, 8, torch.Generator().manual_seed(0), 3))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))
    ids = torch.tensor(vocab.encode(text))
    from_ids = next(char_lm_batches(ids, vocab, 16, 8, torch.Generator().manual_seed(0)))
    assert torch.equal(from_ids[0], batches[0][0])


@pytest.mark.parametrize(
    ("text", "kwargs", "error", "match"),
    [
        ("abc", {}, ValueError, "text must be longer than block_size"),
        ("abcdefghijkl", {"block_size": 0}, ValueError, "block_size must be a positive int"),
        (torch.ones(2, 20, dtype=torch.long), {}, TypeError, "1-D torch.long"),
        (b"abcdefghijkl", {}, TypeError, "text must be a str"),
    ],
)
def test_char_lm_batches_bad_inputs(text, kwargs: dict, error: type, match: str) -> None:
    args = {"block_size": 4, "batch_size": 2}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        char_lm_batches(text, CharVocab("abcdefghijkl"), **args)
