"""Date normalisation: human-written dates ("Sunday, 22 November 2026") -> ISO 8601 ("2026-11-22").

The classic small task for attention models (as in the Bahdanau-era tutorials): the output is a
reordering of pieces of the input, so the alignment heatmaps are easy to read. Month and weekday
names are written out here in English, independent of the machine's locale.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import date

import torch
from torch.utils.data import Dataset

from coursepkg.data.batching import Seq2SeqBatch, make_seq2seq_batch
from coursepkg.data.vocab import CharVocab

__all__ = [
    "DATE_FORMATS",
    "SRC_ALPHABET",
    "TGT_ALPHABET",
    "DateDataset",
    "date_split",
    "date_vocabs",
    "encode_batch",
    "format_date",
    "make_date_pairs",
]

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _ordinal(day: int) -> str:
    """1 -> "1st", 2 -> "2nd", 11 -> "11th", 22 -> "22nd"."""
    if 11 <= day % 100 <= 13:
        return f"{day}th"
    return f"{day}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th') }"


def _month(d: date) -> str:
    return MONTHS[d.month - 1]


def _mon(d: date) -> str:
    return MONTHS[d.month - 1][:3]


def _weekday(d: date) -> str:
    return WEEKDAYS[d.weekday()]


# Name (the pattern) -> formatter. The examples are for 2026-11-22, a Sunday. Numeric formats are
# day-first or year-first only: month-first "11/22/2026" would make "03/04/2026" ambiguous.
DATE_FORMATS: dict[str, Callable[[date], str]] = {
    "D Mon YYYY": lambda d: f"{d.day} {_mon(d)} {d.year}",  # 22 Nov 2026
    "Month D, YYYY": lambda d: f"{_month(d)} {d.day}, {d.year}",  # November 22, 2026
    "DD/MM/YYYY": lambda d: f"{d.day:02d}/{d.month:02d}/{d.year}",  # 22/11/2026
    "Weekday, D Month YYYY": lambda d: f"{_weekday(d)}, {d.day} {_month(d)} {d.year}",
    "YYYY Mon D": lambda d: f"{d.year} {_mon(d)} {d.day}",  # 2026 Nov 22
    "DD.MM.YYYY": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",  # 22.11.2026
    "Mon D, YYYY": lambda d: f"{_mon(d)} {d.day}, {d.year}",  # Nov 22, 2026
    "D Month YYYY": lambda d: f"{d.day} {_month(d)} {d.year}",  # 22 November 2026
    "Dth of Month YYYY": lambda d: f"{_ordinal(d.day)} of {_month(d)} {d.year}",  # 22nd of ...
    "Wkd D Mon YYYY": lambda d: f"{_weekday(d)[:3]} {d.day} {_mon(d)} {d.year}",  # Sun 22 Nov 2026
    "YYYY/MM/DD": lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",  # 2026/11/22
    "DD-Mon-YYYY": lambda d: f"{d.day:02d}-{_mon(d)}-{d.year}",  # 22-Nov-2026
    "Weekday, Month D, YYYY": lambda d: f"{_weekday(d)}, {_month(d)} {d.day}, {d.year}",
    "d mon yyyy": lambda d: f"{d.day} {_mon(d).lower()} {d.year}",  # 22 nov 2026
}

# Every character any format can produce, sorted, so the source vocabulary is fixed.
SRC_ALPHABET = "".join(
    sorted(
        set(
            "0123456789 ,./-"
            + "stndrdth of"
            + "".join(MONTHS + WEEKDAYS).lower()
            + "".join(MONTHS + WEEKDAYS)
        )
    )
)
TGT_ALPHABET = "0123456789-"


def format_date(d: date, fmt: str) -> str:
    """Write ``d`` in the human format named ``fmt`` (a key of :data:`DATE_FORMATS`)."""
    if not isinstance(d, date):
        raise TypeError(f"d must be a datetime.date, got {type(d).__name__}")
    if fmt not in DATE_FORMATS:
        raise ValueError(f"fmt must be one of {sorted(DATE_FORMATS)}, got {fmt!r}")
    return DATE_FORMATS[fmt](d)


def date_vocabs() -> tuple[CharVocab, CharVocab]:
    """The source vocabulary (all characters of all formats) and the ISO target vocabulary."""
    return CharVocab(SRC_ALPHABET), CharVocab(TGT_ALPHABET)


def _check_args(
    n: int, name: str, start_year: int, end_year: int, formats: Sequence[str] | None
) -> tuple[int, int, list[str]]:
    """Validate the common arguments; return the ordinal range and the format names."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"{name} must be a non-negative int, got {n!r}")
    for arg, value in (("start_year", start_year), ("end_year", end_year)):
        if not isinstance(value, int) or not 1 <= value <= 9999:
            raise ValueError(f"{arg} must be an int in [1, 9999], got {value!r}")
    if start_year > end_year:
        raise ValueError(f"start_year must be <= end_year, got {start_year} > {end_year}")
    names = list(DATE_FORMATS) if formats is None else list(formats)
    unknown = [f for f in names if f not in DATE_FORMATS]
    if not names or unknown:
        raise ValueError(f"formats must be names from {sorted(DATE_FORMATS)}, got {formats!r}")
    return date(start_year, 1, 1).toordinal(), date(end_year, 12, 31).toordinal(), names


def _pair(ordinal: int, rng: random.Random, names: list[str]) -> tuple[str, str]:
    d = date.fromordinal(ordinal)
    return DATE_FORMATS[rng.choice(names)](d), d.isoformat()


def make_date_pairs(
    n: int,
    seed: int,
    start_year: int = 1900,
    end_year: int = 2099,
    formats: Sequence[str] | None = None,
) -> list[tuple[str, str]]:
    """``n`` random (human date, ISO date) pairs, the same for the same arguments.

    Dates are uniform over the calendar days from 1 January ``start_year`` to 31 December
    ``end_year`` (so always valid, leap days included); each gets a uniformly chosen format.

    Args:
        n: Number of pairs.
        seed: Seed of the private ``random.Random`` (the global RNG is not touched).
        start_year: First year (inclusive).
        end_year: Last year (inclusive).
        formats: Names from :data:`DATE_FORMATS` to use (default: all).

    Returns:
        A list of ``(human, iso)`` string pairs, e.g. ``("22 Nov 2026", "2026-11-22")``.
    """
    lo, hi, names = _check_args(n, "n", start_year, end_year, formats)
    rng = random.Random(seed)
    return [_pair(rng.randint(lo, hi), rng, names) for _ in range(n)]


def date_split(
    n_train: int,
    n_test: int,
    seed: int,
    start_year: int = 1900,
    end_year: int = 2099,
    formats: Sequence[str] | None = None,
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Train and test pairs with disjoint *calendar dates*, so the test measures generalisation.

    The ``n_test`` test dates are distinct; training dates are drawn from the remaining days
    (with repetition, each time in a freshly chosen format).

    Args:
        n_train: Number of training pairs.
        n_test: Number of test pairs (at most the number of days in the range minus one).
        seed: Seed of the private ``random.Random``.
        start_year: First year (inclusive).
        end_year: Last year (inclusive).
        formats: Names from :data:`DATE_FORMATS` to use (default: all).

    Returns:
        ``(train, test)``, two lists of ``(human, iso)`` pairs.
    """
    lo, hi, names = _check_args(n_train, "n_train", start_year, end_year, formats)
    _check_args(n_test, "n_test", start_year, end_year, formats)
    n_days = hi - lo + 1
    if n_test >= n_days:
        raise ValueError(
            f"n_test must be smaller than the {n_days} days from {start_year} to {end_year}, "
            f"got {n_test}"
        )
    rng = random.Random(seed)
    test_days = rng.sample(range(lo, hi + 1), n_test)
    held_out = set(test_days)
    test = [_pair(o, rng, names) for o in test_days]
    if len(held_out) * 2 > n_days:  # mostly held out: draw from the explicit rest
        rest = [o for o in range(lo, hi + 1) if o not in held_out]
        train_days = [rng.choice(rest) for _ in range(n_train)]
    else:  # rejection sampling accepts at least half of the draws
        train_days = []
        while len(train_days) < n_train:
            o = rng.randint(lo, hi)
            if o not in held_out:
                train_days.append(o)
    train = [_pair(o, rng, names) for o in train_days]
    return train, test


def encode_batch(
    pairs: Sequence[tuple[str, str]],
    src_vocab: CharVocab,
    tgt_vocab: CharVocab,
    device: torch.device | str | None = None,
) -> Seq2SeqBatch:
    """Encode and pad ``(human, iso)`` pairs for teacher forcing.

    Args:
        pairs: B pairs of strings.
        src_vocab: Vocabulary of the human dates (see :func:`date_vocabs`).
        tgt_vocab: Vocabulary of the ISO dates.
        device: Where to put the tensors (default CPU).

    Shape:
        - src, src_mask: (B, S)
        - tgt_in, tgt_out, tgt_mask: (B, T), T = 11 for ISO dates (BOS/EOS + 10 characters)

    Returns:
        A :class:`~coursepkg.data.batching.Seq2SeqBatch` ``(src, tgt_in, tgt_out, src_mask,
        tgt_mask)``; ``tgt_in`` starts with BOS, ``tgt_out`` ends with EOS, masks True = real.
    """
    if len(pairs) == 0:
        raise ValueError("pairs must contain at least one (human, iso) pair, got none")
    for vocab_name, vocab in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
        if not isinstance(vocab, CharVocab):
            raise TypeError(f"{vocab_name} must be a CharVocab, got {type(vocab).__name__}")
    sources = [src_vocab.encode(human) for human, _ in pairs]
    targets = [tgt_vocab.encode(iso) for _, iso in pairs]
    return make_seq2seq_batch(sources, targets, device=device)


class DateDataset(Dataset):
    """A map-style dataset of date pairs whose :meth:`collate` pads a list of them into a batch.

    Use it as ``DataLoader(ds, batch_size=64, shuffle=True, collate_fn=ds.collate)``.

    Args:
        pairs: ``(human, iso)`` pairs, e.g. from :func:`make_date_pairs` or :func:`date_split`.
        src_vocab: Source vocabulary (default: :func:`date_vocabs`).
        tgt_vocab: Target vocabulary (default: :func:`date_vocabs`).
    """

    def __init__(
        self,
        pairs: Sequence[tuple[str, str]],
        src_vocab: CharVocab | None = None,
        tgt_vocab: CharVocab | None = None,
    ) -> None:
        default_src, default_tgt = date_vocabs()
        self.pairs = list(pairs)
        self.src_vocab = src_vocab if src_vocab is not None else default_src
        self.tgt_vocab = tgt_vocab if tgt_vocab is not None else default_tgt

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[str, str]:
        return self.pairs[index]

    def collate(self, pairs: Sequence[tuple[str, str]]) -> Seq2SeqBatch:
        """Pad a list of pairs into a :class:`~coursepkg.data.batching.Seq2SeqBatch` (CPU)."""
        return encode_batch(pairs, self.src_vocab, self.tgt_vocab)
