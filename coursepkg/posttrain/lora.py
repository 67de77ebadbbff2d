"""LoRA: fine-tuning a low-rank change of chosen weight matrices (Hu et al., 2021).

A linear layer ``y = x W^T + b`` (W of shape out x in) is frozen and learns only a change of rank
r written as a product, ``W + (alpha / r) B A``, with A (r x in) and B (out x r):

    y = x W^T + b + (alpha / r) * dropout(x) A^T B^T

B starts at zero, so the adapted model computes exactly what the pre-trained one does at step 0;
A starts random (as ``nn.Linear`` does), so B's gradient is not zero. A layer trains
r (in + out) numbers instead of in x out. The alpha / r scale keeps the change's size about the
same when r is changed. After training, :meth:`LoRALinear.merge` folds the change into W (no
extra cost at inference) and :meth:`LoRALinear.unmerge` restores W exactly.

The names follow Hugging Face ``peft`` (``lora_A`` and ``lora_B`` hold the weights of its two
``nn.Linear`` layers), so the same numbers give the same outputs (tested).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from ..config import TransformerConfig

__all__ = [
    "LoRALinear",
    "add_lora",
    "lora_modules",
    "lora_parameter_count",
    "merge_lora",
    "unmerge_lora",
]


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank change.

    Args:
        base: the linear layer to adapt (its parameters are frozen).
        r: the rank of the change, >= 1.
        alpha: the change is scaled by ``alpha / r``.
        dropout: dropout on the input of the low-rank path only.

    Parameters ``lora_A`` (r, in), kaiming-uniform like ``nn.Linear``, and ``lora_B`` (out, r),
    zeros; submodule ``base``.

    Shape:
        (..., in) -> (..., out).
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"base must be an nn.Linear, got {type(base).__name__}")
        if not isinstance(r, int) or r < 1:
            raise ValueError(f"r (the rank) must be an integer >= 1, got {r!r}")
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.base = base
        for parameter in base.parameters():
            parameter.requires_grad_(False)
        self.r, self.alpha = r, alpha
        self.scaling = alpha / r
        weight = base.weight
        like = dict(dtype=weight.dtype, device=weight.device)
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, **like))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, **like))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's (and peft's) init
        self.dropout = nn.Dropout(dropout)
        self.merged = False
        self._unmerged_weight: Tensor | None = None

    def delta_weight(self) -> Tensor:
        """The change of W, ``(alpha / r) B A``.

        Shape:
            (out, in).
        """
        return self.scaling * (self.lora_B @ self.lora_A)  # (out, in)

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)  # (..., out)
        if self.merged:  # the change is inside base.weight already
            return y
        h = self.dropout(x) @ self.lora_A.T  # (..., r)
        return y + self.scaling * (h @ self.lora_B.T)  # (..., out)

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the change into ``base.weight`` (forward then costs one matrix product). The
        weight before is kept, so :meth:`unmerge` restores it bit for bit."""
        if self.merged:
            raise RuntimeError("this LoRA layer is merged already")
        self._unmerged_weight = self.base.weight.detach().clone()
        self.base.weight += self.delta_weight().to(self.base.weight.dtype)
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Restore ``base.weight`` as it was before :meth:`merge`."""
        if not self.merged:
            raise RuntimeError("this LoRA layer is not merged")
        self.base.weight.copy_(self._unmerged_weight)
        self._unmerged_weight = None
        self.merged = False

    def extra_repr(self) -> str:
        base = self.base
        return (
            f"in={base.in_features}, out={base.out_features}, r={self.r}, alpha={self.alpha}, "
            f"merged={self.merged}"
        )


def add_lora(
    model: nn.Module,
    targets: Iterable[str] = ("q_proj", "v_proj"),
    r: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
) -> list[str]:
    """Wrap the model's ``nn.Linear`` layers named in ``targets`` in :class:`LoRALinear` and
    freeze every other parameter: only the adapters train.

    Args:
        model: any module (the course's models name their linears ``q_proj k_proj v_proj
            out_proj linear1 linear2 linear3 lm_head``).
        targets: the last part of the names of the layers to adapt (``"q_proj"`` adapts every
            layer's query projection).
        r: the rank.
        alpha: the scale's numerator (the change is scaled by ``alpha / r``).
        dropout: dropout on the adapters' input.

    Returns:
        The full names of the wrapped layers, in the model's order.
    """
    targets = [targets] if isinstance(targets, str) else list(targets)
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets
    ]
    if not found:
        linears = sorted(
            {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        )
        raise ValueError(
            f"targets {targets} name no nn.Linear of the model; its linears: {linears}"
        )
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for name, module in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(module, r, alpha, dropout))
    return [name for name, _ in found]


def lora_modules(model: nn.Module) -> list[LoRALinear]:
    """The :class:`LoRALinear` layers of ``model``, in its order."""
    return [module for module in model.modules() if isinstance(module, LoRALinear)]


def merge_lora(model: nn.Module) -> None:
    """Merge every adapter of ``model`` into its base weight (:meth:`LoRALinear.merge`)."""
    for module in lora_modules(model):
        module.merge()


def unmerge_lora(model: nn.Module) -> None:
    """Undo :func:`merge_lora` exactly (:meth:`LoRALinear.unmerge`)."""
    for module in lora_modules(model):
        module.unmerge()


def lora_parameter_count(config: TransformerConfig, targets: Iterable[str], r: int) -> int:
    """The trainable parameters :func:`add_lora` adds to a
    :class:`~coursepkg.decoder_only.DecoderOnlyLM`, in closed form: r (in + out) per adapted
    matrix.

    Per layer, with H heads, Hkv key/value heads, Dk, Dv, D and F: ``q_proj`` D -> H Dk,
    ``k_proj`` D -> Hkv Dk, ``v_proj`` D -> Hkv Dv, ``out_proj`` H Dv -> D, ``linear1`` (and, gated,
    ``linear3``) D -> F, ``linear2`` F -> D; once for the model, ``lm_head`` D -> V.

    Args:
        config: the model's configuration.
        targets: the adapted layers' names, as given to :func:`add_lora`.
        r: the rank.

    Returns:
        The count.
    """
    d, h, g = config.d_model, config.n_heads, config.kv_heads
    dk, dv, f = config.head_dim_k, config.head_dim_v, config.d_ff
    per_layer = {
        "q_proj": (d, h * dk),
        "k_proj": (d, g * dk),
        "v_proj": (d, g * dv),
        "out_proj": (h * dv, d),
        "linear1": (d, f),
        "linear2": (f, d),
    }
    if config.activation in ("swiglu", "geglu"):
        per_layer["linear3"] = (d, f)
    targets = [targets] if isinstance(targets, str) else list(targets)
    unknown = [t for t in targets if t not in per_layer and t != "lm_head"]
    if unknown:
        raise ValueError(
            f"targets {unknown} are not linears of the model: {[*per_layer, 'lm_head']}"
        )
    total = sum(r * sum(per_layer[t]) for t in targets if t in per_layer) * config.n_layers
    return total + (r * (d + config.vocab_size) if "lm_head" in targets else 0)
