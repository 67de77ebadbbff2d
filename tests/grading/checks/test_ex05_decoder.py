"""Tests of the ex05 checks (causal mask, decoder layer): correct solutions written differently
from the reference pass, its catalogue (each mistake rerun: test_check_protocol.py), and forbidden
shortcuts are named."""

from __future__ import annotations

import math

import grading_impls_decoder as impls
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from coursepkg.grading import (
    CheckFailure,
    catalogue,
    check_causal_mask,
    check_decoder_layer,
)
from coursepkg.grading.checks import ex05_decoder_mistakes as mistakes
from coursepkg.grading.framework import configs
from coursepkg.layers import DecoderLayer as ReferenceDecoderLayer
from coursepkg.layers import LayerNorm as ReferenceLayerNorm
from coursepkg.masks import causal_mask


def _layer_with(forward=None, **pieces) -> type:
    """DecoderLayerEinsum with its forward and/or some pieces replaced (pieces are
    factories called with (d_model, n_heads, d_ff))."""

    class Variant(impls.DecoderLayerEinsum):
        def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
            super().__init__(d_model, n_heads, d_ff)
            for name, make in pieces.items():
                setattr(self, name, make(d_model, n_heads, d_ff))

    if forward is not None:
        Variant.forward = forward
    return Variant


# ---------------------------------------------------------------------------------------------
# check_causal_mask
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "impl",
    [causal_mask, impls.causal_mask_tril, impls.causal_mask_compare],
    ids=lambda f: f.__name__,
)
def test_causal_mask_accepts_correct_masks(impl) -> None:
    result = check_causal_mask(impl, points=1)
    assert result.passed and result.points == 1
    assert "L = 1, 4, 7" in str(result)


def test_causal_mask_shows_the_wrong_grid() -> None:
    with pytest.raises(CheckFailure) as info:
        check_causal_mask(lambda n: torch.ones(n, n, dtype=torch.bool).triu())
    text = str(info.value)
    assert "row 0, column 1" in text and "1 1 1 1" in text


def test_causal_mask_wrong_shape_is_reported() -> None:
    with pytest.raises(CheckFailure, match=r"shape \(1, 2\)"):
        check_causal_mask(lambda n: torch.ones(n, n + 1, dtype=torch.bool).tril())


def test_causal_mask_calling_the_reference_is_named() -> None:
    with pytest.raises(CheckFailure, match="calls coursepkg.masks.causal_mask"):
        check_causal_mask(lambda n: causal_mask(n))


def test_causal_mask_thorough_configs_depend_on_the_seed() -> None:
    a = configs("causal_mask", thorough=True, seed=0)
    b = configs("causal_mask", thorough=True, seed=1)
    assert a != b and len(a) > len(configs("causal_mask"))
    assert check_causal_mask(impls.causal_mask_compare, thorough=True, seed=1).passed


# ---------------------------------------------------------------------------------------------
# check_decoder_layer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [impls.DecoderLayerEinsum, impls.DecoderLayerLoop])
def test_decoder_layer_accepts_independent_layers(cls) -> None:
    result = check_decoder_layer(cls)
    assert result.passed
    assert any("gradients" in m for m in result.messages)


def test_decoder_layer_thorough_mode_uses_seeded_configs() -> None:
    a = configs("decoder_layer", thorough=True, seed=0)
    b = configs("decoder_layer", thorough=True, seed=1)
    assert a != b
    assert a[:3] == configs("decoder_layer")
    assert check_decoder_layer(impls.DecoderLayerLoop, thorough=True, seed=1).passed


def test_reference_decoder_layer_is_rejected() -> None:
    with pytest.raises(CheckFailure, match="coursepkg's reference DecoderLayer"):
        check_decoder_layer(ReferenceDecoderLayer)


def test_reference_piece_inside_the_layer_is_rejected() -> None:
    layer = _layer_with(norm2=lambda d, h, f: ReferenceLayerNorm(d))
    with pytest.raises(CheckFailure, match="reference LayerNorm .* as `norm2`"):
        check_decoder_layer(layer)


class _TorchMHA(nn.Module):
    """The contract's signature around nn.MultiheadAttention (forbidden)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.inner = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def forward(self, query, key, value, mask=None):
        blocked = None if mask is None else ~mask
        return self.inner(query, key, value, attn_mask=blocked, need_weights=False)[0]


def test_nn_multihead_attention_is_rejected_by_name() -> None:
    with pytest.raises(CheckFailure, match=r"torch\.nn\.MultiheadAttention"):
        check_decoder_layer(_layer_with(self_attn=_TorchMHA))


class _SdpaMHA(impls.EinsumMHA):
    """Right numbers, but through PyTorch's fused attention."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__(d_model, n_heads)

    def forward(self, query, key, value, mask=None):
        b, n_q, d = query.shape
        split = lambda t: t.reshape(b, t.size(1), self.h, d // self.h).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(query)), split(self.k_proj(key)), split(self.v_proj(value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, L, Dv)
        return self.out_proj(out.transpose(1, 2).reshape(b, n_q, d))


def test_fused_attention_call_is_named() -> None:
    with pytest.raises(CheckFailure, match="torch.nn.functional.scaled_dot_product_attention"):
        check_decoder_layer(_layer_with(cross_attn=_SdpaMHA))


class _CenteringOnlyNorm(impls.ManualLayerNorm):
    """A wrong LayerNorm: subtracts the mean but does not divide by the deviation."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__(d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * (x - x.mean(-1, keepdim=True)) + self.bias


def test_first_wrong_piece_is_named_and_the_rest_declared_right() -> None:
    with pytest.raises(CheckFailure) as info:
        check_decoder_layer(_layer_with(norm2=_CenteringOnlyNorm))
    text = str(info.value)
    assert "Your norm2 differs from the reference LayerNorm" in text
    assert "the rest of your layer is right" in text
    assert "norm1" not in text.split("Your norm2")[1].split(".")[0]


class _UnscaledMHA(impls.EinsumMHA):
    """A wrong attention: scores are not divided by sqrt(Dk)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__(d_model, n_heads)

    def forward(self, query, key, value, mask=None):
        b, n_q, d = query.shape
        dk = d // self.h
        q = self.q_proj(query).reshape(b, n_q, self.h, dk)  # (B, L, H, Dk)
        k = self.k_proj(key).reshape(b, key.size(1), self.h, dk)  # (B, S, H, Dk)
        v = self.v_proj(value).reshape(b, value.size(1), self.h, dk)  # (B, S, H, Dv)
        scores = torch.einsum("blhd,bshd->bhls", q, k)  # (B, H, L, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # (B, H, L, S)
        return self.out_proj(torch.einsum("bhls,bshd->blhd", w, v).reshape(b, n_q, d))


def test_wrong_attention_class_is_named_for_both_attention_blocks() -> None:
    with pytest.raises(CheckFailure) as info:
        check_decoder_layer(_layer_with(self_attn=_UnscaledMHA, cross_attn=_UnscaledMHA))
    text = str(info.value)
    assert "Your self_attn differs from the reference MultiHeadAttention" in text
    assert "(and so does your cross_attn)" in text
    assert "Fix your MultiHeadAttention first: check_multi_head_attention says more" in text


class _NaNMHA(impls.EinsumMHA):
    """Right except that a fully masked row gives NaN (softmax over only -inf)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__(d_model, n_heads)

    def forward(self, query, key, value, mask=None):
        b, n_q, d = query.shape
        dk = d // self.h
        q = self.q_proj(query).reshape(b, n_q, self.h, dk)  # (B, L, H, Dk)
        k = self.k_proj(key).reshape(b, key.size(1), self.h, dk)  # (B, S, H, Dk)
        v = self.v_proj(value).reshape(b, value.size(1), self.h, dk)  # (B, S, H, Dv)
        scores = torch.einsum("blhd,bshd->bhls", q, k) / math.sqrt(dk)  # (B, H, L, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-1)  # (B, H, L, S)
        return self.out_proj(torch.einsum("bhls,bshd->blhd", w, v).reshape(b, n_q, d))


def test_fully_masked_row_must_not_give_nan() -> None:
    with pytest.raises(CheckFailure, match="NaN"):
        check_decoder_layer(_layer_with(cross_attn=_NaNMHA))


def test_missing_bias_is_explained_by_the_parameter_table() -> None:
    class NoBiasOut(impls.EinsumMHA):
        def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
            super().__init__(d_model, n_heads)
            self.out_proj = nn.Linear(d_model, d_model, bias=False)

    with pytest.raises(CheckFailure) as info:
        check_decoder_layer(_layer_with(self_attn=NoBiasOut))
    assert "self_attn.out_proj has no bias: −D" in str(info.value)


def test_float64_inputs_must_give_float64_outputs() -> None:
    def forward(self, x, memory, self_mask=None, cross_mask=None):
        return impls.DecoderLayerEinsum.forward(self, x, memory, self_mask, cross_mask).float()

    with pytest.raises(CheckFailure, match="dtype torch.float32, expected torch.float64"):
        check_decoder_layer(_layer_with(forward=forward))


def test_catalogue_lists_the_decoder_bugs() -> None:
    ids = {bug.id for bug in catalogue()}
    assert {bug.id for bug in mistakes.BUGS} <= ids
    assert len({bug.id for bug in mistakes.BUGS}) == len(mistakes.BUGS)


def test_unknown_wiring_mistake_points_to_forward() -> None:
    def halved_residual(self, x, memory, self_mask=None, cross_mask=None):
        x = self.norm1(0.5 * x + self.self_attn(x, x, x, self_mask))
        x = self.norm2(x + self.cross_attn(x, memory, memory, cross_mask))
        return self.norm3(x + self.ffn(x))

    with pytest.raises(CheckFailure) as info:
        check_decoder_layer(_layer_with(forward=halved_residual))
    assert info.value.diagnosis is None
    assert "the mistake is in how forward combines them" in str(info.value)
    assert "The paper's order: x = norm1(x + self_attn(" in str(info.value)
