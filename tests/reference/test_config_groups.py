"""The config's groups (issue 61): each group checks itself, layers build their variant from
it (nothing is swapped in after the model is built), and what the flat config of before wrote
still loads: the checkpoints and run file in ``tests/fixtures/old_config`` were written by the
flat ``TransformerConfig`` and hold the logits its models gave."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from coursepkg import DecoderOnlyLM, LatentConfig, MoEConfig, RopeConfig, TransformerConfig
from coursepkg.config import upgrade_options
from coursepkg.decoder_only import DecoderOnlyLayer
from coursepkg.mla import MultiHeadLatentAttention
from coursepkg.moe import MoEFeedForward
from coursepkg.training.checkpoint import CheckpointError, check_compatible, load_checkpoint
from coursepkg.training.settings import load_settings, model_config

OLD = Path(__file__).parents[1] / "fixtures" / "old_config"
SMALL = dict(vocab_size=16, d_model=8, n_heads=2, d_ff=16, n_layers=2, positional="rope")


@pytest.mark.parametrize("name", ["dense", "moe", "latent"])
def test_a_checkpoint_of_the_flat_config_loads_and_computes_what_it_did(name) -> None:
    saved = load_checkpoint(OLD / f"{name}.pt")
    flat = saved["identity"]["config"]
    assert "n_experts" in flat and "moe" not in flat  # written before the groups
    config = TransformerConfig.from_dict(flat)
    assert (config.moe is None) == (flat["n_experts"] == 0)
    assert (config.latent is None) == (flat["kv_rank"] is None)
    assert config.rope == RopeConfig(flat["rope_theta"], flat["rope_pairs"])
    model = DecoderOnlyLM(config).eval()
    model.load_state_dict(saved["model"])  # strict: every weight where it was
    with torch.no_grad():  # (B, L, V): to float32 rounding, as another CPU wrote them
        torch.testing.assert_close(model(saved["tokens"]), saved["logits"], rtol=1e-5, atol=1e-6)
    # today's form round-trips, and a run resumes from the old identity
    assert TransformerConfig.from_dict(dataclasses.asdict(config)) == config
    check_compatible(saved["identity"], {"config": dataclasses.asdict(config)}, "old.pt")
    changed = dataclasses.asdict(config.replace(d_ff=32))
    with pytest.raises(CheckpointError, match="config.d_ff: checkpoint 16, now 32"):
        check_compatible(saved["identity"], {"config": changed}, "old.pt")


def test_the_groups_the_old_flat_fields_become() -> None:
    moe = TransformerConfig.from_dict(load_checkpoint(OLD / "latent.pt")["identity"]["config"])
    assert moe.moe == MoEConfig(n_experts=2, top_k=1, router="sigmoid", bias_update_rate=0.01)
    assert moe.latent == LatentConfig(kv_rank=4, d_rope=2, q_rank=6)


def test_a_run_file_with_flat_model_options_still_trains_the_same_model() -> None:
    config = model_config(load_settings(OLD / "run_moe.yaml"), vocab_size=50)
    assert config.moe == MoEConfig(n_experts=4, top_k=2, every=2)
    assert config.latent == LatentConfig(kv_rank=8, d_rope=4)
    kinds = [type(layer.ffn) for layer in DecoderOnlyLM(config).layers]
    assert kinds[1] is MoEFeedForward and kinds[0] is not MoEFeedForward


@pytest.mark.parametrize(
    "options",
    [
        {"n_experts": 4, "moe_top_k": 1, "kv_rank": 6, "d_rope": 2, "rope_theta": 5e5},
        {
            "moe.n_experts": 4,
            "moe.top_k": 1,
            "latent.kv_rank": 6,
            "latent.d_rope": 2,
            "rope.theta": 5e5,
        },  # --model
        {
            "moe": {"n_experts": 4, "top_k": 1},
            "latent": {"kv_rank": 6, "d_rope": 2},
            "rope": {"theta": 5e5},
        },  # YAML
        {"moe": MoEConfig(4, top_k=1), "latent": LatentConfig(6, 2), "rope": RopeConfig(5e5)},
    ],
    ids=["flat", "dotted", "nested", "groups"],
)
def test_every_form_of_the_options_gives_one_config(options) -> None:
    config = TransformerConfig.from_dict({**SMALL, **options})
    assert config.moe == MoEConfig(n_experts=4, top_k=1)
    assert config.latent == LatentConfig(kv_rank=6, d_rope=2)
    assert config.rope == RopeConfig(theta=5e5, pairs="halves")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"moe_top_k": 3}, r"moe.top_k=3 needs the moe group, which n_experts=0 leaves out"),
        ({"n_experts": 0, "moe_every": 2}, "moe.every=2 needs the moe group"),
        ({"q_rank": 4}, "latent.q_rank=4 needs the latent group, which kv_rank=None leaves out"),
        (
            {"moe": {"n_experts": 2, "top_k": 2}, "moe_top_k": 1},
            r"moe options \['top_k'\] are "
            "given twice",
        ),
        ({"moe": {"n_experts": 2, "k": 1}}, r"moe has no options \['k'\]"),
        ({"n_expert": 2}, r"options \['n_expert'\] are not TransformerConfig fields"),
        ({"rope_pairs": "adjacent"}, "rope.pairs must be one of"),
        ({"rope": {"theta": 1.0}, "rope_theta": 2.0}, r"rope options \['theta'\] are given twice"),
    ],
)
def test_options_that_cannot_be_read_are_named(options, message) -> None:
    with pytest.raises(ValueError, match=message):
        TransformerConfig.from_dict({**SMALL, **options})


def test_absent_groups_of_the_flat_form_are_none() -> None:
    flat = {"n_experts": 0, "moe_top_k": 2, "kv_rank": None, "q_rank": None, "d_rope": 0}
    assert upgrade_options({**SMALL, **flat}) == {**SMALL, "moe": None, "latent": None}


def test_layers_build_their_variant_from_their_block() -> None:
    config = TransformerConfig(
        **SMALL, latent=LatentConfig(kv_rank=4, d_rope=2), moe=MoEConfig(4, d_ff=8, first_dense=1)
    )
    blocks = [config.block(i) for i in range(2)]
    assert [b.moe for b in blocks] == [None, MoEConfig(4, d_ff=8, first_dense=1)]
    assert config.block().moe is None and all(b.latent == config.latent for b in blocks)
    layers = [DecoderOnlyLayer(b) for b in blocks]  # what DecoderOnlyLM builds, nothing swapped
    assert [type(layer.ffn) is MoEFeedForward for layer in layers] == [False, True]
    assert all(isinstance(layer.self_attn, MultiHeadLatentAttention) for layer in layers)
    assert layers[1].ffn.experts[0].linear1.out_features == 8  # the experts' own width
    # moe.d_ff None means the model's d_ff, resolved in the block
    assert config.replace(moe=MoEConfig(4)).block(1).moe.d_ff == 16
