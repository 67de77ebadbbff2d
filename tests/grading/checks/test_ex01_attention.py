"""Tests of the ex01 checks (``checks/ex01_attention.py``): its catalogue (each mistake rerun:
test_check_protocol.py), the reference and independent correct implementations pass, hidden shapes
depend on the seed, and calls into PyTorch's attention or the reference are named."""

from __future__ import annotations

import grading_impls_encoder as impls
import pytest
import torch
import torch.nn.functional as F

import coursepkg.attention as ref
from coursepkg.grading import CheckFailure
from coursepkg.grading.checks import ex01_attention as ex01
from coursepkg.grading.checks import ex01_attention_mistakes as mistakes
from coursepkg.grading.framework import configs

ATTENTION_BUGS = [*mistakes.SDPA_BUGS, *mistakes.ADDITIVE_BUGS]


@pytest.fixture(autouse=True)
def _one_thread():
    # The checks run hundreds of tiny ops; on a busy machine a second thread only adds
    # synchronisation (measured: ~0.15 s per check with one thread, ~1 s with two).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_catalogue_ids_are_unique_and_cover_the_issue():
    ids = [b.id for b in ATTENTION_BUGS]
    assert len(ids) == len(set(ids))
    for required in (
        "sdpa.no_scaling",
        "sdpa.scale_by_dk",
        "sdpa.softmax_query_axis",
        "sdpa.mask_after_softmax",
        "sdpa.inverted_mask",
        "sdpa.masked_row_nan",
    ):
        assert required in ids


def test_reference_functions_pass():
    assert ex01.check_scaled_dot_product_attention(ref.scaled_dot_product_attention)
    assert ex01.check_additive_score(ex01._reference_additive, thorough=True, seed=1)


@pytest.mark.parametrize("impl", [impls.sdpa_einsum, impls.sdpa_manual_softmax])
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_independent_sdpa_passes(impl, seed):
    result = ex01.check_scaled_dot_product_attention(impl, thorough=seed is not None, seed=seed)
    assert result.passed
    assert any("float64" in m for m in result.messages)


@pytest.mark.parametrize("impl", [impls.additive_score_einsum, impls.additive_score_loop])
def test_independent_additive_score_passes(impl):
    assert ex01.check_additive_score(impl)
    assert ex01.check_additive_score(impl, thorough=True, seed=4)


@pytest.mark.parametrize("item", [ex01.SDPA_ITEM, ex01.ADDITIVE_ITEM])
def test_thorough_configs_depend_on_the_seed(item):
    visible = configs(item)
    first, second = configs(item, True, 0), configs(item, True, 1)
    assert len(visible) >= 3
    assert first != second
    assert first[: len(visible)] == visible and len(first) > len(visible)


def test_visible_configs_cover_batch_one_odd_lengths_and_unequal_sizes():
    sdpa = configs(ex01.SDPA_ITEM)
    assert any(c["B"] == 1 for c in sdpa)
    assert any(c["L"] != c["S"] for c in sdpa)
    assert any(c["Dk"] != c["Dv"] for c in sdpa)
    assert any(c["L"] % 2 == 1 for c in sdpa)
    assert any("H" in c for c in sdpa)  # 4-D inputs, as multi-head attention calls it


def _sdpa_fused(query, key, value, mask=None):
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return out, out


def _sdpa_calls_reference(query, key, value, mask=None):
    return ref.scaled_dot_product_attention(query, key, value, mask)


@pytest.mark.parametrize(
    ("impl", "named"),
    [
        (_sdpa_fused, "torch.nn.functional.scaled_dot_product_attention"),
        (_sdpa_calls_reference, "coursepkg.attention.scaled_dot_product_attention"),
    ],
)
def test_forbidden_calls_in_sdpa_are_named(impl, named):
    with pytest.raises(CheckFailure) as info:
        ex01.check_scaled_dot_product_attention(impl)
    assert named in str(info.value)


def test_sdpa_returning_one_tensor_is_told_the_contract():
    with pytest.raises(CheckFailure) as info:
        ex01.check_scaled_dot_product_attention(lambda q, k, v, mask=None: q @ k.mT @ v)
    assert "tuple (output, weights)" in str(info.value)


def _sdpa_crashes(query, key, value, mask=None):
    scores = query @ key  # wrong: key is not transposed
    return scores, scores


def test_student_error_names_the_line():
    with pytest.raises(CheckFailure) as info:
        ex01.check_scaled_dot_product_attention(_sdpa_crashes)
    message = str(info.value)
    assert "scores = query @ key" in message and "RuntimeError" in message


def _sdpa_float32_always(query, key, value, mask=None):
    out, weights = impls.sdpa_einsum(query.float(), key.float(), value.float(), mask)
    return out, weights


def test_dtype_must_follow_the_inputs():
    with pytest.raises(CheckFailure) as info:
        ex01.check_scaled_dot_product_attention(_sdpa_float32_always)
    assert "dtype torch.float32, expected torch.float64" in str(info.value)


def _sdpa_ignores_mask(query, key, value, mask=None):
    return impls.sdpa_einsum(query, key, value, None)


def test_ignored_mask_fails_the_invariance_with_the_convention():
    with pytest.raises(CheckFailure) as info:
        ex01.check_scaled_dot_product_attention(_sdpa_ignores_mask)
    message = str(info.value)
    assert "padding mask hides" in message and "True = may attend" in message
