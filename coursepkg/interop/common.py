"""What every weight transfer of :mod:`coursepkg.interop` shares: importing ``transformers``
on demand, refusing a model with a clear message, copying a tensor or a linear layer with its
shape checked, a gated feed-forward or a mixture of experts in Hugging Face's layout, and
placing the result like the model it came from.

Our feed-forward names -> Hugging Face's: ``linear1`` is ``gate_proj``, ``linear3``
``up_proj``, ``linear2`` ``down_proj``; a mixture's router is ``gate``, and its experts keep
their gate and up matrices stacked in one ``gate_up_proj`` tensor (E, 2F, D) and their down
matrices in ``down_proj`` (E, D, F).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..moe import MoEFeedForward

__all__ = [
    "GATED_FROM_HF",
    "check_model_class",
    "copy_layer_norms",
    "copy_linear",
    "copy_mlp",
    "copy_mlp_back",
    "copy_tensor",
    "decoder_fields",
    "finish_from_hf",
    "placed_like",
    "require",
    "rope_theta_of",
    "transformers_module",
]

#: The gated feed-forward each Hugging Face activation makes: down(act(gate x) * up x).
GATED_FROM_HF = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu"}
_MLP = (("linear1", "gate_proj"), ("linear3", "up_proj"), ("linear2", "down_proj"))


def transformers_module() -> Any:
    """The ``transformers`` package, or an ImportError saying how to install it."""
    try:
        import transformers
    except ImportError as err:  # pragma: no cover - the course environment has it
        raise ImportError(
            "coursepkg.interop needs Hugging Face transformers: pip install 'coursepkg[interop]'"
        ) from err
    return transformers


def check_model_class(model: object, name: str) -> None:
    """Raise ``TypeError`` unless ``model`` is an instance of ``transformers``' class ``name``
    (``"LlamaForCausalLM"``): what each ``from_hf_*`` reads first."""
    if not isinstance(model, getattr(transformers_module(), name)):
        raise TypeError(f"model must be a {name}, got {type(model).__name__}")


def require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition`` holds."""
    if not condition:
        raise ValueError(message)


def copy_tensor(dst: Tensor, src: Tensor, name: str) -> None:
    """Copy ``src`` into ``dst`` in place; a shape that differs names ``name``."""
    if dst.shape != src.shape:
        raise ValueError(f"{name}: expected shape {tuple(dst.shape)}, got {tuple(src.shape)}")
    dst.copy_(src)


def copy_linear(dst: nn.Module, weight: Tensor, bias: Tensor | None, name: str) -> None:
    """Copy a weight and its bias into ``dst`` (an ``nn.Linear``, (out, in), or a LayerNorm)."""
    copy_tensor(dst.weight, weight, f"{name}.weight")
    if (dst.bias is None) != (bias is None):
        raise ValueError(f"{name}: one side has a bias and the other has not")
    if bias is not None:
        copy_tensor(dst.bias, bias, f"{name}.bias")


def placed_like(module: nn.Module, hf_model: nn.Module) -> nn.Module:
    """``module`` on the device and dtype of ``hf_model``'s weights, in its train/eval mode."""
    p = next(hf_model.parameters())
    return module.to(device=p.device, dtype=p.dtype).train(hf_model.training)


def rope_theta_of(c: Any, family: str) -> float:
    """RoPE's base in a Hugging Face config; any RoPE scaling is refused.

    transformers 5 keeps RoPE's settings in ``rope_parameters`` (``rope_scaling`` is its
    alias); 4.x had ``rope_theta`` and ``rope_scaling`` (None when plain).
    """
    params = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    kind = params.get("rope_type", params.get("type", "default"))
    require(
        kind == "default",
        f"{family}: rope_type {kind!r} is not supported (the reference implements plain RoPE)",
    )
    return float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def decoder_fields(c: Any) -> dict[str, Any]:
    """The reference config's fields that every Hugging Face decoder it reads (Llama, Qwen3,
    Mistral, Mixtral, DeepSeek-V3) sets the same way: a pre-norm RMSNorm stack with a final
    norm, RoPE, a gated feed-forward and unscaled embeddings.

    Args:
        c: the Hugging Face config (``hidden_act`` already checked against ``GATED_FROM_HF``).

    Returns:
        Keyword arguments for :class:`~coursepkg.TransformerConfig`; each family adds its
        attention's sizes, its RoPE, its bias and its experts.
    """
    return dict(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
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
        activation=GATED_FROM_HF[c.hidden_act],
        scale_embeddings=False,
        tie_embeddings=c.tie_word_embeddings,
    )


def copy_layer_norms(dst: nn.Module, src: nn.Module, name: str) -> None:
    """A Hugging Face decoder layer's two RMSNorms (``src``) into the reference layer ``dst``."""
    copy_tensor(dst.norm1.weight, src.input_layernorm.weight, f"{name}.input_layernorm")
    copy_tensor(dst.norm2.weight, src.post_attention_layernorm.weight, f"{name}.post_attention_ln")


def finish_from_hf(lm: nn.Module, model: nn.Module, tied: bool) -> nn.Module:
    """The final norm and (untied) head of the Hugging Face ``model`` copied into ``lm``, then
    ``lm`` placed like ``model``: the last step of every ``from_hf_*`` of a decoder."""
    copy_tensor(lm.norm.weight, model.model.norm.weight, "norm")
    if not tied:
        copy_tensor(lm.lm_head.weight, model.lm_head.weight, "lm_head")
    return placed_like(lm, model)


def copy_mlp(ffn: nn.Module, mlp: nn.Module, name: str) -> None:
    """Hugging Face's feed-forward ``mlp`` into ours: a dense gated one, or a mixture of
    experts (the router, then each expert's gate, the first half of ``gate_up_proj``'s rows,
    its up, the second half, and its down matrix)."""
    if not isinstance(ffn, MoEFeedForward):
        for mine, hf in _MLP:
            proj = getattr(mlp, hf)
            copy_linear(getattr(ffn, mine), proj.weight, proj.bias, f"{name}.mlp.{hf}")
        return
    copy_tensor(ffn.router.weight, mlp.gate.weight, f"{name}.mlp.gate")
    gate_up, down = mlp.experts.gate_up_proj, mlp.experts.down_proj  # (E, 2F, D), (E, D, F)
    for e, expert in enumerate(ffn.experts):
        gate, up = gate_up[e].chunk(2, dim=0)  # (F, D), (F, D)
        copy_tensor(expert.linear1.weight, gate, f"{name}.mlp.experts.gate_up_proj[{e}] (gate)")
        copy_tensor(expert.linear3.weight, up, f"{name}.mlp.experts.gate_up_proj[{e}] (up)")
        copy_tensor(expert.linear2.weight, down[e], f"{name}.mlp.experts.down_proj[{e}]")


def copy_mlp_back(mlp: nn.Module, ffn: nn.Module, name: str) -> None:
    """:func:`copy_mlp`'s inverse: each expert's gate and up matrices stacked again in
    ``gate_up_proj``."""
    if not isinstance(ffn, MoEFeedForward):
        for mine, hf in _MLP:
            ours = getattr(ffn, mine)
            copy_linear(getattr(mlp, hf), ours.weight, ours.bias, f"{name}.ffn.{mine}")
        return
    copy_tensor(mlp.gate.weight, ffn.router.weight, f"{name}.ffn.router")
    for e, expert in enumerate(ffn.experts):
        gate_up = torch.cat([expert.linear1.weight, expert.linear3.weight])  # (2F, D)
        copy_tensor(mlp.experts.gate_up_proj[e], gate_up, f"{name}.ffn.experts.{e} (gate, up)")
        copy_tensor(
            mlp.experts.down_proj[e], expert.linear2.weight, f"{name}.ffn.experts.{e}.linear2"
        )
