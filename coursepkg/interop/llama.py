"""Today's decoders from Hugging Face ``transformers`` in the reference: Llama, Qwen3 and
Mistral, and the mixtures of experts Mixtral and Qwen3-MoE, as a :class:`~coursepkg.DecoderOnlyLM`,
and the way back to Llama, Mixtral and Qwen3-MoE.

All three are the same block: pre-norm with RMSNorm, rotary positions in Hugging Face's
rotate-half layout (``rope.pairs="halves"``), a SwiGLU feed-forward (``gate_proj`` is our
``linear1``, ``up_proj`` ``linear3``, ``down_proj`` ``linear2``), grouped-query attention,
no biases by default, unscaled embeddings. Qwen3 adds QK-norm and an explicit ``head_dim``
(H * Dk need not be D); Mistral a sliding window. Mixtral is Mistral with a mixture of experts
on every layer (``block_sparse_moe`` in older ``transformers``, ``mlp`` now: a router ``gate``
and ``experts`` whose gate and up matrices are stacked in one ``gate_up_proj`` tensor);
Qwen3-MoE is Qwen3 with one, on every ``decoder_sparse_step``-th layer. Each ``from_hf_*``
reads the architecture from the config, refuses what the reference does not implement (RoPE
scaling, a partial sliding window), builds the model and copies every weight, so that the
logits agree (fp32).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import HFOptions, TransformerConfig, config_value
from ..config_groups import MoEConfig, RopeConfig
from ..decoder_only import DecoderOnlyLM
from .common import (
    GATED_FROM_HF,
    check_model_class,
    copy_layer_norms,
    copy_linear,
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

__all__ = [
    "from_hf_llama",
    "from_hf_mistral",
    "from_hf_mixtral",
    "from_hf_qwen3",
    "from_hf_qwen3_moe",
    "llama_config",
    "to_hf_llama",
    "to_hf_mixtral",
    "to_hf_qwen3_moe",
]

_FAMILIES = ("Llama", "Qwen3", "Mistral", "Mixtral", "Qwen3MoE")
# Our names -> theirs, inside self-attention and the feed-forward network.
_ATTENTION = (
    ("q_proj", "q_proj"),
    ("k_proj", "k_proj"),
    ("v_proj", "v_proj"),
    ("out_proj", "o_proj"),
)


def _sliding_window(c: Any, family: str) -> int | None:
    # Mistral: one window for every layer (None: none). Qwen3: only when use_sliding_window,
    # and then on some layers only, which the reference does not do.
    # Mixtral and Qwen3-MoE (whose config keeps it only with use_sliding_window): every layer.
    if family in ("Mistral", "Mixtral", "Qwen3MoE"):
        return c.sliding_window
    if family == "Qwen3":
        layer_types = getattr(c, "layer_types", None) or ["full_attention"]
        require(
            not c.use_sliding_window and set(layer_types) == {"full_attention"},
            f"Qwen3: sliding-window layers (layer_types={layer_types}) are not supported",
        )
    return None


def llama_config(hf_config: Any, family: str = "Llama") -> TransformerConfig:
    """The :class:`TransformerConfig` of a ``LlamaConfig``, ``Qwen3Config``, ``MistralConfig``,
    ``MixtralConfig`` or ``Qwen3MoeConfig``.

    Args:
        hf_config: the Hugging Face config.
        family: ``"Llama"``, ``"Qwen3"`` (adds ``qk_norm``), ``"Mistral"`` (adds its
            ``sliding_window``), ``"Mixtral"`` (Mistral with experts) or ``"Qwen3MoE"``
            (Qwen3 with experts; ``mlp_only_layers`` must be the first layers).

    Returns:
        A pre-norm, RMSNorm, RoPE ("halves"), gated feed-forward, grouped-query config.
    """
    require(family in _FAMILIES, f"family must be one of {_FAMILIES}, got {family!r}")
    c = hf_config
    require(c.hidden_act in GATED_FROM_HF, f"{family}: hidden_act {c.hidden_act!r}")
    attention_bias = getattr(c, "attention_bias", False)
    mlp_bias = getattr(c, "mlp_bias", False)  # Qwen3 and Mistral have none
    require(
        attention_bias == mlp_bias,
        f"{family}: attention_bias={attention_bias} and mlp_bias={mlp_bias} differ; the "
        "reference has one bias switch",
    )
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return TransformerConfig(
        **decoder_fields(c),
        **_moe_fields(c, family),
        n_kv_heads=c.num_key_value_heads,
        d_k=head_dim,
        d_v=head_dim,
        rope=RopeConfig(theta=rope_theta_of(c, family), pairs="halves"),
        bias=attention_bias,
        qk_norm=family in ("Qwen3", "Qwen3MoE"),
        sliding_window=_sliding_window(c, family),
    )


def _moe_fields(c: Any, family: str) -> dict[str, Any]:
    # The experts of Mixtral (every layer, of width intermediate_size, always renormalised)
    # and Qwen3-MoE (every decoder_sparse_step-th layer, moe_intermediate_size wide).
    if family == "Mixtral":
        n, k = c.num_local_experts, c.num_experts_per_tok
        return dict(moe=MoEConfig(n_experts=n, top_k=k, d_ff=c.intermediate_size))
    if family != "Qwen3MoE" or c.num_experts == 0:
        return {}
    dense = list(c.mlp_only_layers or [])
    require(
        dense == list(range(len(dense))),
        f"Qwen3MoE: mlp_only_layers={c.mlp_only_layers} is not supported (the reference keeps "
        "dense only the first layers, moe.first_dense, and those off every moe.every-th)",
    )
    moe = MoEConfig(
        first_dense=len(dense),
        n_experts=c.num_experts,
        top_k=c.num_experts_per_tok,
        d_ff=c.moe_intermediate_size,
        renormalize=bool(c.norm_topk_prob),
        every=c.decoder_sparse_step,
    )
    return dict(moe=moe)


@torch.no_grad()
def _from_hf(model: nn.Module, family: str) -> DecoderOnlyLM:
    # Build the reference model from the config and copy every weight, layer by layer.
    body = model.model
    tied = model.lm_head.weight is body.embed_tokens.weight
    config = llama_config(model.config, family).replace(tie_embeddings=tied)
    lm = DecoderOnlyLM(config)
    copy_tensor(lm.embed.weight, body.embed_tokens.weight, "embed_tokens")
    for i, (dst, src) in enumerate(zip(lm.layers, body.layers, strict=True)):
        name = f"layers.{i}"
        ours, theirs = dst.self_attn, src.self_attn
        for mine, hf in _ATTENTION:
            proj = getattr(theirs, hf)
            copy_linear(getattr(ours, mine), proj.weight, proj.bias, f"{name}.self_attn.{hf}")
        if config.qk_norm:
            copy_tensor(ours.q_norm.weight, theirs.q_norm.weight, f"{name}.self_attn.q_norm")
            copy_tensor(ours.k_norm.weight, theirs.k_norm.weight, f"{name}.self_attn.k_norm")
        copy_mlp(dst.ffn, src.mlp, name)
        copy_layer_norms(dst, src, name)
    return finish_from_hf(lm, model, tied)


def from_hf_llama(model: nn.Module) -> DecoderOnlyLM:
    """A :class:`~coursepkg.DecoderOnlyLM` with the weights of a Hugging Face Llama.

    Args:
        model: a ``LlamaForCausalLM``.

    Returns:
        The reference model on ``model``'s device and dtype, in its train/eval mode;
        ``lm(tokens, mask)`` equals ``model(tokens, attention_mask=mask,
        position_ids=positions_from_mask(mask)).logits`` at the real tokens, and
        ``lm.generate`` gives ``model.generate``'s greedy tokens.
    """
    check_model_class(model, "LlamaForCausalLM")
    return _from_hf(model, "Llama")


def from_hf_qwen3(model: nn.Module) -> DecoderOnlyLM:
    """A :class:`~coursepkg.DecoderOnlyLM` (with ``qk_norm``) from a ``Qwen3ForCausalLM``; as
    :func:`from_hf_llama`."""
    check_model_class(model, "Qwen3ForCausalLM")
    return _from_hf(model, "Qwen3")


def from_hf_mistral(model: nn.Module) -> DecoderOnlyLM:
    """A :class:`~coursepkg.DecoderOnlyLM` (with its ``sliding_window``) from a
    ``MistralForCausalLM``; as :func:`from_hf_llama`."""
    check_model_class(model, "MistralForCausalLM")
    return _from_hf(model, "Mistral")


def from_hf_mixtral(model: nn.Module) -> DecoderOnlyLM:
    """A :class:`~coursepkg.DecoderOnlyLM` with a mixture of experts on every layer from a
    ``MixtralForCausalLM``; as :func:`from_hf_llama` (in eval mode: the router's jitter noise,
    used in training only, is not carried over)."""
    check_model_class(model, "MixtralForCausalLM")
    return _from_hf(model, "Mixtral")


def from_hf_qwen3_moe(model: nn.Module) -> DecoderOnlyLM:
    """A :class:`~coursepkg.DecoderOnlyLM` (with ``qk_norm`` and a mixture of experts on every
    ``decoder_sparse_step``-th layer) from a ``Qwen3MoeForCausalLM``; as :func:`from_hf_llama`."""
    check_model_class(model, "Qwen3MoeForCausalLM")
    return _from_hf(model, "Qwen3MoE")


# What each way back needs of the reference's config, beyond the common block (a Llama's).
_BLOCK = {
    "norm_first": True,
    "use_final_norm": True,
    "norm": "rmsnorm",
    "positional": "rope",
    "rope.pairs": "halves",
    "activation": "swiglu",
    "scale_embeddings": False,
    "hf": HFOptions(),
}
_SOFTMAX_ROUTER = {
    "moe.router": "softmax",
    "moe.groups": 1,
    "moe.top_groups": 1,
    "moe.scale": 1.0,
    "moe.shared_experts": 0,
}


def _check_shape(lm: Any, family: str, needs: dict[str, Any]) -> Any:
    # The config of ``lm`` when it is a DecoderOnlyLM with the values ``needs`` names
    # (``moe.every``: a field of a group, None when the group is absent).
    if not isinstance(lm, DecoderOnlyLM):
        raise TypeError(f"lm must be a DecoderOnlyLM, got {type(lm).__name__}")
    c = lm.config
    needs = {**_BLOCK, "head_dim_v": c.head_dim_k, **needs}
    wrong = {k: config_value(c, k) for k, v in needs.items() if config_value(c, k) != v}
    require(not wrong, f"lm is not {family} shaped: needs {needs}, differs in {wrong}")
    return c


def _hf_block(c: TransformerConfig) -> dict[str, Any]:
    # The Hugging Face config fields every family shares, from ours.
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.kv_heads,
        head_dim=c.head_dim_k,
        hidden_act="silu",
        max_position_embeddings=c.max_len,
        rms_norm_eps=c.layer_norm_eps,
        tie_word_embeddings=c.tie_embeddings,
        rope_theta=c.rope.theta,
        attention_dropout=c.attention_dropout,
    )


def _build_back(lm: DecoderOnlyLM, family: str, config: Any) -> nn.Module:
    # The Hugging Face model ``config`` describes, with every weight of ``lm``.
    tf = transformers_module()
    model = getattr(tf, f"{family}ForCausalLM")(config)
    with torch.no_grad():
        _copy_back(model, lm)
    return placed_like(model, lm)


def to_hf_llama(lm: DecoderOnlyLM, **hf_overrides: Any) -> nn.Module:
    """The way back: a ``transformers.LlamaForCausalLM`` with the weights of ``lm``.

    Args:
        lm: a Llama-shaped model (pre-norm with a final norm, RMSNorm, RoPE in "halves" pairs,
            SwiGLU, unscaled embeddings, Dk = Dv, no QK-norm, sliding window, experts or logits
            bias); anything else raises ``ValueError``.
        hf_overrides: more ``LlamaConfig`` fields (token ids, for instance).

    Returns:
        The Hugging Face model, on ``lm``'s device and dtype, in its train/eval mode.
    """
    needs = dict(qk_norm=False, sliding_window=None, moe=None)
    c = _check_shape(lm, "Llama", needs)
    fields = dict(intermediate_size=c.d_ff, attention_bias=c.bias, mlp_bias=c.bias)
    config = transformers_module().LlamaConfig(**_hf_block(c), **fields, **hf_overrides)
    return _build_back(lm, "Llama", config)


def to_hf_mixtral(lm: DecoderOnlyLM, **hf_overrides: Any) -> nn.Module:
    """The way back to a ``transformers.MixtralForCausalLM``: as :func:`to_hf_llama`, for a
    model with a softmax-routed, renormalised mixture of experts on every layer (no shared
    experts, no biases, no QK-norm; a sliding window on every layer or none)."""
    require(
        not isinstance(lm, DecoderOnlyLM) or lm.config.moe is not None,
        "lm is not Mixtral shaped: moe=None (no experts); use to_hf_llama",
    )
    needs = {
        "qk_norm": False,
        "bias": False,
        "moe.every": 1,
        "moe.first_dense": 0,
        "moe.renormalize": True,
        **_SOFTMAX_ROUTER,
    }
    c = _check_shape(lm, "Mixtral", needs)
    fields = dict(
        intermediate_size=c.expert_d_ff,
        num_local_experts=c.moe.n_experts,
        num_experts_per_tok=c.moe.top_k,
        sliding_window=c.sliding_window,
    )
    config = transformers_module().MixtralConfig(**_hf_block(c), **fields, **hf_overrides)
    return _build_back(lm, "Mixtral", config)


def to_hf_qwen3_moe(lm: DecoderOnlyLM, **hf_overrides: Any) -> nn.Module:
    """The way back to a ``transformers.Qwen3MoeForCausalLM``: as :func:`to_hf_llama`, for a
    model with QK-norm and a softmax-routed mixture of experts on every ``moe.every``-th layer
    after the ``moe.first_dense`` first (no shared experts, biases or sliding window)."""
    require(
        not isinstance(lm, DecoderOnlyLM) or lm.config.moe is not None,
        "lm is not Qwen3MoE shaped: moe=None (no experts)",
    )
    needs = dict(qk_norm=True, bias=False, sliding_window=None, **_SOFTMAX_ROUTER)
    c = _check_shape(lm, "Qwen3MoE", needs)
    moe = c.moe
    fields = dict(
        intermediate_size=c.d_ff,
        moe_intermediate_size=c.expert_d_ff,
        num_experts=moe.n_experts,
        num_experts_per_tok=moe.top_k,
        norm_topk_prob=moe.renormalize,
        decoder_sparse_step=moe.every,
        mlp_only_layers=list(range(moe.first_dense)),
        attention_bias=False,
        use_sliding_window=False,
    )
    config = transformers_module().Qwen3MoeConfig(**_hf_block(c), **fields, **hf_overrides)
    return _build_back(lm, "Qwen3Moe", config)


def _copy_back(model: nn.Module, lm: DecoderOnlyLM) -> None:
    # Every weight of ``lm`` into the Hugging Face ``model`` (the names mirror _from_hf's).
    body = model.model
    copy_tensor(body.embed_tokens.weight, lm.embed.weight, "embed")
    for i, (src, dst) in enumerate(zip(lm.layers, body.layers, strict=True)):
        pairs = [(getattr(dst.self_attn, hf), getattr(src.self_attn, m)) for m, hf in _ATTENTION]
        for theirs, ours in pairs:
            copy_linear(theirs, ours.weight, ours.bias, type(theirs).__name__)
        if lm.config.qk_norm:
            copy_tensor(
                dst.self_attn.q_norm.weight, src.self_attn.q_norm.weight, f"layers.{i}.q_norm"
            )
            copy_tensor(
                dst.self_attn.k_norm.weight, src.self_attn.k_norm.weight, f"layers.{i}.k_norm"
            )
        copy_mlp_back(dst.mlp, src.ffn, f"layers.{i}")
        copy_tensor(dst.input_layernorm.weight, src.norm1.weight, "norm1")
        copy_tensor(dst.post_attention_layernorm.weight, src.norm2.weight, "norm2")
    copy_tensor(body.norm.weight, lm.norm.weight, "norm")
    if not lm.config.tie_embeddings:
        copy_tensor(model.lm_head.weight, lm.lm_head.weight, "lm_head")
