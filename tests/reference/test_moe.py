"""The mixture-of-experts feed-forward (issue 51): the routed sum against a token-by-token loop,
the router's two weightings, the load-balancing loss's properties, the expert load, the closed
form parameter counts (total and active) against the built model, generation with and without
the cache, DeepSeek-V3's choice bias moved against the load (toward even; float32 under
bfloat16), and the configurations that are refused."""

from __future__ import annotations

import pytest
import torch
from model_shapes import LLAMA_STYLE
from torch.testing import assert_close
from torch.utils.flop_counter import FlopCounterMode

from coursepkg import (
    DecoderOnlyLM,
    MoEConfig,
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
    count_parameters,
)
from coursepkg.encoder_only import EncoderOnlyLM
from coursepkg.moe import (
    MoEFeedForward,
    expert_load,
    load_balancing_loss,
    route_sigmoid,
    route_top_k,
    update_choice_bias,
)
from coursepkg.params import active_parameters, forward_multiply_adds, parameter_breakdown

MODERN = dict(
    vocab_size=23,
    d_model=16,
    n_heads=2,
    d_ff=24,
    n_layers=3,
    dropout=0.0,
    max_len=32,
    **LLAMA_STYLE,
)
MOE = dict(n_experts=4, top_k=2, d_ff=12)


def _lm(moe: dict | None = None, **fields) -> DecoderOnlyLM:
    # MODERN with ``fields``, and the experts MOE with ``moe``'s changes
    group = MoEConfig(**{**MOE, **(moe or {})})
    return DecoderOnlyLM(TransformerConfig(**{**MODERN, **fields}, moe=group)).eval()


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("k, shared", [(1, 0), (2, 0), (3, 1), (4, 2)])
def test_the_routed_sum_equals_a_loop_over_tokens(k, shared, renormalize) -> None:
    moe = MoEFeedForward(8, 6, 4, k, renormalize, n_shared=shared).eval()
    x = torch.randn(2, 5, 8)
    out = moe(x)
    probs = torch.softmax(moe.router(x), dim=-1)  # (B, L, E)
    expected = torch.zeros_like(x)
    for b in range(2):
        for t in range(5):
            top = probs[b, t].topk(k)
            w = top.values / top.values.sum() if renormalize else top.values
            for weight, e in zip(w, top.indices.tolist(), strict=True):
                expected[b, t] += weight * moe.experts[e](x[b, t])
            if shared:
                expected[b, t] += moe.shared(x[b, t])
    assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_one_expert_chosen_from_one_is_its_feed_forward() -> None:
    moe = MoEFeedForward(8, 6, 1, 1)
    x = torch.randn(3, 4, 8)
    assert_close(moe(x), moe.experts[0](x))


def test_the_router_weights_sum_to_one_only_when_renormalised() -> None:
    logits = torch.randn(50, 6)
    kept = route_top_k(logits, 2, renormalize=True)
    assert_close(kept.weights.sum(-1), torch.ones(50))
    raw = route_top_k(logits, 2, renormalize=False)
    assert_close(raw.weights, raw.probs.gather(1, raw.experts))
    assert (raw.weights.sum(-1) < 1).all()
    assert torch.equal(kept.experts, raw.experts)


def test_a_uniform_router_gives_a_loss_of_k_and_the_load_sums_to_k_tokens() -> None:
    moe = MoEFeedForward(8, 6, 5, 2)
    with torch.no_grad():
        moe.router.weight.zero_()  # every probability 1/E, whatever the choice
    moe(torch.randn(3, 7, 8))
    assert_close(load_balancing_loss([moe.routing], 5), torch.tensor(2.0))
    assert expert_load(moe.routing, 5).sum() == 2 * 21


def test_an_unbalanced_router_pays_more_and_the_gradient_reaches_it() -> None:
    moe = MoEFeedForward(8, 6, 4, 1)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0].fill_(5.0)  # expert 0 wins for inputs with a positive sum
    moe(torch.rand(2, 6, 8))
    loss = load_balancing_loss([moe.routing], 4)
    assert loss > 1.5 and expert_load(moe.routing, 4)[0] == 12
    loss.backward()
    assert moe.router.weight.grad.abs().sum() > 0


def test_padding_takes_no_part_in_the_loss_or_the_load() -> None:
    moe = MoEFeedForward(8, 6, 4, 2)
    x = torch.randn(2, 6, 8)
    mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    moe(x)
    padded, load = load_balancing_loss([moe.routing], 4, mask), expert_load(moe.routing, 4, mask)
    moe(x[mask][None])  # the nine real tokens alone
    assert_close(padded, load_balancing_loss([moe.routing], 4))
    assert torch.equal(load, expert_load(moe.routing, 4))


def test_the_models_loss_pools_every_moe_layer() -> None:
    lm = _lm(dict(every=1))
    lm(torch.randint(0, 23, (2, 5)))
    routings = lm.routings()
    assert len(routings) == 3
    pooled = load_balancing_loss(routings, 4)
    assert_close(lm.load_balancing_loss(), pooled)
    assert pooled.requires_grad


@pytest.mark.parametrize("padded", [False, True])
def test_the_forward_returns_the_aux_loss_a_trainer_adds(padded) -> None:
    """``return_aux=True`` gives the logits of the plain call and the load-balancing loss the
    trainers used to read from the layers afterwards, bit for bit (padding left out when a
    ``token_mask`` is given); a dense model's is None."""
    lm = _lm(dict(every=1)).train()
    tokens = torch.randint(0, 23, (3, 7))
    mask = torch.arange(7) < torch.tensor([7, 5, 2])[:, None] if padded else None  # (B, L)
    torch.manual_seed(1)
    plain = lm(tokens, mask)
    before = lm.load_balancing_loss(mask)
    torch.manual_seed(1)
    out = lm(tokens, mask, return_aux=True)
    assert torch.equal(out.logits, plain) and torch.equal(out.aux_loss, before)
    assert out.aux_loss.requires_grad
    dense = DecoderOnlyLM(TransformerConfig(**MODERN))(tokens, mask, return_aux=True)
    assert dense.aux_loss is None and dense.logits.shape == (3, 7, 23)


@pytest.mark.parametrize(
    "moe, fields",
    [
        ({}, {}),
        (dict(every=2), {}),
        (dict(shared_experts=2), {}),
        (dict(top_k=1, d_ff=None), dict(tie_embeddings=False)),
        ({}, dict(bias=True, activation="relu", norm="layernorm", n_kv_heads=1)),
        (dict(n_experts=8, top_k=8, every=3), dict(qk_norm=True)),
        (
            dict(
                n_experts=8,
                top_k=3,
                first_dense=1,
                router="sigmoid",
                groups=4,
                top_groups=2,
                shared_experts=1,
                scale=2.5,
            ),
            {},
        ),
    ],
)
def test_closed_form_counts_equal_the_built_model(moe, fields) -> None:
    lm = _lm(moe, **fields)
    config = lm.config
    total = sum(p.numel() for p in lm.parameters())
    assert count_parameters(config, "decoder-only") == total
    assert sum(parameter_breakdown(config, "decoder-only").values()) == total
    unused = 0  # the experts a token is not routed to, in every MoE layer
    for layer in lm.layers:
        if isinstance(layer.ffn, MoEFeedForward):
            per_expert = sum(p.numel() for p in layer.ffn.experts[0].parameters())
            unused += (config.moe.n_experts - config.moe.top_k) * per_expert
    assert active_parameters(config) == total - unused


def test_a_dense_model_is_all_active() -> None:
    config = TransformerConfig(**MODERN)
    assert active_parameters(config) == count_parameters(config, "decoder-only")


def test_every_nth_layer_is_moe() -> None:
    lm = _lm(dict(every=2), n_layers=4)
    kinds = [isinstance(layer.ffn, MoEFeedForward) for layer in lm.layers]
    assert kinds == [False, True, False, True]
    assert lm.layers[0].ffn.linear1.out_features == 24  # d_ff for the dense ones
    assert lm.layers[1].ffn.experts[0].linear1.out_features == 12  # moe.d_ff for experts


def test_the_first_layers_stay_dense() -> None:
    lm = _lm(dict(first_dense=2), n_layers=4)
    assert [isinstance(layer.ffn, MoEFeedForward) for layer in lm.layers] == [
        False,
        False,
        True,
        True,
    ]


def test_without_bias_or_groups_the_sigmoid_router_picks_the_softmaxs_experts() -> None:
    # sigmoid and softmax are both increasing in the logit: the same k best, other weights
    logits = torch.randn(40, 6)
    sigmoid = route_sigmoid(logits, 2, torch.zeros(6), renormalize=False)
    softmax = route_top_k(logits, 2)
    assert torch.equal(sigmoid.experts, softmax.experts)
    assert_close(sigmoid.weights, torch.sigmoid(logits).gather(1, sigmoid.experts))
    assert_close(sigmoid.probs.sum(-1), torch.ones(40))  # a distribution, for the aux loss
    renormalised = route_sigmoid(logits, 2, torch.zeros(6))
    assert_close(renormalised.weights.sum(-1), torch.ones(40))


def test_the_sigmoid_routed_sum_equals_a_loop_over_tokens() -> None:
    moe = MoEFeedForward(
        8, 6, 8, 3, n_shared=1, router="sigmoid", groups=4, top_groups=2, scale=2.5
    ).eval()
    moe.choice_bias.normal_()
    x = torch.randn(2, 5, 8)
    out = moe(x)
    scores = torch.sigmoid(moe.router(x)).detach()  # (B, L, E)
    expected = torch.zeros_like(x)
    for b in range(2):
        for t in range(5):
            biased = scores[b, t] + moe.choice_bias  # (E,)
            pairs = biased.view(4, 2)  # (G, E/G): both experts count in a group's score
            groups = pairs.sum(-1).topk(2).indices.tolist()
            allowed = [e for g in groups for e in (2 * g, 2 * g + 1)]
            chosen = sorted(allowed, key=lambda e: -float(biased[e]))[:3]
            w = scores[b, t, chosen] / scores[b, t, chosen].sum() * 2.5
            for weight, e in zip(w, chosen, strict=True):
                expected[b, t] += weight * moe.experts[e](x[b, t])
            expected[b, t] += moe.shared(x[b, t])
    assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_a_k_above_the_experts_is_refused_by_the_router_functions() -> None:
    logits = torch.randn(5, 4)
    for route in (route_top_k, lambda lg, k: route_sigmoid(lg, k, torch.zeros(4))):
        with pytest.raises(ValueError, match=r"k must be an integer in \[1, E=4\].*got 5"):
            route(logits, 5)
    routing = route_top_k(logits, 2)
    with pytest.raises(
        ValueError,
        match=r"n_experts must be the routers' number of experts, "
        r"\[4\], got 3",
    ):
        load_balancing_loss([routing], 3)


def test_a_k_above_the_experts_is_refused_by_the_module_too() -> None:
    with pytest.raises(ValueError, match=r"top_k must be in \[1, n_experts=4\], got 5"):
        MoEFeedForward(8, 6, 4, 5)
    with pytest.raises(ValueError, match="router must be 'softmax' or 'sigmoid', got 'relu'"):
        MoEFeedForward(8, 6, 4, 2, router="relu")


def test_greedy_generation_is_the_same_with_and_without_the_cache() -> None:
    lm = _lm(dict(shared_experts=1))
    prompt = torch.randint(0, 23, (2, 4))
    assert torch.equal(lm.generate(prompt, 8), lm.generate(prompt, 8, use_cache=False))


def test_training_the_aux_loss_moves_the_router() -> None:
    lm = _lm().train()
    tokens = torch.randint(0, 23, (2, 8))
    logits = lm(tokens)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    (loss + 0.01 * lm.load_balancing_loss()).backward()
    assert all(layer.ffn.router.weight.grad.abs().sum() > 0 for layer in lm.layers)


@pytest.mark.parametrize(
    "moe, message",
    [
        (dict(n_experts=4, top_k=5), "moe.top_k must be at most moe.n_experts"),
        (dict(n_experts=-1), "moe.n_experts must be a positive integer"),
        (dict(n_experts=4, top_k=0), "moe.top_k must be a positive integer"),
        (dict(n_experts=4, every=4), "moe.every must be at most n_layers=3"),
        (dict(n_experts=4, renormalize=1), "moe.renormalize must be True or False"),
        (
            dict(n_experts=4, first_dense=3),
            "moe.first_dense=3 leaves no MoE layer among n_layers=3",
        ),
        (dict(n_experts=4, first_dense=-1), "moe.first_dense must be an integer >= 0"),
        (dict(n_experts=4, router="relu"), "moe.router must be one of"),
        (dict(n_experts=4, scale=0), "moe.scale must be a number > 0, got 0"),
        (
            dict(n_experts=4, groups=2),
            "moe.groups=2 and moe.top_groups=1 are DeepSeek-V3's "
            "group-limited routing, which needs moe.router='sigmoid'",
        ),
        (
            dict(n_experts=6, router="sigmoid", groups=4),
            "moe.groups must split n_experts=6 into equal groups",
        ),
        (
            dict(n_experts=8, router="sigmoid", groups=4, top_groups=5),
            "moe.top_groups must be at most moe.groups=4, got 5",
        ),
        (
            dict(n_experts=8, top_k=5, router="sigmoid", groups=4, top_groups=2),
            "moe.top_k=5 experts cannot be chosen from top_groups=2 groups of 2",
        ),
        (
            dict(n_experts=4, bias_update_rate=0.01),
            "moe.bias_update_rate=0.01 moves the "
            "sigmoid router's choice bias, which needs moe.router='sigmoid', got 'softmax'",
        ),
        (
            dict(n_experts=4, router="sigmoid", bias_update_rate=-1),
            "moe.bias_update_rate must be a number >= 0, got -1",
        ),
    ],
)
def test_impossible_configurations_are_refused(moe, message) -> None:
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**MODERN, moe=moe)  # a mapping, as YAML gives it: checked the same


@pytest.mark.parametrize("cls", [Transformer, EncoderOnlyLM])
def test_models_without_experts_refuse_them(cls) -> None:
    config = TransformerConfig(
        vocab_size=11, d_model=16, n_heads=2, d_ff=8, moe=MoEConfig(n_experts=2)
    )
    with pytest.raises(ValueError, match=r"does not support moe=MoEConfig\(n_experts=2"):
        cls(config)


def test_the_aux_loss_of_a_dense_model_is_refused() -> None:
    lm = DecoderOnlyLM(TransformerConfig(**MODERN))
    with pytest.raises(ValueError, match="config.moe is None"):
        lm.load_balancing_loss()


@pytest.mark.parametrize("moe", [{}, dict(every=2, shared_experts=1), dict(n_experts=8, top_k=1)])
def test_multiply_adds_count_the_router_and_the_chosen_experts_only(moe) -> None:
    lm = _lm(moe)
    for module in lm.modules():
        if isinstance(module, MultiHeadAttention):
            module.record_weights = True  # the explicit products, which the counter sees
    tokens = torch.randint(0, 23, (2, 9))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        lm(tokens)
    parts = forward_multiply_adds(lm.config, "decoder-only", src_len=9)
    assert counter.get_total_flops() == 2 * 2 * sum(parts.values())
    dense = forward_multiply_adds(lm.config.replace(moe=None), "decoder-only", src_len=9)
    assert parts["layers"] != dense["layers"]


def test_the_choice_bias_moves_against_the_load_by_its_sign() -> None:
    bias = torch.tensor([0.0, 0.5, -0.5, 0.0])
    update_choice_bias(bias, torch.tensor([6.0, 2.0, 4.0, 4.0]), 0.25)  # mean 4
    assert torch.equal(bias, torch.tensor([-0.25, 0.75, -0.5, 0.0]))
    with pytest.raises(ValueError, match=r"load must have the choice bias's shape \(4,\)"):
        update_choice_bias(bias, torch.ones(3), 0.25)


def test_moving_the_bias_evens_out_a_router_that_favours_one_expert() -> None:
    # no gradient at all: only the bias moves, and the load follows it toward even
    torch.manual_seed(0)
    moe = MoEFeedForward(8, 12, 4, top_k=1, router="sigmoid").eval()
    with torch.no_grad():
        moe.router.weight[0] += 1.0  # expert 0 scores higher for most tokens
    tokens = torch.randn(1, 400, 8).abs()  # (B, L, D): positive, so expert 0 wins

    def busiest() -> float:  # the busiest expert's load over an even share
        moe(tokens)
        load = expert_load(moe.routing, 4)  # (E,)
        return (load.max() / load.mean()).item()

    before = busiest()
    history = []
    for _ in range(80):
        moe(tokens)
        load = expert_load(moe.routing, 4)  # (E,)
        history.append((load.max() / load.mean()).item())
        update_choice_bias(moe.choice_bias, load, 0.01)
    # every token went to expert 0 (4x an even share); the last steps stay near even (the
    # sign steps make the load oscillate around it rather than settle exactly)
    assert before == 4.0 and max(history[-10:]) < 1.5 and busiest() < 1.5
    assert moe.choice_bias[0] < 0 < moe.choice_bias[1:].max()


def test_the_choice_bias_stays_float32_when_the_model_goes_to_bfloat16() -> None:
    lm = _lm(dict(router="sigmoid", bias_update_rate=0.001)).to(torch.bfloat16)
    moe = lm.layers[0].ffn
    assert moe.choice_bias.dtype == torch.float32 and moe.router.weight.dtype == torch.bfloat16
    logits = lm(torch.randint(0, 23, (2, 5)))  # (B, L, V)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    update_choice_bias(moe.choice_bias, expert_load(moe.routing, 4), 0.001)
    assert moe.choice_bias.abs().max().item() == pytest.approx(0.001)  # not rounded away
