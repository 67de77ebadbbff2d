"""``coursepkg serve`` under load, through OpenAI's own client: N streaming chat requests sent
all at once (continuous batching serves them together) against the same N sent one at a time,
alternated round by round on one server, so machine noise hits both alike.

Reported (:func:`coursepkg.serving.http.load.measure_serving`): how many greedy answers equal
offline generation; completion tokens per second of each and their ratio; each request's latency
(request to last token) and time to its first text, p50 and p99. Wall clock (the client and the
server are two processes). Without ``--checkpoint`` a seeded random chat model is written (rotary
positions, GPT-2's BPE with the chat tokens; ``--size``): throughput does not depend on what the
weights learned, only on their shapes, and every answer runs to ``max_tokens`` (greedy rarely
picks a stop token from random weights; the token counts are reported).

    python benchmarks/http_serve.py --requests 32 --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coursepkg import DecoderOnlyLM, TransformerConfig  # noqa: E402
from coursepkg.posttrain.trainer import CHAT_BPE, MODEL, chat_tokenizer  # noqa: E402
from coursepkg.serving.http.load import measure_serving  # noqa: E402
from coursepkg.training.checkpoint import save_checkpoint  # noqa: E402

SIZES = {
    "small": dict(d_model=64, n_heads=4, d_ff=256, n_layers=2),
    "medium": dict(d_model=256, n_heads=8, d_ff=1024, n_layers=6),
}


def random_chat_model(folder: Path, size: str, context: int) -> Path:
    """A seeded random chat model in ``coursepkg finetune``'s ``model.pt`` format."""
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=len(chat_tokenizer()),
        dropout=0.0,
        max_len=context,
        norm_first=True,
        positional="rope",
        activation="gelu",
        **SIZES[size],
    )
    identity = {"tokenizer": CHAT_BPE, "config": dataclasses.asdict(config)}
    state = DecoderOnlyLM(config).state_dict()
    save_checkpoint(folder / MODEL, {"identity": identity, "model": state})
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a model to serve (default: a random chat model)")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    prompts = [f"Request {i}: tell me " + "more " * (i % 9) for i in range(args.requests)]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or random_chat_model(Path(tmp), args.size, 512)
        serve = measure_serving(checkpoint, prompts, args.max_tokens, args.rounds)
    print(
        f"{serve['requests']} streaming chat requests (all decoded together), max_tokens "
        f"{serve['max_tokens']}, {serve['completion_tokens']} completion tokens a round, "
        f"{serve['rounds']} alternated rounds, wall clock; greedy answers equal to offline "
        f"generation: {serve['greedy_equal']} of {serve['requests']}"
    )
    for label in ("one at a time", "all at once"):
        f = serve[label]
        print(
            f"  {label:>13}: {f['tokens_per_second']:7.1f} tokens/s; latency p50 "
            f"{f['latency_p50']:.3f} s p99 {f['latency_p99']:.3f} s; first text p50 "
            f"{f['ttft_p50']:.3f} s p99 {f['ttft_p99']:.3f} s"
        )
    print(f"  throughput, all at once / one at a time: {serve['ratio']:.2f}x")


if __name__ == "__main__":
    main()
