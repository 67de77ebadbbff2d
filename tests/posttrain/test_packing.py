"""Tests of coursepkg.posttrain.packing: padded batches, packed windows, the document mask, and
a packed example's logits equal to its logits alone."""

from __future__ import annotations

import pytest
import torch

from coursepkg.masks import causal_mask, segment_positions
from coursepkg.posttrain.chat import ChatExample, encode_chat
from coursepkg.posttrain.packing import document_mask, pack_examples, packed_logits, pad_batch

PAD = 0


def _examples(tokenizer) -> list[ChatExample]:
    pairs = [("What is two plus three?", " Five."), ("Reverse cat", "tac"), ("Sort 3 1 2", "1 2 3")]
    return [
        encode_chat(
            tokenizer, [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        )
        for q, a in pairs
    ]


def test_padding_fills_the_end_of_each_row_and_is_never_learned(chat_tokenizer):
    examples = _examples(chat_tokenizer)
    batch = pad_batch(examples, PAD)
    length = max(map(len, examples))
    assert batch.tokens.shape == batch.loss_mask.shape == batch.token_mask.shape == (3, length)
    for row, example in enumerate(examples):
        n = len(example)
        assert batch.tokens[row, :n].tolist() == example.ids
        assert batch.token_mask[row].tolist() == [True] * n + [False] * (length - n)
        assert batch.loss_mask[row].tolist() == example.response_mask + [False] * (length - n)
    assert not (batch.loss_mask & ~batch.token_mask).any()


def test_packing_keeps_every_example_whole_and_in_order(chat_tokenizer):
    examples = _examples(chat_tokenizer) * 3
    window = len(examples[0]) + len(examples[1]) + 2
    packed = pack_examples(examples, window, PAD)
    pieces = []
    for tokens, segments in zip(packed.tokens, packed.segments, strict=True):
        for s in range(int(segments.max()) + 1):
            pieces.append(tokens[segments == s].tolist())
        assert (tokens[segments < 0] == PAD).all()
    assert pieces == [e.ids for e in examples]
    assert packed.loss_mask.sum() == sum(sum(e.response_mask) for e in examples)
    assert (packed.segments >= 0).sum() < packed.tokens.numel()  # some padding: the bound is tight


def test_an_example_longer_than_the_window_is_named(chat_tokenizer):
    examples = _examples(chat_tokenizer)
    with pytest.raises(
        ValueError, match=rf"examples\[0\] has {len(examples[0])} tokens, more than the window"
    ):
        pack_examples(examples, len(examples[0]) - 1, PAD)
    with pytest.raises(ValueError, match="max_len"):
        pad_batch(examples, PAD, max_len=3)


def test_the_document_mask_is_causal_inside_each_segment_and_closed_between_them():
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [0, 0, 0, 0, 0, 0, 0, 0]])
    mask = document_mask(segments)  # (2, 1, 8, 8)
    assert mask.shape == (2, 1, 8, 8)
    assert torch.equal(mask[1, 0], causal_mask(8))  # one segment: the plain causal mask
    for i in range(8):
        for j in range(8):
            same = segments[0, i] == segments[0, j] and segments[0, i] >= 0
            assert bool(mask[0, 0, i, j]) == bool(same and j <= i)
    assert segment_positions(segments)[0].tolist() == [0, 1, 2, 0, 1, 0, 0, 1]
    assert segment_positions(segments)[1].tolist() == list(range(8))


@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_a_packed_example_gets_the_logits_it_gets_alone(chat_tokenizer, chat_model, positional):
    model = chat_model(positional=positional)
    examples = _examples(chat_tokenizer)
    window = sum(map(len, examples)) + 3  # all three in one window, padding at the end
    packed = pack_examples(examples, window, PAD)
    assert packed.tokens.size(0) == 1
    with torch.no_grad():
        logits = packed_logits(model, packed.tokens, packed.segments)  # (1, W, V)
        assert torch.isfinite(logits).all()  # the padding's fully masked rows give no NaN
        for s, example in enumerate(examples):
            alone = model(torch.tensor([example.ids]))[0]  # (L, V)
            inside = logits[0][packed.segments[0] == s]  # (L, V)
            if positional == "rope" or s == 0:  # a position table counts along the window
                torch.testing.assert_close(inside, alone, atol=1e-5, rtol=1e-5)
            else:
                assert not torch.allclose(inside, alone, atol=1e-3)


def test_packed_logits_refuses_mismatched_shapes(chat_model):
    with pytest.raises(ValueError, match="same shape"):
        packed_logits(
            chat_model(), torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long)
        )
