"""Assignment ex18_data: cleaning a web corpus before training on it (the steps of
:mod:`coursepkg.curation`, see ``docs/curation.md``): exact line deduplication, MinHash
signatures over word n-grams and locality-sensitive banding (Broder 1997; Leskovec, Rajaraman
and Ullman, *Mining of Massive Datasets*, chapter 3), the Gopher quality rules (Rae et al. 2021,
appendix A.1.1) and masks for e-mail addresses, phone numbers and IPv4 addresses.

Dimension legend: K signature length (hash functions), b bands, r rows per band (b * r = K).
"""

from __future__ import annotations

import re  # noqa: F401  (you will need it)
import unicodedata  # noqa: F401  (you will need it)
from collections.abc import Sequence

#: What each mask writes in place of what it hides.
EMAIL_TOKEN = "|||EMAIL_ADDRESS|||"
PHONE_TOKEN = "|||PHONE_NUMBER|||"
IP_TOKEN = "|||IP_ADDRESS|||"

#: The names of the Gopher rules, in the order :func:`gopher_failures` checks them.
GOPHER_RULE_NAMES = (
    "word_count",
    "mean_word_length",
    "symbol_ratio",
    "bullet_lines",
    "ellipsis_lines",
    "alphabetic_words",
    "stop_words",
)

#: Gopher's stop words: a document must hold at least two of them (counted with repeats).
STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})


def exact_line_dedup(documents: list[str]) -> list[str]:
    """Remove every copy of each line that occurs more than once in the whole corpus.

    Two lines are the same when their normalised forms are equal: Unicode NFKC
    (``unicodedata.normalize("NFKC", line)``), then every run of whitespace made one space and
    both ends stripped (``" ".join(line.split())``). Every copy of a repeated line goes (a site's
    menu leaves no trace), including copies inside one document. Blank lines (empty or only
    whitespace) are never removed. Split documents with ``str.splitlines()`` and join the lines
    you keep with ``"\\n"``.

    Args:
        documents: the corpus, one string per document.

    Returns:
        The documents in the same order, each without its repeated lines.
    """
    raise NotImplementedError


def word_shingles(text: str, n: int) -> set[str]:
    """The set of word n-grams of ``text``, the items MinHash compares.

    Normalise first: lower case (``str.casefold``), every character that is neither a letter,
    a digit, ``_`` nor whitespace replaced by a space (``re.sub(r"[^\\w\\s]", " ", text)``),
    then split on whitespace into words. A shingle is ``n`` consecutive words joined by one
    space. A text of ``n`` words or fewer gives one shingle (all its words); no words, no
    shingle. (The course's version also removes accents; the check's texts have none.)

    Args:
        text: a document.
        n: the shingle length in words, at least 1.

    Returns:
        The set of shingles.
    """
    raise NotImplementedError


def minhash_signature(items: set[str], num_perm: int, seed: int) -> list[int]:
    """The MinHash signature of a set: for each of ``num_perm`` hash functions, its smallest
    value over the items.

    Draw the ``num_perm`` hash functions from ``seed`` (the same seed gives the same functions,
    another seed other ones). Any family that behaves like random functions will do, e.g.
    h_i(x) = ((a_i * x + b_i) mod p) mod 2^32 with p = 2^61 - 1, random a_i, b_i and x a 32-bit
    hash of the shingle (``hashlib``: never Python's ``hash``, which changes between runs).
    Every value must be an integer in [0, 2^32). Two sets agree at one position with
    probability equal to their Jaccard similarity |A & B| / |A | B|.

    Args:
        items: a non-empty set of shingles.
        num_perm: K, the number of hash functions.
        seed: the seed the hash functions are drawn from.

    Shape:
        returns K integers.

    Returns:
        The signature, a list of ``num_perm`` integers.
    """
    raise NotImplementedError


def lsh_candidate_pairs(signatures: Sequence[Sequence[int]], bands: int) -> set[tuple[int, int]]:
    """Locality-sensitive hashing: the pairs of documents that agree on at least one whole band.

    Split each signature into ``bands`` bands of r = K / bands consecutive rows (band 0 is rows
    0 to r - 1, band 1 rows r to 2r - 1, ...; together they cover each row exactly once).
    Documents i and j are candidates when, for some band, their r values in that band are all
    equal. Equal values in two *different* bands do not count.

    Args:
        signatures: one signature per document, all of the same length K.
        bands: b, which divides K.

    Shape:
        signatures (N, K).

    Returns:
        The candidate pairs as ``(i, j)`` with i < j (indices into ``signatures``).
    """
    raise NotImplementedError


def gopher_failures(text: str) -> list[str]:
    """The Gopher rules that ``text`` breaks (names from :data:`GOPHER_RULE_NAMES`).

    A *word* is a whitespace-separated piece of the text (``text.split()``), punctuation
    included: not a tokenizer's token, not a regular expression's ``\\w+`` run. A *line* is a
    piece of ``text.splitlines()``; the line rules count non-empty lines only (``line.strip()``
    not empty). A document fails:

    - ``word_count``: fewer than 50 or more than 100,000 words;
    - ``mean_word_length``: a mean word length (characters) outside 3 to 10, bounds included
      (3.0 and 10.0 pass; no words fails);
    - ``symbol_ratio``: more than 0.1 per word of hash marks ``#`` and ellipses (``...`` or
      ``\\u2026``), counted inside the words;
    - ``bullet_lines``: more than 90% of the non-empty lines start (after stripping) with
      ``*``, ``-`` or ``\\u2022``;
    - ``ellipsis_lines``: more than 30% of the non-empty lines end (after stripping) with
      ``...`` or ``\\u2026``;
    - ``alphabetic_words``: fewer than 80% of the words hold at least one letter
      (``str.isalpha`` on some character);
    - ``stop_words``: fewer than two words that are stop words (:data:`STOP_WORDS`) once lower
      cased and stripped of the punctuation ``.,;:!?"'()`` at their ends.

    Args:
        text: a document.

    Returns:
        The names of the rules it breaks, in any order; empty when it passes them all.
    """
    raise NotImplementedError


def mask_emails(text: str) -> tuple[str, int]:
    """Replace every e-mail address with :data:`EMAIL_TOKEN`.

    An address is a local part (letters, digits and ``. _ % + -``), ``@``, and a domain: labels
    of letters, digits and ``-`` separated by dots, the last one (the top-level domain) of two
    letters or more. Punctuation around it (a full stop, brackets) is not part of it.

    Args:
        text: any text.

    Returns:
        The masked text and the number of addresses replaced.
    """
    raise NotImplementedError


def mask_phone_numbers(text: str) -> tuple[str, int]:
    """Replace every North American phone number with :data:`PHONE_TOKEN`.

    An optional ``+1`` or ``1`` (then a space, dot, hyphen or nothing), a 3-digit area code
    bare or in brackets, then 3 and 4 digits, the groups separated by a space, a dot, a hyphen
    or nothing: ``(555) 123-4567``, ``555-123-4567``, ``555.123.4567``, ``5551234567``,
    ``+1 555 123 4567``. A number is not part of a longer run of digits or hyphens: dates
    (``2026-11-29``, ``29/11/2026``), times, prices and longer numbers stay as they are.

    Args:
        text: any text.

    Returns:
        The masked text and the number of phone numbers replaced.
    """
    raise NotImplementedError


def mask_ipv4(text: str) -> tuple[str, int]:
    """Replace every IPv4 address with :data:`IP_TOKEN`.

    Four octets separated by dots, each a number from 0 to 255 written without a leading zero;
    ``999.1.1.1`` or ``256.1.1.1`` is no address, and no part of it is masked either (the
    address is not part of a longer dotted run of digits).

    Args:
        text: any text.

    Returns:
        The masked text and the number of addresses replaced.
    """
    raise NotImplementedError
