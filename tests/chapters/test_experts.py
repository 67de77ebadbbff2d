"""coursepkg.chapters.experts: the chapter's mixture and its dense peer trained alike (the cache
returns the same run; the recorded loss leaves the auxiliary term out), the expert loads and the
routes."""

from __future__ import annotations

import pytest
import torch

from coursepkg import TransformerConfig, count_parameters
from coursepkg.chapters.experts import (
    ATTENTION,
    DENSE,
    MOE,
    expert_loads,
    token_routes,
    train_experts_run,
)
from coursepkg.params import active_parameters, kv_cache_bytes_per_token

TINY_RUN = dict(steps=3, block_size=16, batch_size=2)


def test_the_dense_peer_spends_the_mixtures_active_feed_forward_width():
    assert DENSE["d_ff"] == MOE["moe"].top_k * MOE["moe"].d_ff
    moe, dense = TransformerConfig(vocab_size=67, **MOE), TransformerConfig(vocab_size=67, **DENSE)
    routers = MOE["n_layers"] * MOE["d_model"] * MOE["moe"].n_experts
    assert active_parameters(moe) - count_parameters(dense, "decoder-only") == routers
    assert count_parameters(moe, "decoder-only") > count_parameters(dense, "decoder-only")


def test_the_recorded_loss_leaves_the_balancing_term_out():
    plain = train_experts_run(aux_loss_coef=0.0, **TINY_RUN)
    balanced = train_experts_run(aux_loss_coef=5.0, **TINY_RUN)
    # same initialisation and first batch: the first language-modelling loss is the same
    assert plain.history.loss[0] == pytest.approx(balanced.history.loss[0], abs=1e-6)
    # the auxiliary term changed the training that followed
    assert plain.history.loss[-1] != balanced.history.loss[-1]
    assert len(plain.history.loss) == 3 and not plain.model.training


def test_a_saved_run_is_reused_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSEPKG_CACHE_DIR", str(tmp_path))
    first = train_experts_run(dense=True, cache="save", **TINY_RUN)
    again = train_experts_run(dense=True, cache="reuse", **TINY_RUN)
    assert len(list(tmp_path.glob("experts-*.pt"))) == 1
    assert again.history.loss == first.history.loss
    for a, b in zip(first.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_loads_are_shares_of_the_assignments_and_routes_are_the_routers_choice():
    run = train_experts_run(**TINY_RUN)
    loads = expert_loads(run)
    assert loads.shape == (MOE["n_layers"], MOE["moe"].n_experts)
    torch.testing.assert_close(loads.sum(dim=-1), torch.ones(MOE["n_layers"]))
    chars, experts = token_routes(run, "To be, or not", layer=1)
    assert chars == list("To be, or not") and experts.shape == (13, MOE["moe"].top_k)
    with torch.no_grad():
        run.model(torch.tensor([run.vocab.encode("To be, or not")]))
    assert torch.equal(experts, run.model.routings()[1].experts)
    # two different experts per character
    assert (experts[:, 0] != experts[:, 1]).all()


def test_latent_and_multi_query_attention_cache_a_quarter_of_multi_head_attentions():
    cache = {
        kind: kv_cache_bytes_per_token(TransformerConfig(vocab_size=67, **DENSE, **change))
        for kind, change in ATTENTION.items()
    }
    assert cache["MLA"] == cache["MQA"] == cache["MHA"] // 4


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_each_attention_trains_with_its_own_cache(kind):
    run = train_experts_run(dense=True, attention=kind, **TINY_RUN)
    config = run.model.config
    assert (config.latent is not None) == (kind == "MLA")
    assert config.kv_heads == (1 if kind == "MQA" else DENSE["n_heads"])
    cache = run.model.new_cache()
    with torch.no_grad():
        run.model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    held = 0
    for layer in cache.self_attn:
        parts = (layer.latent, layer.k_rope) if kind == "MLA" else (layer.k, layer.v)
        held += sum(t.numel() * t.element_size() for t in parts)
    assert held == 5 * kv_cache_bytes_per_token(config)
    assert len(run.history.loss) == 3 and all(torch.isfinite(torch.tensor(run.history.loss)))


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="attention must be one of .*, got 'GQA'"):
        train_experts_run(attention="GQA", **TINY_RUN)
    with pytest.raises(ValueError, match="aux_loss_coef must be a number >= 0, got -1"):
        train_experts_run(aux_loss_coef=-1, **TINY_RUN)
    with pytest.raises(ValueError, match="cache must be None, 'save' or 'reuse'"):
        train_experts_run(cache="keep", **TINY_RUN)
    dense = train_experts_run(dense=True, **TINY_RUN)
    with pytest.raises(ValueError, match="expert_loads needs a mixture of experts"):
        expert_loads(dense)
    run = train_experts_run(steps=1, block_size=16, batch_size=2)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 2\), got 2"):
        token_routes(run, "abc", layer=2)
