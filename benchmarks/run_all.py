"""Run every benchmark in turn (``make bench``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import attention_at_length  # noqa: E402
import decode_hf  # noqa: E402
import decode_llama  # noqa: E402
import grade_class  # noqa: E402
import kv_cache  # noqa: E402
import serve  # noqa: E402
import tokenizer  # noqa: E402
import train_lm  # noqa: E402
import train_step  # noqa: E402

if __name__ == "__main__":
    print("== training step: reference vs torch.nn.Transformer ==")
    train_step.main([])
    print("\n== coursepkg train's step vs Hugging Face GPT-2 + torch AdamW; DDP vs threads ==")
    train_lm.main([])
    print("\n== attention at length: textbook vs tiled vs fused SDPA vs linear ==")
    attention_at_length.main([])
    print("\n== greedy decoding: KV cache vs recomputation ==")
    kv_cache.main([])
    print("\n== greedy decoding: coursepkg vs Hugging Face transformers, same GPT-2 weights ==")
    decode_hf.main([])
    print("\n== greedy decoding: coursepkg vs transformers, same Llama-shaped weights (GQA) ==")
    decode_llama.main([])
    print("\n== serving: speculative decoding, continuous batching over a paged cache ==")
    serve.main([])
    print("\n== byte-level BPE: coursepkg vs Hugging Face tokenizers and tiktoken, one thread ==")
    tokenizer.main([])
    print("\n== grading a class: coursepkg grade --workers 2 vs sequential nbgrader (~10 min) ==")
    grade_class.main([])
