"""Tests of the constraint verdicts (``chapters/constraints.py``): the fixed-parameter pairing
matches the counts, the fixed-data pairing keeps what it promises, Muon gets exactly the blocks'
matrices, and the decision rule names a winner only past two combined standard errors. The grid
itself is trained by ``benchmarks/constraint_verdicts.py``; here a tiny one checks its shape."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg.chapters.constraints import (
    CONSTRAINTS,
    PAIRS,
    PARAM_TOLERANCE,
    _config,
    arm_config,
    compare,
    constraint_verdicts,
    count_params,
    muon_parameters,
    winner_changes,
)
from coursepkg.decoder_only import DecoderOnlyLM


def _settings(d_model: int, experts: int = 4, top_k: int = 2) -> dict:
    return dict(d_model=d_model, n_layers=2, block_size=16, experts=experts, top_k=top_k)


@settings(max_examples=10, deadline=None)
@given(d=st.sampled_from([16, 32, 48, 64]), experts=st.sampled_from([2, 4]))
def test_at_fixed_params_each_challenger_matches_the_baseline_count(d: int, experts: int):
    s = _settings(d, experts, top_k=min(2, experts))
    base = count_params(arm_config("ffn", 0, "params", s), s)
    for pair in PAIRS:
        chal = count_params(arm_config(pair, 1, "params", s), s)
        assert abs(chal - base) / base <= PARAM_TOLERANCE, (pair, chal, base)


@pytest.mark.parametrize("d", [16, 32])
def test_at_fixed_data_the_challengers_keep_their_natural_shape(d: int):
    s = _settings(d)
    base = arm_config("ffn", 0, "data", s)
    swiglu = arm_config("ffn", 1, "data", s)
    assert (swiglu["activation"], swiglu["d_ff"]) == ("swiglu", base["d_ff"])
    e, k, width = arm_config("experts", 1, "data", s)["moe"]
    assert k * width == base["d_ff"]  # each token's active feed-forward is the dense one
    muon = arm_config("optimizer", 1, "data", s)
    assert muon == dict(base, optimizer="muon") == arm_config("optimizer", 1, "params", s)
    # the counts differ where they should: SwiGLU and the mixture hold more at fixed data
    assert count_params(swiglu, s) > count_params(base, s)
    assert count_params(arm_config("experts", 1, "data", s), s) > count_params(base, s)


def test_muon_gets_the_blocks_matrices_and_adamw_the_rest():
    s = _settings(16)
    model = DecoderOnlyLM(_config(arm_config("experts", 1, "data", s), s))
    hidden, rest = muon_parameters(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert len(hidden) + len(rest) == len(names)
    assert all(p.ndim == 2 and names[id(p)].startswith("layers.") for p in hidden)
    assert {names[id(p)] for p in rest} >= {"embed.weight", "positions.weight"}
    assert all(p.ndim != 2 or not names[id(p)].startswith("layers.") for p in rest)


def test_the_rule_names_a_winner_only_past_two_standard_errors():
    a = [3.50, 3.51, 3.52]  # mean 3.51, sample sd 0.01: se of each mean 0.01 / sqrt(3)
    se = math.sqrt(2 * 0.01**2 / 3)  # about 0.00816
    lower = compare(a, [x - 0.03 for x in a])  # 0.03 = 3.7 se: b wins
    assert lower["winner"] == 1 and lower["se"] == pytest.approx(se)
    assert compare(a, [x + 0.03 for x in a])["winner"] == 0
    near = compare(a, [x - 0.015 for x in a])  # 1.8 se: no separation, though b's mean is lower
    assert near["winner"] is None and near["diff"] < 0
    assert compare(a, a)["winner"] is None
    assert compare([1.0, 1.0], [2.0, 2.0])["winner"] == 0  # no spread at all: any gap separates
    with pytest.raises(ValueError, match="two or more seeds"):
        compare([1.0], [1.0, 2.0])


def test_the_winner_changes_only_when_each_side_wins_somewhere():
    assert winner_changes([0, None, 1])
    assert not winner_changes([0, None, None])
    assert not winner_changes([1, 1, 1])
    assert not winner_changes([None, None, None])


def test_a_tiny_grid_has_every_cell_and_buys_the_challenger_steps_with_the_baseline_time():
    threads = torch.get_num_threads()
    out = constraint_verdicts(d_model=16, steps=4, seeds=(0, 1), heldout_bytes=256, batch_size=2)
    assert torch.get_num_threads() == threads  # one thread while it ran, restored after
    assert set(out["pairs"]) == set(PAIRS)
    for pair, rows in out["pairs"].items():
        assert set(rows) >= set(CONSTRAINTS)
        for constraint in CONSTRAINTS:
            row = rows[constraint]
            assert len(row["baseline"]) == len(row["challenger"]) == 2
            assert all(math.isfinite(r["bpb"]) and r["bpb"] > 0 for r in row["challenger"])
        assert rows["params"]["same_as_data"] == (pair == "optimizer")
        assert all(r["steps"] == 4 for r in rows["data"]["challenger"])
        # fixed time: the challenger's steps are what the baseline's mean CPU time buys at the
        # challenger's own CPU seconds per step
        budget = sum(r["seconds"] for r in rows["data"]["baseline"]) / 2
        per_step = sum(r["seconds"] for r in rows["data"]["challenger"]) / 2 / 4
        assert {r["steps"] for r in rows["time"]["challenger"]} == {
            max(1, round(budget / per_step))
        }
    with pytest.raises(ValueError, match="two or more seeds"):
        constraint_verdicts(seeds=(0,))
