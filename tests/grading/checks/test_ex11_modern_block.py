"""Tests of the ex11 checks (``checks/ex11_modern_block.py``): its catalogue (each mistake rerun
and named by its own id: test_check_protocol.py), independent correct solutions in two styles
(Llama's and Meta's/nanoGPT's) pass in visible and thorough mode, the same styles with a habit that
is wrong here get its id, the catalogue's correct modules are the reference's, and a cache of H
heads or a call to the reference is told."""

from __future__ import annotations

import grading_impls_modern as impls
import pytest
import torch

from coursepkg.grading import (
    CheckFailure,
    check_apply_rope,
    check_grouped_query_attention,
    check_modern_block,
    check_rms_norm,
    check_swiglu,
)
from coursepkg.grading.checks import ex11_modern_block_mistakes as catalogue
from coursepkg.grading.framework import configs, decode_with_cache, modern_blocks, weights
from coursepkg.layers import PositionwiseFeedForward, RMSNorm
from coursepkg.masks import causal_mask
from coursepkg.positional import apply_rope

CHECKS = {
    catalogue.RMS_NORM_ITEM: check_rms_norm,
    catalogue.ROPE_ITEM: check_apply_rope,
    catalogue.SWIGLU_ITEM: check_swiglu,
    catalogue.GQA_ITEM: check_grouped_query_attention,
    catalogue.MODERN_BLOCK_ITEM: check_modern_block,
}


@pytest.fixture(autouse=True)
def _one_thread():
    # Hundreds of tiny ops: a second thread only adds synchronisation on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_issue_s_mistakes_are_catalogued_once_each():
    ids = [b.id for b in catalogue.BUGS]
    assert len(ids) == len(set(ids)) == 33
    assert {b.item for b in catalogue.BUGS} == set(CHECKS)


@pytest.mark.parametrize(
    ("check", "impl"),
    [
        (check_rms_norm, impls.LlamaRMSNorm),
        (check_rms_norm, impls.MetaRMSNorm),
        (check_apply_rope, impls.llama_rope),
        (check_apply_rope, impls.complex_rope),
        (check_swiglu, impls.LlamaMLP),
        (check_swiglu, impls.MetaFeedForward),
        (check_grouped_query_attention, impls.LlamaAttention),
        (check_grouped_query_attention, impls.GroupedEinsumAttention),
        (check_modern_block, impls.LlamaDecoderLayer),
        (check_modern_block, impls.MetaBlock),
    ],
    ids=lambda x: x.__name__,
)
@pytest.mark.parametrize("seed", [None, 0], ids=["visible", "thorough"])
def test_independent_solutions_pass(check, impl, seed):
    result = check(impl, thorough=seed is not None, seed=seed)
    assert result.passed and result.messages


@pytest.mark.parametrize(
    ("check", "impl", "bug_id"),
    [
        (check_apply_rope, impls.meta_rope_always_complex_pairs, "rope.interleaved_pairs"),
        (
            check_grouped_query_attention,
            impls.LlamaAttentionTiledKV,
            "gqa.kv_repeat_not_interleave",
        ),
        (
            check_grouped_query_attention,
            impls.LlamaAttentionNoPastPositions,
            "gqa.positions_not_offset",
        ),
        (check_modern_block, impls.LlamaLayerNormedResidual, "modern_block.residual_after_norm"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_a_mistake_in_another_style_is_named(check, impl, bug_id):
    with pytest.raises(CheckFailure) as info:
        check(impl)
    assert info.value.diagnosis == bug_id, str(info.value)


def test_the_pairing_mistake_says_which_layout_was_written():
    """Each pairing mistake is named on the configuration of the other layout, and its
    message says which one the student wrote."""
    for bug, wrote in (
        ("rope.interleaved_pairs", "adjacent columns (2i, 2i+1)"),
        ("rope.halves_pairs", "column i with column i + Dh/2"),
    ):
        impl = next(b.impl for b in catalogue.ROPE_BUGS if b.id == bug)
        with pytest.raises(CheckFailure) as info:
            check_apply_rope(impl)
        assert info.value.diagnosis == bug and f"you paired {wrote}" in str(info.value)


def test_a_cache_of_every_query_head_is_told():
    with pytest.raises(CheckFailure) as info:
        check_grouped_query_attention(impls.GroupedEinsumCacheAllHeads)
    message = str(info.value)
    assert "should hold the rotated keys of the 2 key/value heads" in message
    assert "holds (2, 4, 6, 4)" in message and info.value.diagnosis is None


def _calls_reference(x, positions, theta=10000.0, pairs="halves"):
    return apply_rope(x, positions, theta, pairs)


def test_a_call_to_the_reference_is_named():
    with pytest.raises(CheckFailure, match="coursepkg.positional.apply_rope"):
        check_apply_rope(_calls_reference)


@pytest.mark.parametrize(
    ("check", "reference"),
    [
        (check_rms_norm, RMSNorm),
        (
            check_swiglu,
            lambda d, f: PositionwiseFeedForward(d, f, activation="swiglu", bias=False),
        ),
    ],
    ids=["RMSNorm", "SwiGLU"],
)
def test_the_reference_passes_when_not_rejected(monkeypatch, check, reference):
    # The reference is rejected by design; with that step off it passes: the numbers the
    # check demands are the reference's.
    monkeypatch.setattr(weights, "reject_reference_class", lambda *a, **k: None)
    cls = type("Ref", (torch.nn.Module,), {})  # a class for the checks' type test
    cls.__new__ = lambda _cls, *a, **k: reference(*a, **k)
    assert check(cls, thorough=True, seed=2).passed


@pytest.mark.parametrize("item", [catalogue.GQA_ITEM, catalogue.MODERN_BLOCK_ITEM])
def test_visible_shapes_cover_grouped_multi_query_and_multi_head(item):
    cfgs = configs(item)
    assert {"halves", "interleaved"} <= {c["pairs"] for c in cfgs}
    assert any(1 < c["Hkv"] < c["H"] for c in cfgs)  # grouped
    assert any(c["Hkv"] == 1 < c["H"] for c in cfgs)  # multi-query
    assert any(c["Hkv"] == c["H"] for c in cfgs)  # multi-head
    assert all(c["D"] // c["H"] % 2 == 0 for c in configs(item, True, 5))  # Dh even
    assert configs(item, True, 0) != configs(item, True, 1)


def test_the_norm_and_feed_forward_mistakes_are_the_reference_with_one_step_wrong():
    """The RMSNorm and SwiGLU mistakes subclass the reference, and the SwiGLU they override
    is the reference's gated feed-forward, so a variant differs from the reference by its own
    mistake only."""
    assert all(issubclass(b.impl, RMSNorm) for b in catalogue.RMS_NORM_BUGS)
    assert all(issubclass(b.impl, PositionwiseFeedForward) for b in catalogue.SWIGLU_BUGS)
    mistake = catalogue.SWIGLU_BUGS[0].impl(8, 12)
    reference = PositionwiseFeedForward(8, 12, 0.0, "swiglu", False)
    assert mistake.state_dict().keys() == reference.state_dict().keys()
    assert mistake.activation is reference.activation


@pytest.mark.parametrize("cfg", configs(catalogue.MODERN_BLOCK_ITEM, True, 3), ids=str)
def test_the_catalogue_s_attention_and_block_are_the_reference_s(cfg):
    """With the reference's weights the catalogue's correct attention and block (whose steps
    the mistakes override) give the reference's outputs under a causal mask, and decoding
    with their dict cache gives the same: the reference's grouped-query attention and its
    pre-norm layer, and the checks' dict cache, agree."""
    args = (cfg["D"], cfg["H"], cfg["Hkv"])
    rope = (cfg["theta"], cfg["pairs"])
    pairs = [
        (modern_blocks.RotaryGQABlock(*args, *rope), modern_blocks.ReferenceGQA(*args, *rope)),
        (
            modern_blocks.PreNormBlock(*args, cfg["F"], 1e-5, *rope),
            modern_blocks.ReferenceBlock(*args, cfg["F"], 1e-5, *rope),
        ),
    ]
    x = torch.randn(cfg["B"], cfg["L"], cfg["D"], generator=torch.Generator().manual_seed(1))
    mask = causal_mask(cfg["L"])
    for mine, reference in pairs:
        mine.load_state_dict(reference.state_dict())
        expected = reference(x, mask)
        torch.testing.assert_close(mine(x, mask), expected)
        prefill = max(1, cfg["L"] // 2)
        torch.testing.assert_close(decode_with_cache(mine, x, prefill), expected)
