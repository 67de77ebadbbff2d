"""Tests of the ex12 check (``checks/ex12_tiled_attention.py``): its catalogue (each mistake rerun
and named by its own id: test_check_protocol.py) (on CUDA too when there is one), three independent
correct styles pass in visible and thorough mode, the same styles with a mistake get its id, the
catalogue's correct Function is the reference's ``tiled_attention`` and SDPA, and the visible
shapes hold the cases the issue asks for."""

from __future__ import annotations

import math

import grading_impls_tiled as impls
import pytest
import torch
import torch.nn.functional as F
from student_code import student_impl

from coursepkg.efficient_attention import tiled_attention
from coursepkg.grading import CheckFailure, check_tiled_attention
from coursepkg.grading.checks import ex12_tiled_attention as check_module
from coursepkg.grading.checks import ex12_tiled_attention_mistakes as catalogue
from coursepkg.grading.framework import configs
from coursepkg.masks import causal_mask

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(autouse=True)
def _one_thread():
    # Many tiny ops: a second thread only adds synchronisation on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_issue_s_mistakes_are_catalogued_once_each():
    ids = [b.id for b in catalogue.BUGS]
    assert len(ids) == len(set(ids)) == 15
    assert {
        "tiled.no_rescale",
        "tiled.max_not_subtracted",
        "tiled.lse_without_max",
        "tiled.causal_skip_off_by_one",
        "tiled.delta_per_block",
        "tiled.normalised_in_loop",
    } <= set(ids)


@pytest.mark.parametrize(
    "impl",
    [impls.FlashTwoStyle, impls.FlashOneStyle, impls.LogAddExpStyle],
    ids=lambda x: x.__name__,
)
@pytest.mark.parametrize("seed", [None, 0], ids=["visible", "thorough"])
def test_independent_solutions_pass(impl, seed):
    result = check_tiled_attention(impl, thorough=seed is not None, seed=seed)
    assert result.passed and result.messages


@pytest.mark.parametrize(
    ("impl", "bug_id"),
    [
        (impls.FlashOneNoRescale, "tiled.no_rescale"),
        (impls.FlashTwoNoMax, "tiled.max_not_subtracted"),
        (impls.FlashOneForgetsMaxInBackward, "tiled.lse_without_max"),
        (impls.LogAddExpDeltaPerTile, "tiled.delta_per_block"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_a_mistake_in_another_style_is_named(impl, bug_id):
    with pytest.raises(CheckFailure) as info:
        check_tiled_attention(impl)
    assert info.value.diagnosis == bug_id, str(info.value)


def test_a_class_that_is_not_an_autograd_function_is_told():
    with pytest.raises(CheckFailure, match="torch.autograd.Function"):
        check_tiled_attention(torch.nn.Module)


@pytest.mark.parametrize("cfg", configs(catalogue.TILED_ITEM, True, 4), ids=str)
def test_the_catalogue_s_function_is_the_reference_s(cfg):
    """The correct Function the mistakes override gives the reference ``tiled_attention``'s
    output and SDPA's gradients, so a variant differs by its own mistake only."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, mask, causal, block_q, block_k, grad_out = check_module._inputs(
        gen, cfg, torch.float64, "cpu"
    )
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = catalogue.TiledFunction.apply(q, k, v, mask, causal, block_q, block_k)
    torch.testing.assert_close(out, tiled_attention(q, k, v, mask, (block_q, block_k), causal))
    allowed = None if mask is None else mask.expand(*q.shape[:-1], k.size(-2))
    if causal:
        tri = causal_mask(q.size(-2), k.size(-2))
        allowed = tri if allowed is None else allowed & tri
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(out, expected)
    mine = torch.autograd.grad(out, (q, k, v), grad_out)
    theirs = torch.autograd.grad(expected, (q, k, v), grad_out)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b)


def test_the_visible_shapes_hold_the_issue_s_cases():
    cfgs = configs(catalogue.TILED_ITEM)
    assert any(c["L"] % c["bq"] and c["S"] % c["bk"] for c in cfgs)  # blocks do not divide
    assert any(c["causal"] and c["L"] < c["S"] for c in cfgs)  # bottom-right, L < S
    assert any(c["mask"] == "padding" for c in cfgs) and any("H" in c for c in cfgs)
    # A key block starting at a query block's last position: the off-by-one skip shows.
    assert any(
        c["causal"] and (i1 - 1 + c["S"] - c["L"]) % c["bk"] == 0
        for c in cfgs
        for i1 in [min(i + c["bq"], c["L"]) for i in range(0, c["L"], c["bq"])]
    )
    assert configs(catalogue.TILED_ITEM, True, 0) != configs(catalogue.TILED_ITEM, True, 1)


def test_the_scaled_queries_overflow_a_plain_exponential():
    """The overflow case is real: exp of the raw scores of the scaled queries is inf in
    float32, while SDPA's output stays finite."""
    cfg = configs(catalogue.TILED_ITEM)[0]
    gen = torch.Generator().manual_seed(0)
    q, k, v, *_ = check_module._inputs(gen, cfg, torch.float32, "cpu")
    scores = (q * check_module.SCALED_QUERIES) @ k.transpose(-2, -1) / math.sqrt(cfg["Dk"])
    assert torch.isinf(torch.exp(scores)).any()
    assert torch.isfinite(
        F.scaled_dot_product_attention(q * check_module.SCALED_QUERIES, k, v)
    ).all()


@CUDA
def test_the_check_runs_on_cuda_too():
    result = check_tiled_attention(impls.FlashTwoStyle, thorough=True, seed=1)
    assert "ran on cpu and cuda" in result.messages


@CUDA
@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda b: b.id)
def test_every_catalogued_mistake_is_named_on_cuda(bug, monkeypatch):
    monkeypatch.setattr(check_module, "devices", lambda: ["cuda"])
    with pytest.raises(CheckFailure) as info:
        check_tiled_attention(student_impl(bug))
    assert info.value.diagnosis == bug.id, str(info.value)
    if not bug.calls:  # the honesty rule does not see a CUDA backward's thread
        assert "cuda" in str(info.value)


class _ThreeGradients(impls.FlashTwoStyle):
    @staticmethod
    def backward(ctx, do):
        return impls.FlashTwoStyle.backward(ctx, do)[:3]


class _ReturnsTheLogSumExp(impls.FlashTwoStyle):
    @classmethod
    def forward(cls, ctx, *args):
        out = impls.FlashTwoStyle.forward.__func__(cls, ctx, *args)
        return out, out.sum(-1)


@pytest.mark.parametrize(
    ("impl", "said"),
    [
        (_ThreeGradients, "(grad_query, grad_key, grad_value, None, None, None, None)"),
        (_ReturnsTheLogSumExp, "forward should return the output only"),
    ],
    ids=["three gradients", "a tuple"],
)
def test_the_shape_of_what_the_function_returns_is_told(impl, said):
    with pytest.raises(CheckFailure) as info:
        check_tiled_attention(impl)
    assert said in str(info.value) and info.value.diagnosis is None
