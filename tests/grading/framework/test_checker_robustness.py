"""The checks' shared machinery on code written in other habits: a crash of the checker is
said to be one (and flagged for review by ``coursepkg grade``), modules that keep tensors on
``self`` or have lazy parameters are handled, reference pieces are swapped into a student's
layer the way the layer calls its own, and the parameter-count explainer may use a part twice.
The corpus (``test_grading_corpus.py``) covers the named mistakes one habit at a time."""

from __future__ import annotations

import copy

import grading_corpus_layers as lay
import grading_impls_encoder as impls
import pytest
import torch
from torch import nn

from coursepkg.attention import MultiHeadAttention as ReferenceMHA
from coursepkg.grading import (
    CheckerError,
    CheckFailure,
    check_encoder_layer,
    check_multi_head_attention,
    check_scaled_dot_product_attention,
)
from coursepkg.grading.checks import ex01_attention as attention_checks
from coursepkg.grading.checks import ex07_parameters as parameter_checks
from coursepkg.grading.classroom import ClassResult, StudentResult, checker_failure_flag
from coursepkg.grading.framework import CHECKER_FAILED, clone_module, materialise_lazy, swap_in


def test_a_crash_of_the_checker_says_so_and_asks_to_tell_the_instructor(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("a bug in the checker")

    monkeypatch.setattr(attention_checks, "expect_tensor", broken)
    with pytest.raises(CheckerError) as info:
        check_scaled_dot_product_attention(impls.sdpa_einsum)
    message = str(info.value)
    assert message.startswith(CHECKER_FAILED)
    assert "KeyError" in message and "not a verdict on your code" in message
    assert "tell your instructor" in message
    assert "your code returned" not in message
    assert info.value.check == "check_scaled_dot_product_attention"
    assert isinstance(info.value, CheckFailure)  # still a failed nbgrader test cell


def test_an_error_in_student_code_is_still_the_students():
    def raises(query, key, value, mask=None):
        raise ValueError("mine")

    with pytest.raises(CheckFailure) as info:
        check_scaled_dot_product_attention(raises)
    assert not isinstance(info.value, CheckerError)
    assert "raised ValueError" in str(info.value) and CHECKER_FAILED not in str(info.value)


def test_grade_flags_a_crashed_check_for_review():
    message = f"CheckerError: {CHECKER_FAILED} (KeyError at x.py:1: 'k')."
    assert "test_sdpa" in checker_failure_flag("test_sdpa", message)
    assert checker_failure_flag("test_sdpa", "your output differs from the reference") is None
    run = ClassResult(
        assignment="ex01_attention",
        students=[
            StudentResult("alice", score=3.0, max_score=5.0, checker_failed=["test_sdpa"]),
            StudentResult("bob", score=5.0, max_score=5.0),
        ],
    )
    summary = run.summary()
    assert "REVIEW" in summary and "alice: test_sdpa" in summary and "bob:" not in summary


def test_a_module_that_keeps_its_attention_weights_can_be_cloned():
    mha = lay.MHAStoresWeights(8, 2)
    x = torch.randn(2, 3, 8)
    mha(x, x, x).sum().backward()  # self.attn is now part of a graph
    with pytest.raises(RuntimeError):
        copy.deepcopy(mha)
    twin = clone_module(mha)
    assert twin.attn is not None and not twin.attn.requires_grad
    assert torch.equal(twin.attn, mha.attn.detach())
    assert all(torch.equal(a, b) for a, b in zip(twin.parameters(), mha.parameters(), strict=True))


def test_lazy_parameters_are_initialised_or_reported():
    mha = lay.MHALazy(8, 2)
    x = torch.zeros(1, 2, 8)
    materialise_lazy(mha, lambda m: m(x, x, x, None), "MultiHeadAttention")
    assert sum(p.numel() for p in mha.parameters()) == sum(
        p.numel() for p in ReferenceMHA(8, 2).parameters()
    )

    class NeverUsed(nn.Module):
        def __init__(self):
            super().__init__()
            self.spare = nn.LazyLinear(4)

        def forward(self, x):
            return x

    with pytest.raises(CheckFailure, match="lazy parameters"):
        materialise_lazy(NeverUsed(), lambda m: m(x), "MultiHeadAttention")


def test_a_swapped_in_piece_accepts_the_students_keyword_names():
    layer = lay.EncoderKwargs(8, 2, 16).eval()
    swap_in(layer, "self_attn", ReferenceMHA(8, 2))
    x = torch.randn(2, 4, 8)
    assert layer(x, torch.ones(2, 1, 1, 4, dtype=torch.bool)).shape == (2, 4, 8)


class _NormWithExtra(impls.VarMeanLayerNorm):
    """A LayerNorm (unbiased variance) with an argument the reference's has not."""

    def forward(self, x, scale=None):
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=1)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class _LayerCallingNormWithExtra(impls.EncoderLayerA):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__(d_model, n_heads, d_ff)
        self.norm1 = _NormWithExtra(d_model)

    def forward(self, x, mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, mask), scale=1.0)
        return self.norm2(x + self.ffn(x))


def test_a_piece_that_cannot_be_swapped_is_said_so_not_blamed_on_the_wiring():
    with pytest.raises(CheckFailure) as info:
        check_encoder_layer(_LayerCallingNormWithExtra)
    message = str(info.value)
    assert "Your norm1 differs" in message and "could not be swapped" in message
    assert "check how your forward connects them" not in message
    assert info.value.diagnosis == "ln.unbiased_variance"


def test_the_parameter_explainer_may_use_a_part_twice():
    kw = dict(parameter_checks._BASE)
    v_d = kw["vocab_size"] * kw["d_model"]
    text = parameter_checks._explain_gap(kw, 2 * v_d)
    assert "counts 2 × a V·D embedding matrix" in text
    text = parameter_checks._explain_gap(kw, kw["vocab_size"])
    assert "output-projection bias" in text


def test_a_fused_projection_is_counted_in_the_model_width():
    """GPT-2's c_attn (D x 3D) reads '3D² + 3D' in the table, not a bare number times D."""
    with pytest.raises(CheckFailure) as info:
        check_multi_head_attention(lay.MHAFusedCAttn)
    message = str(info.value)
    assert "c_attn is not in the reference: +3D² + 3D" in message
    assert "Split a fused projection (c_attn.weight, c_attn.bias)" in message
