"""TransformerConfig: defaults, derived sizes, presets, immutability, the nested Hugging Face
options (errors: test_errors.py)."""

from __future__ import annotations

import dataclasses

import pytest

from coursepkg import HFOptions, TransformerConfig


def test_defaults_are_the_paper_base_model() -> None:
    c = TransformerConfig(vocab_size=100)
    assert (c.d_model, c.n_heads, c.d_ff, c.n_layers, c.dropout) == (512, 8, 2048, 6, 0.1)
    assert c.norm_first is False and c.positional == "sinusoidal"
    assert c.tie_embeddings is True and c.share_embeddings is True
    assert c.head_dim_k == c.head_dim_v == 64


def test_config_is_frozen_and_replace_copies() -> None:
    c = TransformerConfig(vocab_size=10, d_model=16, n_heads=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 32  # type: ignore[misc]
    d = c.replace(d_model=32)
    assert d.d_model == 32 and c.d_model == 16
    assert d.replace(d_model=16) == c
    assert hash(d.replace(d_model=16)) == hash(c)


def test_hf_options_are_nested_and_a_config_round_trips_through_a_dict() -> None:
    hf_names = {f.name for f in dataclasses.fields(HFOptions)}
    assert not hf_names & {f.name for f in dataclasses.fields(TransformerConfig)}
    c = TransformerConfig(vocab_size=11, hf=HFOptions(n_token_types=2, pooler=True))
    as_dict = dataclasses.asdict(c)  # what a checkpoint stores
    assert as_dict["hf"] == dict(
        n_token_types=2, embed_norm=False, pooler=True, mlm_head=True, logits_bias=False
    )
    again = TransformerConfig(**as_dict)  # a mapping is read as HFOptions
    assert again == c and isinstance(again.hf, HFOptions) and hash(again) == hash(c)
    assert c.replace(d_model=64).hf is c.hf
    assert TransformerConfig(vocab_size=11).hf == HFOptions()


def test_bad_hf_options_are_named() -> None:
    with pytest.raises(ValueError, match=r"hf has no options \['pooller'\]"):
        TransformerConfig(vocab_size=11, hf={"pooller": True})
    with pytest.raises(ValueError, match="hf must be an HFOptions, got bool"):
        TransformerConfig(vocab_size=11, hf=True)
    with pytest.raises(ValueError, match="hf.pooler must be True or False, got 1"):
        HFOptions(pooler=1)
    with pytest.raises(TypeError, match="pooler"):  # the spelling before the options moved
        TransformerConfig(vocab_size=11, pooler=True)


def test_replace_validates_again() -> None:
    c = TransformerConfig(vocab_size=10, d_model=16, n_heads=2)
    with pytest.raises(ValueError, match="n_heads"):
        c.replace(n_heads=3)


@pytest.mark.parametrize(
    ("d_model", "n_heads", "d_k", "d_v", "want_k", "want_v"),
    [
        (16, 2, None, None, 8, 8),
        (16, 4, None, None, 4, 4),
        (10, 3, 4, 5, 4, 5),  # explicit sizes lift the divisibility requirement
        (16, 2, 3, None, 3, 8),
        (16, 2, None, 7, 8, 7),
    ],
)
def test_head_dims(d_model, n_heads, d_k, d_v, want_k, want_v) -> None:
    c = TransformerConfig(vocab_size=5, d_model=d_model, n_heads=n_heads, d_k=d_k, d_v=d_v)
    assert (c.head_dim_k, c.head_dim_v) == (want_k, want_v)


@pytest.mark.parametrize(
    ("norm_first", "final_norm", "expected"),
    [(False, None, False), (True, None, True), (False, True, True), (True, False, False)],
)
def test_use_final_norm(norm_first, final_norm, expected) -> None:
    c = TransformerConfig(vocab_size=5, norm_first=norm_first, final_norm=final_norm)
    assert c.use_final_norm is expected


def test_derived_fields() -> None:
    c = TransformerConfig(vocab_size=5, n_layers=3)
    assert c.decoder_layers == 3 and c.source_vocab_size == 5 and not c.separate_vocabularies
    c = TransformerConfig(
        vocab_size=5,
        n_layers=3,
        n_decoder_layers=4,
        src_vocab_size=7,
        share_embeddings=False,
        attention_dropout=0.25,
    )
    assert c.decoder_layers == 4 and c.source_vocab_size == 7 and c.separate_vocabularies
    assert c.attention_dropout == 0.25
    # the same size given twice is one vocabulary, so sharing is allowed
    assert not TransformerConfig(vocab_size=5, src_vocab_size=5).separate_vocabularies


@pytest.mark.parametrize(
    ("preset", "fields"),
    [
        ("base", dict(d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1)),
        ("big", dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3)),
    ],
)
def test_presets(preset, fields) -> None:
    c = getattr(TransformerConfig, preset)()
    assert c.vocab_size == 37000
    assert {k: getattr(c, k) for k in fields} == fields
    c = getattr(TransformerConfig, preset)(vocab_size=123, norm_first=True, n_layers=2)
    assert (c.vocab_size, c.norm_first, c.n_layers, c.d_model) == (123, True, 2, fields["d_model"])
