"""Conceptual and architecture diagrams for the book, drawn with matplotlib (no files, no
network). Every function returns a new figure made of labelled boxes, arrows and grids; every
label is plain ASCII text, so the drawing looks the same on any machine.

* :mod:`~coursepkg.diagrams.architecture`: the paper's Figure 1, multi-head attention.
* :mod:`~coursepkg.diagrams.sequences`: the RNN bottleneck, the soft lookup, positional clocks,
  the three masks, teacher forcing, label smoothing (chapters 1-8).
* :mod:`~coursepkg.diagrams.generation`: the beam, the KV cache, BERT's and GPT's attention
  patterns, the residual stream, BPE merges (chapters 9-13).
* :mod:`~coursepkg.diagrams.scaling`: where the parameters are, tiled attention, the sliding
  window, pre- and post-norm, RoPE (chapters 6, 10, 14, 15).
* :mod:`~coursepkg.diagrams.training`: weight tying, data parallelism, the checkpoint (11, 16).
* :mod:`~coursepkg.diagrams.serving`: speculative decoding's rounds, the paged cache's block
  tables (18).
* :mod:`~coursepkg.diagrams.experts`: a token routed through a mixture of experts, latent
  attention's cache (the chapter on experts).
* :mod:`~coursepkg.diagrams.posttraining`: the loss mask over a conversation (the chapter on
  post-training).
* :mod:`~coursepkg.diagrams.parallel`: who holds what under DDP, ZeRO-1 and FSDP; tensor and
  pipeline parallelism (the chapter on training across machines).
"""

from coursepkg.diagrams.architecture import encoder_decoder_diagram, multi_head_diagram
from coursepkg.diagrams.experts import latent_attention_diagram, moe_routing_diagram
from coursepkg.diagrams.generation import (
    attention_patterns_diagram,
    beam_diagram,
    bpe_merge_tree_diagram,
    kv_cache_diagram,
    residual_stream_diagram,
)
from coursepkg.diagrams.parallel import model_parallel_diagram, sharding_diagram
from coursepkg.diagrams.posttraining import loss_mask_diagram
from coursepkg.diagrams.scaling import (
    norm_placement_diagram,
    parameter_map_diagram,
    rope_rotation_diagram,
    sliding_window_diagram,
    tiled_attention_diagram,
)
from coursepkg.diagrams.sequences import (
    bottleneck_diagram,
    label_smoothing_diagram,
    masks_diagram,
    positional_clocks_diagram,
    qkv_lookup_diagram,
    teacher_forcing_diagram,
)
from coursepkg.diagrams.serving import block_table_diagram, speculative_diagram
from coursepkg.diagrams.training import checkpoint_diagram, ddp_diagram, weight_tying_diagram

__all__ = [
    "loss_mask_diagram",
    "model_parallel_diagram",
    "sharding_diagram",
    "block_table_diagram",
    "latent_attention_diagram",
    "moe_routing_diagram",
    "speculative_diagram",
    "checkpoint_diagram",
    "ddp_diagram",
    "weight_tying_diagram",
    "norm_placement_diagram",
    "parameter_map_diagram",
    "rope_rotation_diagram",
    "sliding_window_diagram",
    "tiled_attention_diagram",
    "attention_patterns_diagram",
    "beam_diagram",
    "bpe_merge_tree_diagram",
    "kv_cache_diagram",
    "label_smoothing_diagram",
    "residual_stream_diagram",
    "bottleneck_diagram",
    "encoder_decoder_diagram",
    "masks_diagram",
    "multi_head_diagram",
    "positional_clocks_diagram",
    "qkv_lookup_diagram",
    "teacher_forcing_diagram",
]
