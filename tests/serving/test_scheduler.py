"""Continuous batching over the paged cache (issue 50): every request's tokens equal what it gets
served alone, whatever the batch size and however tight the pool (requests then wait, in
order); the static-batch baseline gives the same tokens; a growing sequence gets blocks
appended to its table and nothing moves; every block returns to the pool; bad input named."""

from __future__ import annotations

import pytest
import torch
from serving_models import V, llama_pair, mixed_requests

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.serving import SamplingParams, generate
from coursepkg.serving.paged import BlockTable, PagedKVCache
from coursepkg.serving.scheduler import (
    ContinuousBatcher,
    Request,
    serve_one_at_a_time,
    serve_static_batches,
)


@pytest.mark.parametrize("max_batch, n_blocks", [(1, 8), (3, 30), (8, 80), (8, 12)])
def test_each_request_gets_what_it_gets_alone(max_batch, n_blocks):
    _, lm = llama_pair()
    requests = mixed_requests()
    batcher = ContinuousBatcher(lm, n_blocks=n_blocks, block_size=4, max_batch=max_batch)
    got = batcher.run(requests)
    alone = serve_one_at_a_time(lm, requests)
    for ours, ref, r in zip(got, alone, requests, strict=True):
        assert ours.shape == (r.prompt.numel() + r.max_new_tokens,)
        assert torch.equal(ours, ref) and not ours.is_inference()
    assert len(batcher.cache.free) == n_blocks  # every block came back
    assert batcher.peak_running == min(max_batch, len(requests)) or n_blocks == 12
    if max_batch > 1 and n_blocks > 12:
        assert batcher.peak_running > 1


def test_a_tight_pool_makes_requests_wait_but_changes_nothing():
    _, lm = llama_pair()
    requests = mixed_requests(seed=1)
    batcher = ContinuousBatcher(lm, n_blocks=9, block_size=4, max_batch=8)
    got = batcher.run(requests)
    assert batcher.peak_running < 8
    for ours, ref in zip(got, serve_one_at_a_time(lm, requests), strict=True):
        assert torch.equal(ours, ref)


def test_the_repetition_penalty_sees_each_requests_own_tokens():
    _, lm = llama_pair(seed=2)
    requests = mixed_requests(seed=2, n=4)
    params = SamplingParams(repetition_penalty=1.5)
    got = ContinuousBatcher(lm, n_blocks=40, block_size=4, max_batch=3, params=params).run(requests)
    for ours, r in zip(got, requests, strict=True):
        assert torch.equal(ours, generate(lm, r.prompt[None], r.max_new_tokens, params)[0])


def test_static_batches_give_the_same_tokens():
    _, lm = llama_pair()
    requests = mixed_requests(seed=3)
    for ours, ref in zip(
        serve_static_batches(lm, requests, 3), serve_one_at_a_time(lm, requests), strict=True
    ):
        assert torch.equal(ours, ref)


def test_a_growing_sequence_appends_blocks_and_nothing_moves():
    pool = PagedKVCache(n_layers=1, n_blocks=6, block_size=4)
    a, b = BlockTable(), BlockTable()
    pool.grow(a, 5)
    pool.grow(b, 3)
    first = list(a.blocks)
    pool.grow(a, 12)
    assert len(a.blocks) == 3 and a.blocks[:2] == first  # appended, earlier blocks kept
    assert not set(a.blocks) & set(b.blocks)
    pool.release(a)
    assert len(pool.free) == 5 and a.blocks == []
    with pytest.raises(RuntimeError, match="free blocks"):
        pool.grow(b, 4 * 7)


def test_the_storage_is_allocated_once():
    _, lm = llama_pair()
    batcher = ContinuousBatcher(lm, n_blocks=30, block_size=4, max_batch=3)
    batcher.run(mixed_requests(n=2))
    pointers = [t.data_ptr() for t in batcher.cache.storage]
    batcher.run(mixed_requests(seed=5))
    assert pointers == [t.data_ptr() for t in batcher.cache.storage]


def test_bad_input_is_named():
    _, lm = llama_pair()
    long = [Request(torch.ones(10, dtype=torch.long), 30)]
    with pytest.raises(ValueError, match="request 0 is longer than the cache can hold"):
        ContinuousBatcher(lm, n_blocks=4, block_size=4).run(long)
    with pytest.raises(ValueError, match="max_new_tokens >= 1"):
        ContinuousBatcher(lm, n_blocks=4).run([Request(torch.ones(3, dtype=torch.long), 0)])
    with pytest.raises(ValueError, match="max_batch"):
        ContinuousBatcher(lm, n_blocks=4, max_batch=0)
    with pytest.raises(ValueError, match="block_size"):
        ContinuousBatcher(lm, n_blocks=4, block_size=0)
    table = DecoderOnlyLM(
        TransformerConfig(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32)
    )
    with pytest.raises(ValueError, match="positional='rope'"):
        ContinuousBatcher(table, n_blocks=4)


def test_requests_admitted_together_share_one_prefill():
    """Prompts of different lengths admitted in one step are prefilled in one padded pass, and
    their tokens are still what each gets alone."""
    _, lm = llama_pair()
    requests = mixed_requests(seed=4, n=6)
    assert len({r.prompt.numel() for r in requests}) > 1
    batcher = ContinuousBatcher(lm, n_blocks=60, block_size=4, max_batch=8)
    got = batcher.run(requests)
    assert batcher.prefills == 1  # all six fit: one step admits them all
    for ours, ref in zip(got, serve_one_at_a_time(lm, requests), strict=True):
        assert torch.equal(ours, ref)


def test_a_padded_prefill_writes_each_prompt_only_and_its_padding_to_the_spare_slot():
    pool = PagedKVCache(n_layers=1, n_blocks=4, block_size=4)
    a, b = BlockTable(), BlockTable()
    pool.begin([a, b], [5, 2])
    k = torch.arange(2 * 5, dtype=torch.float).view(2, 1, 5, 1)  # (B, H, n, Dk): row*5 + col
    keys, _ = pool.write_and_gather(0, k, -k)
    assert (a.length, b.length) == (5, 2) and len(a.blocks) == 2 and len(b.blocks) == 1
    assert pool.token_mask().tolist() == [[True] * 5, [False] * 3 + [True] * 2]
    assert keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4]
    assert keys[1, 0, 3:, 0].tolist() == [8, 9]  # row 1's real tokens are its last two
    slot = b.blocks[0] * 4
    assert pool.storage[0][slot : slot + 2, 0, 0].tolist() == [8, 9]
    assert pool.storage[0].size(0) == 4 * 4 + 1  # the spare row
    with pytest.raises(ValueError, match="n_new must be one positive count per sequence"):
        pool.begin([a, b], [1])


def test_padded_paged_steps_give_each_requests_own_logits():
    """Greedy tokens of a small random model can hide a leak between rows; the logits cannot:
    a left-padded prefill of three prompts and two decode steps over the paged cache give each
    request the logits of its own tokens run alone."""
    _, lm = llama_pair(seed=3)
    g = torch.Generator().manual_seed(0)
    full = [torch.randint(1, V, (n,), generator=g) for n in (7, 4, 8)]  # (L_i,)
    pool = PagedKVCache(lm.config.n_layers, n_blocks=12, block_size=4)
    tables = [BlockTable() for _ in full]
    prompt = [5, 2, 6]  # then one token each, twice
    with torch.inference_mode():
        width = max(prompt)
        tokens = torch.zeros(3, width, dtype=torch.long)  # (B, L) left padded
        for row, (x, n) in enumerate(zip(full, prompt, strict=True)):
            tokens[row, width - n :] = x[:n]
        pool.begin(tables, prompt)
        logits = lm(tokens, token_mask=pool.token_mask(), cache=pool)  # (B, L, V)
        for row, (x, n) in enumerate(zip(full, prompt, strict=True)):
            alone = lm(x[None, :n])[0]  # (n, V)
            torch.testing.assert_close(logits[row, width - n :], alone, rtol=1e-5, atol=1e-5)
        for step in range(2):
            new = torch.stack([x[n + step] for x, n in zip(full, prompt, strict=True)])[:, None]
            pool.begin(tables, 1)
            logits = lm(new, token_mask=pool.token_mask(), cache=pool)[:, -1]  # (B, V)
            for row, (x, n) in enumerate(zip(full, prompt, strict=True)):
                alone = lm(x[None, : n + step + 1])[0, -1]  # (V,)
                torch.testing.assert_close(logits[row], alone, rtol=1e-5, atol=1e-5)
