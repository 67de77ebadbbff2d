"""LayerNorm (== nn.LayerNorm), the position-wise FFN, and the encoder/decoder layers in post-LN
and pre-LN form: the formulas by hand, masking invariances, and dropout behaviour."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from coursepkg import (
    DecoderLayer,
    EncoderLayer,
    LayerNorm,
    PositionwiseFeedForward,
    TransformerConfig,
    causal_mask,
)
from coursepkg.config import BlockConfig
from coursepkg.layers import layer_norm_reference

D, H, FF = 16, 2, 32


def _randomise_norms(module: nn.Module) -> None:
    """Random gains and shifts, so that a test cannot pass by the defaults (1, 0) alone."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, LayerNorm | nn.LayerNorm):
                m.weight.normal_(1.0, 0.5)
                if m.bias is not None:
                    m.bias.normal_()


# --------------------------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(8,), (3, 8), (2, 5, 8)])
@pytest.mark.parametrize("eps", [1e-5, 1e-3, 0.5])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_equals_torch(eps, shape, dtype, bias) -> None:
    ours = LayerNorm(8, eps=eps, bias=bias).to(dtype)
    ref = nn.LayerNorm(8, eps=eps, bias=bias).to(dtype)
    _randomise_norms(ours)
    ref.load_state_dict(ours.state_dict())
    assert (ours.bias is None) is (not bias)
    x = (3.0 * torch.randn(*shape, dtype=dtype) + 5.0).requires_grad_()
    want = ref(x)
    got = ours(x)
    assert_close(got, want)
    assert_close(layer_norm_reference(x, ours.weight, ours.bias, eps), want)
    g = torch.randn_like(want)
    (grad_ours,) = torch.autograd.grad(got, x, g)
    (grad_ref,) = torch.autograd.grad(want, x, g)
    assert_close(grad_ours, grad_ref)


def test_layer_norm_parameters_and_normalisation() -> None:
    ln = LayerNorm(6)
    assert torch.equal(ln.weight, torch.ones(6)) and torch.equal(ln.bias, torch.zeros(6))
    assert [n for n, _ in ln.named_parameters()] == ["weight", "bias"]
    y = ln(10 * torch.randn(4, 6) - 3)
    assert_close(y.mean(-1), torch.zeros(4), atol=1e-5, rtol=0)
    assert_close(y.var(-1, unbiased=False), torch.ones(4), atol=1e-3, rtol=0)


# ------------------------------------------------------------------------------------- FFN
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_feed_forward_formula(activation, bias) -> None:
    ffn = PositionwiseFeedForward(D, FF, activation=activation, bias=bias)
    assert ffn.linear1.weight.shape == (FF, D) and ffn.linear2.weight.shape == (D, FF)
    assert (ffn.linear1.bias is None) is (not bias)
    x = torch.randn(2, 5, D)
    act = F.relu if activation == "relu" else F.gelu
    assert_close(ffn(x), ffn.linear2(act(ffn.linear1(x))))


def test_feed_forward_is_position_wise() -> None:
    ffn = PositionwiseFeedForward(D, FF)
    x = torch.randn(2, 5, D)
    perm = torch.tensor([3, 0, 4, 1, 2])
    assert_close(ffn(x[:, perm]), ffn(x)[:, perm])
    assert_close(ffn(x[:, 2:3]), ffn(x)[:, 2:3])


# ------------------------------------------------------------------------------------ layers
def _encoder_by_hand(layer: EncoderLayer, x, mask):
    if layer.norm_first:
        h = layer.norm1(x)
        x = x + layer.self_attn(h, h, h, mask)
        return x + layer.ffn(layer.norm2(x))
    x = layer.norm1(x + layer.self_attn(x, x, x, mask))
    return layer.norm2(x + layer.ffn(x))


def _decoder_by_hand(layer: DecoderLayer, y, mem, self_mask, cross_mask):
    if layer.norm_first:
        h = layer.norm1(y)
        y = y + layer.self_attn(h, h, h, self_mask)
        h = layer.norm2(y)
        y = y + layer.cross_attn(h, mem, mem, cross_mask)
        return y + layer.ffn(layer.norm3(y))
    y = layer.norm1(y + layer.self_attn(y, y, y, self_mask))
    y = layer.norm2(y + layer.cross_attn(y, mem, mem, cross_mask))
    return layer.norm3(y + layer.ffn(y))


def _key_mask(lengths: list[int], n: int) -> torch.Tensor:
    """(B, 1, 1, n) attention mask hiding the keys past each length."""
    return (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_formula(norm_first) -> None:
    layer = EncoderLayer(BlockConfig.of(D, H, FF, norm_first=norm_first)).eval()
    _randomise_norms(layer)
    x, mask = torch.randn(2, 5, D), _key_mask([5, 3], 5)
    out = layer(x, mask)
    assert out.shape == (2, 5, D)
    assert_close(out, _encoder_by_hand(layer, x, mask))


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_formula(norm_first) -> None:
    layer = DecoderLayer(BlockConfig.of(D, H, FF, norm_first=norm_first)).eval()
    _randomise_norms(layer)
    y, mem = torch.randn(2, 4, D), torch.randn(2, 6, D)
    self_mask, cross_mask = causal_mask(4), _key_mask([6, 2], 6)
    out = layer(y, mem, self_mask, cross_mask)
    assert out.shape == (2, 4, D)
    assert_close(out, _decoder_by_hand(layer, y, mem, self_mask, cross_mask))


@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_post_ln_and_pre_ln_differ(cls) -> None:
    post = cls(BlockConfig.of(D, H, FF, norm_first=False)).eval()
    pre = cls(BlockConfig.of(D, H, FF, norm_first=True)).eval()
    pre.load_state_dict(post.state_dict())  # the same weights, only the placement differs
    x, mem = torch.randn(2, 4, D), torch.randn(2, 3, D)
    args = (x,) if cls is EncoderLayer else (x, mem)
    a, b = post(*args), pre(*args)
    assert not torch.allclose(a, b, atol=1e-3)
    # post-LN ends with a LayerNorm (unit gain, zero shift here): each position is normalised
    assert_close(a.mean(-1), torch.zeros(2, 4), atol=1e-5, rtol=0)
    assert b.mean(-1).abs().max() > 1e-3


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_ignores_padded_positions(norm_first) -> None:
    layer = EncoderLayer(BlockConfig.of(D, H, FF, norm_first=norm_first)).eval()
    lengths = [5, 2, 4]
    x, mask = torch.randn(3, 5, D), _key_mask(lengths, 5)
    real = mask[:, 0, 0, :]  # (B, S)
    x2 = torch.where(real[..., None], x, 50 * torch.randn_like(x))
    assert_close(layer(x2, mask)[real], layer(x, mask)[real])


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_masks(norm_first) -> None:
    layer = DecoderLayer(BlockConfig.of(D, H, FF, norm_first=norm_first)).eval()
    y, mem = torch.randn(2, 5, D), torch.randn(2, 6, D)
    cross = _key_mask([6, 3], 6)
    out = layer(y, mem, causal_mask(5), cross)
    # masked memory positions do not matter
    mem2 = mem.clone()
    mem2[1, 3:] = 100 * torch.randn(3, D)
    assert_close(layer(y, mem2, causal_mask(5), cross), out)
    # later target positions do not matter for earlier ones (causal self-attention)
    for i in range(4):
        y2 = y.clone()
        y2[:, i + 1 :] = torch.randn_like(y2[:, i + 1 :])
        assert_close(layer(y2, mem, causal_mask(5), cross)[:, : i + 1], out[:, : i + 1])
    # and without the causal mask they do
    full = layer(y, mem, None, cross)
    y2 = y.clone()
    y2[:, -1] += torch.randn(D)  # (a constant shift would vanish in pre-LN's LayerNorm)
    assert not torch.allclose(layer(y2, mem, None, cross)[:, 0], full[:, 0])


@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_layers_dropout_only_in_training(cls) -> None:
    x, mem = torch.randn(2, 4, D), torch.randn(2, 3, D)
    args = (x,) if cls is EncoderLayer else (x, mem)
    layer = cls(D, H, FF, dropout=0.5)
    a, b = layer(*args), layer(*args)
    assert not torch.allclose(a, b)  # training: two different dropout masks
    layer.eval()
    assert torch.equal(layer(*args), layer(*args))
    no_drop = cls(D, H, FF, dropout=0.0)
    assert_close(no_drop(*args), no_drop.eval()(*args))


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_gradients_reach_every_parameter(norm_first) -> None:
    layer = DecoderLayer(BlockConfig.of(D, H, FF, norm_first=norm_first))
    y, mem = torch.randn(2, 4, D), torch.randn(2, 3, D)
    (layer(y, mem, causal_mask(4)) * torch.randn(2, 4, D)).sum().backward()
    names = {n for n, _ in layer.named_parameters()}
    assert {"self_attn.q_proj.weight", "cross_attn.k_proj.weight", "ffn.linear1.weight"} <= names
    assert {"norm1.weight", "norm2.weight", "norm3.bias"} <= names
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
@pytest.mark.parametrize("seed", range(3))
def test_the_exercise_form_builds_the_paper_layer_of_a_block_config(cls, seed) -> None:
    # EncoderLayer(D, H, F, dropout) (the exercises', ex09's stand-in) == the config form.
    torch.manual_seed(seed)
    a = cls(D, H, FF, 0.1)
    torch.manual_seed(seed)
    b = cls(BlockConfig.of(D, H, FF, 0.1))
    assert {k: v.shape for k, v in a.state_dict().items()} == {
        k: v.shape for k, v in b.state_dict().items()
    }
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert a.dropout1.p == b.dropout1.p == 0.1


@pytest.mark.parametrize("n_kv_heads, d_k", [(None, None), (1, 6), (2, None)])
def test_a_model_config_resolves_its_block_once(n_kv_heads, d_k) -> None:
    config = TransformerConfig(
        vocab_size=7, d_model=D, n_heads=H, d_ff=FF, n_kv_heads=n_kv_heads, d_k=d_k, d_v=d_k
    )
    block = config.block()
    assert (block.n_kv_heads, block.d_k, block.d_v) == (
        config.kv_heads,
        config.head_dim_k,
        config.head_dim_v,
    )
    assert block.n_kv_heads == (H if n_kv_heads is None else n_kv_heads)
    attn = EncoderLayer(block).self_attn
    assert (attn.n_kv_heads, attn.d_k, attn.k_proj.out_features) == (
        block.n_kv_heads,
        block.d_k,
        block.n_kv_heads * block.d_k,
    )


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: BlockConfig.of(10, 3, 16), "d_model must be divisible by n_heads"),
        (lambda: BlockConfig.of(D, H, FF, n_kv_heads=3), "n_kv_heads must divide n_heads=2"),
        (lambda: BlockConfig.of(D, H, FF, activation="tanh"), "activation must be one of"),
        (lambda: BlockConfig.of(D, H, FF, dropout=1.0), "dropout must be in"),
        (lambda: BlockConfig.of(D, H, FF, positional="rope"), r"no options \['positional'\]"),
        (
            lambda: dataclasses.replace(BlockConfig.of(D, H, FF), n_kv_heads=0),
            "n_kv_heads must be a positive integer",
        ),
        (lambda: dataclasses.replace(BlockConfig.of(D, H, FF), norm="batch"), "norm must be"),
        (lambda: EncoderLayer(D), "needs n_heads and d_ff"),
        (lambda: DecoderLayer(BlockConfig.of(D, H, FF), H), "either a BlockConfig or d_model"),
    ],
)
def test_impossible_blocks_are_named(make, field) -> None:
    with pytest.raises(ValueError, match=field):
        make()


def test_a_block_config_is_frozen_and_named() -> None:
    block = BlockConfig.of(D, H, FF)
    with pytest.raises(dataclasses.FrozenInstanceError):
        block.n_kv_heads = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        BlockConfig(D, H, FF)  # type: ignore[misc]  # keyword only: every field by name
