"""Closed-form multiply-adds == what PyTorch's FLOP counter sees in a real forward pass, over
random configurations and lengths; the 6 x parameters x tokens rule."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from coursepkg import (
    DecoderOnlyLM,
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
    count_parameters,
)
from coursepkg.params import forward_multiply_adds, training_flops


def _config(seed: int) -> TransformerConfig:
    rng = random.Random(seed)
    n_heads = rng.choice([1, 2, 4])
    return TransformerConfig(
        vocab_size=rng.randint(5, 60),
        d_model=n_heads * rng.randint(2, 8),
        n_heads=n_heads,
        d_k=rng.choice([None, rng.randint(1, 9)]),
        d_v=rng.choice([None, rng.randint(1, 9)]),
        d_ff=rng.randint(1, 40),
        n_layers=rng.randint(1, 3),
        n_decoder_layers=rng.choice([None, 1, 2]),
        max_len=32,
        bias=rng.random() < 0.5,
        norm_first=rng.random() < 0.5,
        tie_embeddings=rng.random() < 0.5,
        dropout=0.0,
    )


def _counted_flops(model: torch.nn.Module, *inputs: torch.Tensor) -> tuple[int, dict]:
    """FLOPs PyTorch counts in one forward pass. Attention takes its explicit path (two
    batched products, which the counter sees) rather than a fused kernel it may not count."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.record_weights = True
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*inputs)
    return counter.get_total_flops(), counter.get_flop_counts()


@pytest.mark.parametrize("seed", range(12))
def test_encoder_decoder_multiply_adds_match_the_flop_counter(seed) -> None:
    config = _config(seed)
    rng = random.Random(100 + seed)
    batch, s, t = rng.randint(1, 3), rng.randint(1, 12), rng.randint(1, 12)
    model = Transformer(config).eval()
    src = torch.randint(4, config.vocab_size, (batch, s))
    tgt = torch.randint(4, config.vocab_size, (batch, t))
    total, by_module = _counted_flops(model, src, tgt)
    parts = forward_multiply_adds(config, src_len=s, tgt_len=t)
    assert set(parts) == {"encoder", "decoder", "output_head", "attention_scores"}
    assert total == 2 * batch * sum(parts.values()), (config, s, t)
    batched = sum(n for op, n in by_module["Global"].items() if "bmm" in str(op))
    assert batched == 2 * batch * parts["attention_scores"]  # Q K^T and the weighted values
    head = sum(by_module["Transformer.lm_head"].values())
    assert (
        head
        == 2 * batch * parts["output_head"]
        == 2 * batch * t * config.d_model * config.vocab_size
    )


@pytest.mark.parametrize("seed", range(12))
def test_decoder_only_multiply_adds_match_the_flop_counter(seed) -> None:
    config = _config(seed)
    length = random.Random(seed).randint(1, 20)
    model = DecoderOnlyLM(config).eval()
    tokens = torch.randint(4, config.vocab_size, (2, length))
    total, _ = _counted_flops(model, tokens)
    parts = forward_multiply_adds(config, "decoder-only", src_len=length)
    assert total == 2 * 2 * sum(parts.values()), (config, length)


def test_weights_cost_one_multiply_add_per_token_and_attention_grows_with_the_square() -> None:
    base = TransformerConfig.base()
    one = forward_multiply_adds(base, src_len=1)
    ten = forward_multiply_adds(base, src_len=10)
    for part in ("encoder", "decoder", "output_head"):
        assert ten[part] == 10 * one[part]
    assert ten["attention_scores"] == 100 * one["attention_scores"]
    # weight matrices only: parameters without biases, norms and the (free) input lookup
    weights = sum(one[p] for p in ("encoder", "decoder", "output_head"))
    embedding = base.vocab_size * base.d_model
    assert 0.99 < weights / (count_parameters(base) - embedding + embedding) < 1.0


def test_length_defaults_and_bad_arguments() -> None:
    config = TransformerConfig(vocab_size=10, d_model=8, n_heads=2, d_ff=16, n_layers=1)
    assert forward_multiply_adds(config, src_len=5) == forward_multiply_adds(
        config, src_len=5, tgt_len=5
    )
    with pytest.raises(ValueError, match="model must be"):
        forward_multiply_adds(config, "encoder-only", src_len=5)
    with pytest.raises(ValueError, match="src_len"):
        forward_multiply_adds(config, src_len=0)
    with pytest.raises(ValueError, match="tgt_len"):
        forward_multiply_adds(config, src_len=3, tgt_len=2.5)


def test_training_flops_is_six_per_parameter_per_token() -> None:
    assert training_flops(10, 7) == 420.0
    assert training_flops(0, 1e9) == 0.0
    with pytest.raises(ValueError, match=">= 0"):
        training_flops(-1, 5)
