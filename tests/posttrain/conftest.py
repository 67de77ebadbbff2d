"""Fixtures of the post-training tests: a small BPE tokenizer with the chat tokens (trained in
milliseconds on a few sentences) and a tiny decoder-only model over its vocabulary."""

from __future__ import annotations

import pytest
import torch

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.posttrain.chat import with_chat_tokens
from coursepkg.tokenizer import Tokenizer, train_bpe

TEXT = (
    "What is two plus three? Five. Reverse the word cat: tac. Sort 3 1 2: 1 2 3. "
    "The cat sat on the mat, and the dog sat on the log. Count the letters of dog: three. "
) * 8


@pytest.fixture(scope="session")
def chat_tokenizer() -> Tokenizer:
    """A 300-id byte-level BPE plus ``<|endoftext|>`` and the four chat tokens."""
    vocab, merges = train_bpe(TEXT, 300, ["<|endoftext|>"])
    return with_chat_tokens(Tokenizer(vocab, merges, ["<|endoftext|>"]))


@pytest.fixture
def chat_model(chat_tokenizer):
    """``chat_model(seed=0, **overrides)`` -> a tiny seeded DecoderOnlyLM over the tokenizer's
    vocabulary, in eval mode (pre-LN, learned positions unless overridden)."""

    def make(seed: int = 0, **overrides) -> DecoderOnlyLM:
        fields = dict(
            vocab_size=len(chat_tokenizer),
            d_model=16,
            n_heads=2,
            d_ff=32,
            n_layers=2,
            dropout=0.0,
            max_len=64,
            norm_first=True,
            positional="learned",
            scale_embeddings=False,
        )
        torch.manual_seed(seed)
        return DecoderOnlyLM(TransformerConfig(**{**fields, **overrides})).eval()

    return make
