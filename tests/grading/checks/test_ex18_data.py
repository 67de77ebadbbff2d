"""Tests of the ex18 checks (``checks/ex18_data.py``): every catalogued mistake is caught and
named by its own id, correct answers in two styles pass (two other hash families for MinHash),
answers written by strangers get the verdict they deserve, the stubs say "not implemented yet",
calling the course's curation code is told, and MinHash's chi-square test fails a correct
signature about as often as its level says (measured at 1%; the check runs it at 1e-6)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from coursepkg.curation.dedup import MinHasher
from coursepkg.grading import (
    CheckFailure,
    NotImplementedYet,
    check_exact_line_dedup,
    check_gopher_failures,
    check_lsh_candidate_pairs,
    check_mask_emails,
    check_mask_ipv4,
    check_mask_phone_numbers,
    check_minhash_signature,
    check_word_shingles,
)
from coursepkg.grading.checks import ex18_data as checks
from coursepkg.grading.checks import ex18_data_mistakes as catalogue
from coursepkg.grading.framework import curation_inputs
from coursepkg.stubs import ex18_data as stub

CHECKS = {
    catalogue.LINE_DEDUP_ITEM: check_exact_line_dedup,
    catalogue.SHINGLES_ITEM: check_word_shingles,
    catalogue.MINHASH_ITEM: check_minhash_signature,
    catalogue.LSH_ITEM: check_lsh_candidate_pairs,
    catalogue.GOPHER_ITEM: check_gopher_failures,
    catalogue.EMAIL_ITEM: check_mask_emails,
    catalogue.PHONE_ITEM: check_mask_phone_numbers,
    catalogue.IPV4_ITEM: check_mask_ipv4,
}


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda b: b.id)
def test_every_catalogued_mistake_is_caught_and_named(bug):
    with pytest.raises(CheckFailure) as info:
        CHECKS[bug.item](bug.impl)
    assert info.value.diagnosis == bug.id, str(info.value)
    assert bug.advice in str(info.value)


def test_the_issue_s_mistakes_are_catalogued_once_each():
    ids = [b.id for b in catalogue.BUGS]
    assert len(ids) == len(set(ids)) == 32
    assert {b.item for b in catalogue.BUGS} == set(CHECKS)
    assert {
        "line_dedup.raw_lines",
        "shingles.characters",
        "shingles.case_kept",
        "minhash.max_not_min",
        "lsh.overlapping_bands",
        "lsh.last_band_dropped",
        "lsh.rows_bands_swapped",
        "gopher.tokens_not_words",
        "gopher.mean_length_exclusive",
        "phone.eats_dates",
        "email.no_dots",
        "email.no_plus",
        "ipv4.any_octet",
    } <= set(ids)


# Correct answers in two styles and the strangers' mistakes (grading_impls_data.py) are
# entries of the corpus (grading_corpus.py), run by test_corpus.py.


@pytest.mark.parametrize("item", list(CHECKS))
def test_untouched_stub_is_not_implemented_yet(item):
    with pytest.raises(NotImplementedYet) as info:
        CHECKS[item](getattr(stub, item))
    assert "not implemented yet" in str(info.value) and "\n" not in str(info.value)


def test_calling_the_course_s_curation_and_a_wrong_return_are_told():
    from coursepkg.curation import mask_emails, shingles

    with pytest.raises(CheckFailure, match="coursepkg.curation.dedup.shingles"):
        check_word_shingles(lambda text, n: shingles(text, n))
    with pytest.raises(CheckFailure, match="coursepkg.curation.pii.mask_emails"):
        check_mask_emails(lambda text: mask_emails(text))
    with pytest.raises(CheckFailure, match=r"must return \(masked text, count\)"):
        check_mask_ipv4(lambda text: text)
    with pytest.raises(CheckFailure, match="must return 64 integers|returned 3 values"):
        check_minhash_signature(lambda items, k, seed: [1, 2, 3])


def test_the_texts_are_the_same_in_every_process():
    """The inputs come from string-seeded generators and sorted sets, never from set order."""
    first = curation_inputs.jaccard_pair(random.Random("x"), 128)
    assert first == curation_inputs.jaccard_pair(random.Random("x"), 128)
    a, b, jac, _, _ = first
    assert len(a & b) / len(a | b) == pytest.approx(jac)


def test_the_chi_square_test_fails_a_correct_signature_as_often_as_its_level():
    """The reference MinHash on 200 seeded draws of the visible check's 24 pairs: at the level
    1% the statistic fails it twice in expectation, and more than 8 times with probability
    2e-4 (binomial), so the chi-square law holds where the check reads it (1e-6)."""
    failures = 0
    for trial in range(200):
        rng = random.Random(f"calibration/{trial}")
        agree, jaccards, ks = [], [], []
        for k in (128,) * 12 + (64,) * 6 + (100,) * 6:
            a, b, jac, k, seed = curation_inputs.jaccard_pair(rng, k)
            hasher = MinHasher(k, seed)
            agree.append(int(np.sum(hasher.signature(a) == hasher.signature(b))))
            jaccards.append(jac)
            ks.append(k)
        failures += checks.binomial_agreement(agree, jaccards, ks).p_value < 0.01
    assert failures <= 8, failures
