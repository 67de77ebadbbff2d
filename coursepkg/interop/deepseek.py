"""DeepSeek-V3 from Hugging Face ``transformers`` in the reference: a ``DeepseekV3ForCausalLM``
as a :class:`~coursepkg.DecoderOnlyLM` with latent attention (``kv_rank``) and, after its first
dense layers, a mixture of experts routed as DeepSeek-V3 routes.

The attention maps one to one: ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj`` (or ``q_proj``)
are our ``q_down``, ``q_norm``, ``q_up`` (``q_proj``); ``kv_a_proj_with_mqa`` (the latent and
the rotated key part in one matrix), ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj`` are
``kv_down``, ``kv_norm``, ``kv_up``, ``out_proj``. ``rope_interleave`` (DeepSeek's layout:
columns 2i and 2i+1 turn together) is ``rope.pairs="interleaved"``. The experts: the router
``gate`` (a sigmoid per expert, ``moe.router="sigmoid"``) and its ``e_score_correction_bias``
(our ``choice_bias``), ``n_group``/``topk_group`` (``moe.groups``/``moe.top_groups``),
``routed_scaling_factor`` (``moe.scale``), ``norm_topk_prob`` (``moe.renormalize``),
``shared_experts`` (our ``shared``, ``n_shared_experts`` wide) and ``first_k_dense_replace``
(``moe.first_dense``); each expert's stacked ``gate_up_proj``/``down_proj`` as Mixtral's.
YaRN's RoPE scaling, attention biases and latent norms whose epsilon is not ``rms_norm_eps``
are refused; the multi-token-prediction layers are not in Hugging Face's model either.
:func:`to_hf_deepseek_v3` goes back, for a reference model of that shape.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import HFOptions, TransformerConfig, config_value
from ..config_groups import LatentConfig, MoEConfig, RopeConfig
from ..decoder_only import DecoderOnlyLM
from ..moe import MoEFeedForward
from .common import (
    GATED_FROM_HF,
    check_model_class,
    copy_layer_norms,
    copy_mlp,
    copy_mlp_back,
    copy_tensor,
    decoder_fields,
    finish_from_hf,
    placed_like,
    require,
    rope_theta_of,
    transformers_module,
)

__all__ = ["deepseek_v3_config", "from_hf_deepseek_v3", "to_hf_deepseek_v3"]

_LATENT_EPS = 1e-6  # DeepseekV3RMSNorm's default, which q_a_layernorm and kv_a_layernorm keep
# Our names -> theirs inside the attention (the query's depend on q_lora_rank).
_LATENT = (
    ("kv_down", "kv_a_proj_with_mqa"),
    ("kv_norm", "kv_a_layernorm"),
    ("kv_up", "kv_b_proj"),
    ("out_proj", "o_proj"),
)
_QUERY_LATENT = (("q_down", "q_a_proj"), ("q_norm", "q_a_layernorm"), ("q_up", "q_b_proj"))


def _moe_fields(c: Any) -> dict[str, Any]:
    # Every layer from first_k_dense_replace on has experts (none when that is every layer).
    if c.first_k_dense_replace >= c.num_hidden_layers:
        return {}
    moe = MoEConfig(
        n_experts=c.n_routed_experts,
        top_k=c.num_experts_per_tok,
        d_ff=c.moe_intermediate_size,
        renormalize=bool(c.norm_topk_prob),
        shared_experts=c.n_shared_experts,
        first_dense=c.first_k_dense_replace,
        router="sigmoid",
        groups=c.n_group or 1,
        top_groups=c.topk_group or 1,
        scale=float(c.routed_scaling_factor),
    )
    return dict(moe=moe)


def deepseek_v3_config(hf_config: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a ``DeepseekV3Config``.

    Args:
        hf_config: the Hugging Face config.

    Returns:
        A pre-norm, RMSNorm, RoPE, SwiGLU config with latent attention (its ``latent`` group;
        ``d_k`` is ``qk_nope_head_dim``, ``d_v`` ``v_head_dim``) and, when some layer has
        experts, the sigmoid-routed mixture of experts (its ``moe`` group:
        ``router="sigmoid"``, ``groups``, ``scale``, ``first_dense``, ...).
    """
    c = hf_config
    require(c.hidden_act in GATED_FROM_HF, f"DeepseekV3: hidden_act {c.hidden_act!r}")
    require(not c.attention_bias, "DeepseekV3: attention_bias=True is not supported")
    require(
        c.num_key_value_heads == c.num_attention_heads,
        f"DeepseekV3: num_key_value_heads={c.num_key_value_heads} must equal "
        f"num_attention_heads={c.num_attention_heads} (latent attention has no groups)",
    )
    require(
        c.rms_norm_eps == _LATENT_EPS,
        f"DeepseekV3: rms_norm_eps={c.rms_norm_eps} differs from the latents' norms' "
        f"{_LATENT_EPS}; the reference has one epsilon",
    )
    return TransformerConfig(
        **decoder_fields(c),
        **_moe_fields(c),
        d_k=c.qk_nope_head_dim,
        d_v=c.v_head_dim,
        latent=LatentConfig(
            kv_rank=c.kv_lora_rank, q_rank=c.q_lora_rank, d_rope=c.qk_rope_head_dim
        ),
        rope=RopeConfig(
            theta=rope_theta_of(c, "DeepseekV3"),
            pairs="interleaved" if c.rope_interleave else "halves",
        ),
        bias=False,
    )


def _copy_deepseek_mlp(ffn: nn.Module, mlp: nn.Module, name: str) -> None:
    # A dense layer, or the router and experts as Mixtral's, then the choice bias and the
    # shared experts, which Mixtral has not.
    copy_mlp(ffn, mlp, name)
    if not isinstance(ffn, MoEFeedForward):
        return
    copy_tensor(
        ffn.choice_bias, mlp.gate.e_score_correction_bias, f"{name}.mlp.gate.e_score_corr.."
    )
    if ffn.shared is not None:
        copy_mlp(ffn.shared, mlp.shared_experts, f"{name}.shared_experts")


@torch.no_grad()
def from_hf_deepseek_v3(model: nn.Module) -> DecoderOnlyLM:
    """A :class:`~coursepkg.DecoderOnlyLM` with latent attention and DeepSeek-V3's mixture of
    experts from a ``DeepseekV3ForCausalLM``; as :func:`~coursepkg.interop.from_hf_llama` (the
    logits agree at the real tokens with and without padding, and greedy generation gives
    ``generate``'s)."""
    check_model_class(model, "DeepseekV3ForCausalLM")
    body = model.model
    tied = model.lm_head.weight is body.embed_tokens.weight
    config = deepseek_v3_config(model.config).replace(tie_embeddings=tied)
    lm = DecoderOnlyLM(config)
    copy_tensor(lm.embed.weight, body.embed_tokens.weight, "embed_tokens")
    query = _QUERY_LATENT if config.latent.q_rank is not None else (("q_proj", "q_proj"),)
    for i, (dst, src) in enumerate(zip(lm.layers, body.layers, strict=True)):
        name = f"layers.{i}"
        for mine, hf in (*query, *_LATENT):
            theirs = getattr(src.self_attn, hf)
            copy_tensor(
                getattr(dst.self_attn, mine).weight, theirs.weight, f"{name}.self_attn.{hf}"
            )
        _copy_deepseek_mlp(dst.ffn, src.mlp, name)
        copy_layer_norms(dst, src, name)
    return finish_from_hf(lm, model, tied)


# What the way back needs of the reference's config: DeepSeek-V3's block, whatever its sizes.
_SHAPE = dict(
    norm_first=True,
    use_final_norm=True,
    norm="rmsnorm",
    positional="rope",
    scale_embeddings=False,
    bias=False,
    qk_norm=False,
    sliding_window=None,
    layer_norm_eps=_LATENT_EPS,
    hf=HFOptions(),
)
_SHAPE_OF_EXPERTS = {"moe.router": "sigmoid", "moe.every": 1}
_ACTIVATION_TO_HF = {ours: theirs for theirs, ours in GATED_FROM_HF.items() if theirs != "swish"}


def _check_deepseek_shape(lm: Any) -> TransformerConfig:
    # The config of ``lm`` when DeepseekV3Config can describe it; otherwise a ValueError that
    # names every field that differs.
    if not isinstance(lm, DecoderOnlyLM):
        raise TypeError(f"lm must be a DecoderOnlyLM, got {type(lm).__name__}")
    c = lm.config
    needs = {**_SHAPE, **(_SHAPE_OF_EXPERTS if c.moe else {})}
    wrong = {k: config_value(c, k) for k, v in needs.items() if config_value(c, k) != v}
    require(not wrong, f"lm is not DeepseekV3 shaped: needs {needs}, differs in {wrong}")
    require(
        c.latent is not None,
        "lm is not DeepseekV3 shaped: latent=None (DeepSeek-V3's attention is latent; "
        "use to_hf_llama for grouped-query attention)",
    )
    require(
        c.activation in _ACTIVATION_TO_HF,
        f"lm is not DeepseekV3 shaped: activation must be one of "
        f"{sorted(_ACTIVATION_TO_HF)}, got {c.activation!r}",
    )
    require(
        c.moe is None or c.moe.shared_experts >= 1,
        "lm is not DeepseekV3 shaped: moe.shared_experts=0 (DeepSeek-V3's mixture always "
        "has shared experts)",
    )
    return c


def _deepseek_fields(c: TransformerConfig) -> dict[str, Any]:
    # The DeepseekV3Config fields of the reference's config (_moe_fields and
    # deepseek_v3_config read backwards).
    fields = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.d_ff,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_heads,
        kv_lora_rank=c.latent.kv_rank,
        q_lora_rank=c.latent.q_rank,
        qk_rope_head_dim=c.latent.d_rope,
        qk_nope_head_dim=c.head_dim_k,
        v_head_dim=c.head_dim_v,
        hidden_act=_ACTIVATION_TO_HF[c.activation],
        max_position_embeddings=c.max_len,
        rms_norm_eps=c.layer_norm_eps,
        tie_word_embeddings=c.tie_embeddings,
        rope_parameters=dict(rope_type="default", rope_theta=c.rope.theta),
        rope_interleave=c.rope.pairs == "interleaved",
        attention_bias=False,
        attention_dropout=c.attention_dropout,
        first_k_dense_replace=c.n_layers,
    )
    if c.moe is not None:
        m = c.moe
        fields.update(
            first_k_dense_replace=m.first_dense,
            n_routed_experts=m.n_experts,
            num_experts_per_tok=m.top_k,
            moe_intermediate_size=c.expert_d_ff,
            n_shared_experts=m.shared_experts,
            n_group=m.groups,
            topk_group=m.top_groups,
            routed_scaling_factor=m.scale,
            norm_topk_prob=m.renormalize,
        )
    return fields


def to_hf_deepseek_v3(lm: DecoderOnlyLM, **hf_overrides: Any) -> nn.Module:
    """The way back: a ``transformers.DeepseekV3ForCausalLM`` with the weights of ``lm``.

    Args:
        lm: a DeepSeek-V3-shaped model: pre-norm with a final norm, RMSNorm with epsilon 1e-6
            (Hugging Face's latent norms keep that one), RoPE in either layout, SwiGLU or
            GeGLU, latent attention (``latent``; its ``q_rank`` optional), no biases, QK-norm
            or sliding window, unscaled embeddings; and, if it has experts, the sigmoid router
            on every layer after the ``moe.first_dense`` first, with shared experts. Anything
            else raises ``ValueError`` naming the fields that differ.
        hf_overrides: more ``DeepseekV3Config`` fields (token ids, ``attn_implementation``).

    Returns:
        The Hugging Face model, on ``lm``'s device and dtype, in its train/eval mode; its
        logits equal ``lm``'s, and :func:`from_hf_deepseek_v3` of it gives ``lm`` back.
    """
    c = _check_deepseek_shape(lm)
    tf = transformers_module()
    config = tf.DeepseekV3Config(**{**_deepseek_fields(c), **hf_overrides})
    model = tf.DeepseekV3ForCausalLM(config)
    query = _QUERY_LATENT if c.latent.q_rank is not None else (("q_proj", "q_proj"),)
    with torch.no_grad():
        body = model.model
        copy_tensor(body.embed_tokens.weight, lm.embed.weight, "embed")
        for i, (src, dst) in enumerate(zip(lm.layers, body.layers, strict=True)):
            name = f"layers.{i}"
            for mine, hf in (*query, *_LATENT):
                ours = getattr(src.self_attn, mine).weight
                copy_tensor(getattr(dst.self_attn, hf).weight, ours, f"{name}.self_attn.{mine}")
            copy_mlp_back(dst.mlp, src.ffn, name)
            if isinstance(src.ffn, MoEFeedForward):
                bias = dst.mlp.gate.e_score_correction_bias
                copy_tensor(bias, src.ffn.choice_bias, f"{name}.ffn.choice_bias")
                copy_mlp_back(dst.mlp.shared_experts, src.ffn.shared, f"{name}.ffn.shared")
            copy_tensor(dst.input_layernorm.weight, src.norm1.weight, f"{name}.norm1")
            copy_tensor(dst.post_attention_layernorm.weight, src.norm2.weight, f"{name}.norm2")
        copy_tensor(body.norm.weight, lm.norm.weight, "norm")
        if not c.tie_embeddings:
            copy_tensor(model.lm_head.weight, lm.lm_head.weight, "lm_head")
    return placed_like(model, lm)
