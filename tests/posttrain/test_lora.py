"""Tests of coursepkg.posttrain.lora: the model unchanged at step 0, merge and unmerge exact,
the trainable count in closed form, gradients only in the adapters, and outputs equal to
Hugging Face ``peft``'s LoRA on the same weights."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from coursepkg.posttrain.lora import (
    LoRALinear,
    add_lora,
    lora_modules,
    lora_parameter_count,
    merge_lora,
    unmerge_lora,
)

ALL = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2", "linear3", "lm_head")
VARIANTS = {
    "gpt": dict(),
    "llama-like, grouped queries": dict(
        positional="rope", norm="rmsnorm", activation="swiglu", bias=False, n_heads=4, n_kv_heads=2
    ),
}


def _tokens(model, batch=2, length=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=g)


def _randomise_b(model, seed=2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in lora_modules(model):
            module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=g) * 0.1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_adapted_model_is_unchanged_at_step_zero(chat_model, variant):
    model = chat_model(**VARIANTS[variant])
    tokens = _tokens(model)
    before = model(tokens)
    add_lora(model, ("q_proj", "v_proj", "linear2"), r=4, alpha=8)
    assert torch.equal(model(tokens), before)  # B = 0: the change is exactly zero


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "targets", [("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "out_proj"), ALL]
)
@pytest.mark.parametrize("r", [1, 4])
def test_the_trainable_parameters_are_the_closed_form(chat_model, variant, targets, r):
    model = chat_model(**VARIANTS[variant])
    targets = [t for t in targets if t != "linear3" or VARIANTS[variant].get("activation")]
    add_lora(model, targets, r=r, alpha=2 * r)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == lora_parameter_count(model.config, targets, r)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(n.endswith(("lora_A", "lora_B")) for n in names)


def test_merge_is_the_same_function_and_unmerge_restores_the_weights_bit_for_bit(chat_model):
    model = chat_model().double()
    tokens = _tokens(model)
    add_lora(model, ALL[:6], r=3, alpha=5)
    _randomise_b(model)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    adapted = model(tokens)
    merge_lora(model)
    assert all(m.merged for m in lora_modules(model))
    torch.testing.assert_close(model(tokens), adapted, atol=1e-12, rtol=1e-12)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, weights[n])]
    assert changed and all(n.endswith("base.weight") for n in changed)
    unmerge_lora(model)
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())
    torch.testing.assert_close(model(tokens), adapted, atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="not merged"):
        lora_modules(model)[0].unmerge()


def test_the_scale_is_alpha_over_r():
    torch.manual_seed(0)
    base = nn.Linear(5, 3)
    layer = LoRALinear(base, r=2, alpha=6)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(4, 5)
    expected = base(x) + 3.0 * x @ layer.lora_A.T @ layer.lora_B.T
    torch.testing.assert_close(layer(x), expected)
    torch.testing.assert_close(layer.delta_weight(), 3.0 * layer.lora_B @ layer.lora_A)


def test_only_the_adapters_learn_and_b_moves_first(chat_model):
    model = chat_model()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    add_lora(model, ("q_proj", "v_proj"), r=2, alpha=4)
    tokens = _tokens(model)
    model(tokens).logsumexp(-1).mean().backward()
    for module in lora_modules(model):
        assert module.lora_B.grad.abs().sum() > 0  # A is random, so B's gradient is not zero
        assert module.lora_A.grad.abs().sum() == 0  # B = 0 blocks A's gradient at step 0
    for name, parameter in model.named_parameters():
        if not name.endswith(("lora_A", "lora_B")):
            assert parameter.grad is None
            assert torch.equal(parameter, frozen[name.replace("base.", "")])


@pytest.mark.parametrize("variant", VARIANTS)
def test_outputs_equal_peft_lora_on_the_same_weights(chat_model, variant):
    peft = pytest.importorskip("peft")
    model = chat_model(**VARIANTS[variant])
    theirs = copy.deepcopy(model)
    tokens = _tokens(model)
    base = model(tokens).detach()
    targets = ["q_proj", "v_proj", "out_proj", "linear1"]
    add_lora(model, targets, r=4, alpha=12)
    _randomise_b(model)
    config = peft.LoraConfig(r=4, lora_alpha=12, lora_dropout=0.0, target_modules=targets)
    theirs = peft.inject_adapter_in_model(config, theirs)
    ours = dict(model.named_modules())
    with torch.no_grad():
        for name, module in theirs.named_modules():
            if isinstance(module, peft.tuners.lora.LoraLayer):
                module.lora_A["default"].weight.copy_(ours[name].lora_A)
                module.lora_B["default"].weight.copy_(ours[name].lora_B)
    with torch.no_grad():
        ours_out = model(tokens)
        torch.testing.assert_close(theirs(tokens), ours_out, atol=1e-6, rtol=0)
    assert (ours_out - base).abs().max() > 1e-3  # the adapters do change the outputs
    # The same count of trainable numbers as peft (which leaves the rest frozen too).
    assert sum(p.numel() for p in theirs.parameters() if p.requires_grad) == sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )


def test_bad_arguments_are_named(chat_model):
    with pytest.raises(ValueError, match="r \\(the rank\\) must be an integer >= 1, got 0"):
        LoRALinear(nn.Linear(3, 3), r=0, alpha=1)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        LoRALinear(nn.Linear(3, 3), r=1, alpha=0)
    with pytest.raises(TypeError, match="must be an nn.Linear"):
        LoRALinear(nn.Conv1d(3, 3, 1), r=1, alpha=1)
    with pytest.raises(
        ValueError, match=r"name no nn.Linear of the model; its linears: \['k_proj'"
    ):
        add_lora(chat_model(), ["query"])
    with pytest.raises(ValueError, match="not linears of the model"):
        lora_parameter_count(chat_model().config, ["query"], 2)


def test_dropout_acts_on_the_low_rank_path_only():
    torch.manual_seed(0)
    base = nn.Linear(6, 4)
    layer = LoRALinear(base, r=2, alpha=2, dropout=0.5).train()
    x = torch.randn(64, 6)
    assert torch.equal(layer(x), base(x))  # B = 0: whatever dropout drops, nothing changes
    with torch.no_grad():
        layer.lora_B.normal_()
    torch.manual_seed(1)
    dropped = layer(x) - base(x)
    torch.manual_seed(1)
    mask = nn.functional.dropout(torch.ones_like(x), 0.5, training=True)  # the same draw
    torch.testing.assert_close(dropped, (x * mask) @ layer.lora_A.T @ layer.lora_B.T)
    layer.eval()
    torch.testing.assert_close(layer(x) - base(x), x @ layer.delta_weight().T)


def test_an_adapted_tied_head_stays_tied_to_the_embedding(chat_model):
    model = chat_model()
    add_lora(model, ["lm_head"], r=2, alpha=2)
    assert model.lm_head.base.weight is model.embed.weight
    assert not model.embed.weight.requires_grad


@pytest.mark.parametrize("variant", VARIANTS)
def test_adapters_are_used_on_many_rows_and_while_generating(chat_model, variant):
    # The models' attention fuses Q, K, V into one matmul on many rows and stacks them while
    # generating, reading the projections' weights: a LoRA layer must be called instead.
    model = chat_model(**VARIANTS[variant])
    tokens = _tokens(model, batch=4, length=12)  # 48 rows >= FUSE_MIN_ROWS
    add_lora(model, ("q_proj", "k_proj", "v_proj"), r=2, alpha=4)
    _randomise_b(model)
    adapted = model(tokens)
    adapted.sum().backward()
    assert all(m.lora_A.grad.abs().sum() > 0 for m in lora_modules(model))
    prompt = tokens[:1, :5]
    generated = model.generate(prompt, max_new_tokens=4)
    merge_lora(model)
    torch.testing.assert_close(model(tokens), adapted, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.generate(prompt, max_new_tokens=4), generated)
