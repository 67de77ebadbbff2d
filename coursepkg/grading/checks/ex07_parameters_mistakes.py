"""The catalogue of ex07_parameters: the known mistakes of the closed-form parameter count.
Each is a wrong function with the stub's signature, the reference count moved by what the
mistake adds or drops (the evidence: the check computes its gaps from the reference over every
configuration and compares them with the student's), its id, and the story and advice a
student reads when the student's gaps match it.

Dimension legend: V vocabulary, D d_model, H heads, Dk/Dv per-head sizes, F d_ff.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ...config import TransformerConfig
from ...params import (
    attention_parameters,
    count_parameters,
    feed_forward_parameters,
    layer_norm_parameters,
)
from ..framework import BugVariant

__all__ = [
    "BUGS",
    "DEFAULTS",
    "PARAMETER_COUNT_BUGS",
    "PARAMETER_COUNT_ITEM",
    "POSITIONAL",
    "call_kwargs",
    "reference_config",
]

PARAMETER_COUNT_ITEM = "transformer_parameter_count"

#: The stub's positional arguments, and the defaults of its keyword arguments.
POSITIONAL = ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers")
DEFAULTS: dict[str, Any] = {
    "n_decoder_layers": None,
    "d_k": None,
    "d_v": None,
    "src_vocab_size": None,
    "share_embeddings": True,
    "tie_embeddings": True,
    "bias": True,
    "final_norm": False,
}


def reference_config(kw: dict[str, Any]) -> TransformerConfig:
    """The reference configuration of the stub's arguments (sinusoidal positions: no
    parameters)."""
    return TransformerConfig(
        vocab_size=kw["vocab_size"],
        d_model=kw["d_model"],
        n_heads=kw["n_heads"],
        d_ff=kw["d_ff"],
        n_layers=kw["n_layers"],
        n_decoder_layers=kw.get("n_decoder_layers"),
        d_k=kw.get("d_k"),
        d_v=kw.get("d_v"),
        src_vocab_size=kw.get("src_vocab_size"),
        share_embeddings=kw.get("share_embeddings", True),
        tie_embeddings=kw.get("tie_embeddings", True),
        bias=kw.get("bias", True),
        final_norm=kw.get("final_norm", False),
        positional="sinusoidal",
    )


# ---------------------------------------------------------------------------------------------
# The wrong functions: the reference count moved by what the mistake adds or drops (no second
# solution here)
# ---------------------------------------------------------------------------------------------


def call_kwargs(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The stub's arguments, positional and keyword, as one dict with the defaults filled in."""
    return {**DEFAULTS, **dict(zip(POSITIONAL, args, strict=False)), **kwargs}


def _mistake(delta: Callable[[TransformerConfig], int]) -> Callable[..., int]:
    """A buggy count: the reference count plus ``delta(config)``."""

    def count(*args: Any, **kwargs: Any) -> int:
        c = reference_config(call_kwargs(args, kwargs))
        return count_parameters(c) + delta(c)

    return count


def _biases(c: TransformerConfig) -> int:
    if not c.bias:
        return 0
    d, h, dk, dv, f = c.d_model, c.n_heads, c.head_dim_k, c.head_dim_v, c.d_ff
    blocks = c.n_layers + 2 * c.decoder_layers
    return blocks * (2 * h * dk + h * dv + d) + (c.n_layers + c.decoder_layers) * (f + d)


def _n_norms(c: TransformerConfig) -> int:
    return 2 * c.n_layers + 3 * c.decoder_layers + (2 if c.use_final_norm else 0)


def _value_size_uses_dk(c: TransformerConfig) -> int:
    blocks = c.n_layers + 2 * c.decoder_layers
    h, d = c.n_heads, c.d_model
    per_width = 2 * d + (1 if c.bias else 0)  # W^V column + W^O row (+ a W^V bias entry)
    return blocks * h * (c.head_dim_k - c.head_dim_v) * per_width


_no_biases = _mistake(lambda c: -_biases(c))
_no_layer_norms = _mistake(lambda c: -_n_norms(c) * layer_norm_parameters(c))
_norm_gain_only = _mistake(lambda c: -_n_norms(c) * c.d_model if c.bias else 0)
_tied_counted_twice = _mistake(lambda c: c.vocab_size * c.d_model if c.tie_embeddings else 0)
_shared_counted_twice = _mistake(lambda c: c.vocab_size * c.d_model if c.share_embeddings else 0)
_two_norms_per_decoder_layer = _mistake(lambda c: -c.decoder_layers * layer_norm_parameters(c))
_no_cross_attention = _mistake(lambda c: -c.decoder_layers * attention_parameters(c))
_value_uses_dk = _mistake(_value_size_uses_dk)
_decoder_layers_ignored = _mistake(
    lambda c: (
        (c.n_layers - c.decoder_layers)
        * (2 * attention_parameters(c) + feed_forward_parameters(c) + 3 * layer_norm_parameters(c))
    )
)
_final_norm_ignored = _mistake(lambda c: -2 * layer_norm_parameters(c) if c.use_final_norm else 0)
_output_bias = _mistake(lambda c: c.vocab_size)
_untied_counted_once = _mistake(
    lambda c: (
        -c.vocab_size * c.d_model if not c.share_embeddings and not c.separate_vocabularies else 0
    )
)


def _builds_torch_transformer(*args: Any, **kwargs: Any) -> int:
    """PyTorch's nn.Transformer built (on the meta device, so nothing is allocated) and its
    parameters counted, plus the embeddings it lacks."""
    c = reference_config(call_kwargs(args, kwargs))
    model = nn.Transformer(
        c.d_model,
        c.n_heads,
        c.n_layers,
        c.decoder_layers,
        c.d_ff,
        batch_first=True,
        device="meta",
    )
    return sum(p.numel() for p in model.parameters()) + c.vocab_size * c.d_model


PARAMETER_COUNT_BUGS: list[BugVariant] = [
    BugVariant(
        id="parameter_count.no_biases",
        item=PARAMETER_COUNT_ITEM,
        description="the linear layers' biases are missing",
        advice="With bias=True every linear layer has a bias of its output size: "
        "2·H·Dk + H·Dv + D per attention block and F + D per feed-forward network.",
        impl=_no_biases,
    ),
    BugVariant(
        id="parameter_count.no_layer_norms",
        item=PARAMETER_COUNT_ITEM,
        description="the LayerNorms are missing",
        advice="Each LayerNorm has a gain and a shift of D each (2·D, or D with bias=False): "
        "2 per encoder layer, 3 per decoder layer, plus one per stack with final_norm.",
        impl=_no_layer_norms,
    ),
    BugVariant(
        id="parameter_count.norm_gain_only",
        item=PARAMETER_COUNT_ITEM,
        description="each LayerNorm is counted with its gain only (D instead of 2·D)",
        advice="A LayerNorm has a gain and a shift (bias), D each; only with bias=False does it "
        "keep the gain alone.",
        impl=_norm_gain_only,
    ),
    BugVariant(
        id="parameter_count.tied_counted_twice",
        item=PARAMETER_COUNT_ITEM,
        description="the output projection is counted although it is tied to the target embedding",
        advice="With tie_embeddings=True the output projection reuses the target embedding "
        "matrix: count that V·D matrix once.",
        impl=_tied_counted_twice,
    ),
    BugVariant(
        id="parameter_count.shared_counted_twice",
        item=PARAMETER_COUNT_ITEM,
        description="the source and target embeddings are counted separately although they "
        "are shared",
        advice="With share_embeddings=True the source and the target use one V·D matrix: "
        "count it once.",
        impl=_shared_counted_twice,
    ),
    BugVariant(
        id="parameter_count.two_norms_per_decoder_layer",
        item=PARAMETER_COUNT_ITEM,
        description="each decoder layer is counted with two LayerNorms instead of three",
        advice="A decoder layer has three sub-layers (self-attention, cross-attention, "
        "feed-forward), each followed by its own LayerNorm.",
        impl=_two_norms_per_decoder_layer,
    ),
    BugVariant(
        id="parameter_count.no_cross_attention",
        item=PARAMETER_COUNT_ITEM,
        description="the decoder's cross-attention blocks are missing",
        advice="Each decoder layer has two attention blocks: masked self-attention and "
        "cross-attention over the encoder output.",
        impl=_no_cross_attention,
    ),
    BugVariant(
        id="parameter_count.value_size_uses_dk",
        item=PARAMETER_COUNT_ITEM,
        description="W^V and W^O are sized with Dk instead of Dv",
        advice="W^V is D x H·Dv and W^O is H·Dv x D; only W^Q and W^K use Dk.",
        impl=_value_uses_dk,
    ),
    BugVariant(
        id="parameter_count.decoder_layers_ignored",
        item=PARAMETER_COUNT_ITEM,
        description="the decoder is counted with n_layers layers, ignoring n_decoder_layers",
        advice="Use n_decoder_layers for the decoder when it is given (None means n_layers).",
        impl=_decoder_layers_ignored,
    ),
    BugVariant(
        id="parameter_count.final_norm_ignored",
        item=PARAMETER_COUNT_ITEM,
        description="the final LayerNorms (final_norm=True) are not counted",
        advice="With final_norm=True each stack ends with one more LayerNorm: add 2 of them.",
        impl=_final_norm_ignored,
    ),
    BugVariant(
        id="parameter_count.output_bias",
        item=PARAMETER_COUNT_ITEM,
        description="the output projection is counted with a bias (V more parameters), "
        "which the model does not have",
        advice="The output projection D -> V has no bias (nn.Linear(d_model, vocab_size, "
        "bias=False)), whether or not it is tied: drop the + V.",
        impl=_output_bias,
    ),
    BugVariant(
        id="parameter_count.untied_embeddings_counted_once",
        item=PARAMETER_COUNT_ITEM,
        description="with share_embeddings=False the source and target embeddings are two "
        "matrices even when the vocabularies have the same size, but only one is counted",
        advice="Count V_src·D for the source embedding and V·D for the target one unless "
        "share_embeddings=True.",
        impl=_untied_counted_once,
    ),
]

PARAMETER_COUNT_BUGS.append(
    BugVariant(
        id="parameter_count.builds_torch_transformer",
        item=PARAMETER_COUNT_ITEM,
        description="your function builds torch.nn.Transformer and counts its parameters, where "
        "the exercise asks for the count from the formulas",
        advice="Add up the closed-form counts: embeddings, per layer 4 attention projections, "
        "the feed-forward network and the LayerNorms, with the options (biases, d_k, d_v, "
        "tying) as arguments.",
        impl=_builds_torch_transformer,
        calls=(nn.Transformer.__init__,),
    )
)

BUGS: list[BugVariant] = [*PARAMETER_COUNT_BUGS]
