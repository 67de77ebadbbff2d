"""Serving a decoder-only model: every sampling filter (equal to ``transformers``' logits
processors), batched prompts with left padding, speculative decoding with a draft model, and
continuous batching over a paged key/value cache.

- :mod:`.sampling`: temperature, top-k, top-p, min-p, repetition penalty; :class:`SamplingParams`.
- :mod:`.generate`: :func:`generate` over the model's public ``forward`` and a cache.
- :mod:`.cache`: a cache that can be cut back (speculative decoding's rejected tokens).
- :mod:`.speculative`: :func:`speculative_generate` (Leviathan et al. 2023, Chen et al. 2023).
- :mod:`.paged`, :mod:`.scheduler`: a block pool with a block table per sequence, and a
  scheduler that admits requests as others finish; :mod:`.packed`: the same scheduler with one
  pass per step (an admitted prompt packed beside the decoding rows), faster on a small model.
- :mod:`.quant`: int8 (per output channel) and int4 (group-wise) weight-only quantization,
  and an int8 key/value cache.

What the serving chapter measures with these (timings, throughput, quantization's bytes and
error) is in :mod:`coursepkg.chapters.serving_measure`.
"""

from .cache import CroppableCache
from .generate import generate
from .packed import PackedBatcher, PackedPagedKVCache
from .paged import BlockTable, PagedKVCache
from .quant import Int8Cache, QuantLinear, quantize_linears, quantized_weight_bytes, weight_bytes
from .sampling import (
    SamplingParams,
    min_p_filter,
    process_logits,
    repetition_penalty,
    sample_token,
    temperature_scale,
    top_k_filter,
    top_p_filter,
)
from .scheduler import ContinuousBatcher, Request, serve_one_at_a_time, serve_static_batches
from .speculative import SpeculativeResult, speculative_generate, verify_drafts

__all__ = [
    "BlockTable",
    "ContinuousBatcher",
    "CroppableCache",
    "Int8Cache",
    "PackedBatcher",
    "PackedPagedKVCache",
    "PagedKVCache",
    "QuantLinear",
    "Request",
    "SpeculativeResult",
    "SamplingParams",
    "generate",
    "min_p_filter",
    "process_logits",
    "quantize_linears",
    "quantized_weight_bytes",
    "repetition_penalty",
    "sample_token",
    "serve_one_at_a_time",
    "serve_static_batches",
    "speculative_generate",
    "temperature_scale",
    "top_k_filter",
    "top_p_filter",
    "verify_drafts",
    "weight_bytes",
]
