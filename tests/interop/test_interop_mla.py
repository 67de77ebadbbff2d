"""DeepSeek-V3 loaded into the reference (issue 51): random DeepseekV3 models built from small
configs (nothing is downloaded), dense or with DeepSeek's experts after the first dense layers
(sigmoid router with a random choice bias, groups, scaling, shared experts), with and without a
query latent, in both RoPE layouts; logits (fp32, atol 1e-5) without and with padding, greedy
tokens against ``model.generate``, the way back (HF -> ours -> HF gives the same logits bit
for bit and every weight in place; a model built here goes to HF and back), the closed-form
counts (total and active) against DeepSeek-V3-shaped models on the meta device, and what is
refused."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from torch.testing import assert_close

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

from model_shapes import LLAMA_STYLE  # noqa: E402

from coursepkg import (  # noqa: E402
    DecoderOnlyLM,
    LatentConfig,
    MoEConfig,
    RopeConfig,
    TransformerConfig,
    count_parameters,
)
from coursepkg.interop import (  # noqa: E402
    deepseek_v3_config,
    from_hf_deepseek_v3,
    to_hf_deepseek_v3,
)
from coursepkg.moe import MoEFeedForward, route_sigmoid  # noqa: E402
from coursepkg.params import active_parameters, kv_cache_bytes_per_token  # noqa: E402
from coursepkg.positional import positions_from_mask  # noqa: E402

V = 97
SMALL = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=12,
    v_head_dim=10,
    first_k_dense_replace=2,
    max_position_embeddings=128,
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=0,
    attn_implementation="eager",
)
CASES = {
    "query_latent_interleaved": dict(q_lora_rank=24, rope_interleave=True),
    "query_projection_halves_tied": dict(
        q_lora_rank=None, rope_interleave=False, tie_word_embeddings=True
    ),
    # layer 0 dense, layer 1 experts: 8 in 4 groups, a token's 3 from its 2 best groups
    "experts_in_groups_scaled": dict(
        q_lora_rank=24,
        rope_interleave=True,
        first_k_dense_replace=1,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_group=4,
        topk_group=2,
        moe_intermediate_size=16,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
    ),
    # every layer has experts, one group, weights not renormalised, two shared experts
    "experts_ungrouped_raw": dict(
        q_lora_rank=None,
        rope_interleave=False,
        first_k_dense_replace=0,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        moe_intermediate_size=12,
        n_shared_experts=2,
        routed_scaling_factor=1.5,
        norm_topk_prob=False,
    ),
}
IDS = list(CASES)


def _build(fields: dict, seed: int = 0):
    torch.manual_seed(seed)
    hf = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(**{**SMALL, **fields})).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
            elif name.endswith("gate.weight") or ".experts." in name:
                p.normal_(0.0, 0.3)  # clear-cut choices, experts that count
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.3)  # a bias that changes the choice (zeros at init)
    return hf, from_hf_deepseek_v3(hf).eval()


def _tokens(b: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("side", [None, "right", "left"])
@pytest.mark.parametrize("name", IDS)
def test_equal_logits(name, side) -> None:
    hf, lm = _build(CASES[name])
    tokens = _tokens(3, 12)
    ar = torch.arange(12)
    lengths = torch.tensor([12, 9, 4])[:, None]
    mask = {None: ar < 12, "right": ar < lengths, "left": ar >= 12 - lengths}[side]
    mask = mask.expand(3, 12)  # (B, L)
    with torch.no_grad():
        ours = lm(tokens, None if side is None else mask)
        theirs = hf(tokens, attention_mask=mask.long(), position_ids=positions_from_mask(mask))
    assert_close(ours[mask], theirs.logits[mask], atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in lm.parameters()) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("name", IDS)
def test_same_greedy_tokens_as_generate(name) -> None:
    hf, lm = _build(CASES[name])
    prompt = _tokens(2, 6, seed=3)
    with torch.no_grad():
        theirs = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=24
        )
    assert torch.equal(lm.generate(prompt, 24), theirs)


DEEPSEEK_V3_DENSE = dict(
    vocab_size=129280,
    hidden_size=7168,
    intermediate_size=18432,
    num_hidden_layers=61,
    num_attention_heads=128,
    num_key_value_heads=128,
    kv_lora_rank=512,
    q_lora_rank=1536,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    first_k_dense_replace=61,
)


def test_a_deepseek_v3_shaped_model_counts_and_caches_in_closed_form() -> None:
    hf_config = tf.DeepseekV3Config(**DEEPSEEK_V3_DENSE)
    with torch.device("meta"):
        model = tf.DeepseekV3ForCausalLM(hf_config)
    config = deepseek_v3_config(hf_config)
    assert count_parameters(config, "decoder-only") == sum(p.numel() for p in model.parameters())
    # 61 layers of 512 + 64 numbers in bf16, against 128 heads of (192 + 128) without the latent
    assert kv_cache_bytes_per_token(config, 2) == 61 * (512 + 64) * 2
    full = config.replace(latent=None, d_k=192)
    assert kv_cache_bytes_per_token(full, 2) / kv_cache_bytes_per_token(config, 2) > 70


def test_the_experts_sit_where_deepseek_puts_them_and_the_bias_steers_the_choice() -> None:
    hf, lm = _build(CASES["experts_in_groups_scaled"])
    assert [isinstance(layer.ffn, MoEFeedForward) for layer in lm.layers] == [False, True]
    moe = lm.layers[1].ffn
    assert moe.choice_bias.abs().sum() > 0 and moe.scale == 2.5 and moe.groups == 4
    lm(_tokens(3, 12))
    routing = moe.routing
    # the chosen experts lie in at most 2 of the 4 groups of 2
    assert all(len(set((row // 2).tolist())) <= 2 for row in routing.experts)
    # with the bias set to zero the same scores choose other experts for some tokens,
    # while a choice that stays gets the same weight: the bias moves the choice only
    logits = moe.router(torch.randn(64, 64))  # (T, E)
    steered = route_sigmoid(logits, 3, moe.choice_bias, 4, 2)
    plain = route_sigmoid(logits, 3, torch.zeros(8), 4, 2)
    assert not torch.equal(steered.experts.sort().values, plain.experts.sort().values)
    same = (steered.experts.sort().values == plain.experts.sort().values).all(dim=1)  # (T,)
    assert same.any()
    assert_close(steered.weights.sort().values[same], plain.weights.sort().values[same])


DEEPSEEK_V3 = dict(DEEPSEEK_V3_DENSE, first_k_dense_replace=3)  # HF's defaults: 256 experts


def test_a_deepseek_v3_shaped_mixture_counts_as_hugging_faces() -> None:
    hf_config = tf.DeepseekV3Config(**DEEPSEEK_V3)
    with torch.device("meta"):
        model = tf.DeepseekV3ForCausalLM(hf_config)
    total = sum(p.numel() for p in model.parameters())
    unused = 0  # the E - k routed experts a token skips, in each MoE layer
    for layer in model.model.layers:
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            per_expert = sum(p.numel() for p in experts.parameters()) // experts.num_experts
            unused += (experts.num_experts - hf_config.num_experts_per_tok) * per_expert
    config = deepseek_v3_config(hf_config)
    assert config.moe.n_experts == 256 and config.moe.groups == 8 and config.moe.top_groups == 4
    assert count_parameters(config, "decoder-only") == total
    assert active_parameters(config) == total - unused
    # the published 671B total and 37B active (without the multi-token-prediction module)
    assert abs(total / 1e9 - 671) < 1 and abs((total - unused) / 1e9 - 37) < 1


def test_what_the_reference_cannot_do_is_refused() -> None:
    with pytest.raises(ValueError, match="moe.groups must split n_experts=6 into equal groups"):
        deepseek_v3_config(
            tf.DeepseekV3Config(
                **{**SMALL, "first_k_dense_replace": 1},
                n_routed_experts=6,
                n_group=4,
                num_experts_per_tok=2,
            )
        )
    with pytest.raises(ValueError, match="rms_norm_eps=1e-05 differs"):
        deepseek_v3_config(tf.DeepseekV3Config(**SMALL, rms_norm_eps=1e-5))
    with pytest.raises(TypeError, match="must be a DeepseekV3ForCausalLM"):
        from_hf_deepseek_v3(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("name", IDS)
def test_the_way_back_gives_hugging_faces_logits_exactly(name) -> None:
    hf, lm = _build(CASES[name])
    back = to_hf_deepseek_v3(lm, attn_implementation="eager").eval()
    assert type(back) is type(hf)
    tokens = _tokens(3, 12)
    mask = torch.arange(12) < torch.tensor([12, 9, 4])[:, None]  # (B, L)
    with torch.no_grad():
        for hf_mask in (None, mask.long()):
            assert torch.equal(
                back(tokens, attention_mask=hf_mask).logits,
                hf(tokens, attention_mask=hf_mask).logits,
            )
    mine, theirs = back.state_dict(), hf.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


REFERENCE = dict(
    vocab_size=V,
    d_model=32,
    n_heads=4,
    d_k=6,
    d_v=8,
    d_ff=40,
    n_layers=3,
    dropout=0.0,
    max_len=64,
    **LLAMA_STYLE,
    final_norm=True,
    layer_norm_eps=1e-6,
    rope=RopeConfig(pairs="interleaved"),
    tie_embeddings=False,
    latent=LatentConfig(kv_rank=12, q_rank=16, d_rope=4),
    moe=MoEConfig(
        n_experts=4,
        top_k=2,
        d_ff=8,
        shared_experts=1,
        first_dense=1,
        router="sigmoid",
        groups=2,
        top_groups=1,
        scale=2.0,
    ),
)


def _reference(latent: dict | None = None, moe: dict | None = None, **fields) -> TransformerConfig:
    # REFERENCE with some fields, and some of its groups' fields, changed
    config = TransformerConfig(**{**REFERENCE, **fields})
    return config.replace(
        latent=dataclasses.replace(config.latent, **(latent or {})),
        moe=dataclasses.replace(config.moe, **(moe or {})),
    )


@pytest.mark.parametrize(
    "changes",
    [
        {},
        dict(latent=dict(q_rank=None), rope=RopeConfig(), moe=dict(renormalize=False, groups=1)),
    ],
    ids=["grouped", "plain"],
)
def test_a_reference_model_goes_to_deepseek_v3_and_back(changes) -> None:
    torch.manual_seed(0)
    lm = DecoderOnlyLM(_reference(**changes)).eval()
    with torch.no_grad():
        for layer in lm.layers[1:]:
            layer.ffn.choice_bias.normal_(0.0, 0.3)
    back = to_hf_deepseek_v3(lm, attn_implementation="eager").eval()
    assert back.config.first_k_dense_replace == 1 and back.config.n_shared_experts == 1
    again = from_hf_deepseek_v3(back).eval()
    assert again.config == lm.config
    tokens = _tokens(2, 10)
    with torch.no_grad():
        assert_close(back(tokens).logits, lm(tokens), atol=1e-5, rtol=1e-5)
        assert torch.equal(again(tokens), lm(tokens))


@pytest.mark.parametrize(
    "config, message",
    [
        (TransformerConfig(**REFERENCE).replace(latent=None), "latent=None"),
        (_reference(layer_norm_eps=1e-5), "not DeepseekV3 shaped.*layer_norm_eps"),
        (_reference(moe=dict(router="softmax", groups=1, top_groups=1)), "moe.router"),
        (_reference(moe=dict(shared_experts=0)), "moe.shared_experts=0"),
        (_reference(activation="gelu"), "activation must be one of"),
    ],
)
def test_what_the_way_back_cannot_write_is_refused(config, message) -> None:
    lm = DecoderOnlyLM(config)
    with pytest.raises(ValueError, match=message):
        to_hf_deepseek_v3(lm)
    with pytest.raises(TypeError, match="lm must be a DecoderOnlyLM"):
        to_hf_deepseek_v3(torch.nn.Linear(2, 2))
