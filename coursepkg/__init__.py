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

__version__ = "0.1.0"

from .attention import (
    AdditiveAttention,
    MultiHeadAttention,
    attention_fast,
    scaled_dot_product_attention,
)
from .config import HFOptions, TransformerConfig
from .config_groups import LatentConfig, MoEConfig
from .decoding import beam_search, greedy_decode
from .encoder_only import EncoderOnlyLM
from .kv_cache import KVCache
from .layers import DecoderLayer, EncoderLayer, LayerNorm, PositionwiseFeedForward, RMSNorm
from .masks import causal_mask, padding_mask
from .model import Decoder, DecoderOnlyLM, Encoder, EncoderDecoder, Transformer
from .params import count_parameters, parameter_breakdown
from .positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from .schedule import LabelSmoothingLoss, label_smoothed_cross_entropy, noam_lr, noam_scheduler

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
