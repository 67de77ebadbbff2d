"""The catalogue of ex04_encoder: the known mistakes of LayerNorm, the feed-forward network and
the encoder layer's wiring. Each is a wrong forward: a subclass of the reference
(:class:`~coursepkg.layers.LayerNorm`, :class:`~coursepkg.layers.PositionwiseFeedForward`,
:class:`~coursepkg.layers.EncoderLayer`) that overrides the one step it gets wrong, its forward
or its widths (the evidence: the check builds it with the student's arguments, gives it the
reference's weights, reruns it on the student's inputs and compares outputs), with its id and
the story and advice a student reads when their output matches it. A mistake that leaves out
parameters or fixes a width is named by the parameter count and the student's module's own
behaviour (``shows``), one that calls a built-in by that call (``calls``); those are not built
on the reference, since the tests run them as a student's code and a student's class may not
contain the reference.
:func:`coursepkg.grading.framework.analyse_norm` also reads a LayerNorm's mistake from the
student's module itself.

The class names (``LayerNorm_<mistake>``) are what a parameter table shows for a variant.

Dimension legend: B batch, L length, D d_model, H heads, F d_ff.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...layers import EncoderLayer, LayerNorm, PositionwiseFeedForward
from ..framework import BugVariant, FeedForwardBlock, HeadsBlock, call_student, materialise_lazy

__all__ = ["BUGS", "ENC_BUGS", "ENC_ITEM", "FFN_BUGS", "FFN_ITEM", "LN_BUGS", "LN_ITEM"]

LN_ITEM = "LayerNorm"
FFN_ITEM = "PositionwiseFeedForward"
ENC_ITEM = "EncoderLayer"

# ---------------------------------------------------------------------------------------------
# Catalogue: LayerNorm and feed-forward
# ---------------------------------------------------------------------------------------------


class LayerNorm_unbiased_variance(LayerNorm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=True, keepdim=True)  # (..., 1): divided by D - 1
        return centred / (var + self.eps).sqrt() * self.weight + self.bias


class LayerNorm_eps_outside_sqrt(LayerNorm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=False, keepdim=True)  # (..., 1)
        return centred / (var.sqrt() + self.eps) * self.weight + self.bias


class LayerNorm_wrong_axis(LayerNorm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-2, keepdim=True)  # (..., L, D): over the positions
        var = x.var(dim=-2, unbiased=False, keepdim=True)  # (..., 1, D)
        return centred / (var + self.eps).sqrt() * self.weight + self.bias


class LayerNorm_no_affine(LayerNorm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=False, keepdim=True)  # (..., 1)
        return centred / (var + self.eps).sqrt()  # weight and bias never applied


class LayerNorm_divides_by_variance(LayerNorm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=False, keepdim=True)  # (..., 1)
        return centred / (var + self.eps) * self.weight + self.bias


class LayerNorm_eps_ignored(LayerNorm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=False, keepdim=True)  # (..., 1)
        return centred / var.sqrt() * self.weight + self.bias


class LayerNorm_default_eps(LayerNorm):
    def __init__(self, d_model: int, eps: float = 1e-12) -> None:
        """BERT's default eps in the signature, where the exercise's is 1e-5."""
        super().__init__(d_model, eps)


class PositionwiseFeedForward_no_activation(PositionwiseFeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.linear1(x))  # (B, L, D)


class PositionwiseFeedForward_activation_after_output(PositionwiseFeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.linear2(self.linear1(x)))  # (B, L, D)


class PositionwiseFeedForward_gelu_instead_of_relu(PositionwiseFeedForward):
    def __init__(self, d_model: int, d_ff: int) -> None:
        """GELU between the layers (BERT's, GPT's) where the paper's network uses ReLU."""
        super().__init__(d_model, d_ff, activation="gelu")


class LayerNorm_builtin_module(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        """PyTorch's nn.LayerNorm, wrapped."""
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x)  # (..., D)


class LayerNorm_builtin_function(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        """The parameters written out, the normalisation left to PyTorch's function."""
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)  # (..., D)


class PositionwiseFeedForward_no_bias(PositionwiseFeedForward):
    def __init__(self, d_model: int, d_ff: int) -> None:
        """Both linear layers without biases (bias=False)."""
        super().__init__(d_model, d_ff, bias=False)


class PositionwiseFeedForward_fixed_width_4d(PositionwiseFeedForward):
    def __init__(self, d_model: int, d_ff: int) -> None:
        """A hidden layer of 4 * d_model whatever d_ff says (GPT-2's MLP)."""
        super().__init__(d_model, 4 * d_model)


def feed_forward_without_bias(module: nn.Module, args: tuple[int, ...]) -> bool:
    """Evidence that neither linear layer has a bias, whatever they are called: a zero input
    gives a zero output (a bias b1 would give W2 relu(b1) + b2)."""
    out = call_student(module, torch.zeros(2, 3, args[0]), item=FFN_ITEM)  # (2, 3, D)
    return bool(out.abs().max() <= 1e-6)


def _parameters_for(module: nn.Module, args: tuple[int, ...]) -> int:
    """The parameter count of the student's class built again with ``args`` (lazy
    parameters sized by one forward pass)."""
    other = call_student(type(module), *args, item=FFN_ITEM)
    probe = torch.zeros(1, 2, args[0])  # (1, 2, D)
    materialise_lazy(other, lambda m: call_student(m, probe, item=FFN_ITEM), FFN_ITEM)
    return sum(p.numel() for p in other.parameters())


def feed_forward_ignores_d_ff(module: nn.Module, args: tuple[int, ...]) -> bool:
    """Evidence that the hidden width ignores ``d_ff``: the student's class built with another
    d_ff (or, when it takes no d_ff at all, with d_model alone) has the same number of
    parameters."""
    d, d_ff = args[0], args[1]
    other = d_ff + 1 if d_ff + 1 != 4 * d else d_ff + 2
    mine = sum(p.numel() for p in module.parameters())
    try:
        return _parameters_for(module, (d, other)) == mine
    except Exception:  # noqa: BLE001 - a class without a d_ff argument: build it without
        return _parameters_for(module, (d,)) == mine


LN_BUGS: list[BugVariant] = [
    BugVariant(
        "ln.unbiased_variance",
        LN_ITEM,
        "the variance is the unbiased one (divided by D - 1)",
        "LayerNorm divides by D: use x.var(-1, unbiased=False, keepdim=True) or "
        "((x - mean) ** 2).mean(-1, keepdim=True).",
        LayerNorm_unbiased_variance,
    ),
    BugVariant(
        "ln.eps_outside_sqrt",
        LN_ITEM,
        "eps is added to the standard deviation instead of to the variance inside the square root",
        "Divide by torch.sqrt(var + self.eps), not by torch.sqrt(var) + self.eps.",
        LayerNorm_eps_outside_sqrt,
    ),
    BugVariant(
        "ln.wrong_axis",
        LN_ITEM,
        "the mean and variance are taken over the positions (dim=-2) instead of over the features",
        "Normalise each position over its D features: reduce over dim=-1 with keepdim=True.",
        LayerNorm_wrong_axis,
    ),
    BugVariant(
        "ln.no_affine",
        LN_ITEM,
        "the learned gain (weight) and shift (bias) are never applied",
        "Return normalised * self.weight + self.bias.",
        LayerNorm_no_affine,
    ),
    BugVariant(
        "ln.divides_by_variance",
        LN_ITEM,
        "the centred input is divided by the variance instead of the standard deviation",
        "Divide by the square root: torch.sqrt(var + self.eps).",
        LayerNorm_divides_by_variance,
    ),
]

LN_BUGS += [
    BugVariant(
        "ln.eps_ignored",
        LN_ITEM,
        "eps is never used: the centred input is divided by sqrt(var) alone, so a constant "
        "row divides 0 by 0",
        "Divide by torch.sqrt(var + self.eps), with the eps given to the constructor.",
        LayerNorm_eps_ignored,
    ),
    BugVariant(
        "ln.default_eps",
        LN_ITEM,
        "the default eps is not the exercise's 1e-5 (BERT-style code uses 1e-12, others 1e-6)",
        "Keep the stub's signature: def __init__(self, d_model, eps=1e-5).",
        LayerNorm_default_eps,
    ),
]

LN_BUGS += [
    BugVariant(
        "ln.builtin_module",
        LN_ITEM,
        "your LayerNorm uses PyTorch's nn.LayerNorm, where the exercise asks you to write it",
        "Compute the mean, the biased variance and (x - mean) / sqrt(var + eps) * weight + "
        "bias yourself, with weight and bias as nn.Parameter.",
        LayerNorm_builtin_module,
        calls=(nn.LayerNorm,),
    ),
    BugVariant(
        "ln.builtin_function",
        LN_ITEM,
        "your LayerNorm calls torch.nn.functional.layer_norm, where the exercise asks you to "
        "write the normalisation",
        "Compute the mean, the biased variance and (x - mean) / sqrt(var + eps) yourself.",
        LayerNorm_builtin_function,
        calls=(F.layer_norm, torch.layer_norm),
    ),
]

FFN_BUGS: list[BugVariant] = [
    BugVariant(
        "ffn.no_activation",
        FFN_ITEM,
        "there is no activation between linear1 and linear2, so the network is linear",
        "Apply ReLU to the output of linear1: self.linear2(torch.relu(self.linear1(x))).",
        PositionwiseFeedForward_no_activation,
    ),
    BugVariant(
        "ffn.activation_after_output",
        FFN_ITEM,
        "the ReLU is applied to the output of linear2 instead of between the two layers",
        "Apply ReLU between the layers (to linear1's output) and return linear2's output as "
        "it is: it must be able to go negative.",
        PositionwiseFeedForward_activation_after_output,
    ),
    BugVariant(
        "ffn.gelu_instead_of_relu",
        FFN_ITEM,
        "the activation is GELU, where the paper's network uses ReLU",
        "Use torch.relu (max(0, x)) between the layers.",
        PositionwiseFeedForward_gelu_instead_of_relu,
    ),
]

FFN_BUGS += [
    BugVariant(
        "ffn.no_bias",
        FFN_ITEM,
        "your linear layers have no biases (bias=False): a zero input gives a zero output, and "
        "your network has D + F fewer parameters; this exercise's linear1 and linear2 are "
        "nn.Linear with biases",
        "Build linear1 = nn.Linear(d_model, d_ff) and linear2 = nn.Linear(d_ff, d_model) with "
        "their default bias (drop bias=False).",
        PositionwiseFeedForward_no_bias,
        shows=feed_forward_without_bias,
    ),
    BugVariant(
        "ffn.fixed_width_4d",
        FFN_ITEM,
        "your hidden layer is 4 * d_model wide whatever d_ff is (GPT-2's MLP): built with "
        "another d_ff it has the same number of parameters",
        "Use the d_ff argument: linear1 = nn.Linear(d_model, d_ff), linear2 = "
        "nn.Linear(d_ff, d_model) (the paper's base model has d_ff = 2048 = 4 * 512, but the "
        "check tries other widths).",
        PositionwiseFeedForward_fixed_width_4d,
        shows=feed_forward_ignores_d_ff,
    ),
]

# ---------------------------------------------------------------------------------------------
# Catalogue: encoder layer (wiring mistakes, with correct pieces)
# ---------------------------------------------------------------------------------------------


class EncoderLayer_pre_ln(EncoderLayer):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, h, mask)  # (B, L, D)
        return x + self.ffn(self.norm2(x))  # (B, L, D)


class EncoderLayer_no_residual_attention(EncoderLayer):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        y = self.norm1(self.self_attn(x, x, x, mask))  # (B, L, D)
        return self.norm2(y + self.ffn(y))


class EncoderLayer_no_residual_ffn(EncoderLayer):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        y = self.norm1(x + self.self_attn(x, x, x, mask))  # (B, L, D)
        return self.norm2(self.ffn(y))


class EncoderLayer_ffn_reads_input(EncoderLayer):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        y = self.norm1(x + self.self_attn(x, x, x, mask))  # (B, L, D)
        return self.norm2(y + self.ffn(x))


class EncoderLayer_builtin_encoder_layer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        """PyTorch's nn.TransformerEncoderLayer, wrapped."""
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, 0.0, batch_first=True)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        blocked = None if mask is None else ~mask  # PyTorch's masks: True = blocked
        return self.layer(x, src_mask=blocked)  # (B, L, D)


class _OwnPiecesEncoder(nn.Module):
    """The paper's post-LN layer from pieces written without the reference, the base of the
    mistakes named by a built-in call: the tests run those as a student's code, and a
    student's layer may not contain the reference. Their numbers are never compared."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.self_attn = HeadsBlock(d_model, n_heads)
        self.ffn = FeedForwardBlock(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        y = self.norm1(x + self.self_attn(x, x, x, mask))  # (B, L, D)
        return self.norm2(y + self.ffn(y))  # (B, L, D)


class EncoderLayer_builtin_multihead_attention(_OwnPiecesEncoder):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        """PyTorch's nn.MultiheadAttention as self-attention."""
        super().__init__(d_model, n_heads, d_ff)
        self.self_attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        blocked = None if mask is None else ~mask  # PyTorch's masks: True = blocked
        y = self.norm1(x + self.self_attn(x, x, x, attn_mask=blocked)[0])  # (B, L, D)
        return self.norm2(y + self.ffn(y))  # (B, L, D)


class _FusedHeads(HeadsBlock):
    """Multi-head attention on PyTorch's fused kernel (the built-in of the mistakes below)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, L, Dk)


class EncoderLayer_builtin_sdpa(_OwnPiecesEncoder):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        """Self-attention whose attention step is PyTorch's fused kernel."""
        super().__init__(d_model, n_heads, d_ff)
        self.self_attn = _FusedHeads(d_model, n_heads)


ENC_BUGS: list[BugVariant] = [
    BugVariant(
        "enc.pre_ln",
        ENC_ITEM,
        "your block normalises before each sub-layer (pre-LN, GPT-2's order: "
        "x + sublayer(norm(x))); this exercise asks for the paper's post-LN: "
        "x = LayerNorm(x + sublayer(x))",
        "Normalise after adding the residual: x = norm1(x + self_attn(x, x, x, mask)), then "
        "x = norm2(x + ffn(x)).",
        EncoderLayer_pre_ln,
    ),
    BugVariant(
        "enc.no_residual_attention",
        ENC_ITEM,
        "the residual connection around self-attention is missing",
        "Add the input back before the norm: norm1(x + self_attn(x, x, x, mask)).",
        EncoderLayer_no_residual_attention,
    ),
    BugVariant(
        "enc.no_residual_ffn",
        ENC_ITEM,
        "the residual connection around the feed-forward network is missing",
        "Add the sub-layer's input back before the norm: norm2(x + ffn(x)).",
        EncoderLayer_no_residual_ffn,
    ),
    BugVariant(
        "enc.ffn_reads_layer_input",
        ENC_ITEM,
        "the feed-forward network is applied to the layer's input instead of to the output "
        "of the attention sub-layer",
        "Feed the result of norm1 to the FFN: y = norm1(x + attn); out = norm2(y + ffn(y)).",
        EncoderLayer_ffn_reads_input,
    ),
]

ENC_BUGS += [
    BugVariant(
        "enc.builtin_encoder_layer",
        ENC_ITEM,
        "your EncoderLayer uses PyTorch's nn.TransformerEncoderLayer, where the exercise asks "
        "you to build the layer from your own pieces",
        "Build self_attn, ffn, norm1 and norm2 from your MultiHeadAttention, "
        "PositionwiseFeedForward and LayerNorm, and wire them yourself.",
        EncoderLayer_builtin_encoder_layer,
        calls=(nn.TransformerEncoderLayer,),
    ),
    BugVariant(
        "enc.builtin_multihead_attention",
        ENC_ITEM,
        "your EncoderLayer uses PyTorch's nn.MultiheadAttention, where the exercise asks you "
        "to use your own MultiHeadAttention",
        "Paste your MultiHeadAttention from ex02 and build self_attn from it.",
        EncoderLayer_builtin_multihead_attention,
        calls=(nn.MultiheadAttention,),
    ),
    BugVariant(
        "enc.builtin_sdpa",
        ENC_ITEM,
        "your EncoderLayer's attention calls PyTorch's fused "
        "torch.nn.functional.scaled_dot_product_attention, where the exercise asks for your "
        "own attention step",
        "Paste your MultiHeadAttention from ex02, whose attention you wrote with matmul, "
        "masking and softmax.",
        EncoderLayer_builtin_sdpa,
        calls=(F.scaled_dot_product_attention,),
    ),
]

BUGS: list[BugVariant] = [*LN_BUGS, *FFN_BUGS, *ENC_BUGS]
