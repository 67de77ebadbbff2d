"""Speculative decoding (issue 50): greedy output token for token the target's alone, whatever
the draft and k; a draft equal to the target is always accepted; with sampling the rejection
rule's output is distributed as the target's: on fixed distributions (60,000 rows at once) and
end to end on two tiny models with a 5-token vocabulary (the joint law of two generated tokens,
computed exactly from the target); chi-square tests at a false-alarm rate of 0.1%, seeded.
Bad input is named."""

from __future__ import annotations

import itertools

import pytest
import torch
from serving_models import FALSE_ALARM, V, chi_square_p_value, llama_pair

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.serving import SamplingParams, generate, process_logits
from coursepkg.serving.speculative import speculative_generate, verify_drafts


def _prompt(n: int = 5, seed: int = 2, vocab: int = V) -> torch.Tensor:
    return torch.randint(1, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("penalty", [None, 1.4])
def test_greedy_is_the_targets_own_output(k, penalty):
    _, target = llama_pair(seed=0, num_hidden_layers=3)
    _, draft = llama_pair(seed=1, hidden_size=16, num_hidden_layers=1)
    params = SamplingParams(repetition_penalty=penalty)
    prompt = _prompt()
    got = speculative_generate(target, draft, prompt, 30, k=k, params=params)
    assert torch.equal(got.tokens, generate(target, prompt, 30, params))
    assert 0 <= got.accepted <= got.proposed
    assert not got.tokens.is_inference()


def test_a_draft_equal_to_the_target_is_always_accepted():
    _, target = llama_pair()
    got = speculative_generate(target, target, _prompt(), 20, k=4)
    assert got.acceptance_rate == 1.0
    assert got.target_forwards == 4  # 5 + 5 + 5 + 5 tokens: k drafts and the target's own
    assert torch.equal(got.tokens, generate(target, _prompt(), 20))


# -- sampling: the output's law is the target's ------------------------------------------------


def test_the_rejection_rule_reproduces_the_targets_distributions():
    """Fixed target p (3 positions) and draft q (2) over 6 tokens: the first emitted token
    follows p[0]; the second, in the rows that kept the first draft, follows p[1]."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 6, generator=g) * 1.5, -1)  # (K + 1, V)
    q = torch.softmax(torch.randn(2, 6, generator=g) * 1.5, -1)  # (K, V)
    n = 60_000
    drafts = torch.stack([torch.multinomial(q[i], n, True, generator=g) for i in range(2)], 1)
    kept, nxt = verify_drafts(p.expand(n, -1, -1), q.expand(n, -1, -1), drafts, False, g)
    first = torch.where(kept >= 1, drafts[:, 0], nxt)
    second = torch.where(kept >= 2, drafts[:, 1], nxt)[kept >= 1]
    for emitted, law in ((first, p[0]), (second, p[1])):
        assert chi_square_p_value(torch.bincount(emitted, minlength=6), law) > FALSE_ALARM
    # The draft's own law is far from the target's: emitting drafts unchecked would fail.
    assert chi_square_p_value(torch.bincount(drafts[:, 0], minlength=6), p[0]) < FALSE_ALARM


def _tiny(seed: int) -> DecoderOnlyLM:
    torch.manual_seed(seed)
    config = TransformerConfig(
        vocab_size=5, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0, max_len=16
    )
    model = DecoderOnlyLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # sharper, different distributions for the two models
    return model


def _exact_joint(target, prompt, params) -> torch.Tensor:
    """P(x1, x2) of the target's two next tokens under ``params``: (V, V)."""
    with torch.no_grad():
        p1 = torch.softmax(_scores(target, prompt, params), -1)[0]  # (V,)
        rows = []
        for x1 in range(5):
            seen = torch.cat([prompt, torch.tensor([[x1]])], 1)
            rows.append(p1[x1] * torch.softmax(_scores(target, seen, params), -1)[0])
    return torch.stack(rows)  # (V, V)


def _scores(model, seq, params):
    return process_logits(model(seq)[:, -1], seq, params)  # (1, V)


@pytest.mark.slow  # 2,000 generations: about 15 s on a busy 2-core machine
def test_end_to_end_sampling_has_the_targets_law():
    target, draft = _tiny(0), _tiny(1)
    prompt = torch.tensor([[1, 3, 2]])
    params = SamplingParams(temperature=1.0, top_k=4)
    law = _exact_joint(target, prompt, params).flatten()  # (V * V,)
    g = torch.Generator().manual_seed(4)
    n = 2000
    pairs = [
        speculative_generate(target, draft, prompt, 2, k=3, params=params, generator=g).tokens
        for _ in range(n)
    ]
    cells = torch.cat(pairs)[:, -2:]  # (n, 2)
    counts = torch.bincount(cells[:, 0] * 5 + cells[:, 1], minlength=25)
    assert (counts[law == 0] == 0).all()
    assert chi_square_p_value(counts, law) > FALSE_ALARM
    draft_law = _exact_joint(draft, prompt, params).flatten()
    assert 0.5 * (draft_law - law).abs().sum() > 0.15  # the test could tell them apart


def test_seeded_speculative_sampling_is_reproducible():
    _, target = llama_pair()
    _, draft = llama_pair(seed=3, num_hidden_layers=1)
    params = SamplingParams(temperature=0.8, top_p=0.9)

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return speculative_generate(target, draft, _prompt(), 15, 3, params, g).tokens

    assert torch.equal(run(1), run(1))
    assert run(1).shape == (1, 20)


def test_bad_input_is_named():
    _, target = llama_pair()
    _, other = llama_pair(vocab_size=V + 1)
    with pytest.raises(ValueError, match="draft must share the target's vocabulary"):
        speculative_generate(target, other, _prompt(), 4)
    with pytest.raises(ValueError, match="k "):
        speculative_generate(target, target, _prompt(), 4, k=0)
    with pytest.raises(ValueError, match="tokens must be one"):
        speculative_generate(target, target, _prompt().repeat(2, 1), 4)
    with pytest.raises(ValueError, match="max_len"):
        speculative_generate(_tiny(0), _tiny(1), torch.tensor([[1, 2]]), 15)


def test_all_cells_of_the_joint_are_reachable():
    law = _exact_joint(_tiny(0), torch.tensor([[1, 3, 2]]), SamplingParams(temperature=1.0))
    assert torch.isclose(law.sum(), torch.tensor(1.0))
    assert all(law[a, b] > 0 for a, b in itertools.product(range(5), range(5)))
