"""The TransformerConfig options that published models need (GPT-2, BERT, Marian), each tested
on its own: activations, embedding scale, sinusoidal layout, and the Hugging Face options of
``config.hf`` (token types and embedding norm, logits bias, pooler and masked-LM head, each
built by its models only); plus the preallocated KV cache."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from coursepkg import (
    DecoderOnlyLM,
    EncoderOnlyLM,
    HFOptions,
    KVCache,
    Transformer,
    TransformerConfig,
    count_parameters,
    parameter_breakdown,
    sinusoidal_table,
)
from coursepkg.kv_cache import AttentionCache
from coursepkg.layers import PositionwiseFeedForward

TINY = dict(vocab_size=13, d_model=8, n_heads=2, d_ff=12, n_layers=2, dropout=0.0, max_len=16)


def _cfg(**kw) -> TransformerConfig:
    return TransformerConfig(**{**TINY, **kw})


def _hf(**options) -> TransformerConfig:
    return _cfg(hf=HFOptions(**options))


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------- activation
@pytest.mark.parametrize(
    ("name", "formula"),
    [
        (
            "gelu_tanh",
            lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        ),
        ("silu", lambda x: x * torch.sigmoid(x)),
        ("gelu", lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),
        ("relu", lambda x: x.clamp(min=0)),
    ],
)
def test_activation_option_is_the_formula(name, formula) -> None:
    ffn = PositionwiseFeedForward(8, 12, activation=name)
    x = torch.randn(2, 5, 8)
    want = F.linear(formula(F.linear(x, ffn.linear1.weight, ffn.linear1.bias)), ffn.linear2.weight)
    assert_close(ffn(x), want + ffn.linear2.bias, atol=1e-6, rtol=1e-5)
    model = DecoderOnlyLM(_cfg(activation=name))
    assert model.layers[0].ffn.activation is ffn.activation  # the model uses the same function


def test_unknown_activation_is_named() -> None:
    with pytest.raises(ValueError, match="activation must be one of"):
        _cfg(activation="gelu_fast")


# ------------------------------------------------------------------------- embedding scale
@pytest.mark.parametrize("scale", [True, False])
def test_scale_embeddings_option(scale) -> None:
    model = DecoderOnlyLM(_cfg(scale_embeddings=scale, positional="learned"))
    tokens = torch.tensor([[1, 4, 2]])
    with torch.no_grad():
        model.positions.weight.zero_()  # isolate the token embedding
    got = model.positions(model.embed(tokens))
    rows = model.embed.weight[tokens]  # (1, 3, D)
    assert_close(got, rows * math.sqrt(8) if scale else rows)


# ---------------------------------------------------------------------- sinusoidal layout
@pytest.mark.parametrize("d_model", [8, 7])
def test_sinusoidal_halves_layout_is_a_column_permutation(d_model) -> None:
    inter = sinusoidal_table(20, d_model)  # (20, D)
    halves = sinusoidal_table(20, d_model, "halves")
    order = list(range(0, d_model, 2)) + list(range(1, d_model, 2))  # sines, then cosines
    assert torch.equal(halves, inter[:, order])
    model = Transformer(_cfg(sinusoidal_layout="halves"))
    assert torch.equal(model.positions.table, sinusoidal_table(16, 8, "halves"))
    with pytest.raises(ValueError, match="sinusoidal_layout"):
        _cfg(sinusoidal_layout="zigzag")


# ------------------------------------------------------------- token types, embedding norm
def test_token_types_and_embed_norm_in_the_encoder_only_model() -> None:
    config = _cfg(positional="learned", hf=HFOptions(n_token_types=3, embed_norm=True))
    model = EncoderOnlyLM(config).eval()
    tokens = torch.randint(0, 13, (2, 6))
    types = torch.randint(0, 3, (2, 6))
    x = model.embed.weight[tokens] * math.sqrt(8) + model.positions.weight[:6]
    x = x + model.token_types.weight[types]
    x = F.layer_norm(x, (8,), model.embed_norm.weight, model.embed_norm.bias, 1e-5)
    with torch.no_grad():
        assert_close(model.encode(tokens, token_types=types), model.encoder(x))
        # default token types are all 0
        zeros = torch.zeros_like(types)
        assert_close(model.encode(tokens), model.encode(tokens, token_types=zeros))
    with pytest.raises(ValueError, match="token_types holds id 3"):
        model(tokens, token_types=torch.full_like(types, 3))
    with pytest.raises(ValueError, match="hf.n_token_types must be an integer >= 0, got -1"):
        _hf(n_token_types=-1)


# Each option off its default, and the models that build it.
_OFF_DEFAULT = {
    "n_token_types": (2, {EncoderOnlyLM}),
    "embed_norm": (True, {EncoderOnlyLM}),
    "pooler": (True, {EncoderOnlyLM}),
    "mlm_head": (False, {EncoderOnlyLM}),
    "logits_bias": (True, {Transformer, DecoderOnlyLM}),
}


def test_every_hf_option_says_which_models_build_it() -> None:
    assert set(_OFF_DEFAULT) == {f.name for f in dataclasses.fields(HFOptions)}


@pytest.mark.parametrize("name", sorted(_OFF_DEFAULT))
@pytest.mark.parametrize("cls", [Transformer, DecoderOnlyLM, EncoderOnlyLM])
def test_an_hf_option_is_built_by_its_models_and_rejected_by_the_others(name, cls) -> None:
    value, builders = _OFF_DEFAULT[name]
    cls(_cfg())  # the defaults add nothing, so every model takes them
    config = _hf(**{name: value})
    if cls in builders:
        cls(config)
        return
    with pytest.raises(ValueError, match=f"{cls.__name__} does not support hf.{name}=") as err:
        cls(config)
    only = str(err.value).split("(only ")[1]
    assert all(b.__name__ in only for b in builders)


# ---------------------------------------------------------------------------- logits bias
@pytest.mark.parametrize("cls", [Transformer, DecoderOnlyLM])
def test_logits_bias_is_a_fixed_buffer_added_to_the_logits(cls) -> None:
    model = cls(_hf(logits_bias=True)).eval()
    assert "logits_bias" in dict(model.named_buffers())
    assert _n_params(model) == _n_params(cls(_cfg()))  # not a trained parameter
    tokens = torch.randint(0, 13, (2, 5))
    args = (tokens, tokens) if cls is Transformer else (tokens,)
    with torch.no_grad():
        before = model(*args)
        model.logits_bias.copy_(torch.randn(13))
        after = model(*args)
    assert_close(after, before + model.logits_bias)
    assert cls(_cfg()).logits_bias is None


# ------------------------------------------------------------------ pooler and masked-LM head
@pytest.mark.parametrize(
    ("kw", "hf"),
    [
        (dict(), dict()),
        (dict(), dict(pooler=True)),
        (dict(), dict(mlm_head=False)),
        (dict(tie_embeddings=False), dict(pooler=True)),
        (dict(bias=False, positional="learned"), dict(n_token_types=2, embed_norm=True)),
        (dict(final_norm=True, norm_first=True), dict()),
    ],
)
def test_encoder_only_closed_form_count_and_outputs(kw, hf) -> None:
    config = _cfg(**kw, hf=HFOptions(**hf))
    model = EncoderOnlyLM(config).eval()
    assert count_parameters(config, "encoder-only") == _n_params(model)
    assert sum(parameter_breakdown(config, "encoder-only").values()) == _n_params(model)
    tokens = torch.randint(0, 13, (3, 7))
    with torch.no_grad():
        out = model(tokens)
        assert out.shape == ((3, 7, 13) if config.hf.mlm_head else (3, 7, 8))
        if config.hf.pooler:
            pooled = model.pool(model.encode(tokens))
            assert pooled.shape == (3, 8) and pooled.abs().max() <= 1  # tanh
    if config.hf.mlm_head and config.tie_embeddings:
        assert model.head.output.weight is model.embed.weight
    if not config.hf.pooler:
        with pytest.raises(ValueError, match="no pooler"):
            model.pool(torch.zeros(1, 2, 8))


def test_encoder_only_padding_invariance() -> None:
    model = EncoderOnlyLM(_cfg(pad_id=0)).eval()
    tokens = torch.tensor([[5, 6, 7, 0, 0]])
    with torch.no_grad():
        padded = model(tokens)[:, :3]
        alone = model(tokens[:, :3])
    assert_close(padded, alone)


# ------------------------------------------------------------------------ preallocated cache
@pytest.mark.parametrize("chunks", [(1, 1, 1, 1), (3, 1), (2, 2)])
def test_preallocated_cache_equals_growing_cache(chunks) -> None:
    grow, fixed = AttentionCache(), AttentionCache(capacity=6)
    start = 0
    for n in chunks:
        k, v = torch.randn(2, 3, n, 4), torch.randn(2, 3, n, 5)
        a, b = grow.update(k, v), fixed.update(k, v)
        start += n
        assert fixed.length == start
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    index = torch.tensor([1, 1])
    grow.reorder(index)
    fixed.reorder(index)
    assert torch.equal(grow.k, fixed.k) and torch.equal(grow.v, fixed.v)
    with pytest.raises(ValueError, match="capacity=6"):
        fixed.update(torch.randn(2, 3, 3, 4), torch.randn(2, 3, 3, 5))
    with pytest.raises(ValueError, match="capacity"):
        KVCache(2, capacity=0)


def test_generate_and_decoding_use_a_preallocated_cache() -> None:
    model = DecoderOnlyLM(_cfg(norm_first=True)).eval()
    prompt = torch.randint(0, 13, (2, 3))
    cache = model.new_cache(capacity=10)
    with torch.no_grad():
        step = model(prompt, cache=cache)
    assert cache.self_attn[0]._storage[0].shape == (2, 2, 10, 4)
    assert_close(step, model(prompt))
    assert torch.equal(model.generate(prompt, 7), model.generate(prompt, 7, use_cache=False))
