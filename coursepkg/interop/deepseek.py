"""DeepSeek-V3 from Hugging Face ``transformers`` in the reference: a ``DeepseekV3ForCausalLM``
as a :class:`~coursepkg.DecoderOnlyLM` with latent attention (``kv_rank``) and, after its first
dense layers, a mixture of experts routed as DeepSeek-V3 routes.

The attention maps one to one: ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj`` (or ``q_proj``)
are our ``q_down``, ``q_norm``, ``q_up`` (``q_proj``); ``kv_a_proj_with_mqa`` (the latent and
the rotated key part in one matrix), ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj`` are
``kv_down``, ``kv_norm``, ``kv_up``, ``out_proj``. ``rope_interleave`` (DeepSeek's layout:
columns 2i and 2i+1 turn together) is ``rope_pairs="interleaved"``. The experts: the router
``gate`` (a sigmoid per expert, ``moe_router="sigmoid"``) and its ``e_score_correction_bias``
(our ``choice_bias``), ``n_group``/``topk_group`` (``moe_groups``/``moe_top_groups``),
``routed_scaling_factor`` (``moe_scale``), ``norm_topk_prob`` (``moe_renormalize``),
``shared_experts`` (our ``shared``, ``n_shared_experts`` wide) and ``first_k_dense_replace``
(``moe_first_dense``); each expert's stacked ``gate_up_proj``/``down_proj`` as Mixtral's.
YaRN's RoPE scaling, attention biases and latent norms whose epsilon is not ``rms_norm_eps``
are refused; the multi-token-prediction layers are not in Hugging Face's model either.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import TransformerConfig
from ..decoder_only import DecoderOnlyLM
from ..moe import MoEFeedForward
from .hf import _copy, _like, _require, _transformers
from .llama import _GATED_FROM_HF, _copy_mlp, _rope_theta

__all__ = ["deepseek_v3_config", "from_hf_deepseek_v3"]

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
    return dict(
        n_experts=c.n_routed_experts,
        moe_top_k=c.num_experts_per_tok,
        moe_d_ff=c.moe_intermediate_size,
        moe_renormalize=bool(c.norm_topk_prob),
        moe_shared_experts=c.n_shared_experts,
        moe_first_dense=c.first_k_dense_replace,
        moe_router="sigmoid",
        moe_groups=c.n_group or 1,
        moe_top_groups=c.topk_group or 1,
        moe_scale=float(c.routed_scaling_factor),
    )


def deepseek_v3_config(hf_config: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a ``DeepseekV3Config``.

    Args:
        hf_config: the Hugging Face config.

    Returns:
        A pre-norm, RMSNorm, RoPE, SwiGLU config with latent attention (``kv_rank``,
        ``q_rank``, ``d_rope``; ``d_k`` is ``qk_nope_head_dim``, ``d_v`` ``v_head_dim``) and,
        when some layer has experts, the sigmoid-routed mixture of experts (``n_experts``,
        ``moe_router="sigmoid"``, ``moe_groups``, ``moe_scale``, ``moe_first_dense``, ...).
    """
    c = hf_config
    _require(c.hidden_act in _GATED_FROM_HF, f"DeepseekV3: hidden_act {c.hidden_act!r}")
    _require(not c.attention_bias, "DeepseekV3: attention_bias=True is not supported")
    _require(
        c.num_key_value_heads == c.num_attention_heads,
        f"DeepseekV3: num_key_value_heads={c.num_key_value_heads} must equal "
        f"num_attention_heads={c.num_attention_heads} (latent attention has no groups)",
    )
    _require(
        c.rms_norm_eps == _LATENT_EPS,
        f"DeepseekV3: rms_norm_eps={c.rms_norm_eps} differs from the latents' norms' "
        f"{_LATENT_EPS}; the reference has one epsilon",
    )
    return TransformerConfig(
        **_moe_fields(c),
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
        d_k=c.qk_nope_head_dim,
        d_v=c.v_head_dim,
        kv_rank=c.kv_lora_rank,
        q_rank=c.q_lora_rank,
        d_rope=c.qk_rope_head_dim,
        d_ff=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        dropout=0.0,
        attention_dropout=c.attention_dropout,
        max_len=c.max_position_embeddings,
        norm_first=True,
        final_norm=True,
        norm="rmsnorm",
        layer_norm_eps=c.rms_norm_eps,
        positional="rope",
        rope_theta=_rope_theta(c, "DeepseekV3"),
        rope_pairs="interleaved" if c.rope_interleave else "halves",
        activation=_GATED_FROM_HF[c.hidden_act],
        bias=False,
        scale_embeddings=False,
        tie_embeddings=c.tie_word_embeddings,
    )


def _copy_deepseek_mlp(ffn: nn.Module, mlp: nn.Module, name: str) -> None:
    # A dense layer, or the router and experts as Mixtral's, then the choice bias and the
    # shared experts, which Mixtral has not.
    _copy_mlp(ffn, mlp, name)
    if not isinstance(ffn, MoEFeedForward):
        return
    _copy(ffn.choice_bias, mlp.gate.e_score_correction_bias, f"{name}.mlp.gate.e_score_corr..")
    if ffn.shared is not None:
        _copy_mlp(ffn.shared, mlp.shared_experts, f"{name}.shared_experts")


@torch.no_grad()
def from_hf_deepseek_v3(model: nn.Module) -> DecoderOnlyLM:
    """A :class:`~coursepkg.DecoderOnlyLM` with latent attention and DeepSeek-V3's mixture of
    experts from a ``DeepseekV3ForCausalLM``; as :func:`~coursepkg.interop.from_hf_llama` (the
    logits agree at the real tokens with and without padding, and greedy generation gives
    ``generate``'s)."""
    tf = _transformers()
    if not isinstance(model, tf.DeepseekV3ForCausalLM):
        raise TypeError(f"model must be a DeepseekV3ForCausalLM, got {type(model).__name__}")
    body = model.model
    tied = model.lm_head.weight is body.embed_tokens.weight
    config = deepseek_v3_config(model.config).replace(tie_embeddings=tied)
    lm = DecoderOnlyLM(config)
    _copy(lm.embed.weight, body.embed_tokens.weight, "embed_tokens")
    query = _QUERY_LATENT if config.q_rank is not None else (("q_proj", "q_proj"),)
    for i, (dst, src) in enumerate(zip(lm.layers, body.layers, strict=True)):
        name = f"layers.{i}"
        for mine, hf in (*query, *_LATENT):
            theirs = getattr(src.self_attn, hf)
            _copy(getattr(dst.self_attn, mine).weight, theirs.weight, f"{name}.self_attn.{hf}")
        _copy_deepseek_mlp(dst.ffn, src.mlp, name)
        _copy(dst.norm1.weight, src.input_layernorm.weight, f"{name}.input_layernorm")
        _copy(dst.norm2.weight, src.post_attention_layernorm.weight, f"{name}.post_attention_ln")
    _copy(lm.norm.weight, body.norm.weight, "norm")
    if not tied:
        _copy(lm.lm_head.weight, model.lm_head.weight, "lm_head")
    return _like(lm, model)
