"""The catalogue of ex04_encoder: the known mistakes of LayerNorm, the feed-forward network and
the encoder layer's wiring, each a runnable variant with the advice a student gets when their
output matches it (:func:`coursepkg.grading.framework.analyse_norm` recognises a LayerNorm's
mistake from the module itself).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..framework import BugVariant, HeadsBlock

LN = "LayerNorm"
FFN = "PositionwiseFeedForward"
ENC = "EncoderLayer"
# ---------------------------------------------------------------------------------------------
# Catalogue: LayerNorm and feed-forward
# ---------------------------------------------------------------------------------------------


class _NormVariant(nn.Module):
    """LayerNorm with switches (class attributes) for the catalogued mistakes; the defaults
    are the correct computation."""

    unbiased = False
    eps_outside_sqrt = False
    eps_ignored = False
    default_eps = 1e-5
    axis = -1
    affine = True
    divide_by_variance = False

    def __init__(self, d_model: int, eps: float | None = None) -> None:
        super().__init__()
        self.eps = self.default_eps if eps is None else eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=self.axis, keepdim=True)  # (..., D)
        var = x.var(dim=self.axis, unbiased=self.unbiased, keepdim=True)  # (..., 1)
        if self.divide_by_variance:
            y = centred / (var + self.eps)
        elif self.eps_ignored:
            y = centred / var.sqrt()
        elif self.eps_outside_sqrt:
            y = centred / (var.sqrt() + self.eps)
        else:
            y = centred / (var + self.eps).sqrt()
        return y * self.weight + self.bias if self.affine else y


class _FeedForwardVariant(nn.Module):
    """The feed-forward network with a switch for where (and which) activation is applied."""

    activation = "relu"  # "none", "gelu", or "output" (ReLU after linear2 instead of between)

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.linear1(x)  # (B, L, F)
        if self.activation == "relu":
            hidden = F.relu(hidden)
        elif self.activation == "gelu":
            hidden = F.gelu(hidden)
        out = self.linear2(hidden)  # (B, L, D)
        return F.relu(out) if self.activation == "output" else out


def _variant(base: type, name: str, **switches: Any) -> type:
    return type(f"{base.__name__.strip('_')}_{name}", (base,), switches)


LN_BUGS: list[BugVariant] = [
    BugVariant(
        "ln.unbiased_variance",
        LN,
        "the variance is the unbiased one (divided by D - 1)",
        "LayerNorm divides by D: use x.var(-1, unbiased=False, keepdim=True) or "
        "((x - mean) ** 2).mean(-1, keepdim=True).",
        _variant(_NormVariant, "unbiased_variance", unbiased=True),
    ),
    BugVariant(
        "ln.eps_outside_sqrt",
        LN,
        "eps is added to the standard deviation instead of to the variance inside the square root",
        "Divide by torch.sqrt(var + self.eps), not by torch.sqrt(var) + self.eps.",
        _variant(_NormVariant, "eps_outside_sqrt", eps_outside_sqrt=True),
    ),
    BugVariant(
        "ln.wrong_axis",
        LN,
        "the mean and variance are taken over the positions (dim=-2) instead of over the features",
        "Normalise each position over its D features: reduce over dim=-1 with keepdim=True.",
        _variant(_NormVariant, "wrong_axis", axis=-2),
    ),
    BugVariant(
        "ln.no_affine",
        LN,
        "the learned gain (weight) and shift (bias) are never applied",
        "Return normalised * self.weight + self.bias.",
        _variant(_NormVariant, "no_affine", affine=False),
    ),
    BugVariant(
        "ln.divides_by_variance",
        LN,
        "the centred input is divided by the variance instead of the standard deviation",
        "Divide by the square root: torch.sqrt(var + self.eps).",
        _variant(_NormVariant, "divides_by_variance", divide_by_variance=True),
    ),
]

LN_BUGS += [
    BugVariant(
        "ln.eps_ignored",
        LN,
        "eps is never used: the centred input is divided by sqrt(var) alone, so a constant "
        "row divides 0 by 0",
        "Divide by torch.sqrt(var + self.eps), with the eps given to the constructor.",
        _variant(_NormVariant, "eps_ignored", eps_ignored=True),
    ),
    BugVariant(
        "ln.default_eps",
        LN,
        "the default eps is not the exercise's 1e-5 (BERT-style code uses 1e-12, others 1e-6)",
        "Keep the stub's signature: def __init__(self, d_model, eps=1e-5).",
        _variant(_NormVariant, "default_eps", default_eps=1e-12),
    ),
]

FFN_BUGS: list[BugVariant] = [
    BugVariant(
        "ffn.no_activation",
        FFN,
        "there is no activation between linear1 and linear2, so the network is linear",
        "Apply ReLU to the output of linear1: self.linear2(torch.relu(self.linear1(x))).",
        _variant(_FeedForwardVariant, "no_activation", activation="none"),
    ),
    BugVariant(
        "ffn.activation_after_output",
        FFN,
        "the ReLU is applied to the output of linear2 instead of between the two layers",
        "Apply ReLU between the layers (to linear1's output) and return linear2's output as "
        "it is: it must be able to go negative.",
        _variant(_FeedForwardVariant, "activation_after_output", activation="output"),
    ),
    BugVariant(
        "ffn.gelu_instead_of_relu",
        FFN,
        "the activation is GELU, where the paper's network uses ReLU",
        "Use torch.relu (max(0, x)) between the layers.",
        _variant(_FeedForwardVariant, "gelu_instead_of_relu", activation="gelu"),
    ),
]

# ---------------------------------------------------------------------------------------------
# Catalogue: encoder layer (wiring mistakes, with correct pieces)
# ---------------------------------------------------------------------------------------------


class _EncoderVariant(nn.Module):
    """An encoder layer with a switch for its wiring; the default is the paper's post-LN."""

    wiring = "post_ln"  # "pre_ln", "no_residual_attention", "no_residual_ffn", "ffn_reads_input"

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.self_attn = HeadsBlock(d_model, n_heads)
        self.ffn = _FeedForwardVariant(d_model, d_ff)
        self.norm1 = _NormVariant(d_model)
        self.norm2 = _NormVariant(d_model)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.wiring == "pre_ln":
            h = self.norm1(x)
            x = x + self.self_attn(h, h, h, mask)  # (B, L, D)
            return x + self.ffn(self.norm2(x))  # (B, L, D)
        attended = self.self_attn(x, x, x, mask)  # (B, L, D)
        if self.wiring == "no_residual_attention":
            y = self.norm1(attended)
        else:
            y = self.norm1(x + attended)  # (B, L, D)
        if self.wiring == "no_residual_ffn":
            return self.norm2(self.ffn(y))
        if self.wiring == "ffn_reads_input":
            return self.norm2(y + self.ffn(x))
        return self.norm2(y + self.ffn(y))  # (B, L, D)


ENCODER_BUGS: list[BugVariant] = [
    BugVariant(
        "enc.pre_ln",
        ENC,
        "the layer is pre-LN (x + sublayer(norm(x))) instead of the paper's post-LN",
        "Normalise after adding the residual: x = norm1(x + self_attn(x, x, x, mask)), then "
        "x = norm2(x + ffn(x)).",
        _variant(_EncoderVariant, "pre_ln", wiring="pre_ln"),
    ),
    BugVariant(
        "enc.no_residual_attention",
        ENC,
        "the residual connection around self-attention is missing",
        "Add the input back before the norm: norm1(x + self_attn(x, x, x, mask)).",
        _variant(_EncoderVariant, "no_residual_attention", wiring="no_residual_attention"),
    ),
    BugVariant(
        "enc.no_residual_ffn",
        ENC,
        "the residual connection around the feed-forward network is missing",
        "Add the sub-layer's input back before the norm: norm2(x + ffn(x)).",
        _variant(_EncoderVariant, "no_residual_ffn", wiring="no_residual_ffn"),
    ),
    BugVariant(
        "enc.ffn_reads_layer_input",
        ENC,
        "the feed-forward network is applied to the layer's input instead of to the output "
        "of the attention sub-layer",
        "Feed the result of norm1 to the FFN: y = norm1(x + attn); out = norm2(y + ffn(y)).",
        _variant(_EncoderVariant, "ffn_reads_input", wiring="ffn_reads_input"),
    ),
]
