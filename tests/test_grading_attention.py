"""Tests of the ex01/ex02 checks: every catalogued mistake is caught and named, the reference and
independent correct implementations pass, stubs say "not implemented yet", hidden shapes
depend on the seed, and calls into PyTorch's attention or the reference are named."""

from __future__ import annotations

import grading_impls_encoder as impls
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import coursepkg.attention as ref
from coursepkg.grading import CheckFailure, NotImplementedYet
from coursepkg.grading.checks import ex01_attention as ex01
from coursepkg.grading.checks import ex02_multihead as ex02
from coursepkg.grading.framework import configs, weights
from coursepkg.stubs import ex01_attention, ex02_multihead

ATTENTION_BUGS = [*ex01.SDPA_BUGS, *ex01.ADDITIVE_BUGS, *ex02.MHA_BUGS]

CHECKS = {
    ex01.SDPA: ex01.check_scaled_dot_product_attention,
    ex01.ADDITIVE: ex01.check_additive_score,
    ex02.MHA: ex02.check_multi_head_attention,
}


@pytest.fixture(autouse=True)
def _one_thread():
    # The checks run hundreds of tiny ops; on a busy machine a second thread only adds
    # synchronisation (measured: ~0.15 s per check with one thread, ~1 s with two).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("bug", ATTENTION_BUGS, ids=lambda b: b.id)
def test_every_catalogued_mistake_is_caught_and_named(bug):
    with pytest.raises(CheckFailure) as info:
        CHECKS[bug.item](bug.impl)
    assert info.value.diagnosis == bug.id, str(info.value)
    assert "known mistake" in str(info.value)
    assert bug.advice in str(info.value)


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
        "mha.split_without_transpose",
        "mha.no_output_projection",
        "mha.merge_wrong_order",
    ):
        assert required in ids


def test_reference_functions_pass():
    assert ex01.check_scaled_dot_product_attention(ref.scaled_dot_product_attention)
    assert ex01.check_additive_score(ex01._reference_additive, thorough=True, seed=1)


def test_reference_class_passes_when_not_rejected(monkeypatch):
    # The reference class is rejected by design; with that step disabled it must pass,
    # which shows the numbers the check demands are the reference's.
    monkeypatch.setattr(weights, "reject_reference_class", lambda *a, **k: None)
    result = ex02.check_multi_head_attention(ref.MultiHeadAttention, points=2)
    assert result.passed and result.points == 2


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


@pytest.mark.parametrize("impl", [impls.HeadLoopMHA, impls.WeightViewMHA])
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_independent_mha_passes(impl, seed):
    assert ex02.check_multi_head_attention(impl, thorough=seed is not None, seed=seed)


@pytest.mark.parametrize(
    ("check", "stub"),
    [
        (ex01.check_scaled_dot_product_attention, ex01_attention.scaled_dot_product_attention),
        (ex01.check_additive_score, ex01_attention.additive_score),
        (ex02.check_multi_head_attention, ex02_multihead.MultiHeadAttention),
    ],
)
def test_untouched_stub_is_not_implemented_yet(check, stub):
    with pytest.raises(NotImplementedYet) as info:
        check(stub)
    assert "not implemented yet" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("item", [ex01.SDPA, ex01.ADDITIVE, "multi_head_attention"])
def test_thorough_configs_depend_on_the_seed(item):
    visible = configs(item)
    first, second = configs(item, True, 0), configs(item, True, 1)
    assert len(visible) >= 3
    assert first != second
    assert first[: len(visible)] == visible and len(first) > len(visible)


def test_visible_configs_cover_batch_one_odd_lengths_and_unequal_sizes():
    sdpa = configs(ex01.SDPA)
    assert any(c["B"] == 1 for c in sdpa)
    assert any(c["L"] != c["S"] for c in sdpa)
    assert any(c["Dk"] != c["Dv"] for c in sdpa)
    assert any(c["L"] % 2 == 1 for c in sdpa)
    assert any("H" in c for c in sdpa)  # 4-D inputs, as multi-head attention calls it
    mha = configs("multi_head_attention")
    assert any(c["B"] == 1 for c in mha) and any(c["L"] != c["S"] for c in mha)


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


class _TorchMHA(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.inner = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def forward(self, query, key, value, mask=None):
        return self.inner(query, key, value, attn_mask=None if mask is None else ~mask)[0]


class _FusedMHA(impls.HeadLoopMHA):
    def forward(self, query, key, value, mask=None):
        b, n_q, d = query.shape
        heads = [
            p(x).view(b, -1, self.n_heads, self.d_head).transpose(1, 2)
            for p, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value))
        ]
        out = F.scaled_dot_product_attention(*heads, attn_mask=mask)  # (B, H, L, Dk)
        return self.out_proj(out.transpose(1, 2).reshape(b, n_q, d))


class _SubclassMHA(ref.MultiHeadAttention):
    pass


@pytest.mark.parametrize(
    ("impl", "named"),
    [
        (_TorchMHA, "torch.nn.MultiheadAttention"),
        (_FusedMHA, "torch.nn.functional.scaled_dot_product_attention"),
        (_SubclassMHA, "coursepkg.attention.MultiHeadAttention"),
    ],
)
def test_forbidden_mha_is_named(impl, named):
    with pytest.raises(CheckFailure) as info:
        ex02.check_multi_head_attention(impl)
    assert named in str(info.value)


class _NoBiasMHA(impls.HeadLoopMHA):
    def __init__(self, d_model, n_heads):
        super().__init__(d_model, n_heads)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)


def test_parameter_gap_is_explained_per_submodule():
    with pytest.raises(CheckFailure) as info:
        ex02.check_multi_head_attention(_NoBiasMHA)
    message = str(info.value)
    assert "out_proj has no bias: −D" in message
    assert "reference" in message and "yours" in message


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


class _DetachedMHA(impls.HeadLoopMHA):
    def forward(self, query, key, value, mask=None):
        return super().forward(query, key.detach(), value, mask).detach() + self.out_proj.bias * 0


def test_missing_gradients_are_named():
    with pytest.raises(CheckFailure) as info:
        ex02.check_multi_head_attention(_DetachedMHA)
    assert "no gradient reaches `q_proj.weight`" in str(info.value)
