"""Greedy generation with the KV cache vs recomputing the whole prefix at every step.

Decoder-only model, d=256, 4 layers, 4 heads, 256 new tokens after a 16-token prompt, 2 threads;
both ways timed alternately in one run, and their tokens compared (they must be identical).
Target: the cache is at least 8x faster.

Run: ``.venv/bin/python benchmarks/kv_cache.py [--rounds N] [--batch B]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, median, setup_threads  # noqa: E402

from coursepkg import DecoderOnlyLM, TransformerConfig  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    setup_threads(args.threads)
    prompt_len = 16
    config = TransformerConfig(
        vocab_size=1000,
        d_model=256,
        n_heads=4,
        d_ff=1024,
        n_layers=4,
        dropout=0.0,
        norm_first=True,
        max_len=prompt_len + args.new_tokens,
    )
    torch.manual_seed(0)
    model = DecoderOnlyLM(config).eval()
    prompt = torch.randint(0, config.vocab_size, (args.batch, prompt_len))
    outputs = {}

    def run(use_cache: bool):
        def fn():
            outputs[use_cache] = model.generate(prompt, args.new_tokens, use_cache=use_cache)

        return fn

    times = alternate({"cache": run(True), "recompute": run(False)}, args.rounds, warmup=1)
    same = torch.equal(outputs[True], outputs[False])
    cache_s, recompute_s = median(times["cache"]), median(times["recompute"])
    speedup = recompute_s / cache_s
    print(
        f"decoder-only d=256 L=4, batch {args.batch}, {args.new_tokens} new tokens, "
        f"threads={torch.get_num_threads()}"
    )
    n_tokens = args.new_tokens * args.batch
    print(f"  with KV cache : {cache_s:.3f} s ({n_tokens / cache_s:.0f} tok/s)")
    print(f"  recompute     : {recompute_s:.3f} s ({n_tokens / recompute_s:.0f} tok/s)")
    print(f"  speed-up      : {speedup:.2f}x (target >= 8x); identical tokens: {same}")
    if not same:
        raise SystemExit("KV cache and recomputation produced different tokens")
    return dict(cache_s=cache_s, recompute_s=recompute_s, speedup=speedup, identical=same)


if __name__ == "__main__":
    main()
