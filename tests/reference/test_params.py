"""Closed-form parameter counts == instantiated models, over random configurations; the paper's
base and big models counted by hand, without building them."""

from __future__ import annotations

import random

import pytest
import torch
from model_shapes import LLAMA_STYLE
from torch import nn

from coursepkg import (
    DecoderLayer,
    DecoderOnlyLM,
    EncoderLayer,
    Transformer,
    TransformerConfig,
    count_parameters,
    parameter_breakdown,
)
from coursepkg.params import layer_breakdown


def _numel(*modules: nn.Module | None) -> int:
    """Distinct parameters of the modules together (a shared matrix counts once)."""
    seen = {id(p): p.numel() for m in modules if m is not None for p in m.parameters()}
    return sum(seen.values())


def _random_config(seed: int) -> TransformerConfig:
    rng = random.Random(seed)
    n_heads = rng.choice([1, 2, 3, 4])
    sizes = rng.choice(["default", "both", "k_only", "v_only"])
    if sizes == "both":  # explicit Dk and Dv: d_model need not be divisible by n_heads
        d_model, d_k, d_v = rng.randint(3, 24), rng.randint(1, 9), rng.randint(1, 9)
    else:
        d_model, d_k, d_v = n_heads * rng.randint(1, 6), None, None
        if sizes == "k_only":
            d_k = rng.randint(1, 9)
        elif sizes == "v_only":
            d_v = rng.randint(1, 9)
    vocab = rng.randint(2, 40)
    vocabularies = rng.choice(["shared", "unshared", "separate"])
    src_vocab = rng.randint(2, 40) if vocabularies == "separate" else None
    if src_vocab == vocab:
        src_vocab += 1
    return TransformerConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_heads=n_heads,
        d_k=d_k,
        d_v=d_v,
        d_ff=rng.randint(1, 48),
        n_layers=rng.randint(1, 3),
        n_decoder_layers=rng.choice([None, 1, 2, 3]),
        max_len=rng.randint(1, 30),
        positional=rng.choice(["sinusoidal", "learned"]),
        bias=rng.random() < 0.5,
        norm_first=rng.random() < 0.5,
        final_norm=rng.choice([None, True, False]),
        tie_embeddings=rng.random() < 0.5,
        share_embeddings=vocabularies == "shared",
        src_vocab_size=src_vocab,
        activation=rng.choice(["relu", "gelu"]),
    )


SEEDS = range(24)


def test_random_configs_cover_the_options() -> None:
    configs = [_random_config(s) for s in SEEDS]
    for field in ("bias", "norm_first", "tie_embeddings", "share_embeddings", "positional"):
        assert len({getattr(c, field) for c in configs}) == 2, field
    assert len({c.final_norm for c in configs}) == 3
    assert any(c.separate_vocabularies for c in configs)
    assert any(c.d_model % c.n_heads for c in configs)  # explicit Dk/Dv rows
    assert any(c.head_dim_k != c.head_dim_v for c in configs)


@pytest.mark.parametrize("seed", SEEDS)
def test_closed_form_equals_instantiated_transformer(seed) -> None:
    config = _random_config(seed)
    model = Transformer(config)
    assert count_parameters(config) == sum(p.numel() for p in model.parameters()), config
    parts = parameter_breakdown(config)
    assert sum(parts.values()) == count_parameters(config)
    assert parts["embeddings"] == _numel(model.src_embed, model.tgt_embed)
    assert parts["positions"] == _numel(model.positions)
    assert parts["encoder"] == _numel(model.encoder)
    assert parts["decoder"] == _numel(model.decoder)
    head = 0 if model.lm_head.weight is model.tgt_embed.weight else model.lm_head.weight.numel()
    assert parts["output_head"] == head


@pytest.mark.parametrize("seed", SEEDS)
def test_closed_form_equals_instantiated_decoder_only(seed) -> None:
    config = _random_config(seed)
    model = DecoderOnlyLM(config)
    total = sum(p.numel() for p in model.parameters())
    assert count_parameters(config, model="decoder-only") == total, config
    parts = parameter_breakdown(config, model="decoder-only")
    assert sum(parts.values()) == total
    assert parts["embeddings"] == _numel(model.embed)
    assert parts["positions"] == _numel(model.positions)
    assert parts["layers"] == _numel(model.layers)
    assert parts["final_norm"] == _numel(model.norm)
    head = 0 if model.lm_head.weight is model.embed.weight else model.lm_head.weight.numel()
    assert parts["output_head"] == head


@pytest.mark.parametrize("seed", range(6))
def test_layer_breakdown_matches_the_layers(seed) -> None:
    c = _random_config(seed)
    enc, dec = EncoderLayer(c.block()), DecoderLayer(c.block())
    parts = layer_breakdown(c)
    assert parts["encoder.self_attn"] == _numel(enc.self_attn)
    assert parts["encoder.ffn"] == _numel(enc.ffn)
    assert parts["encoder.norms"] == _numel(enc.norm1, enc.norm2)
    assert parts["decoder.self_attn"] == _numel(dec.self_attn)
    assert parts["decoder.cross_attn"] == _numel(dec.cross_attn)
    assert parts["decoder.ffn"] == _numel(dec.ffn)
    assert parts["decoder.norms"] == _numel(dec.norm1, dec.norm2, dec.norm3)


def _by_hand(vocab: int, d: int, f: int, n: int) -> dict[str, int]:
    """The paper's models (shared, tied embeddings; post-LN, no final norm; sinusoidal)."""
    attn = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O with biases (H * Dk = D)
    ffn = 2 * d * f + f + d  # W1, W2, b1, b2
    norm = 2 * d  # gain and shift
    return {
        "embeddings": vocab * d,  # one matrix: source, target and output projection
        "encoder": n * (attn + ffn + 2 * norm),
        "decoder": n * (2 * attn + ffn + 3 * norm),
    }


@pytest.fixture
def no_modules(monkeypatch):
    """Fail loudly if anything builds an nn.Module: closed forms must not instantiate."""

    def boom(*args, **kwargs):
        raise AssertionError("count_parameters must not instantiate a model")

    monkeypatch.setattr(nn.Module, "__init__", boom)


@pytest.mark.parametrize(
    ("preset", "total", "parts"),
    [
        (
            "base",
            63_082_496,
            {"embeddings": 18_944_000, "encoder": 18_914_304, "decoder": 25_224_192},
        ),
        (
            "big",
            214_245_376,
            {"embeddings": 37_888_000, "encoder": 75_577_344, "decoder": 100_780_032},
        ),
    ],
)
def test_paper_presets_in_closed_form(preset, total, parts, no_modules) -> None:
    config = getattr(TransformerConfig, preset)()
    assert count_parameters(config) == total
    hand = _by_hand(config.vocab_size, config.d_model, config.d_ff, config.n_layers)
    assert hand == parts and sum(hand.values()) == total
    got = parameter_breakdown(config)
    assert {k: got[k] for k in parts} == parts
    assert got["positions"] == 0 and got["output_head"] == 0


def test_no_modules_fixture_really_blocks_instantiation(no_modules) -> None:
    with pytest.raises(AssertionError, match="instantiate"):
        torch.nn.Linear(2, 2)


@pytest.mark.parametrize(
    "fields, expected",
    [
        # Llama-3.2-1B's shape: grouped-query attention (8 of 32 heads), SwiGLU, tied head
        (
            dict(vocab_size=128256, d_model=2048, n_heads=32, n_kv_heads=8, d_ff=8192, n_layers=16),
            1_235_814_400,
        ),
        # Qwen3-0.6B's shape: H * Dk = 2048 != D = 1024, QK-norm
        (
            dict(
                vocab_size=151936,
                d_model=1024,
                n_heads=16,
                n_kv_heads=8,
                d_k=128,
                d_v=128,
                d_ff=3072,
                n_layers=28,
                qk_norm=True,
            ),
            596_049_920,
        ),
    ],
    ids=["llama_3.2_1b", "qwen3_0.6b"],
)
def test_todays_decoders_count_in_closed_form(fields, expected) -> None:
    """The figures Hugging Face's models give on the meta device (tests/reference/
    test_interop_llama.py), in closed form and in the reference model built on the meta device."""
    from coursepkg import DecoderOnlyLM

    config = TransformerConfig(
        **fields,
        **LLAMA_STYLE,
    )
    assert count_parameters(config, "decoder-only") == expected
    with torch.device("meta"):
        lm = DecoderOnlyLM(config)
    assert sum(p.numel() for p in lm.parameters()) == expected
