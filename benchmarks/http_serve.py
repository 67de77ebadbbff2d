"""``coursepkg serve`` under load, through OpenAI's own client: N streaming chat requests sent
all at once (continuous batching serves them together) against the same N sent one at a time,
alternated round by round on one server, so machine noise hits both alike.

Reported: completion tokens per second of each and their ratio; each request's latency (request
to last token) and time to its first token, p50 and p99. Wall clock (the client and the server
are two processes). Without ``--checkpoint`` a seeded random chat model is written (rotary
positions, GPT-2's BPE with the chat tokens; ``--size``): throughput does not depend on what the
weights learned, only on their shapes, and every answer runs to ``max_tokens`` (greedy rarely
picks a stop token from random weights; the token counts are reported).

    python benchmarks/http_serve.py --requests 32 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import openai
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coursepkg import DecoderOnlyLM, TransformerConfig  # noqa: E402
from coursepkg.posttrain.trainer import CHAT_BPE, MODEL, chat_tokenizer  # noqa: E402
from coursepkg.serving.http.launch import ServerProcess  # noqa: E402
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


async def one(client: openai.AsyncOpenAI, model: str, i: int, max_tokens: int) -> dict:
    """One streaming request: its latency, time to first token and completion tokens."""
    messages = [{"role": "user", "content": f"Request {i}: tell me " + "more " * (i % 9)}]
    start = time.perf_counter()
    first, pieces = None, 0
    stream = await client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            pieces += 1
    end = time.perf_counter()
    return {"latency": end - start, "ttft": (first or end) - start, "pieces": pieces}


async def round_of(client, model: str, n: int, max_tokens: int, together: bool) -> dict:
    lengths = [max_tokens // 2 + (i * 7) % (max_tokens // 2 + 1) for i in range(n)]
    start = time.perf_counter()
    if together:
        rows = await asyncio.gather(*(one(client, model, i, lengths[i]) for i in range(n)))
    else:
        rows = [await one(client, model, i, lengths[i]) for i in range(n)]
    return {"wall": time.perf_counter() - start, "rows": rows}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def main_async(args: argparse.Namespace, server: ServerProcess) -> None:
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    await round_of(client, server.name, 4, 8, True)  # warm-up: the first calls pay one-off costs
    results: dict[str, list[dict]] = {"one at a time": [], "all at once": []}
    for _ in range(args.rounds):
        for label, together in (("one at a time", False), ("all at once", True)):
            results[label].append(
                await round_of(client, server.name, args.requests, args.max_tokens, together)
            )
    print(
        f"{args.requests} streaming chat requests, max_tokens {args.max_tokens // 2}.."
        f"{args.max_tokens}, {args.rounds} alternated rounds, wall clock"
    )
    tput = {}
    for label, rounds in results.items():
        pieces = sum(r["pieces"] for rd in rounds for r in rd["rows"])
        wall = sum(rd["wall"] for rd in rounds)
        tput[label] = pieces / wall
        lat = [r["latency"] for rd in rounds for r in rd["rows"]]
        ttft = [r["ttft"] for rd in rounds for r in rd["rows"]]
        per_round = ", ".join(f"{rd['wall']:.2f}" for rd in rounds)
        print(
            f"  {label:>13}: {tput[label]:7.1f} tokens/s (rounds {per_round} s); latency p50 "
            f"{pct(lat, 0.5):.3f} s p99 {pct(lat, 0.99):.3f} s; first token p50 "
            f"{pct(ttft, 0.5):.3f} s p99 {pct(ttft, 0.99):.3f} s"
        )
    ratio = tput["all at once"] / tput["one at a time"]
    print(f"  throughput, all at once / one at a time: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a model to serve (default: a random chat model)")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or random_chat_model(Path(tmp), args.size, 512)
        options = ("--max-batch", str(args.max_batch))
        with ServerProcess(checkpoint, *options) as server:
            asyncio.run(main_async(args, server))


if __name__ == "__main__":
    main()
