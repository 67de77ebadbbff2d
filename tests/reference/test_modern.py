"""Today's decoder options in the reference (issue 30): RMSNorm, the gated feed-forwards."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg import DecoderOnlyLM, EncoderOnlyLM, RMSNorm, Transformer, TransformerConfig
from coursepkg.layers import LayerNorm, PositionwiseFeedForward, rms_norm_reference
from coursepkg.params import count_parameters, feed_forward_parameters


@settings(max_examples=25, deadline=None)
@given(
    d=st.integers(1, 24),
    rows=st.integers(1, 5),
    eps=st.sampled_from([1e-6, 1e-5, 1e-2]),
    seed=st.integers(0, 2**16),
)
def test_rmsnorm_equals_torch_and_the_formula(d: int, rows: int, eps: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 3, d, generator=g, dtype=torch.float64) * 3
    ours = RMSNorm(d, eps).double()
    theirs = torch.nn.RMSNorm(d, eps=eps, dtype=torch.float64)
    with torch.no_grad():
        w = torch.randn(d, generator=g, dtype=torch.float64)
        ours.weight.copy_(w)
        theirs.weight.copy_(w)
    torch.testing.assert_close(ours(x), theirs(x))
    # an independent computation: divide each row by its root mean square (eps inside the root)
    by_hand = (
        torch.stack([r / torch.sqrt((r * r).sum() / d + eps) for r in x.reshape(-1, d)]).reshape(
            x.shape
        )
        * w
    )
    torch.testing.assert_close(ours(x), by_hand)
    torch.testing.assert_close(rms_norm_reference(x, w, eps), by_hand)


def test_rmsnorm_does_not_centre() -> None:
    # a constant row: LayerNorm maps it to its shift, RMSNorm keeps its sign and size ~1
    x = torch.full((1, 4), 2.0)
    torch.testing.assert_close(RMSNorm(4, eps=0.0)(x), torch.ones(1, 4))


def test_config_rejects_unknown_norm() -> None:
    with pytest.raises(ValueError, match="norm must be one of .*'batchnorm'"):
        TransformerConfig(vocab_size=10, norm="batchnorm")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("cls", "kind"),
    [(DecoderOnlyLM, "decoder-only"), (Transformer, "encoder-decoder"), (EncoderOnlyLM, None)],
)
def test_norm_option_builds_rmsnorm_everywhere(cls, kind, bias: bool) -> None:
    config = TransformerConfig(
        vocab_size=17,
        d_model=8,
        n_heads=2,
        d_ff=12,
        n_layers=2,
        dropout=0.0,
        norm_first=True,
        norm="rmsnorm",
        bias=bias,
        max_len=16,
    )
    model = cls(config)
    assert not any(isinstance(m, LayerNorm) for m in model.modules())
    assert sum(isinstance(m, RMSNorm) for m in model.modules()) >= 2 * config.n_layers
    if kind is not None:
        assert count_parameters(config, kind) == sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, 17, (2, 5))
    out = model(tokens, tokens) if kind == "encoder-decoder" else model(tokens)
    assert torch.isfinite(out).all()


def test_rmsnorm_model_changes_when_norm_changes() -> None:
    torch.manual_seed(0)
    base = TransformerConfig(
        vocab_size=17,
        d_model=8,
        n_heads=2,
        d_ff=12,
        n_layers=1,
        dropout=0.0,
        norm_first=True,
        bias=False,
        max_len=16,
    )
    ln, rms = DecoderOnlyLM(base), DecoderOnlyLM(base.replace(norm="rmsnorm"))
    rms.load_state_dict(ln.state_dict())  # without biases both have the same parameters
    tokens = torch.randint(0, 17, (1, 6))
    assert not torch.allclose(ln(tokens), rms(tokens))


@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(["swiglu", "geglu"]),
    bias=st.booleans(),
    d=st.integers(1, 12),
    f=st.integers(1, 20),
    seed=st.integers(0, 2**16),
)
def test_gated_feed_forward_by_hand(kind: str, bias: bool, d: int, f: int, seed: int) -> None:
    torch.manual_seed(seed)
    ffn = PositionwiseFeedForward(d, f, activation=kind, bias=bias).double()
    x = torch.randn(2, 3, d, dtype=torch.float64)
    act = torch.nn.SiLU() if kind == "swiglu" else torch.nn.GELU()

    def lin(m: torch.nn.Linear, v: torch.Tensor) -> torch.Tensor:
        out = v @ m.weight.T
        return out + m.bias if m.bias is not None else out

    expected = lin(ffn.linear2, act(lin(ffn.linear1, x)) * lin(ffn.linear3, x))
    torch.testing.assert_close(ffn(x), expected)
    config = TransformerConfig(
        vocab_size=5, d_model=d, n_heads=1, d_ff=f, activation=kind, bias=bias
    )
    assert feed_forward_parameters(config) == sum(p.numel() for p in ffn.parameters())


@settings(max_examples=15, deadline=None)
@given(d=st.integers(1, 12), f=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_relu_squared_feed_forward_by_hand(d: int, f: int, seed: int) -> None:
    """ "relu2" (Primer, nanochat): W2 relu(W1 x + b1)^2 + b2, two matrices like "relu"."""
    torch.manual_seed(seed)
    ffn = PositionwiseFeedForward(d, f, activation="relu2").double()
    x = torch.randn(2, 3, d, dtype=torch.float64)
    hidden = torch.relu(x @ ffn.linear1.weight.T + ffn.linear1.bias)
    torch.testing.assert_close(ffn(x), hidden**2 @ ffn.linear2.weight.T + ffn.linear2.bias)
    config = TransformerConfig(vocab_size=5, d_model=d, n_heads=1, d_ff=f, activation="relu2")
    assert feed_forward_parameters(config) == sum(p.numel() for p in ffn.parameters())


def test_gate_is_on_the_first_branch() -> None:
    # W1 = 1, W3 = 2: silu(x) * 2x, which the gate on the wrong branch (x * silu(2x)) is not
    ffn = PositionwiseFeedForward(1, 1, activation="swiglu", bias=False)
    with torch.no_grad():
        ffn.linear1.weight.fill_(1.0)
        ffn.linear2.weight.fill_(1.0)
        ffn.linear3.weight.fill_(2.0)
    x = torch.tensor([[[3.0]]])
    silu = torch.nn.functional.silu
    torch.testing.assert_close(ffn(x), silu(x) * 2 * x)
    assert (ffn(x) - x * silu(2 * x)).abs().item() > 0.5


def test_unknown_activation_names_the_choices() -> None:
    with pytest.raises(ValueError, match="activation must be one of .*swiglu.*'reglu'"):
        PositionwiseFeedForward(4, 8, activation="reglu")
    with pytest.raises(ValueError, match="activation must be one of .*geglu.*'reglu'"):
        TransformerConfig(vocab_size=10, activation="reglu")


def test_swiglu_decoder_counts() -> None:
    config = TransformerConfig(
        vocab_size=17,
        d_model=8,
        n_heads=2,
        d_ff=12,
        n_layers=2,
        dropout=0.0,
        norm_first=True,
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
        max_len=16,
    )
    model = DecoderOnlyLM(config)
    assert count_parameters(config, "decoder-only") == sum(p.numel() for p in model.parameters())
    assert torch.isfinite(model(torch.randint(0, 17, (2, 5)))).all()


def test_masked_lm_head_refuses_a_gated_activation() -> None:
    config = TransformerConfig(vocab_size=10, d_model=8, n_heads=2, d_ff=8, activation="swiglu")
    with pytest.raises(ValueError, match="ungated activation.*got activation='swiglu'"):
        EncoderOnlyLM(config)
