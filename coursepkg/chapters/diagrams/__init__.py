"""Conceptual and architecture diagrams for the book, drawn with matplotlib (no files, no
network). Every function returns a new figure made of labelled boxes, arrows and grids; every
label is plain ASCII text, so the drawing looks the same on any machine.

* :mod:`~coursepkg.chapters.diagrams.architecture`: the paper's Figure 1, multi-head attention.
* :mod:`~coursepkg.chapters.diagrams.blocks`: the recurrence and its gradient path, additive
  attention, attention's projections and products, heads, where positions enter, the FFN and the
  encoder layer (chapters 1-6).
* :mod:`~coursepkg.chapters.diagrams.sequences`: the RNN bottleneck, the soft lookup, positional
  clocks, the three masks, teacher forcing, label smoothing (chapters 1-8).
* :mod:`~coursepkg.chapters.diagrams.generation`: the beam, the KV cache, BERT's and GPT's attention
  patterns, the residual stream, BPE merges (chapters 9-13).
* :mod:`~coursepkg.chapters.diagrams.scaling`: where the parameters are, tiled attention, the
  sliding window, pre- and post-norm, RoPE (chapters 6, 10, 14, 15).
* :mod:`~coursepkg.chapters.diagrams.training`: weight tying, data parallelism, the checkpoint
  (11, 16).
* :mod:`~coursepkg.chapters.diagrams.models`: how the trained models are fed, stacked, read and
  trained: a training step, shifted targets, greedy's trap, BERT's corruption, the GPT stack, the
  logit lens, the FFN as a memory, routed compute, DPO's pair (chapters 8-20);
  :mod:`~coursepkg.chapters.diagrams.costs`: FLOPs and bytes per parameter, gradient accumulation,
  linear attention's state; :mod:`~coursepkg.chapters.diagrams.tokens`: pre-tokens and bytes (14).
* :mod:`~coursepkg.chapters.diagrams.serving`: speculative decoding's rounds, the paged cache's
  block tables (18).
* :mod:`~coursepkg.chapters.diagrams.experts`: a token routed through a mixture of experts, latent
  attention's cache (the chapter on experts).
* :mod:`~coursepkg.chapters.diagrams.posttraining`: the loss mask over a conversation (the chapter
  on post-training).
* :mod:`~coursepkg.chapters.diagrams.parallel`: who holds what under DDP, ZeRO-1 and FSDP; tensor
  and pipeline parallelism (the chapter on training across machines).
* :mod:`~coursepkg.chapters.diagrams.data`: LSH's bands over two MinHash signatures (the chapter
  on data and scale).
"""

from coursepkg.chapters.diagrams.architecture import (
    encoder_decoder_diagram,
    gqa_grouping_diagram,
    multi_head_diagram,
)
from coursepkg.chapters.diagrams.blocks import (
    additive_score_diagram,
    attention_decoder_step_diagram,
    attention_products_diagram,
    encoder_layer_diagram,
    feed_forward_diagram,
    gradient_path_diagram,
    head_parameters_diagram,
    positions_enter_diagram,
    qkv_projection_diagram,
    recurrence_diagram,
    shift_rotation_diagram,
    split_heads_diagram,
)
from coursepkg.chapters.diagrams.costs import (
    flops_per_weight_diagram,
    grad_accumulation_diagram,
    linear_attention_state_diagram,
    memory_per_parameter_diagram,
)
from coursepkg.chapters.diagrams.data import lsh_bands_diagram
from coursepkg.chapters.diagrams.experts import latent_attention_diagram, moe_routing_diagram
from coursepkg.chapters.diagrams.generation import (
    attention_patterns_diagram,
    beam_diagram,
    bert_embeddings_diagram,
    bpe_merge_tree_diagram,
    kv_cache_diagram,
    residual_stream_diagram,
)
from coursepkg.chapters.diagrams.models import (
    dense_vs_routed_diagram,
    dpo_pair_diagram,
    ffn_memory_diagram,
    gpt_stack_diagram,
    greedy_trap_diagram,
    logit_lens_diagram,
    mlm_corruption_diagram,
    next_token_diagram,
    shifted_targets_diagram,
    training_step_diagram,
)
from coursepkg.chapters.diagrams.parallel import (
    model_parallel_diagram,
    ring_allreduce_diagram,
    sharding_diagram,
)
from coursepkg.chapters.diagrams.posttraining import lora_diagram, loss_mask_diagram
from coursepkg.chapters.diagrams.scaling import (
    norm_placement_diagram,
    parameter_map_diagram,
    rope_rotation_diagram,
    sliding_window_diagram,
    tiled_attention_diagram,
)
from coursepkg.chapters.diagrams.sequences import (
    bottleneck_diagram,
    label_smoothing_diagram,
    masks_diagram,
    positional_clocks_diagram,
    qkv_lookup_diagram,
    teacher_forcing_diagram,
)
from coursepkg.chapters.diagrams.serving import (
    block_table_diagram,
    packed_mask_diagram,
    speculative_diagram,
)
from coursepkg.chapters.diagrams.tokens import bytes_diagram, pretokens_diagram
from coursepkg.chapters.diagrams.training import (
    checkpoint_diagram,
    ddp_diagram,
    weight_tying_diagram,
)

__all__ = [
    "bytes_diagram",
    "dense_vs_routed_diagram",
    "dpo_pair_diagram",
    "ffn_memory_diagram",
    "flops_per_weight_diagram",
    "gpt_stack_diagram",
    "grad_accumulation_diagram",
    "greedy_trap_diagram",
    "linear_attention_state_diagram",
    "logit_lens_diagram",
    "memory_per_parameter_diagram",
    "mlm_corruption_diagram",
    "next_token_diagram",
    "pretokens_diagram",
    "shifted_targets_diagram",
    "training_step_diagram",
    "additive_score_diagram",
    "attention_decoder_step_diagram",
    "attention_products_diagram",
    "encoder_layer_diagram",
    "feed_forward_diagram",
    "gradient_path_diagram",
    "head_parameters_diagram",
    "positions_enter_diagram",
    "qkv_projection_diagram",
    "recurrence_diagram",
    "shift_rotation_diagram",
    "split_heads_diagram",
    "bert_embeddings_diagram",
    "gqa_grouping_diagram",
    "lora_diagram",
    "packed_mask_diagram",
    "ring_allreduce_diagram",
    "loss_mask_diagram",
    "model_parallel_diagram",
    "sharding_diagram",
    "block_table_diagram",
    "latent_attention_diagram",
    "lsh_bands_diagram",
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
