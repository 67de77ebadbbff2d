"""Tests of the ex02 check (``checks/ex02_multihead.py``): its catalogue (each mistake rerun:
test_check_protocol.py), the reference and independent correct classes pass, hidden shapes depend
on the seed, PyTorch's attention and the reference are named, and a parameter gap or a missing
gradient is explained."""

from __future__ import annotations

import grading_impls_encoder as impls
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import coursepkg.attention as ref
from coursepkg.grading import CheckFailure
from coursepkg.grading.checks import ex02_multihead as ex02
from coursepkg.grading.checks import ex02_multihead_mistakes as mistakes
from coursepkg.grading.framework import configs, weights


@pytest.fixture(autouse=True)
def _one_thread():
    # The checks run hundreds of tiny ops; on a busy machine a second thread only adds
    # synchronisation (measured: ~0.15 s per check with one thread, ~1 s with two).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_catalogue_ids_are_unique_and_cover_the_issue():
    ids = [b.id for b in mistakes.MHA_BUGS]
    assert len(ids) == len(set(ids))
    for required in (
        "mha.split_without_transpose",
        "mha.no_output_projection",
        "mha.merge_wrong_order",
    ):
        assert required in ids


def test_thorough_configs_depend_on_the_seed():
    visible = configs("multi_head_attention")
    first, second = (
        configs("multi_head_attention", True, 0),
        configs("multi_head_attention", True, 1),
    )
    assert len(visible) >= 3
    assert first != second
    assert first[: len(visible)] == visible and len(first) > len(visible)


def test_visible_configs_cover_batch_one_and_unequal_lengths():
    mha = configs("multi_head_attention")
    assert any(c["B"] == 1 for c in mha) and any(c["L"] != c["S"] for c in mha)


def test_reference_class_passes_when_not_rejected(monkeypatch):
    # The reference class is rejected by design; with that step disabled it must pass,
    # which shows the numbers the check demands are the reference's.
    monkeypatch.setattr(weights, "reject_reference_class", lambda *a, **k: None)
    result = ex02.check_multi_head_attention(ref.MultiHeadAttention, points=2)
    assert result.passed and result.points == 2


@pytest.mark.parametrize("impl", [impls.HeadLoopMHA, impls.WeightViewMHA])
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_independent_mha_passes(impl, seed):
    assert ex02.check_multi_head_attention(impl, thorough=seed is not None, seed=seed)


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


class _DetachedMHA(impls.HeadLoopMHA):
    def forward(self, query, key, value, mask=None):
        return super().forward(query, key.detach(), value, mask).detach() + self.out_proj.bias * 0


def test_missing_gradients_are_named():
    with pytest.raises(CheckFailure) as info:
        ex02.check_multi_head_attention(_DetachedMHA)
    assert "no gradient reaches `q_proj.weight`" in str(info.value)
