"""coursepkg: the reference Transformer of the course, its exercises' stubs and checks.

Dimension legend (used in every shape comment, in the code and in the book):

====  ==========================================
B     batch size (batch first everywhere)
L     query / target length
S     key / source length
H     number of attention heads
D     model width ``d_model``
Dk    per-head query/key size ``d_k``
Dv    per-head value size ``d_v``
F     feed-forward inner width ``d_ff``
V     vocabulary size
====  ==========================================

Mask convention: every mask is boolean and **True means "may attend"** (the meaning used by
:func:`torch.nn.functional.scaled_dot_product_attention`). Beware: ``torch.nn.MultiheadAttention``'s
``attn_mask``/``key_padding_mask`` use the opposite meaning (True = blocked).
"""

from ._lazy import lazy_attributes

__version__ = "0.1.0"

# Every name below is imported when first used (PEP 562), so that `import coursepkg.cli`
# and `coursepkg --help` do not import torch; `from coursepkg import X` works as before.
_HOMES = {
    "AdditiveAttention": ".attention",
    "MultiHeadAttention": ".attention",
    "attention_fast": ".attention",
    "scaled_dot_product_attention": ".attention",
    "HFOptions": ".config",
    "TransformerConfig": ".config",
    "LatentConfig": ".config_groups",
    "MoEConfig": ".config_groups",
    "RopeConfig": ".config_groups",
    "beam_search": ".decoding",
    "greedy_decode": ".decoding",
    "EncoderOnlyLM": ".encoder_only",
    "KVCache": ".kv_cache",
    "DecoderLayer": ".layers",
    "EncoderLayer": ".layers",
    "LayerNorm": ".layers",
    "PositionwiseFeedForward": ".layers",
    "RMSNorm": ".layers",
    "causal_mask": ".masks",
    "padding_mask": ".masks",
    "Decoder": ".model",
    "DecoderOnlyLM": ".decoder_only",
    "Encoder": ".model",
    "EncoderDecoder": ".model",
    "Transformer": ".model",
    "count_parameters": ".params",
    "parameter_breakdown": ".params",
    "LearnedPositionalEmbedding": ".positional",
    "SinusoidalPositionalEncoding": ".positional",
    "sinusoidal_table": ".positional",
    "LabelSmoothingLoss": ".schedule",
    "label_smoothed_cross_entropy": ".schedule",
    "noam_lr": ".schedule",
    "noam_scheduler": ".schedule",
}


__all__ = [
    "AdditiveAttention",
    "Decoder",
    "DecoderLayer",
    "DecoderOnlyLM",
    "Encoder",
    "EncoderDecoder",
    "EncoderLayer",
    "EncoderOnlyLM",
    "HFOptions",
    "KVCache",
    "LabelSmoothingLoss",
    "LatentConfig",
    "LayerNorm",
    "RMSNorm",
    "RopeConfig",
    "LearnedPositionalEmbedding",
    "MoEConfig",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "SinusoidalPositionalEncoding",
    "Transformer",
    "TransformerConfig",
    "attention_fast",
    "beam_search",
    "causal_mask",
    "count_parameters",
    "greedy_decode",
    "label_smoothed_cross_entropy",
    "noam_lr",
    "noam_scheduler",
    "padding_mask",
    "parameter_breakdown",
    "scaled_dot_product_attention",
    "sinusoidal_table",
]


# Each name imported from its module on first use; a submodule's name imports the submodule
# (``coursepkg.model_parts.TokenEmbedding`` after ``import coursepkg``, as before).
__getattr__ = lazy_attributes(__name__, _HOMES, globals(), submodules=True)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
