"""The serving chapter's measurements (issue 50): each returns what it measured on real small
models (no timing order asserted, only that the numbers are consistent): speculative decoding's
tokens equal the target's and its trace adds up; the workload's lengths stay in their ranges;
throughput is reported for every batch size; the quantization table's bytes equal the closed
form and its fp32 row has no error; bad arguments named."""

from __future__ import annotations

import pytest
import torch
from serving_models import V, llama_pair

from coursepkg.chapters.serving_measure import (
    mixed_workload,
    quantization_table,
    throughput_by_concurrency,
    time_speculative,
)
from coursepkg.serving import quantize_linears, quantized_weight_bytes, weight_bytes


def test_speculative_timing_is_exact_and_its_trace_adds_up():
    _, target = llama_pair(seed=0, num_hidden_layers=3)
    _, draft = llama_pair(seed=1, num_hidden_layers=1)
    prompt = torch.randint(1, V, (1, 5), generator=torch.Generator().manual_seed(0))
    timing = time_speculative(target, draft, prompt, 12, k=3, rounds=1)
    assert timing.same_tokens
    spec = timing.result
    assert sum(n + 1 for _, n in spec.trace) == 12  # each round emits kept + 1
    assert sum(p for p, _ in spec.trace) == spec.proposed
    assert sum(n for _, n in spec.trace) == spec.accepted
    assert len(spec.trace) == spec.target_forwards
    assert timing.tokens_per_forward == 12 / spec.target_forwards
    for s in (timing.target_seconds, timing.draft_seconds, timing.speculative_seconds):
        assert s > 0
    assert timing.speedup == timing.target_seconds / timing.speculative_seconds


def test_the_workload_keeps_its_ranges_and_seed():
    requests = mixed_workload(40, V, (2, 6), (3, 5), 9, 0.5, seed=3)
    assert len(requests) == 40
    assert all(2 <= r.prompt.numel() <= 6 for r in requests)
    assert all(r.max_new_tokens in (3, 4, 5, 9) for r in requests)
    assert {r.max_new_tokens == 9 for r in requests} == {True, False}
    assert all(int(r.prompt.min()) >= 1 and int(r.prompt.max()) < V for r in requests)
    again = mixed_workload(40, V, (2, 6), (3, 5), 9, 0.5, seed=3)
    assert all(torch.equal(a.prompt, b.prompt) for a, b in zip(requests, again, strict=True))


def test_throughput_is_reported_for_every_batch_size():
    _, lm = llama_pair()
    requests = mixed_workload(5, V, (2, 6), (2, 4), 7, 0.3)
    served = throughput_by_concurrency(lm, requests, (1, 3), block_size=4)
    assert set(served) == {"continuous", "static"}
    for rates in served.values():
        assert set(rates) == {1, 3} and all(r > 0 for r in rates.values())


@pytest.mark.parametrize(("bits", "group"), [(None, 32), (8, 32), (4, 16), (4, 8)])
def test_the_closed_form_matches_what_quantization_holds(bits, group):
    _, lm = llama_pair()
    expected = quantized_weight_bytes(lm, bits, group)
    if bits is not None:
        quantize_linears(lm, bits, group)
    assert weight_bytes(lm) == expected


def test_the_quantization_table_leaves_the_model_alone():
    _, lm = llama_pair()
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    windows = [(torch.randint(0, V, (2, 8), generator=g), torch.randint(0, V, (2, 8), generator=g))]
    rows = quantization_table(lm, windows, group_size=16)
    assert [r.name for r in rows] == ["fp32", "int8", "int4"]
    assert all(r.bytes == r.closed_form for r in rows)
    assert rows[0].logit_error == 0 and rows[1].logit_error > 0
    assert rows[0].bytes > rows[1].bytes > rows[2].bytes
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())


def test_bad_arguments_are_named():
    _, lm = llama_pair()
    with pytest.raises(ValueError, match="rounds"):
        time_speculative(lm, lm, torch.ones(1, 3, dtype=torch.long), 2, rounds=0)
    with pytest.raises(ValueError, match="bits"):
        quantized_weight_bytes(lm, 3)
