"""The catalogue of ex04_encoder: the known mistakes of LayerNorm, the feed-forward network and
the encoder layer's wiring. Each is a wrong forward: a subclass of the correct module written
here (:class:`_Norm`, :class:`_FeedForward`, :class:`_Encoder`, with the reference's parameter
names) that overrides ``forward`` (the evidence: the check builds it with the student's
arguments, gives it the reference's weights, reruns it on the student's inputs and compares
outputs), with its id and the story and advice a student reads when their output matches it.
:func:`coursepkg.grading.framework.analyse_norm` also reads a LayerNorm's mistake from the
student's module itself.

The class names (``LayerNorm_<mistake>``) are what a parameter table shows for a variant.

Dimension legend: B batch, L length, D d_model, H heads, F d_ff.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..framework import BugVariant, HeadsBlock

__all__ = ["BUGS", "ENC_BUGS", "ENC_ITEM", "FFN_BUGS", "FFN_ITEM", "LN_BUGS", "LN_ITEM"]

LN_ITEM = "LayerNorm"
FFN_ITEM = "PositionwiseFeedForward"
ENC_ITEM = "EncoderLayer"

# ---------------------------------------------------------------------------------------------
# Catalogue: LayerNorm and feed-forward
# ---------------------------------------------------------------------------------------------


class _Norm(nn.Module):
    """The correct LayerNorm, with the reference's parameter names; each catalogued LayerNorm
    mistake overrides its forward (or its default eps)."""

    default_eps = 1e-5

    def __init__(self, d_model: int, eps: float | None = None) -> None:
        super().__init__()
        self.eps = self.default_eps if eps is None else eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=False, keepdim=True)  # (..., 1)
        return centred / (var + self.eps).sqrt() * self.weight + self.bias  # (..., D)


class LayerNorm_unbiased_variance(_Norm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=True, keepdim=True)  # (..., 1): divided by D - 1
        return centred / (var + self.eps).sqrt() * self.weight + self.bias


class LayerNorm_eps_outside_sqrt(_Norm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=False, keepdim=True)  # (..., 1)
        return centred / (var.sqrt() + self.eps) * self.weight + self.bias


class LayerNorm_wrong_axis(_Norm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-2, keepdim=True)  # (..., L, D): over the positions
        var = x.var(dim=-2, unbiased=False, keepdim=True)  # (..., 1, D)
        return centred / (var + self.eps).sqrt() * self.weight + self.bias


class LayerNorm_no_affine(_Norm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=False, keepdim=True)  # (..., 1)
        return centred / (var + self.eps).sqrt()  # weight and bias never applied


class LayerNorm_divides_by_variance(_Norm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=False, keepdim=True)  # (..., 1)
        return centred / (var + self.eps) * self.weight + self.bias


class LayerNorm_eps_ignored(_Norm):
    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        var = x.var(dim=-1, unbiased=False, keepdim=True)  # (..., 1)
        return centred / var.sqrt() * self.weight + self.bias


class LayerNorm_default_eps(_Norm):
    default_eps = 1e-12  # BERT's


class _FeedForward(nn.Module):
    """The correct feed-forward network, with the reference's parameter names; each
    catalogued mistake overrides its forward."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.relu(self.linear1(x)))  # (B, L, D)


class PositionwiseFeedForward_no_activation(_FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.linear1(x))  # (B, L, D)


class PositionwiseFeedForward_activation_after_output(_FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.linear2(self.linear1(x)))  # (B, L, D)


class PositionwiseFeedForward_gelu_instead_of_relu(_FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.gelu(self.linear1(x)))  # (B, L, D)


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

# ---------------------------------------------------------------------------------------------
# Catalogue: encoder layer (wiring mistakes, with correct pieces)
# ---------------------------------------------------------------------------------------------


class _Encoder(nn.Module):
    """The paper's post-LN encoder layer built from the correct pieces; each catalogued wiring
    mistake overrides its forward."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.self_attn = HeadsBlock(d_model, n_heads)
        self.ffn = _FeedForward(d_model, d_ff)
        self.norm1 = _Norm(d_model)
        self.norm2 = _Norm(d_model)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        y = self.norm1(x + self.self_attn(x, x, x, mask))  # (B, L, D)
        return self.norm2(y + self.ffn(y))  # (B, L, D)


class EncoderLayer_pre_ln(_Encoder):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, h, mask)  # (B, L, D)
        return x + self.ffn(self.norm2(x))  # (B, L, D)


class EncoderLayer_no_residual_attention(_Encoder):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        y = self.norm1(self.self_attn(x, x, x, mask))  # (B, L, D)
        return self.norm2(y + self.ffn(y))


class EncoderLayer_no_residual_ffn(_Encoder):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        y = self.norm1(x + self.self_attn(x, x, x, mask))  # (B, L, D)
        return self.norm2(self.ffn(y))


class EncoderLayer_ffn_reads_input(_Encoder):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        y = self.norm1(x + self.self_attn(x, x, x, mask))  # (B, L, D)
        return self.norm2(y + self.ffn(x))


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

BUGS: list[BugVariant] = [*LN_BUGS, *FFN_BUGS, *ENC_BUGS]
