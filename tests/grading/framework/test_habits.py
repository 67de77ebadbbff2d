"""The evidence behind the mistakes public code's habits make (issue 34): a forbidden built-in
is named from the check's catalogue, never by its numbers; a parameter count that differs
names a mistake only when the student's module also behaves as that mistake does (biases left
out, a width that ignores ``d_ff``), whatever its parameter names."""

from __future__ import annotations

import grading_corpus_habits as hab
import grading_corpus_layers as lay
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from coursepkg import grading
from coursepkg.attention import MultiHeadAttention as ReferenceMHA
from coursepkg.grading.checks import ex02_multihead_mistakes as mha
from coursepkg.grading.checks import ex04_encoder_mistakes as enc
from coursepkg.grading.framework import (
    BugVariant,
    ForbiddenCall,
    diagnose,
    diagnose_structure,
    forbidden_calls,
    name_forbidden_call,
)
from coursepkg.layers import PositionwiseFeedForward as ReferenceFFN


def _sdpa_call(q):
    return F.scaled_dot_product_attention(q, q, q)


def test_a_forbidden_call_is_named_by_the_catalogue_entry_that_lists_it():
    q = torch.randn(1, 2, 4)
    named = BugVariant(
        "x.builtin",
        "x",
        "uses the built-in",
        "write it",
        _sdpa_call,
        calls=(F.scaled_dot_product_attention,),
    )
    other = BugVariant("x.other", "x", "another", "other", _sdpa_call, calls=(F.layer_norm,))
    with pytest.raises(ForbiddenCall) as info:
        with forbidden_calls("x"):
            exec("F.scaled_dot_product_attention(q, q, q)", {"F": F, "q": q})  # noqa: S102
    plain = info.value.message
    name_forbidden_call(info.value, [other])
    assert info.value.diagnosis is None and info.value.message == plain
    name_forbidden_call(info.value, [other, named])
    assert info.value.diagnosis == "x.builtin"
    assert str(info.value) == f"{plain} (known mistake: x.builtin)"


def test_a_forbidden_class_is_named_by_the_check():
    with pytest.raises(grading.CheckFailure) as info:
        grading.check_multi_head_attention(hab.MHAWrapsTorch)
    assert info.value.diagnosis == "mha.builtin_multihead_attention"
    assert "contains torch.nn.MultiheadAttention as `mha`" in str(info.value)


def test_a_mistake_named_by_its_call_is_never_matched_by_its_numbers():
    """The fused kernel's output is the right one (and NaN where a query sees no key): an
    output that matches it must not be called a use of the built-in."""
    bug = next(b for b in mha.MHA_BUGS if b.id == "mha.builtin_sdpa")
    q = torch.randn(1, 2, 3, 4)
    assert diagnose(lambda *a: F.scaled_dot_product_attention(*a), [bug], (q, q, q)) is None


@settings(max_examples=8, deadline=None)
@given(heads=st.integers(1, 4), per_head=st.integers(1, 4))
def test_attention_without_biases_is_named_whatever_its_names(heads, per_head):
    d = heads * per_head
    torch.manual_seed(0)
    reference = ReferenceMHA(d, heads)
    for cls in (hab.MHAFusedNoBias, hab.MHANoBiasStoresWeights):
        found = diagnose_structure(cls(d, heads), reference, mha.MHA_BUGS, (d, heads))
        assert found is not None and found.id == "mha.no_bias", cls.__name__
    raschka = hab.MHARaschkaQKVBiasFalse(d, heads)
    assert diagnose_structure(raschka, reference, mha.MHA_BUGS, (d, heads)).id == (
        "mha.no_qkv_bias"
    )


class _FusedWithOffset(hab.MHAFusedNoBias):
    """No bias parameters, but a fixed offset on the output (a buffer): the count of the
    bias-free variant, not its behaviour."""

    def __init__(self, d_model, n_heads):
        super().__init__(d_model, n_heads)
        self.register_buffer("offset", torch.ones(d_model))

    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, mask) + self.offset


class _QueryBiasOnly(nn.Module):
    """q_proj with a bias, the others without: 3·D fewer parameters than the reference, like
    qkv_bias=False, but the queries carry a bias."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.inner = hab.MHAFusedNoBias(d_model, n_heads)
        self.q_bias = nn.Parameter(torch.randn(d_model))
        self.spare = nn.Parameter(torch.randn(2 * d_model))

    def forward(self, query, key, value, mask=None):
        return self.inner(query + self.q_bias, key, value, mask)


@pytest.mark.parametrize("cls", [_FusedWithOffset, _QueryBiasOnly])
def test_a_parameter_count_alone_names_no_bias_mistake(cls):
    d, h = 8, 2
    torch.manual_seed(0)
    module, reference = cls(d, h), ReferenceMHA(d, h)
    assert diagnose_structure(module, reference, mha.MHA_BUGS, (d, h)) is None


def test_a_feed_forward_of_fixed_width_is_told_from_one_that_reads_d_ff():
    bug = next(b for b in enc.FFN_BUGS if b.id == "ffn.fixed_width_4d")
    assert bug.shows(hab.NanoGPTMLP(6, 10), (6, 10))
    assert bug.shows(hab.NanoGPTMLPOwnSignature(6), (6, 10))  # no d_ff argument at all
    assert not bug.shows(lay.FFNDropout(6, 10), (6, 10))
    lazy = hab.FFNLazyKeepsHidden(6, 10)
    lazy(torch.zeros(1, 2, 6))  # as the check does: a forward pass sizes it
    assert not bug.shows(lazy, (6, 10))
    # A width that depends on d_ff, with the 4D network's parameter count at d_ff = 24:
    # the count matches, the behaviour (another d_ff, another count) does not.
    reference = ReferenceFFN(6, 10)
    assert diagnose_structure(lay.FFNDropout(6, 24), reference, enc.FFN_BUGS, (6, 10)) is None


def test_a_bias_free_feed_forward_is_named_and_a_biased_one_is_not():
    reference = ReferenceFFN(4, 7)
    lazy = hab.FFNLazyNoBias(4, 7)
    lazy(torch.zeros(1, 2, 4))  # as the check does: a forward pass sizes it
    assert diagnose_structure(lazy, reference, enc.FFN_BUGS, (4, 7)).id == "ffn.no_bias"
    offset = _FeedForwardWithOffset(4, 7)  # the variant's count, not its behaviour
    assert diagnose_structure(offset, reference, enc.FFN_BUGS, (4, 7)) is None


class _FeedForwardWithOffset(nn.Module):
    """No bias parameters (2·D·F, the bias-free variant's count) but a fixed offset on the
    output (a buffer): a zero input does not give zero."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.a = nn.Linear(d_model, d_ff, bias=False)
        self.b = nn.Linear(d_ff, d_model, bias=False)
        self.register_buffer("offset", torch.ones(d_model))

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + self.offset
