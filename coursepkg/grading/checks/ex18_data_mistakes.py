"""The catalogue of ex18_data: the known mistakes of exact line deduplication, word shingles,
MinHash signatures, LSH banding, the Gopher rules and the three PII masks. Each is a wrong
function with the stub's signature, its id, and the story and advice a student reads when their
output behaves as it does (the check reruns it on the student's inputs; MinHash's are named by
what any hash family would show: a union's signature, a seed's effect).

Dimension legend: K signature length, b bands, r rows per band.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Sequence

from ...curation.dedup import MERSENNE_PRIME, hash32, normalise_line
from ...curation.gopher import GOPHER_RULES, STOP_WORDS
from ...curation.pii import EMAIL_TOKEN, IP_TOKEN, PHONE_TOKEN
from ..framework import BugVariant

__all__ = [
    "BUGS",
    "EMAIL_BUGS",
    "EMAIL_ITEM",
    "GOPHER_BUGS",
    "GOPHER_ITEM",
    "IPV4_BUGS",
    "IPV4_ITEM",
    "LINE_DEDUP_BUGS",
    "LINE_DEDUP_ITEM",
    "LSH_BUGS",
    "LSH_ITEM",
    "MINHASH_BUGS",
    "MINHASH_ITEM",
    "PHONE_BUGS",
    "PHONE_ITEM",
    "SHINGLES_BUGS",
    "SHINGLES_ITEM",
]

LINE_DEDUP_ITEM = "exact_line_dedup"
SHINGLES_ITEM = "word_shingles"
MINHASH_ITEM = "minhash_signature"
LSH_ITEM = "lsh_candidate_pairs"
GOPHER_ITEM = "gopher_failures"
EMAIL_ITEM = "mask_emails"
PHONE_ITEM = "mask_phone_numbers"
IPV4_ITEM = "mask_ipv4"


def _drop_repeated(documents: list[str], repeated: Callable[[str, int], bool]) -> list[str]:
    """Keep the lines for which ``repeated(line, index_of_its_document)`` is False."""
    return [
        "\n".join(line for line in doc.splitlines() if not repeated(line, index))
        for index, doc in enumerate(documents)
    ]


def line_dedup_raw_lines(documents: list[str]) -> list[str]:
    """Lines compared as written: trailing spaces or a double space make a copy look new."""
    counts = Counter(line for doc in documents for line in doc.splitlines() if line.strip())
    return _drop_repeated(documents, lambda line, _: bool(line.strip()) and counts[line] > 1)


def line_dedup_keeps_first(documents: list[str]) -> list[str]:
    """The first copy of each repeated line is kept, the later ones removed."""
    seen: set[str] = set()
    out = []
    for doc in documents:
        lines = []
        for line in doc.splitlines():
            key = normalise_line(line)
            if key and key in seen:
                continue
            seen.add(key)
            lines.append(line)
        out.append("\n".join(lines))
    return out


def line_dedup_drops_blank_lines(documents: list[str]) -> list[str]:
    """Blank lines count as lines like any other, so every blank line that repeats goes."""
    counts = Counter(normalise_line(line) for doc in documents for line in doc.splitlines())
    return _drop_repeated(documents, lambda line, _: counts[normalise_line(line)] > 1)


def line_dedup_within_document(documents: list[str]) -> list[str]:
    """Lines are counted in each document alone: boilerplate shared by pages stays."""
    counts = [Counter(normalise_line(line) for line in doc.splitlines()) for doc in documents]

    def repeated(line: str, index: int) -> bool:
        return bool(line.strip()) and counts[index][normalise_line(line)] > 1

    return _drop_repeated(documents, repeated)


LINE_DEDUP_BUGS: list[BugVariant] = [
    BugVariant(
        "line_dedup.raw_lines",
        LINE_DEDUP_ITEM,
        "lines are compared as they are written, so a copy with a trailing space, a tab or a "
        "double space counts as a new line and stays",
        "Compare normalised lines: unicodedata.normalize('NFKC', line), then "
        "' '.join(line.split()).",
        line_dedup_raw_lines,
    ),
    BugVariant(
        "line_dedup.keeps_first",
        LINE_DEDUP_ITEM,
        "the first copy of each repeated line is kept and only the later ones removed, so a "
        "site's boilerplate survives once (and which copy survives depends on the order)",
        "Count each normalised line over the whole corpus first, then drop every line whose "
        "count is above 1, the first copy too.",
        line_dedup_keeps_first,
    ),
    BugVariant(
        "line_dedup.drops_blank_lines",
        LINE_DEDUP_ITEM,
        "blank lines are counted like the others, so the empty lines between paragraphs are "
        "removed as duplicates",
        "Keep every line whose strip() is empty, whatever its count.",
        line_dedup_drops_blank_lines,
    ),
    BugVariant(
        "line_dedup.within_document",
        LINE_DEDUP_ITEM,
        "lines are counted within each document alone, so a line that repeats across documents "
        "(a menu on every page) is kept",
        "Count the lines of all the documents together before removing any.",
        line_dedup_within_document,
    ),
]


def _grams(words: Sequence[str], n: int, stop: int) -> set[str]:
    if len(words) <= n:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i : i + n]) for i in range(stop)}


def shingles_of_characters(text: str, n: int) -> set[str]:
    """Character n-grams of the normalised text instead of word n-grams."""
    flat = " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())
    return {flat[i : i + n] for i in range(max(len(flat) - n + 1, 1))} if flat else set()


def shingles_case_kept(text: str, n: int) -> set[str]:
    """Words keep their capitals: "The cat" and "the cat" are different shingles."""
    words = re.sub(r"[^\w\s]", " ", text).split()
    return _grams(words, n, len(words) - n + 1)


def shingles_punctuation_kept(text: str, n: int) -> set[str]:
    """Words keep their punctuation: "cat," and "cat" are different words."""
    words = text.casefold().split()
    return _grams(words, n, len(words) - n + 1)


def shingles_last_missing(text: str, n: int) -> set[str]:
    """The window stops one word early, so the last shingle is missing."""
    words = re.sub(r"[^\w\s]", " ", text.casefold()).split()
    return _grams(words, n, len(words) - n)


def shingles_short_text_empty(text: str, n: int) -> set[str]:
    """A text of fewer than n words gives no shingle at all."""
    words = re.sub(r"[^\w\s]", " ", text.casefold()).split()
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


SHINGLES_BUGS: list[BugVariant] = [
    BugVariant(
        "shingles.characters",
        SHINGLES_ITEM,
        "the shingles are n characters long, not n words: near-duplicate detection then "
        "measures shared spellings rather than shared phrases",
        "Split the normalised text into words (str.split()) and join n consecutive words.",
        shingles_of_characters,
    ),
    BugVariant(
        "shingles.case_kept",
        SHINGLES_ITEM,
        "the text is not lower-cased, so a sentence that starts a line in one copy and follows "
        "a comma in another gives different shingles",
        "Lower-case the text first: text.casefold().",
        shingles_case_kept,
    ),
    BugVariant(
        "shingles.punctuation_kept",
        SHINGLES_ITEM,
        "punctuation stays attached to the words, so 'cat,' and 'cat' differ",
        "Replace every character that is not a letter, digit, _ or space by a space: "
        "re.sub(r'[^\\w\\s]', ' ', text), then split.",
        shingles_punctuation_kept,
    ),
    BugVariant(
        "shingles.last_missing",
        SHINGLES_ITEM,
        "the window stops one word early and the last n-gram of the text is missing",
        "A text of W words has W - n + 1 windows: range(len(words) - n + 1).",
        shingles_last_missing,
    ),
    BugVariant(
        "shingles.short_text_empty",
        SHINGLES_ITEM,
        "a text of fewer than n words gives an empty set, so two short documents never match",
        "When there are n words or fewer, return the one shingle made of all of them.",
        shingles_short_text_empty,
    ),
]


def _family(num_perm: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randrange(1, 1 << 32), rng.randrange(0, 1 << 32)) for _ in range(num_perm)]


def _hash_values(items: set[str], a: int, b: int) -> list[int]:
    return [((a * hash32(item) + b) % MERSENNE_PRIME) & 0xFFFFFFFF for item in items]


def minhash_max(items: set[str], num_perm: int, seed: int) -> list[int]:
    """Each hash function keeps its largest value over the items, not its smallest."""
    return [max(_hash_values(items, a, b)) for a, b in _family(num_perm, seed)]


def minhash_one_function(items: set[str], num_perm: int, seed: int) -> list[int]:
    """The same hash function is used K times, so all K values are equal."""
    a, b = _family(1, seed)[0]
    return [min(_hash_values(items, a, b))] * num_perm


def minhash_seed_ignored(items: set[str], num_perm: int, seed: int) -> list[int]:
    """The hash functions are drawn from a fixed seed, whatever ``seed`` says."""
    return [min(_hash_values(items, a, b)) for a, b in _family(num_perm, 0)]


def minhash_few_values(items: set[str], num_perm: int, seed: int) -> list[int]:
    """Each hash function takes 16 values only (mod 16), so unrelated shingles tie at the
    minimum and two sets agree more often than their similarity says."""
    return [min(v % 16 for v in _hash_values(items, a, b)) for a, b in _family(num_perm, seed)]


MINHASH_BUGS: list[BugVariant] = [
    BugVariant(
        "minhash.max_not_min",
        MINHASH_ITEM,
        "each hash function keeps its largest value over the items: the signature of a union "
        "A | B is then the elementwise maximum of the two signatures instead of their minimum",
        "Keep the smallest value of each hash function: min over the items.",
        minhash_max,
    ),
    BugVariant(
        "minhash.one_function",
        MINHASH_ITEM,
        "the K positions use one and the same hash function, so every value of a signature is "
        "equal and two sets either agree everywhere or nowhere: the estimate is 0 or 1",
        "Draw K different hash functions (K pairs a_i, b_i) and keep one minimum per function.",
        minhash_one_function,
    ),
    BugVariant(
        "minhash.seed_ignored",
        MINHASH_ITEM,
        "the hash functions do not depend on the seed: every seed gives the same signature",
        "Draw the coefficients from random.Random(seed) (or another generator seeded with seed).",
        minhash_seed_ignored,
    ),
    BugVariant(
        "minhash.small_range",
        MINHASH_ITEM,
        "the hash values take only a few distinct values, so different shingles collide and "
        "the estimated similarities come out too high",
        "Hash each shingle to 32 bits at least and keep (a x + b) mod p mod 2^32 with a large "
        "prime p.",
        minhash_few_values,
    ),
]


def _pairs(signatures: Sequence[Sequence[int]], windows: list[tuple[int, int]], keyed: bool):
    buckets: dict[tuple, list[int]] = {}
    for index, sig in enumerate(signatures):
        for band, (start, stop) in enumerate(windows):
            values = tuple(int(v) for v in sig[start:stop])
            buckets.setdefault((band, values) if keyed else values, []).append(index)
    return {(i, j) for group in buckets.values() for i in group for j in group if i < j}


def lsh_overlapping_bands(signatures: Sequence[Sequence[int]], bands: int) -> set[tuple[int, int]]:
    """Band i starts at row i (a sliding window), so the bands overlap and leave rows out."""
    rows = len(signatures[0]) // bands
    return _pairs(signatures, [(i, i + rows) for i in range(bands)], True)


def lsh_rows_bands_swapped(signatures: Sequence[Sequence[int]], bands: int) -> set[tuple[int, int]]:
    """``bands`` is used as the number of rows per band (K / b bands of b rows)."""
    k = len(signatures[0])
    return _pairs(signatures, [(i * bands, (i + 1) * bands) for i in range(k // bands)], True)


def lsh_last_band_dropped(signatures: Sequence[Sequence[int]], bands: int) -> set[tuple[int, int]]:
    """The loop stops one band early, so the last r rows are never compared."""
    rows = len(signatures[0]) // bands
    return _pairs(signatures, [(i * rows, (i + 1) * rows) for i in range(bands - 1)], True)


def lsh_band_index_ignored(signatures: Sequence[Sequence[int]], bands: int) -> set[tuple[int, int]]:
    """A band is keyed by its values alone, so equal values in two different bands match."""
    rows = len(signatures[0]) // bands
    return _pairs(signatures, [(i * rows, (i + 1) * rows) for i in range(bands)], False)


def lsh_all_bands(signatures: Sequence[Sequence[int]], bands: int) -> set[tuple[int, int]]:
    """A pair is a candidate only when every band agrees (the whole signature is equal)."""
    return _pairs(signatures, [(0, len(signatures[0]))], True)


LSH_BUGS: list[BugVariant] = [
    BugVariant(
        "lsh.overlapping_bands",
        LSH_ITEM,
        "band i starts at row i instead of row i * r: the bands overlap and the last rows are "
        "in no band, so the bands do not partition the signature",
        "Band i is signature[i * r : (i + 1) * r] with r = K // bands.",
        lsh_overlapping_bands,
    ),
    BugVariant(
        "lsh.rows_bands_swapped",
        LSH_ITEM,
        "the number of bands is used as the number of rows per band (K / b bands of b rows), "
        "which moves the threshold of the S-curve 1 - (1 - s^r)^b",
        "r = K // bands rows per band, and bands bands.",
        lsh_rows_bands_swapped,
    ),
    BugVariant(
        "lsh.last_band_dropped",
        LSH_ITEM,
        "the last band is never compared, so a pair that agrees only there is missed and the "
        "bands do not cover the signature",
        "Loop over range(bands): band bands - 1 ends at row K.",
        lsh_last_band_dropped,
    ),
    BugVariant(
        "lsh.band_index_ignored",
        LSH_ITEM,
        "a band is bucketed by its values alone, so band 0 of one document and band 3 of "
        "another make a pair when their values happen to be equal",
        "Key each bucket by (band index, the band's values).",
        lsh_band_index_ignored,
    ),
    BugVariant(
        "lsh.all_bands",
        LSH_ITEM,
        "a pair is a candidate only when all bands agree (AND): LSH asks for any band (OR), "
        "which is what makes similar, not only identical, documents candidates",
        "Make (i, j) a candidate as soon as one band's values are equal.",
        lsh_all_bands,
    ),
]


def _failures(words: list[str], lines: list[str], **changed: Callable[..., bool]) -> list[str]:
    rules = {**GOPHER_RULES, **changed}
    return [name for name, fails in rules.items() if fails(words, lines)]


def gopher_regex_words(text: str) -> list[str]:
    """The rules run on ``\\w+`` runs (tokens), not on whitespace-separated words."""
    return _failures(re.findall(r"\w+", text), text.splitlines())


def gopher_split_on_space(text: str) -> list[str]:
    """Words are ``text.split(" ")``: newlines glue words together and double spaces add
    empty words."""
    return _failures(text.split(" "), text.splitlines())


def gopher_mean_length_exclusive(text: str) -> list[str]:
    """The mean-word-length rule excludes its bounds: a mean of exactly 3 or 10 fails."""

    def rule(words: list[str], lines: list[str]) -> bool:
        return not 3 < (sum(map(len, words)) / len(words) if words else 0.0) < 10

    return _failures(text.split(), text.splitlines(), mean_word_length=rule)


def gopher_word_count_exclusive(text: str) -> list[str]:
    """The word-count rule excludes its bounds: a document of exactly 50 words fails."""
    rule = lambda words, lines: not 50 < len(words) < 100_000  # noqa: E731
    return _failures(text.split(), text.splitlines(), word_count=rule)


def _over_all_lines(lines: list[str], marked: Callable[[str], bool], share: float) -> bool:
    return bool(lines) and sum(marked(line.strip()) for line in lines) > share * len(lines)


def gopher_blank_lines_counted(text: str) -> list[str]:
    """The line rules divide by all the lines, blank ones included."""
    bullets = lambda line: line.startswith(("*", "-", "\u2022"))  # noqa: E731
    ellipses = lambda line: line.endswith(("...", "\u2026"))  # noqa: E731
    return _failures(
        text.split(),
        text.splitlines(),
        bullet_lines=lambda words, lines: _over_all_lines(lines, bullets, 0.9),
        ellipsis_lines=lambda words, lines: _over_all_lines(lines, ellipses, 0.3),
    )


def gopher_stop_words_exact(text: str) -> list[str]:
    """A stop word counts only as written: "The" and "the," are not counted."""
    rule = lambda words, lines: sum(word in STOP_WORDS for word in words) < 2  # noqa: E731
    return _failures(text.split(), text.splitlines(), stop_words=rule)


GOPHER_BUGS: list[BugVariant] = [
    BugVariant(
        "gopher.tokens_not_words",
        GOPHER_ITEM,
        "the rules run on \\w+ runs (tokens) instead of whitespace-separated words: '#', '...' "
        "and the punctuation vanish, so the counts, the mean length and the symbol ratio change",
        "Take the words as text.split(): punctuation stays part of its word, as in the paper.",
        gopher_regex_words,
    ),
    BugVariant(
        "gopher.split_on_space",
        GOPHER_ITEM,
        "the words are text.split(' '): words on either side of a newline are glued together "
        "and every double space adds an empty word",
        "Use text.split() without an argument: it splits on any whitespace and drops empties.",
        gopher_split_on_space,
    ),
    BugVariant(
        "gopher.mean_length_exclusive",
        GOPHER_ITEM,
        "the mean-word-length rule excludes its bounds, so a mean of exactly 3 or 10 characters "
        "fails when it should pass",
        "A document passes when 3 <= mean <= 10 (bounds included).",
        gopher_mean_length_exclusive,
    ),
    BugVariant(
        "gopher.word_count_exclusive",
        GOPHER_ITEM,
        "the word-count rule excludes its bounds, so a document of exactly 50 words fails",
        "A document passes when 50 <= number of words <= 100,000.",
        gopher_word_count_exclusive,
    ),
    BugVariant(
        "gopher.blank_lines_counted",
        GOPHER_ITEM,
        "the bullet and ellipsis ratios divide by every line, blank ones included, so spacing "
        "between lines hides a page of bullets",
        "Count only the non-empty lines (line.strip() != '') in both the numerator and the "
        "denominator.",
        gopher_blank_lines_counted,
    ),
    BugVariant(
        "gopher.stop_words_exact",
        GOPHER_ITEM,
        "a stop word is counted only as written, so 'The' and 'the,' do not count",
        "Lower-case each word and strip the punctuation .,;:!?\"'() from its ends before "
        "looking it up.",
        gopher_stop_words_exact,
    ),
]


_DOMAIN = r"@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"


def email_no_dots(text: str) -> tuple[str, int]:
    """The local part has no dots: jane.doe@x.org loses only doe@x.org."""
    return re.subn(r"[A-Za-z0-9_%+-]+" + _DOMAIN, EMAIL_TOKEN, text)


def email_no_plus(text: str) -> tuple[str, int]:
    """The local part has no plus sign: jane+news@x.org loses only news@x.org."""
    return re.subn(r"[A-Za-z0-9._%-]+" + _DOMAIN, EMAIL_TOKEN, text)


def email_one_level_domain(text: str) -> tuple[str, int]:
    """The domain is one label and a top-level domain: mail.example.co.uk is cut short."""
    return re.subn(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+\.[A-Za-z]{2,}", EMAIL_TOKEN, text)


def phone_eats_dates(text: str) -> tuple[str, int]:
    """Any run of 9 or more digits and separators is a phone number, dates included."""
    return re.subn(r"\+?\d[\d ().-]{7,}\d", PHONE_TOKEN, text)


def phone_no_brackets(text: str) -> tuple[str, int]:
    """An area code in brackets is not recognised: (555) 123-4567 stays."""
    pattern = r"(?<![\w+-])(?:\+?1[ .-]?)?\d{3}[ .-]?\d{3}[ .-]?\d{4}(?![\w-])"
    return re.subn(pattern, PHONE_TOKEN, text)


def phone_inside_longer_numbers(text: str) -> tuple[str, int]:
    """No guard on either side: ten digits inside a longer number are masked."""
    pattern = r"(?:\+?1[ .-]?)?(?:\(\d{3}\) ?|\d{3}[ .-]?)\d{3}[ .-]?\d{4}"
    return re.subn(pattern, PHONE_TOKEN, text)


def ipv4_any_octet(text: str) -> tuple[str, int]:
    """Any one to three digits make an octet, so 999.1.1.1 is an address."""
    return re.subn(r"(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?!\.?\d)", IP_TOKEN, text)


def ipv4_inside_longer(text: str) -> tuple[str, int]:
    """The octets are right but nothing guards the ends: 256.1.1.1 loses 56.1.1.1."""
    octet = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
    return re.subn(rf"{octet}(?:\.{octet}){{3}}", IP_TOKEN, text)


EMAIL_BUGS: list[BugVariant] = [
    BugVariant(
        "email.no_dots",
        EMAIL_ITEM,
        "the local part leaves out the dot, so jane.doe@example.com is masked from 'doe' on and "
        "'jane.' stays in the text",
        "Allow . in the local part: [A-Za-z0-9._%+-]+ before the @.",
        email_no_dots,
    ),
    BugVariant(
        "email.no_plus",
        EMAIL_ITEM,
        "the local part leaves out the plus sign, so jane+news@example.com keeps 'jane+'",
        "Allow + in the local part: [A-Za-z0-9._%+-]+ before the @.",
        email_no_plus,
    ),
    BugVariant(
        "email.one_level_domain",
        EMAIL_ITEM,
        "the domain is one label and a top-level domain, so an address at mail.example.co.uk "
        "is cut after 'mail.example' and the rest of the domain stays",
        "Allow several dotted labels: @[A-Za-z0-9-]+(?:\\.[A-Za-z0-9-]+)*\\.[A-Za-z]{2,}.",
        email_one_level_domain,
    ),
]

PHONE_BUGS: list[BugVariant] = [
    BugVariant(
        "phone.eats_dates",
        PHONE_ITEM,
        "any long run of digits and separators counts as a phone number, so dates such as "
        "2026-11-29 and long order numbers are masked too",
        "Match the groups exactly: an optional +1, 3 digits (or (3 digits)), 3, then 4 digits, "
        "with no digit or hyphen on either side: (?<![\\w+-]) ... (?![\\w-]).",
        phone_eats_dates,
    ),
    BugVariant(
        "phone.no_brackets",
        PHONE_ITEM,
        "an area code in brackets is not recognised, so (555) 123-4567 stays in the text",
        "Accept either \\(\\d{3}\\) ? or \\d{3}[ .-]? for the area code.",
        phone_no_brackets,
    ),
    BugVariant(
        "phone.inside_longer_numbers",
        PHONE_ITEM,
        "nothing guards the ends of the match, so ten digits inside a longer number (an order "
        "or account number) are masked as a phone number",
        "Refuse a digit, letter or hyphen just before or after: (?<![\\w+-]) and (?![\\w-]).",
        phone_inside_longer_numbers,
    ),
]

IPV4_BUGS: list[BugVariant] = [
    BugVariant(
        "ipv4.any_octet",
        IPV4_ITEM,
        "an octet is any one to three digits, so 999.1.1.1 is masked although no address has "
        "an octet above 255",
        "Match an octet as 25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d.",
        ipv4_any_octet,
    ),
    BugVariant(
        "ipv4.inside_longer",
        IPV4_ITEM,
        "nothing guards the ends of the match, so inside 256.1.1.1 the valid-looking 56.1.1.1 "
        "is masked and the '2' stays",
        "Refuse a digit or dot just before and after the address: (?<![\\d.]) and (?!\\.?\\d).",
        ipv4_inside_longer,
    ),
]

BUGS: list[BugVariant] = [
    *LINE_DEDUP_BUGS,
    *SHINGLES_BUGS,
    *MINHASH_BUGS,
    *LSH_BUGS,
    *GOPHER_BUGS,
    *EMAIL_BUGS,
    *PHONE_BUGS,
    *IPV4_BUGS,
]
