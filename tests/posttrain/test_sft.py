"""Tests of coursepkg.posttrain.sft: the masked loss against a float64 loop, prompt and padding
never counted, per-token against per-sequence averaging, and a step that learns."""

from __future__ import annotations

import math

import pytest
import torch

from coursepkg.posttrain.chat import encode_chat
from coursepkg.posttrain.packing import pad_batch
from coursepkg.posttrain.per_token import token_log_probs
from coursepkg.posttrain.sft import sft_loss, sft_microbatch_step, sft_step

V = 7


def _batch(seed: int = 0):
    """Two rows: row 0 learns targets 2..4 (3 tokens), row 1 learns target 5 only; 6-7 padding."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 8, V, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (2, 8), generator=g)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[0, 2:5] = True
    mask[1, 5] = True
    return logits, tokens, mask


def _loop_losses(logits, tokens, mask):
    """Each row's list of -log p(target) over its masked targets, by hand in float64."""
    rows = []
    for b in range(tokens.size(0)):
        row = []
        for t in range(1, tokens.size(1)):
            if mask[b, t]:
                scores = logits[b, t - 1].tolist()
                log_z = math.log(sum(math.exp(s) for s in scores))
                row.append(log_z - scores[int(tokens[b, t])])
        rows.append(row)
    return rows


def test_both_averages_equal_their_closed_forms():
    logits, tokens, mask = _batch()
    rows = _loop_losses(logits, tokens, mask)
    per_token = sum(map(sum, rows)) / sum(map(len, rows))  # (3 + 1) tokens weigh the same
    per_sequence = sum(sum(r) / len(r) for r in rows) / len(rows)  # 2 rows weigh the same
    assert sft_loss(logits, tokens, mask, "token").item() == pytest.approx(per_token, rel=1e-12)
    assert sft_loss(logits, tokens, mask, "sequence").item() == pytest.approx(
        per_sequence, rel=1e-12
    )
    assert per_token != pytest.approx(per_sequence)  # lengths 3 and 1: the two differ


def test_the_averages_agree_when_every_row_learns_as_many_tokens():
    logits, tokens, mask = _batch()
    mask[1] = False
    mask[1, 4:7] = True
    torch.testing.assert_close(
        sft_loss(logits, tokens, mask, "token"), sft_loss(logits, tokens, mask, "sequence")
    )


@pytest.mark.parametrize("normalise", ["token", "sequence"])
def test_prompt_and_padding_positions_change_nothing(normalise):
    logits, tokens, mask = _batch()
    before = sft_loss(logits, tokens, mask, normalise)
    # A position whose target is not learned may hold anything, even inf and NaN.
    unlearned = ~mask[:, 1:]  # (B, L-1): logits at t predict token t + 1
    noisy = logits.clone()
    noisy[:, :-1][unlearned] = float("nan")
    noisy[:, -1] = float("inf")  # the last position predicts nothing
    other = tokens.clone()
    other[~mask] = (tokens[~mask] + 1) % V
    other[:, 0] = tokens[:, 0]  # position 0's logits predict token 1: keep what they read
    after = sft_loss(noisy, torch.where(mask, tokens, other), mask, normalise)
    torch.testing.assert_close(after, before)


def test_only_learned_targets_get_a_gradient():
    logits, tokens, mask = _batch()
    logits.requires_grad_(True)
    sft_loss(logits, tokens, mask).backward()
    has_gradient = logits.grad.abs().sum(-1) > 0  # (B, L)
    expected = torch.zeros_like(mask)
    expected[:, :-1] = mask[:, 1:]
    assert torch.equal(has_gradient, expected)


def test_bad_arguments_are_named():
    logits, tokens, mask = _batch()
    with pytest.raises(ValueError, match="normalise must be one of"):
        sft_loss(logits, tokens, mask, "batch")
    with pytest.raises(ValueError, match="marks no target"):
        sft_loss(logits, tokens, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="loss_mask must be a bool tensor"):
        sft_loss(logits, tokens, mask.long())


def test_a_few_steps_learn_the_response(chat_tokenizer, chat_model):
    model = chat_model()
    chat = [{"role": "user", "content": "Reverse cat"}, {"role": "assistant", "content": "tac"}]
    examples = [encode_chat(chat_tokenizer, chat)] * 2
    batch = pad_batch(examples, pad_id=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = [sft_step(model, optimizer, *batch) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    model.eval()
    ids, learned = examples[0].ids, examples[0].response_mask
    start = learned.index(True)
    out = model.generate(torch.tensor([ids[:start]]), len(ids) - start)  # greedy
    assert out[0, start:].tolist() == ids[start:]  # "tac" and the end-of-turn token


def test_a_row_without_response_tokens_is_left_out_of_the_per_sequence_mean():
    logits, tokens, mask = _batch()
    only_first = mask.clone()
    only_first[1] = False  # row 1: all prompt (or all padding)
    rows = _loop_losses(logits, tokens, only_first)
    assert sft_loss(logits, tokens, only_first, "sequence").item() == pytest.approx(
        sum(rows[0]) / len(rows[0]), rel=1e-12
    )
    torch.testing.assert_close(
        sft_loss(logits[:1], tokens[:1], mask[:1], "sequence"),
        sft_loss(logits, tokens, only_first, "sequence"),
    )


@pytest.mark.parametrize("splits", [1, 2, 4])
def test_microbatch_steps_add_up_to_the_whole_batch_s_token_mean(splits):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 6, V, generator=g, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, V, (4, 6), generator=g)
    mask = torch.rand(4, 6, generator=g) < 0.7
    mask[:, 1] = True  # every row learns a target
    whole = sft_loss(logits, tokens, mask)
    (expected,) = torch.autograd.grad(whole, logits)
    targets = mask[:, 1:]  # (B, L-1): the mask shifted to the targets
    constant = int(targets.sum()) / splits  # the batch's response targets, per microbatch
    total = 0.0
    for rows in torch.arange(4).chunk(splits):
        logp = token_log_probs(logits[rows], tokens[rows])  # (b, L-1)
        loss = sft_microbatch_step(logp, targets[rows], splits, constant)
        total += float(loss)
        # each microbatch's loss is its masked sum / constant / steps
        assert float(loss) == pytest.approx(
            float(-(logp * targets[rows]).sum()) / constant / splits, rel=1e-12
        )
    torch.testing.assert_close(logits.grad, expected)
    assert total == pytest.approx(float(whole), rel=1e-12)


def test_microbatch_step_names_bad_accumulation_steps():
    logp = torch.zeros(1, 2, requires_grad=True)
    with pytest.raises(ValueError, match="grad_accum_steps must be an integer >= 1, got 0"):
        sft_microbatch_step(logp, torch.ones(1, 2, dtype=torch.bool), 0, 1.0)
