"""The capstone chapter's baseline curve (coursepkg/chapters/capstone.py)."""

from __future__ import annotations

import math

import pytest
import torch

from coursepkg.chapters.capstone import BASELINE_MODEL, baseline_curve, heldout_bpb
from coursepkg.config import TransformerConfig
from coursepkg.decoder_only import DecoderOnlyLM


def test_a_model_that_predicts_nothing_scores_eight_bits_per_byte():
    net = DecoderOnlyLM(TransformerConfig(**BASELINE_MODEL))
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.zero_()  # every score 0: a uniform guess over 256 bytes
    held_out = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(0))
    assert heldout_bpb(net, held_out, 64) == pytest.approx(8.0, abs=1e-5)
    with pytest.raises(ValueError, match="fewer than one window of 64"):
        heldout_bpb(net, held_out[:63], 64)


def test_the_curve_scores_each_checkpoint_learns_and_is_reused_from_its_cache(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("COURSEPKG_CACHE_DIR", str(tmp_path))
    curve = baseline_curve(steps=5, every=2, heldout_bytes=1024, cache="save")
    assert curve.steps == [0, 2, 4, 5]
    assert curve.seconds[0] == 0.0 and curve.seconds == sorted(curve.seconds)
    assert all(math.isfinite(b) for b in curve.bpb) and curve.bpb[-1] < curve.bpb[0]
    assert curve.n_parameters == 116_480  # the notebook's baseline
    again = baseline_curve(steps=5, every=2, heldout_bytes=1024, cache="reuse")
    assert again == curve  # the same run, loaded (its seconds too, which a rerun would change)


def test_the_curve_s_adamw_gives_the_per_parameter_loop_s_numbers(per_parameter_adam):
    curve = baseline_curve(steps=5, every=2, heldout_bytes=1024)
    per_parameter_adam()
    looped = baseline_curve(steps=5, every=2, heldout_bytes=1024)
    assert curve.bpb == looped.bpb and curve.bpb[-1] < curve.bpb[0]


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="steps and every must be >= 1"):
        baseline_curve(steps=0)
    with pytest.raises(ValueError, match="cache must be"):
        baseline_curve(cache="always")
