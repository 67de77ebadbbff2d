"""Tests of coursepkg.posttrain.dpo: the loss, rewards and margins against a float64 closed form
(value and gradient), sequence log-probabilities against a loop, the frozen reference, a step
that raises the margin, and the errors on bad pairs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from coursepkg.posttrain.dpo import (
    PreferencePair,
    dpo_loss,
    dpo_pairs_loss,
    dpo_step,
    encode_preference,
    frozen_copy,
    pair_examples,
    read_preference_jsonl,
    response_logprobs,
    sequence_logprobs,
)
from coursepkg.posttrain.packing import Batch, pad_batch


def _logps(seed=0, n=5):
    g = torch.Generator().manual_seed(seed)
    return [-(torch.rand(n, generator=g, dtype=torch.float64) * 20) for _ in range(4)]


@pytest.mark.parametrize("beta", [0.01, 0.1, 1.0])
def test_the_loss_and_margins_equal_the_closed_form(beta):
    pc, pr, rc, rr = _logps()
    out = dpo_loss(pc, pr, rc, rr, beta)
    losses, margins = [], []
    for i in range(pc.numel()):
        z = beta * ((pc[i] - rc[i]) - (pr[i] - rr[i])).item()
        margins.append(z)
        losses.append(math.log1p(math.exp(-z)))  # -log sigmoid(z)
    assert out.loss.item() == pytest.approx(sum(losses) / len(losses), rel=1e-12)
    assert out.margins.tolist() == pytest.approx(margins, rel=1e-12)
    torch.testing.assert_close(out.chosen_rewards, beta * (pc - rc))
    torch.testing.assert_close(out.rejected_rewards, beta * (pr - rr))


def test_the_gradient_equals_the_closed_form_and_never_reaches_the_reference():
    beta = 0.5
    pc, pr, rc, rr = (x.requires_grad_(True) for x in _logps(1))
    out = dpo_loss(pc, pr, rc, rr, beta)
    out.loss.backward()
    z = out.margins  # d loss / d pc = -beta sigmoid(-z) / B, and the opposite for pr
    expected = -beta * torch.sigmoid(-z) / z.numel()
    torch.testing.assert_close(pc.grad, expected)
    torch.testing.assert_close(pr.grad, -expected)
    assert rc.grad is None and rr.grad is None


def test_a_policy_equal_to_its_reference_scores_log_two():
    pc, pr, _, _ = _logps(2)
    out = dpo_loss(pc, pr, pc.clone(), pr.clone(), beta=0.3)
    assert out.loss.item() == pytest.approx(math.log(2), rel=1e-12)
    assert torch.equal(out.margins, torch.zeros_like(pc))


def test_response_logprobs_sum_the_response_tokens_only():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 5, (2, 6), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    expected = [
        sum(
            torch.log_softmax(logits[b, t - 1], -1)[tokens[b, t]].item()
            for t in range(1, 6)
            if mask[b, t]
        )
        for b in range(2)
    ]
    assert response_logprobs(logits, tokens, mask).tolist() == pytest.approx(expected, rel=1e-12)


def _pairs(tokenizer, n=2):
    prompts = ["What is two plus three?", "Reverse the word cat"][:n]
    chosen, rejected = [" Five.", " tac."][:n], [" dog.", " mat."][:n]
    pairs = [
        PreferencePair([{"role": "user", "content": p}], c, r)
        for p, c, r in zip(prompts, chosen, rejected, strict=True)
    ]
    encoded = [encode_preference(tokenizer, pair) for pair in pairs]
    return pad_batch([c for c, _ in encoded], 0), pad_batch([r for _, r in encoded], 0)


def test_sequence_logprobs_do_not_depend_on_padding(chat_tokenizer, chat_model):
    model = chat_model()
    chosen, _ = _pairs(chat_tokenizer)
    with torch.no_grad():
        together = sequence_logprobs(model, chosen)
        for row in range(2):
            n = int(chosen.token_mask[row].sum())
            alone = Batch(*(x[row : row + 1, :n] for x in chosen))  # (1, n): no padding
            torch.testing.assert_close(sequence_logprobs(model, alone), together[row : row + 1])


def test_steps_raise_the_margin_and_leave_the_reference_alone(chat_tokenizer, chat_model):
    policy = chat_model()
    reference = frozen_copy(policy)
    weights = {n: p.clone() for n, p in reference.named_parameters()}
    assert not any(p.requires_grad for p in reference.parameters())
    chosen, rejected = _pairs(chat_tokenizer)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    stats = [dpo_step(policy, reference, optimizer, chosen, rejected, beta=0.5) for _ in range(8)]
    assert stats[0]["loss"] == pytest.approx(math.log(2), rel=1e-5)  # policy == reference
    assert stats[-1]["margin"] > 0 and stats[-1]["loss"] < stats[0]["loss"]
    assert stats[-1]["accuracy"] == 1.0
    assert all(torch.equal(p, weights[n]) for n, p in reference.named_parameters())


def test_identical_answers_and_bad_beta_are_refused(chat_tokenizer):
    pair = PreferencePair([{"role": "user", "content": "hi"}], "same", "same")
    with pytest.raises(ValueError, match="chosen and rejected are the same answer"):
        encode_preference(chat_tokenizer, pair)
    pc, pr, rc, rr = _logps()
    with pytest.raises(ValueError, match="beta must be > 0, got 0"):
        dpo_loss(pc, pr, rc, rr, beta=0)
    with pytest.raises(ValueError, match="reference_chosen must have policy_chosen's shape"):
        dpo_loss(pc, pr, rc[:2], rr)


def test_preference_jsonl_names_its_bad_lines(tmp_path):
    good = {"prompt": "Reverse cat", "chosen": "tac", "rejected": "cat"}
    lines = [json.dumps(good), json.dumps({**good, "prompt": [{"role": "user", "content": "hi"}]})]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    pairs = read_preference_jsonl(path)
    assert pairs[0] == PreferencePair([{"role": "user", "content": "Reverse cat"}], "tac", "cat")
    assert pairs[1].prompt == [{"role": "user", "content": "hi"}]
    bad = [
        ({**good, "rejected": "tac"}, "line 2: 'chosen' and 'rejected' are the same answer"),
        ({"prompt": "x", "chosen": "y"}, "line 2: expected the keys"),
        (
            {**good, "prompt": [{"role": "bot", "content": "hi"}]},
            "line 2: message 0 has the unknown role 'bot'",
        ),
        ({**good, "chosen": 3}, "line 2: 'chosen' must be a str"),
    ]
    for record, message in bad:
        path.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n", encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            read_preference_jsonl(path)


def _alpaca(tokenizer, instruction):
    """A prompt format other than the course's chat template (Alpaca's)."""
    return tokenizer.encode(f"### Instruction:\n{instruction}\n\n### Response:\n")


def test_dpo_of_any_prompt_format_is_the_formula_on_each_pair_alone(chat_tokenizer, chat_model):
    policy, reference = chat_model(seed=1), chat_model(seed=2)
    eos = chat_tokenizer.encode("<|endoftext|>")
    questions = [("Reverse the word cat:", " tac", " cat"), ("Sort 3 1 2:", " 1 2 3", " 3 2 1 0")]
    pairs = [
        pair_examples(
            _alpaca(chat_tokenizer, q),
            chat_tokenizer.encode(c) + eos,
            chat_tokenizer.encode(r) + eos,
        )
        for q, c, r in questions
    ]
    out = dpo_pairs_loss(policy, reference, pairs, pad_id=0, beta=0.3)

    def logp(model, example):  # one unpadded sequence, its answer's tokens summed
        ids = torch.tensor([example.ids])
        log_probs = model(ids).detach().log_softmax(-1)[0]  # (L, V)
        return sum(
            float(log_probs[t - 1, ids[0, t]])
            for t in range(len(example))
            if example.response_mask[t]
        )

    losses = []
    for chosen, rejected in pairs:
        z = 0.3 * (
            (logp(policy, chosen) - logp(reference, chosen))
            - (logp(policy, rejected) - logp(reference, rejected))
        )
        losses.append(math.log1p(math.exp(-z)))  # -log sigmoid(z)
    assert out.loss.item() == pytest.approx(sum(losses) / 2, rel=1e-5)
    out.loss.backward()
    assert all(p.grad is None for p in reference.parameters())


def test_pair_examples_mark_the_answers_and_refuse_equal_ones():
    chosen, rejected = pair_examples([5, 6], [7], [8, 9])
    assert chosen.ids == [5, 6, 7] and chosen.response_mask == [False, False, True]
    assert rejected.ids == [5, 6, 8, 9] and rejected.response_mask == [False, False, True, True]
    with pytest.raises(ValueError, match="same ids"):
        pair_examples([5], [7], [7])
