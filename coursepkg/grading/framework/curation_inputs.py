"""The held-out inputs of ex18_data's checks, generated from a seeded ``random.Random``: corpora
of boilerplate lines, texts to shingle, sets of known Jaccard similarity, signatures whose bands
collide, documents at each Gopher rule's bounds and texts with personal information beside what
only looks like it. Every case holds each feature a catalogued mistake changes, so that one
case tells the mistakes apart; the seed changes the words around them. Imported as
``framework.curation_inputs`` by ex18's checks only.
"""

from __future__ import annotations

import random

__all__ = [
    "EXTRA",
    "GOPHER_VISIBLE",
    "VISIBLE",
    "corpus_case",
    "email_case",
    "gopher_case",
    "ipv4_case",
    "jaccard_pair",
    "phone_case",
    "shingle_set",
    "shingles_case",
    "signatures_case",
]

#: The configurations of the text checks: a variant number only (it seeds the case).
VISIBLE = [{"variant": 0}, {"variant": 1}, {"variant": 2}]
EXTRA = [{"variant": 3}, {"variant": 4}]
#: The Gopher check's: one document at the bound of each rule.
GOPHER_VISIBLE = [{"variant": kind} for kind in range(9)]

_WORDS = (
    "river stone garden market window letter morning silver harbour candle forest "
    "village station teacher kitchen bridge winter summer museum orchard engine "
    "painter meadow library theatre lantern valley island cottage mirror"
).split()
_STOP = ["the", "and", "of", "to", "with", "that"]


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def corpus_case(rng: random.Random, variant: int) -> tuple[list[str]]:
    """A corpus: a menu line on every page (with another spacing on one), a footer twice, a
    line repeated inside one page only, blank lines, and lines of each page's own."""
    menu = f"Home | {rng.choice(_WORDS).title()} | Contact"
    footer = f"Copyright {rng.randrange(1990, 2030)} {rng.choice(_WORDS)} ltd"
    n_docs = 3 + variant % 3
    docs = []
    for d in range(n_docs):
        lines = [menu if d else menu + "  ", "", _sentence(rng, 6), "   "]
        if d == 1:
            lines += [f"Read  more   about {_WORDS[d]}", _sentence(rng, 5)]
            lines += [f"Read more about {_WORDS[d]}\t"]
        lines += [_sentence(rng, rng.randrange(4, 9)) for _ in range(rng.randrange(1, 4))]
        if d < 2:
            lines.append(footer)
        docs.append("\n".join(lines))
    return (docs,)


def shingles_case(rng: random.Random, variant: int) -> tuple[str, int]:
    """A text with capitals and punctuation (``n`` from 1 to 4), or one shorter than ``n``."""
    if variant % 3 == 2:
        return (f"{rng.choice(_WORDS).title()}, {rng.choice(_WORDS)}!", 5)
    words = [rng.choice(_WORDS) for _ in range(rng.randrange(12, 20))]
    words[0] = words[0].title()
    words[4] = words[4] + ","
    words[7] = words[7].upper() + "."
    return (" ".join(words) + " (end)", 1 + (variant + rng.randrange(3)) % 4)


def signatures_case(rng: random.Random, variant: int) -> tuple[list[list[int]], int]:
    """Signatures of K = 12 values from a small alphabet (bands often equal, sometimes in the
    wrong band), some near-copies of others."""
    bands = (3, 4, 2, 6, 4)[variant % 5]
    rows = 12 // bands
    alphabet = {1: 3, 2: 4, 3: 2, 4: 2, 6: 2}[rows]
    sigs = [[rng.randrange(alphabet) for _ in range(12)] for _ in range(8)]
    for _ in range(4):
        copy = list(rng.choice(sigs))
        for position in rng.sample(range(12), rng.randrange(2, 6)):
            copy[position] = rng.randrange(alphabet)
        sigs.append(copy)
    last = list(sigs[0])
    last[: 12 - rows] = [(v + 1) % alphabet for v in last[: 12 - rows]]
    sigs.append(last)  # equal to document 0 in the last band only
    shifted = sigs[1][rows:] + sigs[1][:rows]
    sigs.append(shifted)  # document 1's bands, each one band earlier
    return (sigs, bands)


def _words(rng: random.Random, n: int, length: int | None = None) -> list[str]:
    pool = [w for w in _WORDS if length is None or len(w) == length]
    return [rng.choice(pool) for _ in range(n)]


def _lines(words: list[str], per_line: int) -> str:
    return "\n".join(" ".join(words[i : i + per_line]) for i in range(0, len(words), per_line))


def gopher_case(rng: random.Random, variant: int) -> tuple[str]:
    """One document at a bound of a rule (the variant picks which), laid out on lines."""
    kind = variant % 9
    if kind == 0:  # exactly 50 words on 5 lines, two stop words
        words = _words(rng, 48) + ["The", "and,"]
        rng.shuffle(words)
        return (_lines(words, 10),)
    if kind == 1:  # mean word length exactly 3
        return (_lines(["the", "cat", "and", "dog", "sat", "ran"] * 10, 12),)
    if kind == 2:  # mean word length exactly 10: 10-letter words, "the" beside 17 letters
        words = ["lighthouse", "bridgework"] * 27 + ["the", "wonderfulnessness"] * 2
        return (_lines(words, 8),)
    if kind == 3:  # hash marks as words: 7 in 61 words is over 10% (\w+ runs lose them)
        words = _words(rng, 51) + ["the", "of", "and"] + ["#"] * 7
        rng.shuffle(words)
        return (_lines(words, 10),)
    if kind == 4:  # bullets on 10 of 11 lines, with blank lines between them
        lines = [f"- {_sentence(rng, 6)} the" for _ in range(10)] + [_sentence(rng, 6)]
        return ("\n\n".join(lines),)
    if kind == 5:  # 4 of 11 lines end with an ellipsis, blank lines between
        lines = [_sentence(rng, 7) + (" and..." if i < 4 else " of") for i in range(11)]
        return ("\n\n\n".join(lines),)
    if kind == 6:  # stop words only capitalised or with punctuation
        words = _words(rng, 56) + ["The", "with,", "(of"]
        rng.shuffle(words)
        return (_lines(words, 11),)
    if kind == 7:  # numbers: a quarter of the words have no letter
        words = _words(rng, 42) + [str(rng.randrange(100, 999)) for _ in range(16)] + _STOP[:2]
        rng.shuffle(words)
        return (_lines(words, 10),)
    words = _words(rng, rng.randrange(40, 70)) + rng.sample(_STOP, 3)  # near the word count
    return (_lines(words, rng.randrange(6, 14)),)


def _local(rng: random.Random) -> str:
    return rng.choice(_WORDS)


def _parts(text: str) -> list[tuple[str]]:
    """A text's clauses (split at "; "), each a case of its own."""
    return [(part,) for part in text.split("; ")]


def email_case(rng: random.Random, variant: int) -> list[tuple[str]]:
    """Addresses with a dotted local part, a plus sign and subdomains, in punctuation, beside
    an @ that is no address."""
    dotted = f"{_local(rng)}.{_local(rng)}@{_local(rng)}.com"
    plus = f"{_local(rng)}+news@{_local(rng)}.org"
    deep = f"{_local(rng)}_{rng.randrange(99)}@mail.{_local(rng)}.co.uk"
    return _parts(
        f"Write to {dotted}.; For the list use <{plus}>; (or {deep}); "
        f"follow @{_local(rng)} and meet at the {_local(rng)} @ 5pm."
    )


def phone_case(rng: random.Random, variant: int) -> list[tuple[str]]:
    """Every format of a number beside a date, a time, a price and a longer number."""

    def digits(n: int) -> str:
        return "".join(str(rng.randrange(10)) for _ in range(n))

    numbers = [
        f"({digits(3)}) {digits(3)}-{digits(4)}",
        f"{digits(3)}-{digits(3)}-{digits(4)}",
        f"{digits(3)}.{digits(3)}.{digits(4)}",
        f"+1 {digits(3)} {digits(3)} {digits(4)}",
        digits(10),
    ]
    rng.shuffle(numbers)
    date = f"{rng.randrange(1990, 2030)}-{rng.randrange(10, 13)}-{rng.randrange(10, 29)}"
    return _parts(
        f"Call {numbers[0]} or {numbers[1]}; fax {numbers[2]}.; Since {date},; at "
        f"{rng.randrange(10, 24)}:30, for $1,{digits(3)}.{digits(2)}; order "
        f"{digits(14)}; home {numbers[3]}, office {numbers[4]}."
    )


def ipv4_case(rng: random.Random, variant: int) -> list[tuple[str]]:
    """Addresses at the octets' bounds beside 999.x, 256.x and a three-octet version."""

    def octet() -> int:
        return rng.choice([0, 9, 10, 99, 100, 199, 200, 249, 250, 255, rng.randrange(256)])

    good = ".".join(str(octet()) for _ in range(4))
    other = f"{rng.randrange(1, 224)}.{octet()}.{octet()}.{octet()}"
    return _parts(
        f"Host {good} answered, {other} did not; 999.{octet()}.1.1 is none; "
        f"256.{octet()}.{octet()}.{octet()} is none; version {rng.randrange(9)}.2.3 is none."
    )


def shingle_set(rng: random.Random, size: int) -> set[str]:
    """``size`` distinct made-up shingles."""
    items: set[str] = set()
    while len(items) < size:
        items.add(f"{rng.choice(_WORDS)} {rng.randrange(10**6)} {rng.choice(_WORDS)}")
    return items


def jaccard_pair(rng: random.Random, k: int) -> tuple[set[str], set[str], float, int, int]:
    """Two sets of Jaccard similarity J in [0.15, 0.85], a signature length and a seed; K J
    (1 - J) >= 8 keeps each pair's count near its normal approximation."""
    common = rng.randrange(6, 25)
    only_a, only_b = rng.randrange(3, 12), rng.randrange(3, 12)
    union = common + only_a + only_b
    while not 0.15 <= common / union <= 0.85 or k * common * (union - common) < 8 * union**2:
        common = rng.randrange(6, 25)
        union = common + only_a + only_b
    everything = sorted(shingle_set(rng, union))
    rng.shuffle(everything)
    a = set(everything[: common + only_a])
    b = set(everything[:common]) | set(everything[common + only_a :])
    return a, b, common / union, k, rng.randrange(1 << 30)
