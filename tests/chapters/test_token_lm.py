"""Tests of coursepkg.chapters.token_lm: bits per byte, and the characters-vs-BPE comparison's
cache."""

from __future__ import annotations

import math

import pytest
import torch

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.chapters.token_lm import (
    bits_per_byte,
    compare_tokenizations,
    encode_seconds_by_length,
)
from coursepkg.tokenizer import Tokenizer, train_bpe


@pytest.mark.parametrize("block_size", [4, 7])
def test_bits_per_byte_of_a_uniform_model(block_size: int) -> None:
    """A model whose logits are all zero spends log2(V) bits per token."""
    config = TransformerConfig(
        vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_layers=1, dropout=0.0, max_len=16
    )
    model = DecoderOnlyLM(config).eval()
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    ids = torch.randint(0, 11, (50,))
    token_bytes = torch.arange(1, 12)  # id i stands for i + 1 bytes
    bpb, nats = bits_per_byte(model, ids, token_bytes, block_size)
    used = (len(ids) - 1) // block_size * block_size
    targets = ids[1 : used + 1]
    assert nats == pytest.approx(math.log(11), rel=1e-5)
    expected = used * math.log2(11) / int(token_bytes[targets].sum())
    assert bpb == pytest.approx(expected, rel=1e-5)


def test_train_bpe_pattern_changes_the_pre_tokens() -> None:
    text = "the cat, the hat. the cat, the hat." * 3
    _, gpt2 = train_bpe(text, 270)
    _, lines = train_bpe(text, 270, pattern=r"[^\n]+")
    assert all(b" " not in a + b or (a + b).startswith(b" ") for a, b in gpt2)
    assert any(b"," in a + b and (a + b) != b"," and b" " in a + b for a, b in lines[:14])


@pytest.mark.slow
def test_comparison_is_cached_and_reused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COURSEPKG_CACHE_DIR", str(tmp_path))
    small = dict(vocab_size=300, steps=3, eval_every=1, d_model=16, d_ff=32, n_layers=1)
    first = compare_tokenizations(cache="save", **small)
    assert set(first) == {"characters", "BPE 300"}
    assert first["characters"].bytes_per_token == 1.0
    assert first["BPE 300"].bytes_per_token > 1.3
    assert list(tmp_path.glob("token_lm-*.pt"))
    again = compare_tokenizations(cache="reuse", **small)
    for name, run in first.items():
        assert again[name].heldout_bpb == run.heldout_bpb
        assert again[name].history.metrics == run.history.metrics
        for a, b in zip(run.model.parameters(), again[name].model.parameters(), strict=True):
            assert torch.equal(a, b)


def test_encode_seconds_by_length_times_every_encoder() -> None:
    tok = Tokenizer(*train_bpe("abcabd jab cabbage " * 20, 300))
    out = encode_seconds_by_length(tok, lengths=(10, 80), rounds=1)
    assert out["length"] == [10, 80]
    routes = ("plain loop", "heap", "backtracking")
    assert all(len(out[k]) == 2 and min(out[k]) > 0 for k in routes)
