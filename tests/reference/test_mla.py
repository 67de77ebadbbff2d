"""Multi-head latent attention (issue 51): decoding from the cached latent equals attention over
the full keys and values rebuilt from it and equals the uncached pass; the cache holds R + Dr
numbers per token and layer, the closed form; the KV-cache bytes per token of MHA, GQA and MQA
models equal what their cache holds; bad ranks are refused."""

from __future__ import annotations

import pytest
import torch
from model_shapes import LLAMA_STYLE
from torch.testing import assert_close

from coursepkg import (
    DecoderOnlyLM,
    LatentConfig,
    MoEConfig,
    Transformer,
    TransformerConfig,
    count_parameters,
)
from coursepkg.attention import scaled_dot_product_attention
from coursepkg.masks import causal_mask
from coursepkg.mla import (
    LatentCache,
    MultiHeadLatentAttention,
    mla_cache_numbers_per_token,
    mla_parameters,
)
from coursepkg.params import kv_cache_bytes_per_token
from coursepkg.positional import RopeAngles, rope_frequencies

SHAPES = [
    dict(d_model=32, n_heads=4, kv_rank=8, d_nope=6, d_rope=4, d_v=5, q_rank=None),
    dict(d_model=32, n_heads=2, kv_rank=16, d_nope=8, d_rope=8, d_v=8, q_rank=12),
]


def _angles(positions: torch.Tensor, d_rope: int) -> RopeAngles:
    return RopeAngles(positions, rope_frequencies(d_rope))


@pytest.mark.parametrize("shape", SHAPES)
def test_the_latent_route_equals_attention_over_full_keys_and_values(shape) -> None:
    mla = MultiHeadLatentAttention(**shape)
    x = torch.randn(2, 7, 32)
    rope = _angles(torch.arange(7), shape["d_rope"])
    mask = causal_mask(7, 7)
    ours = mla(x, mask=mask, rope=rope)
    # The same numbers the long way: every head's full query, key and value, then attention.
    q_nope, q_rope = mla.queries(x, rope)  # (B, H, L, Dn), (B, H, L, Dr)
    latent, k_rope = mla.compress(x, rope)
    k_nope, v = mla.expand(latent)
    k_rope = k_rope[:, None].expand(-1, shape["n_heads"], -1, -1)  # (B, H, L, Dr)
    q, k = torch.cat([q_nope, q_rope], -1), torch.cat([k_nope, k_rope], -1)
    out, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, H, L, Dv)
    expected = mla.out_proj(out.transpose(1, 2).flatten(2))
    assert_close(ours, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_decoding_token_by_token_from_the_cache_equals_the_whole_pass(shape) -> None:
    mla = MultiHeadLatentAttention(**shape)
    x = torch.randn(2, 9, 32)
    whole = mla(x, mask=causal_mask(9, 9), rope=_angles(torch.arange(9), shape["d_rope"]))
    cache = LatentCache()
    prefix = mla(
        x[:, :4], None, None, causal_mask(4, 4), cache, _angles(torch.arange(4), shape["d_rope"])
    )
    steps = [prefix]
    for t in range(4, 9):
        steps.append(
            mla(x[:, t : t + 1], cache=cache, rope=_angles(torch.tensor([t]), shape["d_rope"]))
        )
    assert_close(torch.cat(steps, dim=1), whole, atol=1e-6, rtol=1e-5)
    assert cache.length == 9
    per_token = mla_cache_numbers_per_token(shape["kv_rank"], shape["d_rope"])
    assert cache.numbers_per_token() == per_token
    stored = cache.latent.numel() + cache.k_rope.numel()
    assert stored == 2 * 9 * per_token
    full = shape["n_heads"] * (shape["d_nope"] + shape["d_rope"] + shape["d_v"])
    assert per_token < full  # what MHA with the same heads would cache


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])  # MHA, GQA, MQA
def test_kv_cache_bytes_per_token_equal_what_the_cache_holds(n_kv_heads) -> None:
    config = TransformerConfig(
        vocab_size=19,
        d_model=16,
        n_heads=4,
        d_ff=24,
        n_layers=3,
        dropout=0.0,
        max_len=32,
        n_kv_heads=n_kv_heads,
    )
    lm = DecoderOnlyLM(config).eval()
    cache = lm.new_cache()
    with torch.no_grad():
        lm(torch.randint(0, 19, (2, 6)), cache=cache)
    held = sum(
        c.k.numel() * c.k.element_size() + c.v.numel() * c.v.element_size() for c in cache.self_attn
    )
    assert held == 2 * 6 * kv_cache_bytes_per_token(config)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(kv_rank=40), "kv_rank must be at most d_model=32"),
        (dict(q_rank=33), "q_rank must be at most d_model=32"),
        (dict(d_rope=3), "d_rope must be even"),
    ],
)
def test_bad_ranks_are_refused(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        MultiHeadLatentAttention(**{**SHAPES[0], **fields})


@pytest.mark.parametrize("shape", SHAPES)
def test_the_absorbed_form_decodes_the_same(shape) -> None:
    mla = MultiHeadLatentAttention(**shape)
    x = torch.randn(2, 6, 32)
    plain, absorbed = LatentCache(), LatentCache()
    for t in range(6):
        rope = _angles(torch.tensor([t]), shape["d_rope"])
        step = x[:, t : t + 1]
        assert_close(
            mla.forward_absorbed(step, rope, absorbed),
            mla(step, cache=plain, rope=rope),
            atol=1e-6,
            rtol=1e-5,
        )
    assert torch.equal(plain.latent, absorbed.latent)


@pytest.mark.parametrize("shape", SHAPES)
def test_closed_form_parameters_equal_the_module(shape) -> None:
    mla = MultiHeadLatentAttention(**shape)
    assert mla_parameters(**shape) == sum(p.numel() for p in mla.parameters())


MODEL = dict(
    vocab_size=29,
    d_model=32,
    n_heads=4,
    d_ff=40,
    n_layers=2,
    dropout=0.0,
    max_len=64,
    **LLAMA_STYLE,
    d_k=6,
    d_v=5,
    latent=LatentConfig(kv_rank=12, d_rope=4),
)
MODELS = [
    {},
    dict(
        latent=LatentConfig(kv_rank=12, d_rope=4, q_rank=16),
        moe=MoEConfig(n_experts=4, top_k=2, d_ff=8),
        tie_embeddings=False,
    ),
]


@pytest.mark.parametrize("fields", MODELS)
def test_a_latent_attention_model_generates_the_same_with_and_without_cache(fields) -> None:
    lm = DecoderOnlyLM(TransformerConfig(**{**MODEL, **fields})).eval()
    prompt = torch.randint(0, 29, (2, 5))
    assert torch.equal(lm.generate(prompt, 10), lm.generate(prompt, 10, use_cache=False))
    cache = lm.new_cache()
    with torch.no_grad():
        lm(prompt, cache=cache)
    held = sum((c.latent.numel() + c.k_rope.numel()) * 4 for c in cache.self_attn)
    assert held == 2 * 5 * kv_cache_bytes_per_token(lm.config)
    assert all(isinstance(layer.self_attn, MultiHeadLatentAttention) for layer in lm.layers)


@pytest.mark.parametrize("fields", MODELS)
def test_left_padding_changes_nothing_and_counts_are_closed_form(fields) -> None:
    lm = DecoderOnlyLM(TransformerConfig(**{**MODEL, **fields})).eval()
    tokens = torch.randint(1, 29, (1, 6))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), tokens], dim=1)  # (1, 9)
    mask = torch.arange(9)[None] >= 3  # (1, 9)
    with torch.no_grad():
        assert_close(lm(padded, mask)[:, 3:], lm(tokens), atol=1e-5, rtol=1e-5)
    total = sum(p.numel() for p in lm.parameters())
    assert count_parameters(lm.config, "decoder-only") == total


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(latent=dict(kv_rank=33, d_rope=4)), "latent.kv_rank must be at most d_model=32"),
        (
            dict(latent=dict(kv_rank=12, d_rope=4, q_rank=40)),
            "latent.q_rank must be at most d_model=32",
        ),
        (dict(latent=dict(kv_rank=12)), "missing 1 required positional argument: 'd_rope'"),
        (dict(latent=dict(kv_rank=12, d_rope=3)), "latent.d_rope must be an even positive"),
        (dict(latent=dict(kv_rank=0, d_rope=2)), "latent.kv_rank must be a positive integer"),
        (dict(positional="learned"), "needs positional='rope'"),
        (dict(n_kv_heads=2), "does not support n_kv_heads=2"),
        (dict(qk_norm=True), "does not support qk_norm=True"),
        (dict(latent=(12, 4)), "latent must be a LatentConfig or None, got tuple"),
    ],
)
def test_impossible_latent_configurations_are_refused(fields, message) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        TransformerConfig(**{**MODEL, **fields})


def test_other_models_refuse_latent_attention() -> None:
    config = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, d_ff=8)
    latent = LatentConfig(kv_rank=4, d_rope=2)
    with pytest.raises(ValueError, match=r"does not support latent=LatentConfig\(kv_rank=4"):
        Transformer(config.replace(positional="rope", latent=latent))
