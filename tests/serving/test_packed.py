"""Continuous batching with the prefills packed into the decode step (issue 50): every
request's tokens equal what it gets served alone; a step is one pass whatever it admits; the
packed step writes each new token to its own request's blocks, reads every request's keys end to
end and lets a token see only its own request's past."""

from __future__ import annotations

import pytest
import torch
from serving_models import llama_pair, mixed_requests

from coursepkg.serving import SamplingParams, generate
from coursepkg.serving.packed import PackedBatcher, PackedPagedKVCache
from coursepkg.serving.paged import BlockTable
from coursepkg.serving.scheduler import ContinuousBatcher, serve_one_at_a_time


@pytest.mark.parametrize("max_batch, n_blocks", [(1, 8), (3, 30), (8, 80), (8, 12)])
@pytest.mark.parametrize("seed", [0, 6])
def test_each_request_gets_what_it_gets_alone(max_batch, n_blocks, seed):
    _, lm = llama_pair()
    requests = mixed_requests(seed=seed, n=9)
    batcher = PackedBatcher(lm, n_blocks=n_blocks, block_size=4, max_batch=max_batch)
    got = batcher.run(requests)
    for ours, ref, r in zip(got, serve_one_at_a_time(lm, requests), requests, strict=True):
        assert ours.shape == (r.prompt.numel() + r.max_new_tokens,)
        assert torch.equal(ours, ref) and not ours.is_inference()
    assert len(batcher.cache.free) == n_blocks  # every block came back
    assert batcher.prefills == 0


def test_sampling_sees_each_requests_own_tokens():
    _, lm = llama_pair(seed=2)
    requests = mixed_requests(seed=2, n=5)
    params = SamplingParams(repetition_penalty=1.5)
    got = PackedBatcher(lm, n_blocks=40, block_size=4, max_batch=3, params=params).run(requests)
    for ours, r in zip(got, requests, strict=True):
        assert torch.equal(ours, generate(lm, r.prompt[None], r.max_new_tokens, params)[0])


def test_a_step_that_admits_is_one_pass():
    """The plain scheduler runs a prefill pass beside the decode step whenever it admits; the
    packed one runs one pass per step, so it makes fewer passes in all."""
    _, lm = llama_pair()
    requests = mixed_requests(seed=3, n=12)
    plain = ContinuousBatcher(lm, n_blocks=40, block_size=4, max_batch=3)
    packed = PackedBatcher(lm, n_blocks=40, block_size=4, max_batch=3)
    for ours, ref in zip(packed.run(requests), plain.run(requests), strict=True):
        assert torch.equal(ours, ref)
    assert plain.prefills > 1
    assert packed.steps < plain.steps + plain.prefills


def test_the_packed_step_reads_and_writes_each_requests_own_positions():
    pool = PackedPagedKVCache(n_layers=1, n_blocks=6, block_size=2)
    a, b, c = BlockTable(), BlockTable(), BlockTable()
    pool.begin([a, b], [3, 1])
    pool.write_and_gather(0, torch.ones(2, 1, 3, 1), torch.ones(2, 1, 3, 1))  # (B, H, n, D)
    assert (a.length, b.length) == (3, 1)
    pool.begin_packed([a, b, c], [1, 1, 2])  # a and b decode one token; c is a new prompt
    assert pool.positions().tolist() == [3, 1, 0, 1]
    seq = [0] * 4 + [1] * 2 + [2] * 2  # the keys end to end: a's 4, b's 2, c's 2
    pos = [0, 1, 2, 3, 0, 1, 0, 1]
    expected = torch.tensor(
        [
            [s == row and p <= at for s, p in zip(seq, pos, strict=True)]
            for row, at in [(0, 3), (1, 1), (2, 0), (2, 1)]
        ]
    )
    assert torch.equal(pool.attn_mask().dense, expected)  # (T, K): own request, causal
    new = torch.tensor([10.0, 20.0, 30.0, 31.0]).view(1, 1, 4, 1)  # (1, H, T, D)
    keys, values = pool.write_and_gather(0, new, -new)
    assert keys.shape == (1, 1, 8, 1) and (a.length, b.length, c.length) == (4, 2, 2)
    assert keys.flatten().tolist() == [1, 1, 1, 10, 1, 20, 30, 31]
    assert values.flatten().tolist() == [1, 1, 1, -10, 1, -20, -30, -31]
    assert not set(c.blocks) & set(a.blocks + b.blocks)


def test_bad_counts_are_named():
    pool = PackedPagedKVCache(n_layers=1, n_blocks=4, block_size=2)
    with pytest.raises(ValueError, match="n_new must be one positive count per sequence"):
        pool.begin_packed([BlockTable()], [0])
    with pytest.raises(ValueError, match="n_new must be one positive count per sequence"):
        pool.begin_packed([BlockTable(), BlockTable()], [1])


def test_packed_steps_give_each_requests_own_logits():
    """Greedy tokens of a small random model can hide a leak between requests; the logits
    cannot: two packed steps (three prompts, then decode rows beside a longer continuation)
    give each request the logits of its own tokens run alone."""
    _, lm = llama_pair(seed=3)
    g = torch.Generator().manual_seed(0)
    full = [torch.randint(1, 61, (n,), generator=g) for n in (7, 4, 8)]  # (L_i,)
    pool = PackedPagedKVCache(lm.config.n_layers, n_blocks=12, block_size=4)
    tables = [BlockTable() for _ in full]
    done = [0, 0, 0]
    with torch.inference_mode():
        for counts in ([5, 3, 4], [1, 1, 4]):  # a prompt each, then 1, 1 and 4 more tokens
            new = [x[d : d + n] for x, d, n in zip(full, done, counts, strict=True)]
            pool.begin_packed(tables, counts)
            logits = lm(
                torch.cat(new)[None],
                cache=pool,
                positions=pool.positions()[None],
                attn_mask=pool.attn_mask(),
            )[0]  # (T, V)
            for i, part in enumerate(logits.split(counts)):
                done[i] += counts[i]
                alone = lm(full[i][None, : done[i]])[0, -counts[i] :]  # (n_i, V)
                torch.testing.assert_close(part, alone, rtol=1e-5, atol=1e-5)
