"""Weight transfer from torch.nn.Transformer: the returned stack computes the same function
(DESIGN: m(src, tgt, tgt_mask=causal, *_key_padding_mask=~token_mask), batch_first=True).

``m`` is compared in two modes: training mode with dropout=0 (the plain Python path of
nn.Transformer), and eval mode with the encoder's nested-tensor fast path switched off
(``enable_nested_tensor=False``), which still runs PyTorch's fused eval kernels."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from coursepkg import EncoderDecoder, causal_mask
from coursepkg.interop import from_torch_transformer

D, H, FF = 16, 2, 24
SRC_MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
TGT_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)


def _torch_transformer(norm_first=False, mode="train", enc=2, dec=3, **kw) -> nn.Transformer:
    with warnings.catch_warnings():  # "enable_nested_tensor is True, but ..." for pre-LN
        warnings.simplefilter("ignore", UserWarning)
        m = nn.Transformer(
            d_model=D,
            nhead=H,
            num_encoder_layers=enc,
            num_decoder_layers=dec,
            dim_feedforward=FF,
            dropout=0.0,
            batch_first=True,
            norm_first=norm_first,
            **kw,
        )
    with torch.no_grad():  # random LayerNorm parameters, so the norms are really tested
        for mod in m.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.normal_(1.0, 0.3)
                if mod.bias is not None:
                    mod.bias.normal_(0.0, 0.3)
            if isinstance(mod, nn.MultiheadAttention) and mod.in_proj_bias is not None:
                mod.in_proj_bias.normal_(0.0, 0.3)
    if mode == "eval":
        m.eval()
        m.encoder.enable_nested_tensor = False
        m.encoder.use_nested_tensor = False
    else:
        m.train()
    return m


def _reference(m, src, tgt, src_mask, tgt_mask):
    t = tgt.size(1)
    with torch.no_grad():
        return m(
            src,
            tgt,
            tgt_mask=~causal_mask(t),  # nn.Transformer: True = blocked
            src_key_padding_mask=None if src_mask is None else ~src_mask,
            tgt_key_padding_mask=None if tgt_mask is None else ~tgt_mask,
            memory_key_padding_mask=None if src_mask is None else ~src_mask,
            tgt_is_causal=True,
        )


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize(("enc", "dec"), [(2, 3), (1, 1), (3, 1)])
def test_from_torch_transformer_equals_torch(enc, dec, norm_first, mode) -> None:
    m = _torch_transformer(norm_first, mode, enc, dec)
    ours = from_torch_transformer(m)
    assert isinstance(ours, EncoderDecoder)
    assert ours.training == m.training
    assert len(ours.encoder.layers) == enc and len(ours.decoder.layers) == dec
    src, tgt = torch.randn(3, 5, D), torch.randn(3, 4, D)
    want = _reference(m, src, tgt, SRC_MASK, TGT_MASK)
    with torch.no_grad():
        got = ours(src, tgt, SRC_MASK, TGT_MASK)
    assert got.shape == (3, 4, D)
    # compare at real target positions (padded ones are never read)
    assert_close(got[TGT_MASK], want[TGT_MASK], atol=1e-5, rtol=1e-5)
    # no padding at all
    with torch.no_grad():
        assert_close(ours(src, tgt), _reference(m, src, tgt, None, None), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kw",
    [dict(activation="gelu"), dict(bias=False), dict(layer_norm_eps=1e-3)],
    ids=["gelu", "no_bias", "eps"],
)
@pytest.mark.parametrize("norm_first", [False, True])
def test_from_torch_transformer_variants(kw, norm_first) -> None:
    m = _torch_transformer(norm_first, "train", **kw)
    ours = from_torch_transformer(m)
    cfg = ours.config
    assert cfg.activation == kw.get("activation", "relu") and cfg.bias == kw.get("bias", True)
    assert cfg.layer_norm_eps == kw.get("layer_norm_eps", 1e-5) and cfg.use_final_norm
    src, tgt = torch.randn(3, 5, D), torch.randn(3, 4, D)
    want = _reference(m, src, tgt, SRC_MASK, TGT_MASK)
    with torch.no_grad():
        got = ours(src, tgt, SRC_MASK, TGT_MASK)
    assert_close(got[TGT_MASK], want[TGT_MASK], atol=1e-5, rtol=1e-5)


def test_from_torch_transformer_float64() -> None:
    m = _torch_transformer(False, "train").double()
    ours = from_torch_transformer(m)
    assert next(ours.parameters()).dtype == torch.float64
    src, tgt = torch.randn(3, 5, D, dtype=torch.float64), torch.randn(3, 4, D, dtype=torch.float64)
    want = _reference(m, src, tgt, SRC_MASK, TGT_MASK)
    with torch.no_grad():
        got = ours(src, tgt, SRC_MASK, TGT_MASK)
    assert_close(got[TGT_MASK], want[TGT_MASK], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(
    "param",
    [
        "encoder.layers.0.self_attn.in_proj_weight",
        "decoder.layers.1.multihead_attn.out_proj.bias",
        "decoder.layers.2.linear2.weight",
        "encoder.norm.weight",
        "decoder.layers.0.norm3.bias",
    ],
)
def test_perturbing_a_transferred_weight_breaks_equality(param) -> None:
    """The comparison above can fail: nudge one weight of m after the transfer."""
    m = _torch_transformer(False, "train")
    ours = from_torch_transformer(m)
    src, tgt = torch.randn(3, 5, D), torch.randn(3, 4, D)
    with torch.no_grad():
        got = ours(src, tgt, SRC_MASK, TGT_MASK)
        assert_close(got[TGT_MASK], _reference(m, src, tgt, SRC_MASK, TGT_MASK)[TGT_MASK])
        w = m.get_parameter(param)
        w.add_(0.05 * torch.randn_like(w))
    want = _reference(m, src, tgt, SRC_MASK, TGT_MASK)
    assert not torch.allclose(got[TGT_MASK], want[TGT_MASK], atol=1e-5, rtol=1e-5)


def test_transfer_copies_rather_than_shares() -> None:
    m = _torch_transformer(False, "train")
    ours = from_torch_transformer(m)
    wq = ours.encoder.layers[0].self_attn.q_proj.weight
    assert_close(wq, m.encoder.layers[0].self_attn.in_proj_weight[:D])
    with torch.no_grad():
        m.encoder.layers[0].self_attn.in_proj_weight.zero_()
    assert wq.abs().sum() > 0


def test_from_torch_transformer_rejects_other_modules() -> None:
    with pytest.raises(TypeError, match="torch.nn.Transformer"):
        from_torch_transformer(nn.Linear(2, 2))  # type: ignore[arg-type]
