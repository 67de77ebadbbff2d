"""Mixtures of experts loaded into the reference (issue 51): random Mixtral and Qwen3-MoE models
built from small configs (nothing is downloaded), their weights copied, the logits compared
(fp32, atol 1e-5) without and with padding, greedy generation with our cache against
``model.generate``, the load-balancing loss against Hugging Face's, the closed-form total
and active parameter counts against Hugging Face's models on the meta device at full size, and
the way back (``to_hf_mixtral``, ``to_hf_qwen3_moe``: the round trip's logits equal)."""

from __future__ import annotations

import os

import pytest
import torch
from torch.testing import assert_close

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

from model_shapes import LLAMA_STYLE  # noqa: E402

from coursepkg import DecoderOnlyLM, MoEConfig, TransformerConfig, count_parameters  # noqa: E402
from coursepkg.interop import (  # noqa: E402
    from_hf_mixtral,
    from_hf_qwen3_moe,
    llama_config,
    to_hf_mixtral,
    to_hf_qwen3_moe,
)
from coursepkg.moe import MoEFeedForward  # noqa: E402
from coursepkg.params import active_parameters  # noqa: E402
from coursepkg.positional import positions_from_mask  # noqa: E402

V = 97
SMALL = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=0,
    attn_implementation="eager",
)

CASES = {
    "mixtral_8_top2": ("mixtral", dict(num_local_experts=8, num_experts_per_tok=2)),
    "mixtral_4_top1_tied_window": (
        "mixtral",
        dict(
            num_local_experts=4, num_experts_per_tok=1, tie_word_embeddings=True, sliding_window=5
        ),
    ),
    "qwen3_moe_renormalised": (
        "qwen3_moe",
        dict(
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            norm_topk_prob=True,
            head_dim=32,
        ),
    ),
    "qwen3_moe_raw_every_2nd": (
        "qwen3_moe",
        dict(
            num_experts=4,
            num_experts_per_tok=3,
            moe_intermediate_size=16,
            norm_topk_prob=False,
            decoder_sparse_step=2,
            head_dim=16,
            num_key_value_heads=1,
        ),
    ),
}
IDS = list(CASES)


def _build(family: str, fields: dict, seed: int = 0):
    """A random Hugging Face model (routers and norms spread out, so that the experts' choice
    is clear-cut) and ours from it."""
    cls, cfg, load = {
        "mixtral": (tf.MixtralForCausalLM, tf.MixtralConfig, from_hf_mixtral),
        "qwen3_moe": (tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig, from_hf_qwen3_moe),
    }[family]
    torch.manual_seed(seed)
    hf = cls(cfg(**{**SMALL, **fields})).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
            elif name.endswith("gate.weight") or "experts" in name:
                p.normal_(0.0, 0.3)
    return hf, load(hf).eval()


def _tokens(b: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", IDS)
def test_equal_logits_without_padding(name) -> None:
    hf, lm = _build(*CASES[name])
    tokens = _tokens(3, 12)
    with torch.no_grad():
        assert_close(lm(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in lm.parameters()) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("name", IDS)
def test_equal_logits_with_padding(name, side) -> None:
    hf, lm = _build(*CASES[name])
    tokens = _tokens(3, 12)
    lengths = torch.tensor([12, 9, 4])
    ar = torch.arange(12)
    mask = ar < lengths[:, None] if side == "right" else ar >= 12 - lengths[:, None]  # (B, L)
    with torch.no_grad():
        ours = lm(tokens, mask)
        theirs = hf(tokens, attention_mask=mask.long(), position_ids=positions_from_mask(mask))
    assert_close(ours[mask], theirs.logits[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", IDS)
def test_same_greedy_tokens_as_generate(name) -> None:
    hf, lm = _build(*CASES[name])
    prompt = _tokens(2, 6, seed=3)
    with torch.no_grad():
        theirs = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=24
        )
    ours = lm.generate(prompt, 24)
    assert theirs.shape == (2, 30) and torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["mixtral_8_top2", "qwen3_moe_raw_every_2nd"])
def test_the_load_balancing_loss_is_hugging_faces(name) -> None:
    family, fields = CASES[name]
    hf, lm = _build(family, fields)
    tokens = _tokens(3, 12)
    mask = torch.arange(12) < torch.tensor([12, 9, 4])[:, None]  # (B, L)
    module = tf.models.mixtral.modeling_mixtral if family == "mixtral" else None
    if module is None:
        module = tf.models.qwen3_moe.modeling_qwen3_moe
    k, n = lm.config.moe.top_k, lm.config.moe.n_experts
    # Padded rows' hidden states differ (ours: a row that sees no key gives zeros), so the
    # unmasked loss is compared on a batch without padding.
    for token_mask in (None, mask):
        hf_mask = None if token_mask is None else token_mask.long()
        with torch.no_grad():
            out = hf(tokens, attention_mask=hf_mask, output_router_logits=True)
            ours = lm(tokens, token_mask, return_aux=True)  # as their out.aux_loss
        theirs = module.load_balancing_loss_func(out.router_logits, n, k, token_mask)
        assert_close(ours.aux_loss, theirs, atol=1e-6, rtol=1e-5)
        assert_close(lm.load_balancing_loss(token_mask), theirs, atol=1e-6, rtol=1e-5)


def _meta_counts(cls, config) -> tuple[int, int]:
    """Hugging Face's total parameters and those a token uses (less E - k experts a layer)."""
    with torch.device("meta"):
        model = cls(config)
    total = sum(p.numel() for p in model.parameters())  # tied matrices are counted once
    unused = 0
    for layer in model.model.layers:
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            per_expert = sum(p.numel() for p in experts.parameters()) // experts.num_experts
            unused += (experts.num_experts - config.num_experts_per_tok) * per_expert
    return total, total - unused


QWEN3_30B_A3B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    tie_word_embeddings=False,
)
MIXTRAL_8X7B = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    num_local_experts=8,
    num_experts_per_tok=2,
)


@pytest.mark.parametrize(
    "cls, cfg, family, fields, billions",
    [
        ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", "Qwen3MoE", QWEN3_30B_A3B, (30.5, 3.3)),
        ("MixtralForCausalLM", "MixtralConfig", "Mixtral", MIXTRAL_8X7B, (46.7, 12.9)),
    ],
    ids=["qwen3_30b_a3b", "mixtral_8x7b"],
)
def test_total_and_active_counts_equal_hugging_faces(cls, cfg, family, fields, billions) -> None:
    hf_config = getattr(tf, cfg)(**fields)
    total, active = _meta_counts(getattr(tf, cls), hf_config)
    config = llama_config(hf_config, family)
    assert count_parameters(config, "decoder-only") == total
    assert active_parameters(config) == active
    # the published sizes (Qwen's 3.3B active: 3.35B with both vocabulary matrices)
    assert abs(total / 1e9 - billions[0]) < 0.05 and abs(active / 1e9 - billions[1]) < 0.06


def test_every_nth_layer_and_the_refusals() -> None:
    _, lm = _build(*CASES["qwen3_moe_raw_every_2nd"])
    assert [isinstance(layer.ffn, MoEFeedForward) for layer in lm.layers] == [False, True]
    assert lm.config.moe.renormalize is False and lm.config.moe.every == 2
    c = tf.Qwen3MoeConfig(**SMALL, num_experts=4, mlp_only_layers=[1])
    with pytest.raises(ValueError, match="mlp_only_layers=\\[1\\] is not supported"):
        llama_config(c, "Qwen3MoE")
    first = tf.Qwen3MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0])
    assert llama_config(first, "Qwen3MoE").moe.first_dense == 1
    with pytest.raises(TypeError, match="must be a MixtralForCausalLM"):
        from_hf_mixtral(tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**SMALL, num_experts=4)))


BACK = {
    "mixtral_8_top2": to_hf_mixtral,
    "mixtral_4_top1_tied_window": to_hf_mixtral,
    "qwen3_moe_renormalised": to_hf_qwen3_moe,
    "qwen3_moe_raw_every_2nd": to_hf_qwen3_moe,
}


@pytest.mark.parametrize("name", IDS)
def test_the_way_back_gives_the_same_logits(name) -> None:
    hf, lm = _build(*CASES[name])
    back = BACK[name](lm, attn_implementation="eager").eval()
    assert type(back) is type(hf)
    tokens = _tokens(3, 12)
    mask = torch.arange(12) < torch.tensor([12, 9, 4])[:, None]  # (B, L)
    with torch.no_grad():
        for token_mask in (None, mask):
            hf_mask = None if token_mask is None else token_mask.long()
            ours, theirs = back(tokens, attention_mask=hf_mask), hf(tokens, attention_mask=hf_mask)
            real = torch.ones_like(mask) if token_mask is None else mask
            assert_close(ours.logits[real], theirs.logits[real], atol=1e-5, rtol=1e-5)
    # and every weight went back where it came from
    mine, theirs = back.state_dict(), hf.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_a_reference_model_with_experts_first_dense_goes_to_qwen3_moe_and_back() -> None:
    config = TransformerConfig(
        vocab_size=V,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        d_ff=40,
        n_layers=3,
        dropout=0.0,
        **LLAMA_STYLE,
        qk_norm=True,
        max_len=64,
        d_k=8,
        d_v=8,
        final_norm=True,
        moe=MoEConfig(n_experts=4, top_k=2, d_ff=16, first_dense=1),
    )
    torch.manual_seed(0)
    lm = DecoderOnlyLM(config).eval()
    back = to_hf_qwen3_moe(lm, attn_implementation="eager").eval()
    assert back.config.mlp_only_layers == [0]
    again = from_hf_qwen3_moe(back).eval()
    tokens = _tokens(2, 10)
    with torch.no_grad():
        assert_close(back(tokens).logits, lm(tokens), atol=1e-5, rtol=1e-5)
    assert again.config == lm.config


@pytest.mark.parametrize(
    "to_hf, fields, message",
    [
        (to_hf_mixtral, dict(moe=MoEConfig(4, shared_experts=1)), "not Mixtral shaped"),
        (to_hf_mixtral, dict(moe=MoEConfig(4, every=2)), "not Mixtral shaped"),
        (to_hf_mixtral, dict(moe=None), "moe=None \\(no experts\\); use to_hf_llama"),
        (
            to_hf_qwen3_moe,
            dict(qk_norm=True, moe=MoEConfig(4, router="sigmoid")),
            "not Qwen3MoE shaped",
        ),
        (to_hf_qwen3_moe, dict(qk_norm=False), "not Qwen3MoE shaped"),
    ],
)
def test_what_the_way_back_cannot_write_is_refused(to_hf, fields, message) -> None:
    base = dict(
        vocab_size=V,
        d_model=16,
        n_heads=2,
        d_ff=24,
        n_layers=2,
        dropout=0.0,
        **LLAMA_STYLE,
        moe=MoEConfig(n_experts=4),
    )
    lm = DecoderOnlyLM(TransformerConfig(**{**base, **fields}))
    with pytest.raises(ValueError, match=message):
        to_hf(lm)
    with pytest.raises(TypeError, match="lm must be a DecoderOnlyLM"):
        to_hf(torch.nn.Linear(2, 2))
