"""Checks of ex18_data: exact line deduplication, word shingles, the Gopher rules and the PII
masks compared with :mod:`coursepkg.curation` exactly on generated held-out texts; LSH banding
compared with :func:`~coursepkg.curation.dedup.band_keys`'s pairs; MinHash, where any hash
family is right, by what every correct family shares (the signature of a union is the
elementwise minimum, a seed changes the functions) and by a chi-square test that the
agreements of pairs of known Jaccard similarity J follow Binomial(K, J). The catalogue of
mistakes they recognise is in :mod:`.ex18_data_mistakes`.

Dimension legend: K signature length, b bands, N documents.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ...curation import dedup, gopher, pii
from ..framework import (
    BugVariant,
    CheckReport,
    ChiSquare,
    call_student,
    configs,
    forbidden_calls,
    public_check,
    register_configs,
)
from ..framework import curation_inputs as inputs
from .ex18_data_mistakes import (
    EMAIL_BUGS,
    EMAIL_ITEM,
    GOPHER_BUGS,
    GOPHER_ITEM,
    IPV4_BUGS,
    IPV4_ITEM,
    LINE_DEDUP_BUGS,
    LINE_DEDUP_ITEM,
    LSH_BUGS,
    LSH_ITEM,
    MINHASH_BUGS,
    MINHASH_ITEM,
    PHONE_BUGS,
    PHONE_ITEM,
    SHINGLES_BUGS,
    SHINGLES_ITEM,
)

__all__ = [
    "MINHASH_ALPHA",
    "binomial_agreement",
    "check_exact_line_dedup",
    "check_gopher_failures",
    "check_lsh_candidate_pairs",
    "check_mask_emails",
    "check_mask_ipv4",
    "check_mask_phone_numbers",
    "check_minhash_signature",
    "check_word_shingles",
]

#: The level of MinHash's chi-square test: the probability that a correct signature fails it
#: (its measured rate at 1e-2 is in tests/grading/checks/test_ex18_data.py).
MINHASH_ALPHA = 1e-6

_BUG = {bug.id: bug for bug in MINHASH_BUGS}

#: The course's curation code, which the exercise asks students to write.
_REFERENCE = (
    dedup.exact_line_dedup,
    dedup.normalise_line,
    dedup.shingles,
    dedup.MinHasher.signature,
    dedup.band_keys,
    dedup.near_duplicate_clusters,
    gopher.gopher_failures,
    pii.mask_emails,
    pii.mask_phone_numbers,
    pii.mask_ipv4,
    pii.mask_pii,
)


def _ready_made() -> tuple[Callable[..., Any], ...]:
    """datasketch's MinHash and LSH, when installed: the exercise asks for one's own."""
    try:
        import datasketch
    except ImportError:  # pragma: no cover - installed with the curation extra
        return ()
    minhash, lsh = datasketch.MinHash, datasketch.MinHashLSH
    return (minhash.update, minhash.update_batch, lsh.insert)


def _run(impl: Any, item: str) -> Callable[..., Any]:
    """The student's function called under the honesty rule."""
    if not callable(impl):
        raise TypeError(f"{item}: expected your function, got {type(impl).__name__}")

    def run(*args: Any) -> Any:
        with forbidden_calls(item, extra=(*_REFERENCE, *_ready_made())):
            return call_student(impl, *args, item=item)

    return run


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


def _compare(
    report: CheckReport,
    impl: Any,
    item: str,
    bugs: Sequence[BugVariant],
    cases: list[tuple[Any, ...]],
    reference: Callable[..., Any],
    tidy: Callable[[Any, str], Any],
) -> None:
    """The student's outputs against ``reference``'s on every case, equal after ``tidy``
    (which turns an answer into a comparable value, or fails naming what is wrong with it).
    On a difference, a known mistake is named when its outputs equal the student's on every
    case and differ from the reference's on one."""
    if not callable(impl):
        report.fail(f"expected your function {item}, got {type(impl).__name__}.")
    run = _run(impl, item)
    answers = [tidy(run(*case), item) for case in cases]
    expected = [tidy(reference(*case), item) for case in cases]
    wrong = [i for i, (got, want) in enumerate(zip(answers, expected, strict=True)) if got != want]
    if wrong:
        first = wrong[0]
        bug = next((b for b in bugs if _shows(b, cases, answers, wrong, tidy, item)), None)
        report.fail(
            f"{item}{_short(cases[first])} returned {_short(answers[first])}; expected "
            f"{_short(expected[first])} ({len(wrong)} of {len(cases)} held-out inputs differ).",
            bug,
        )
    report.ok(f"{item} equals the reference on {len(cases)} held-out inputs")


def _shows(bug: BugVariant, cases: list[tuple], answers: list, wrong: list[int], tidy, item: str):
    """The evidence: rerun on every input where the student's answer is wrong, the mistake
    gives exactly the student's answer."""
    try:
        return all(tidy(bug.impl(*cases[i]), item) == answers[i] for i in wrong)
    except Exception:  # noqa: BLE001 - a variant that cannot run these inputs shows nothing
        return False


def _fail(item: str, message: str):
    report = CheckReport(item)
    report.fail(f"{item} {message}")


def _as_documents(answer: Any, item: str) -> list[str]:
    if not isinstance(answer, list | tuple) or not all(isinstance(d, str) for d in answer):
        _fail(item, f"must return a list of str (one per document), got {_short(answer, 80)}.")
    return list(answer)


def _as_strings(answer: Any, item: str) -> set[str]:
    if isinstance(answer, str) or not isinstance(answer, Iterable):
        _fail(item, f"must return a set of str, got {type(answer).__name__}.")
    answer = list(answer)
    if not all(isinstance(s, str) for s in answer):
        _fail(item, f"must return str items, got {_short(answer, 80)}.")
    return set(answer)


def _as_rule_names(answer: Any, item: str) -> set[str]:
    names = _as_strings(answer, item)
    unknown = names - set(gopher.GOPHER_RULES)
    if unknown:
        known = list(gopher.GOPHER_RULES)
        _fail(item, f"returned unknown rule names {sorted(unknown)}; use {known}.")
    return names


def _as_pairs(answer: Any, item: str) -> set[tuple[int, int]]:
    if isinstance(answer, str) or not isinstance(answer, Iterable):
        _fail(item, f"must return a set of (i, j) pairs, got {type(answer).__name__}.")
    pairs = set()
    for pair in answer:
        try:
            i, j = (int(x) for x in pair)
        except (TypeError, ValueError):
            _fail(item, f"must return pairs of two document indices, got {_short(pair, 80)}.")
        if i == j:
            _fail(item, f"returned the pair {(i, j)}: a document is not its own candidate.")
        pairs.add((min(i, j), max(i, j)))
    return pairs


def _as_masked(answer: Any, item: str) -> tuple[str, int]:
    ok = isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], str)
    if not ok:
        _fail(item, f"must return (masked text, count), got {_short(answer, 80)}.")
    try:
        return answer[0], int(answer[1])
    except (TypeError, ValueError):
        _fail(item, f"must return an integer count, got {_short(answer[1], 80)}.")


def _reference_pairs(signatures: list[list[int]], bands: int) -> set[tuple[int, int]]:
    import numpy as np

    buckets: dict[tuple[int, bytes], list[int]] = {}
    for index, sig in enumerate(signatures):
        for key in dedup.band_keys(np.array(sig, dtype=np.uint64), bands):
            buckets.setdefault(key, []).append(index)
    return {(i, j) for group in buckets.values() for i in group for j in group if i < j}


def _cases(item: str, thorough: bool, seed: int | None, make: Callable[..., Any]) -> list[tuple]:
    """One case per configuration, or several when ``make`` returns a list (a text's parts,
    each a case of its own so that a mistake shows where it acts)."""
    base = 0 if seed is None else seed
    out: list[tuple] = []
    for index, config in enumerate(configs(item, thorough, seed)):
        made = make(random.Random(f"{item}/{base}/{index}"), **config)
        out += made if isinstance(made, list) else [made]
    return out


def _sample(rng: random.Random) -> dict[str, Any]:
    return {"variant": rng.randrange(1000)}


register_configs(GOPHER_ITEM, visible=inputs.GOPHER_VISIBLE, extra=inputs.EXTRA, sample=_sample)
for _item in (
    LINE_DEDUP_ITEM,
    SHINGLES_ITEM,
    EMAIL_ITEM,
    PHONE_ITEM,
    IPV4_ITEM,
    LSH_ITEM,
):
    register_configs(_item, visible=inputs.VISIBLE, extra=inputs.EXTRA, sample=_sample)
register_configs(
    MINHASH_ITEM,
    visible=[{"pairs": 12, "K": 128}, {"pairs": 6, "K": 64}, {"pairs": 6, "K": 100}],
    extra=[{"pairs": 8, "K": 96}],
    sample=lambda rng: {"pairs": 6, "K": rng.choice([64, 128, 160])},
)


@public_check(assignment="ex18_data", implements=LINE_DEDUP_ITEM, bugs=LINE_DEDUP_BUGS)
def check_exact_line_dedup(report: CheckReport, impl: Any, thorough: bool, seed: int | None):
    """Every repeated line (normalised) removed, every copy, blank lines kept: the reference's
    output on corpora of shared boilerplate, its copies with other spacing, lines repeated in
    one document, blank lines."""
    cases = _cases(LINE_DEDUP_ITEM, thorough, seed, inputs.corpus_case)
    reference = lambda docs: dedup.exact_line_dedup(docs)[0]  # noqa: E731
    _compare(report, impl, LINE_DEDUP_ITEM, LINE_DEDUP_BUGS, cases, reference, _as_documents)


@public_check(assignment="ex18_data", implements=SHINGLES_ITEM, bugs=SHINGLES_BUGS)
def check_word_shingles(report: CheckReport, impl: Any, thorough: bool, seed: int | None):
    """The set of word n-grams after lower-casing and removing punctuation, as the reference's,
    on texts longer and shorter than n."""
    cases = _cases(SHINGLES_ITEM, thorough, seed, inputs.shingles_case)
    _compare(report, impl, SHINGLES_ITEM, SHINGLES_BUGS, cases, dedup.shingles, _as_strings)


@public_check(assignment="ex18_data", implements=LSH_ITEM, bugs=LSH_BUGS)
def check_lsh_candidate_pairs(report: CheckReport, impl: Any, thorough: bool, seed: int | None):
    """The pairs that share a whole band, with bands keyed by their index: the reference's
    pairs on signatures of few distinct values (many bands collide)."""
    cases = _cases(LSH_ITEM, thorough, seed, inputs.signatures_case)
    _compare(report, impl, LSH_ITEM, LSH_BUGS, cases, _reference_pairs, _as_pairs)


@public_check(assignment="ex18_data", implements=GOPHER_ITEM, bugs=GOPHER_BUGS)
def check_gopher_failures(report: CheckReport, impl: Any, thorough: bool, seed: int | None):
    """The rules a document breaks, as the reference's, on documents at each rule's bounds."""
    cases = _cases(GOPHER_ITEM, thorough, seed, inputs.gopher_case)
    reference = gopher.gopher_failures
    _compare(report, impl, GOPHER_ITEM, GOPHER_BUGS, cases, reference, _as_rule_names)


@public_check(assignment="ex18_data", implements=EMAIL_ITEM, bugs=EMAIL_BUGS)
def check_mask_emails(report: CheckReport, impl: Any, thorough: bool, seed: int | None):
    """The masked text and count equal the reference's on addresses with dots, plus signs,
    subdomains and punctuation around them, and on text with an @ that is no address."""
    cases = _cases(EMAIL_ITEM, thorough, seed, inputs.email_case)
    _compare(report, impl, EMAIL_ITEM, EMAIL_BUGS, cases, pii.mask_emails, _as_masked)


@public_check(assignment="ex18_data", implements=PHONE_ITEM, bugs=PHONE_BUGS)
def check_mask_phone_numbers(report: CheckReport, impl: Any, thorough: bool, seed: int | None):
    """The masked text and count equal the reference's on every format of a number, beside
    dates, times, prices and longer numbers that must stay."""
    cases = _cases(PHONE_ITEM, thorough, seed, inputs.phone_case)
    _compare(report, impl, PHONE_ITEM, PHONE_BUGS, cases, pii.mask_phone_numbers, _as_masked)


@public_check(assignment="ex18_data", implements=IPV4_ITEM, bugs=IPV4_BUGS)
def check_mask_ipv4(report: CheckReport, impl: Any, thorough: bool, seed: int | None):
    """The masked text and count equal the reference's on addresses at the octets' bounds and
    on dotted numbers that are none (999.1.1.1, 256.1.1.1, three octets)."""
    cases = _cases(IPV4_ITEM, thorough, seed, inputs.ipv4_case)
    _compare(report, impl, IPV4_ITEM, IPV4_BUGS, cases, pii.mask_ipv4, _as_masked)


# minhash_signature ----------------------------------------------------------------------------


def _signature(run: Callable[..., Any], items: set[str], k: int, seed: int) -> list[int]:
    """The student's signature as K integers in [0, 2^32), or a failure saying what is not."""
    answer = run(set(items), k, seed)
    try:
        values = [int(v) for v in answer]
    except (TypeError, ValueError):
        _fail(MINHASH_ITEM, f"must return {k} integers, got {_short(answer, 80)}.")
    if len(values) != k:
        _fail(MINHASH_ITEM, f"returned {len(values)} values for num_perm={k}.")
    if not all(0 <= v < 1 << 32 for v in values):
        _fail(MINHASH_ITEM, "returned values outside [0, 2^32).")
    return values


def _minhash_properties(report: CheckReport, run: Callable[..., Any], rng: random.Random) -> None:
    """What every correct family shares: determinism, the union's signature, the seed."""
    a, b = inputs.shingle_set(rng, 30), inputs.shingle_set(rng, 30)
    sig_a, sig_b = _signature(run, a, 64, 7), _signature(run, b, 64, 7)
    if _signature(run, set(sorted(a)), 64, 7) != sig_a:
        _fail(MINHASH_ITEM, "gave two signatures for one set and seed: draw them from seed.")
    union = _signature(run, a | b, 64, 7)
    lowest = [min(x, y) for x, y in zip(sig_a, sig_b, strict=True)]
    if union != lowest:
        highest = [max(x, y) for x, y in zip(sig_a, sig_b, strict=True)]
        bug = _BUG["minhash.max_not_min"] if union == highest else None
        report.fail(
            "minhash_signature: the signature of A | B must be the elementwise minimum of the "
            "signatures of A and B (each value is a minimum over the items).",
            bug,
        )
    report.ok("minhash_signature(A | B) == min(signature(A), signature(B))")
    if len(set(sig_a)) == 1:
        report.fail("minhash_signature: all K values are equal.", _BUG["minhash.one_function"])
    if _signature(run, a, 64, 8) == sig_a:
        report.fail(
            "minhash_signature: seeds 7 and 8 give the same signature.",
            _BUG["minhash.seed_ignored"],
        )
    report.ok("the K hash functions differ and depend on the seed")


def binomial_agreement(agree: Sequence[int], jaccards: Sequence[float], ks: Sequence[int]):
    """Pearson's statistic of pairs' agreement counts against Binomial(K, J).

    Each count a of equal positions is compared with its mean K J and variance K J (1 - J);
    the sum of (a - K J)^2 / (K J (1 - J)) over M pairs follows chi-square with M degrees of
    freedom when the K hash functions behave as random ones (each term is a squared, nearly
    normal deviation for K J (1 - J) >= 8).

    Args:
        agree: for each pair, the number of positions where its two signatures are equal.
        jaccards: each pair's true Jaccard similarity, in (0, 1).
        ks: each pair's signature length.

    Returns:
        A :class:`~coursepkg.grading.framework.sampling.ChiSquare` (statistic, M, p-value).
    """
    terms = [
        (a - k * j) ** 2 / (k * j * (1 - j)) for a, j, k in zip(agree, jaccards, ks, strict=True)
    ]
    statistic, dof = float(sum(terms)), len(terms)
    p_value = torch.special.gammaincc(
        torch.tensor(dof / 2.0, dtype=torch.float64),
        torch.tensor(statistic / 2.0, dtype=torch.float64),
    )
    return ChiSquare(statistic, dof, float(p_value))


def _agreement_test(report: CheckReport, run: Callable[..., Any], cases: list[tuple]) -> None:
    """The pairs' agreements against Binomial(K, J) (:func:`binomial_agreement`); a total
    shift above 3 standard deviations names too few hash values."""
    agree, jaccards, ks = [], [], []
    for a, b, jac, k, seed in cases:
        sig_a, sig_b = _signature(run, a, k, seed), _signature(run, b, k, seed)
        agree.append(sum(x == y for x, y in zip(sig_a, sig_b, strict=True)))
        jaccards.append(jac)
        ks.append(k)
    fit = binomial_agreement(agree, jaccards, ks)
    if fit.p_value < MINHASH_ALPHA:
        shift = sum(a - k * j for a, j, k in zip(agree, jaccards, ks, strict=True))
        z = shift / sum(k * j * (1 - j) for j, k in zip(jaccards, ks, strict=True)) ** 0.5
        bug = _BUG["minhash.small_range"] if z > 3 else None
        report.fail(
            f"minhash_signature: over {fit.dof} pairs of known Jaccard similarity J, the "
            f"numbers of equal positions do not follow Binomial(K, J) (chi-square "
            f"{fit.statistic:.1f} on {fit.dof} degrees of freedom, p-value {fit.p_value:.2g}; "
            f"a correct signature fails this test with probability {MINHASH_ALPHA:g}); they "
            f"are {z:+.1f} standard deviations from K J in total.",
            bug,
        )
    report.ok(f"the agreements of {fit.dof} pairs follow Binomial(K, J) (p {fit.p_value:.2g})")


@public_check(assignment="ex18_data", implements=MINHASH_ITEM, bugs=MINHASH_BUGS)
def check_minhash_signature(report: CheckReport, impl: Any, thorough: bool, seed: int | None):
    """Any hash family passes: K integers in [0, 2^32), one signature per set and seed, the
    union's signature the elementwise minimum, other seeds other functions, and Jaccard
    estimates within the binomial error of the true Jaccard (a chi-square test at level
    :data:`MINHASH_ALPHA`)."""
    if not callable(impl):
        report.fail(f"expected your function {MINHASH_ITEM}, got {type(impl).__name__}.")
    run = _run(impl, MINHASH_ITEM)
    base = 0 if seed is None else seed
    _minhash_properties(report, run, random.Random(f"minhash/{base}"))
    cases = []
    for index, config in enumerate(configs(MINHASH_ITEM, thorough, seed)):
        rng = random.Random(f"minhash/{base}/{index}")
        cases += [inputs.jaccard_pair(rng, config["K"]) for _ in range(config["pairs"])]
    _agreement_test(report, run, cases)
