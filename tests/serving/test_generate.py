"""``coursepkg.serving.generate`` (issue 50): without padding the tokens of the model's own
``generate``; batched prompts of different lengths, left padded, give the tokens of
``transformers``' batched ``generate`` on the same Llama (greedy, and greedy with a repetition
penalty), and each row the tokens it gets alone; seeded sampling is reproducible; bad input is
named."""

from __future__ import annotations

import pytest
import torch

tf = pytest.importorskip("transformers")

from serving_models import V, left_padded, llama_pair  # noqa: E402

from coursepkg import DecoderOnlyLM, TransformerConfig  # noqa: E402
from coursepkg.serving import SamplingParams, generate  # noqa: E402


def test_without_padding_equal_to_the_models_generate():
    _, lm = llama_pair()
    prompt = torch.randint(1, V, (3, 7), generator=torch.Generator().manual_seed(2))
    out = generate(lm, prompt, 20)
    assert torch.equal(out, lm.generate(prompt, 20))
    assert not out.is_inference()  # usable with autograd afterwards


@pytest.mark.parametrize("penalty", [None, 1.3])
def test_left_padded_batch_equals_transformers(penalty):
    hf, lm = llama_pair()
    tokens, mask = left_padded([9, 4, 1, 6])
    params = SamplingParams(repetition_penalty=penalty)
    ours = generate(lm, tokens, 24, params, token_mask=mask)
    with torch.no_grad():
        theirs = hf.generate(
            tokens,
            attention_mask=mask.long(),
            max_new_tokens=24,
            do_sample=False,
            repetition_penalty=penalty,
        )
    assert ours.shape == (4, 9 + 24)
    assert torch.equal(ours, theirs)


def test_each_padded_row_gets_what_it_gets_alone():
    _, lm = llama_pair(seed=1)
    lengths = [5, 8, 2]
    tokens, mask = left_padded(lengths, seed=4)
    batch = generate(lm, tokens, 16, token_mask=mask)
    for row, n in enumerate(lengths):
        alone = generate(lm, tokens[row : row + 1, -n:], 16)
        assert torch.equal(batch[row : row + 1, -(n + 16) :], alone)


def test_seeded_sampling_is_reproducible():
    _, lm = llama_pair()
    tokens, mask = left_padded([6, 3])
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=20, min_p=0.02)

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return generate(lm, tokens, 12, params, token_mask=mask, generator=g)

    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))


def test_bad_input_is_named():
    _, lm = llama_pair()
    tokens, mask = left_padded([4, 2])
    with pytest.raises(ValueError, match="left padded"):
        generate(lm, tokens, 3, token_mask=mask.flip(-1))
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(lm, tokens, -1)
    with pytest.raises(ValueError, match="token_mask"):
        generate(lm, tokens, 3, token_mask=mask[:, 1:])
    table = DecoderOnlyLM(
        TransformerConfig(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32)
    )
    with pytest.raises(ValueError, match="positional='rope'"):
        generate(table, tokens, 3, token_mask=mask)
