"""Tests of the ex04 checks: its catalogue (each mistake rerun: test_check_protocol.py), the
reference and independent correct implementations pass, an inner stub is named, hidden shapes
depend on the seed, forbidden classes and calls are named, and a wrong encoder layer is traced to
its first wrong piece."""

from __future__ import annotations

import grading_impls_encoder as impls
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursepkg import layers
from coursepkg.attention import MultiHeadAttention as ReferenceMHA
from coursepkg.grading import CheckFailure, NotImplementedYet
from coursepkg.grading.checks import ex02_multihead_mistakes as attention_mistakes
from coursepkg.grading.checks import ex04_encoder as encoder
from coursepkg.grading.checks import ex04_encoder_mistakes as encoder_mistakes
from coursepkg.grading.framework import configs, weights
from coursepkg.stubs import ex02_multihead


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny ops: a second thread only adds synchronisation on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_catalogue_covers_the_issue():
    ids = {b.id for b in encoder_mistakes.BUGS}
    assert len(ids) == len(encoder_mistakes.BUGS)
    assert {
        "ln.unbiased_variance",
        "ln.eps_outside_sqrt",
        "ln.wrong_axis",
        "ffn.no_activation",
        "enc.no_residual_attention",
        "enc.no_residual_ffn",
        "enc.pre_ln",
    } <= ids


@pytest.mark.parametrize(
    ("check", "cls"),
    [
        (encoder.check_layer_norm, layers.LayerNorm),
        (encoder.check_feed_forward, layers.PositionwiseFeedForward),
        (encoder.check_encoder_layer, layers.EncoderLayer),
    ],
)
def test_reference_classes_pass_when_not_rejected(monkeypatch, check, cls):
    # Reference classes are rejected by design; with that step off they must pass.
    monkeypatch.setattr(weights, "reject_reference_class", lambda *a, **k: None)
    assert check(cls, thorough=True, seed=3)


@pytest.mark.parametrize("impl", [impls.VarMeanLayerNorm, impls.SquaresLayerNorm])
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_independent_layer_norms_pass(impl, seed):
    assert encoder.check_layer_norm(impl, thorough=seed is not None, seed=seed)


@pytest.mark.parametrize("impl", [impls.ClampFFN, impls.SequentialishFFN])
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_independent_feed_forwards_pass(impl, seed):
    assert encoder.check_feed_forward(impl, thorough=seed is not None, seed=seed)


@pytest.mark.parametrize("impl", [impls.EncoderLayerA, impls.EncoderLayerB])
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_independent_encoder_layers_pass(impl, seed):
    result = encoder.check_encoder_layer(impl, thorough=seed is not None, seed=seed)
    assert result.passed and any("causal" in m for m in result.messages)


class _LayerWithStubAttention(impls.EncoderLayerA):
    def __init__(self, d_model, n_heads, d_ff):
        nn.Module.__init__(self)
        self.self_attn = ex02_multihead.MultiHeadAttention(d_model, n_heads)


def test_inner_stub_is_named():
    with pytest.raises(NotImplementedYet) as info:
        encoder.check_encoder_layer(_LayerWithStubAttention)
    assert "MultiHeadAttention.__init__ still raises NotImplementedError" in str(info.value)


@pytest.mark.parametrize("item", ["layer_norm", "feed_forward", "encoder_layer"])
def test_thorough_configs_depend_on_the_seed(item):
    visible = configs(item)
    assert len(visible) >= 3 and any(c["B"] == 1 for c in visible)
    assert configs(item, True, 0) != configs(item, True, 1)


def encoder_with(attn=impls.HeadLoopMHA, ffn=impls.ClampFFN, norm=impls.VarMeanLayerNorm):
    """A student-style encoder layer assembled from the given pieces."""

    class Layer(impls.EncoderLayerA):
        def __init__(self, d_model, n_heads, d_ff):
            nn.Module.__init__(self)
            self.self_attn = attn(d_model, n_heads)
            self.ffn = ffn(d_model, d_ff)
            self.norm1 = norm(d_model)
            self.norm2 = norm(d_model)

    return Layer


def _bug(bug_id):
    return next(
        b.impl for b in [*encoder_mistakes.BUGS, *attention_mistakes.MHA_BUGS] if b.id == bug_id
    )


@pytest.mark.parametrize(
    ("pieces", "wrong", "kind", "diagnosis"),
    [
        ({"norm": _bug("ln.unbiased_variance")}, "norm1", "LayerNorm", "ln.unbiased_variance"),
        ({"ffn": _bug("ffn.no_activation")}, "ffn", "PositionwiseFeedForward", "ffn.no_activation"),
        (
            {"attn": _bug("mha.inverted_mask")},
            "self_attn",
            "MultiHeadAttention",
            "mha.inverted_mask",
        ),
        (
            {"attn": _bug("mha.split_without_transpose")},
            "self_attn",
            "MultiHeadAttention",
            "mha.split_without_transpose",
        ),
    ],
)
def test_wrong_piece_is_located_and_named(pieces, wrong, kind, diagnosis):
    with pytest.raises(CheckFailure) as info:
        encoder.check_encoder_layer(encoder_with(**pieces))
    message = str(info.value)
    assert f"Your {wrong} differs from the reference {kind}" in message
    assert "the rest of your layer is right" in message
    assert info.value.diagnosis == diagnosis


class _OneWrongNorm(impls.EncoderLayerA):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__(d_model, n_heads, d_ff)
        self.norm2 = _bug("ln.eps_outside_sqrt")(d_model)


def test_only_the_second_norm_is_blamed():
    with pytest.raises(CheckFailure) as info:
        encoder.check_encoder_layer(_OneWrongNorm)
    message = str(info.value)
    assert "Your norm2 differs from the reference LayerNorm" in message
    assert "norm1" not in message.split("Your norm2")[1]
    assert info.value.diagnosis == "ln.eps_outside_sqrt"


def test_wiring_mistake_says_the_pieces_are_right():
    with pytest.raises(CheckFailure) as info:
        encoder.check_encoder_layer(_bug("enc.pre_ln"))
    assert "Each of your pieces" in str(info.value)


class _FunctionalLayerNorm(impls.VarMeanLayerNorm):
    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class _TorchLayerNorm(nn.LayerNorm):
    pass


class _TorchEncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.inner = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, 0.0, batch_first=True)

    def forward(self, x, mask=None):
        return self.inner(x)


class _ReferenceInside(impls.EncoderLayerA):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__(d_model, n_heads, d_ff)
        self.self_attn = ReferenceMHA(d_model, n_heads)


@pytest.mark.parametrize(
    ("check", "impl", "named"),
    [
        (encoder.check_layer_norm, _FunctionalLayerNorm, "torch.nn.functional.layer_norm"),
        (encoder.check_layer_norm, _TorchLayerNorm, "torch.nn.LayerNorm"),
        (encoder.check_encoder_layer, _TorchEncoderLayer, "torch.nn.TransformerEncoderLayer"),
        (encoder.check_encoder_layer, _ReferenceInside, "coursepkg.attention.MultiHeadAttention"),
    ],
)
def test_forbidden_classes_and_calls_are_named(check, impl, named):
    with pytest.raises(CheckFailure) as info:
        check(impl)
    assert named in str(info.value)


class _ZeroGainLayerNorm(impls.VarMeanLayerNorm):
    def __init__(self, d_model, eps=1e-5):
        super().__init__(d_model, eps)
        self.weight = nn.Parameter(torch.zeros(d_model))


def test_layer_norm_initialisation_is_checked():
    with pytest.raises(CheckFailure, match="initialised to ones"):
        encoder.check_layer_norm(_ZeroGainLayerNorm)


class _FixedEpsLayerNorm(impls.VarMeanLayerNorm):
    def __init__(self, d_model, eps=1e-5):
        super().__init__(d_model)


def test_layer_norm_must_use_its_eps():
    with pytest.raises(CheckFailure, match="eps=0.1"):
        encoder.check_layer_norm(_FixedEpsLayerNorm)


class _MixingFFN(impls.ClampFFN):
    def forward(self, x):
        return super().forward(x + x.mean(dim=1, keepdim=True))


def test_feed_forward_must_be_position_wise():
    with pytest.raises(CheckFailure):
        encoder.check_feed_forward(_MixingFFN)


class _MaskIgnored(impls.EncoderLayerA):
    def forward(self, x, mask=None):
        return super().forward(x, None)


class _NaNOnEmptyRows(impls.HeadLoopMHA):
    def forward(self, query, key, value, mask=None):
        out = super().forward(query, key, value, mask)  # (B, L, D)
        if mask is not None:
            full = mask.expand(query.size(0), 1, query.size(1), key.size(1))  # (B, 1, L, S)
            out = out.masked_fill(~full.any(-1).transpose(1, 2), float("nan"))  # (B, L, D)
        return out


def test_fully_masked_sequence_must_not_give_nan():
    with pytest.raises(CheckFailure) as info:
        encoder.check_encoder_layer(encoder_with(attn=_NaNOnEmptyRows))
    message = str(info.value)
    assert "contains NaN" in message and "Your self_attn differs" in message


def test_encoder_layer_ignoring_the_mask_fails():
    with pytest.raises(CheckFailure, match="padding mask"):
        encoder.check_encoder_layer(_MaskIgnored)


class _NoBiasFFN(impls.ClampFFN):
    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model, bias=False)


def test_parameter_gap_in_the_layer_is_explained():
    with pytest.raises(CheckFailure) as info:
        encoder.check_encoder_layer(encoder_with(ffn=_NoBiasFFN))
    assert "ffn.linear2 has no bias: −D" in str(info.value)
