"""Batch-1 decoding against the memory wall: a roofline for the GPT-2-small shape.

Batch-1 decoding reads every weight once per token and does two FLOPs per weight read (one
multiply-add), an arithmetic intensity of 0.5 FLOP/byte in fp32: far below what the CPU's
arithmetic could sustain, so its speed limit is memory bandwidth. This measures, in one run:

* the machine's memory bandwidth, STREAM's copy: ``dst.copy_(src)`` of two ``--mib`` MiB fp32
  tensors (larger than the L3 cache), counted as 2 x the size (read + write), best of rounds;
* the fp32 matmul peak (``common.matmul_peak_flops``), the roof's flat part;
* coursepkg's ``DecoderOnlyLM`` of GPT-2 small's shape (12 layers, D=768, 12 heads, F=3072,
  V=50,257, tied head; random weights from ``transformers.GPT2Config()``, nothing downloaded)
  decoding one token at a time from a KV cache holding ``--context`` positions, in fp32 and in
  bf16: the time per token (best of rounds of ``--steps`` steps), the bytes a token must read
  (every weight, the tied embedding once as the output layer, one position row, and the cache's
  keys and values: 2 x layers x S x D elements) and the share of the measured bandwidth those
  bytes per second reach (target >= 50% in fp32);
* the same step at batch 4 and 16 (fp32, ``--batches``): the weights are read once per step
  for all rows, so the intensity grows with the batch and the step moves from the bandwidth
  roof towards the arithmetic one.

Writes the roofline (intensity against attained FLOP/s, log-log) to ``--png``.
Threads: ``--threads`` (2 by default, this machine's cores). Clock: wall time (a bandwidth
needs it), so a loaded machine lowers both sides of the share alike only roughly: run it quiet.

Run: ``.venv/bin/python benchmarks/decode_roofline.py [--rounds N] [--png PATH]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import matmul_peak_flops, setup_threads  # noqa: E402


def stream_copy_bandwidth(mib: int, rounds: int) -> float:
    """Bytes per second of ``dst.copy_(src)``, counted as read + write (STREAM's copy)."""
    src = torch.randn(mib * 2**18)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages once
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / best


def gpt2_small():
    import transformers

    from coursepkg.interop import from_hf_gpt2

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    return from_hf_gpt2(transformers.GPT2LMHeadModel(transformers.GPT2Config())).eval()


def step_cost(lm, batch: int, context: int) -> tuple[float, float]:
    """(bytes read, FLOPs) of one decoding step of ``batch`` rows at ``context`` cached positions:
    the weights once (the position table one row a row), the cache's keys and values per row,
    2 FLOPs per weight and row, and attention's 2 x 2 x S x D per layer and row."""
    cfg = lm.config
    e = next(lm.parameters()).element_size()
    positions = lm.positions.weight
    weights = sum(p.numel() for p in lm.parameters()) - positions.numel() + batch * cfg.d_model
    cache = 2 * cfg.n_layers * context * cfg.d_model * batch
    matmul = sum(
        p.numel() for n, p in lm.named_parameters() if p.dim() == 2 and "positions" not in n
    )
    flops = 2 * matmul * batch + 4 * cfg.n_layers * context * cfg.d_model * batch
    return float((weights + cache) * e), float(flops)


def seconds_per_step(lm, batch: int, context: int, steps: int, rounds: int) -> float:
    """Best over ``rounds`` of the mean time of ``steps`` one-token steps, after one
    ``context``-token prompt per row fills the cache (the rounds follow one another, so the
    cache grows by ``steps`` a round)."""
    prompt = torch.randint(0, lm.config.vocab_size, (batch, context))
    best = float("inf")
    with torch.inference_mode():
        cache = lm.new_cache(capacity=context + rounds * steps)
        token = lm(prompt, cache=cache)[:, -1:].argmax(-1)  # (B, 1)
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(steps):
                token = lm(token, cache=cache)[:, -1:].argmax(-1)  # (B, 1)
            best = min(best, (time.perf_counter() - start) / steps)
    return best


def draw(path: Path, bandwidth: float, peak: float, points: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ridge = peak / bandwidth
    xs = [0.05, ridge, max(1000.0, 10 * ridge)]
    roof = f"roof: {bandwidth / 1e9:.1f} GB/s copy, {peak / 1e9:.0f} GFLOP/s matmul"
    ax.loglog(xs, [min(peak, bandwidth * x) for x in xs], color="black", lw=1.5, label=roof)
    for p in points:
        ax.loglog(p["intensity"], p["flops_per_s"], p["marker"], color=p["color"], ms=8,
                  label=p["label"])  # fmt: skip
    ax.set_xlabel("arithmetic intensity (FLOP per byte read)")
    ax.set_ylabel("attained FLOP/s")
    ax.set_title("Decoding GPT-2 small on this CPU, under the roofline")
    ax.legend(fontsize=9, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="*", default=[4, 16])
    parser.add_argument(
        "--png", type=Path, default=Path(__file__).parent / "figures" / "decode_roofline.png"
    )
    args = parser.parse_args(argv)
    setup_threads(args.threads)
    bandwidth = stream_copy_bandwidth(args.mib, args.rounds + 2)
    peak = matmul_peak_flops()
    print(f"STREAM copy ({args.mib} MiB x 2): {bandwidth / 1e9:.2f} GB/s; "
          f"fp32 matmul peak {peak / 1e9:.1f} GFLOP/s; {args.threads} threads")  # fmt: skip
    lm = gpt2_small()
    out, points = {"bandwidth": bandwidth, "peak_flops": peak}, []
    runs = [("fp32", torch.float32, b) for b in [1, *args.batches]]
    runs.append(("bf16", torch.bfloat16, 1))  # last: the conversion is in place
    for name, dtype, batch in runs:
        model = lm.to(dtype)
        seconds = seconds_per_step(model, batch, args.context, args.steps, args.rounds)
        read, flops = step_cost(model, batch, args.context + args.rounds * args.steps // 2)
        share = read / seconds / bandwidth
        row = dict(seconds=seconds, bytes=read, flops=flops, share=share,
                   intensity=flops / read, flops_per_s=flops / seconds)  # fmt: skip
        out[f"{name}_b{batch}"] = row
        print(f"  {name} batch {batch:>2}: {1e3 * seconds:7.2f} ms a step, {read / 1e6:6.1f} MB "
              f"read, {read / seconds / 1e9:5.2f} GB/s = {100 * share:3.0f}% of the copy "
              f"bandwidth{' (target >= 50%)' if (name, batch) == ('fp32', 1) else ''}; "
              f"{flops / seconds / 1e9:5.1f} GFLOP/s at {flops / read:.2f} FLOP/byte")  # fmt: skip
        marker = "o" if batch == 1 else "s"
        color = {"fp32": "#0072B2", "bf16": "#D55E00"}[name] if batch == 1 else None
        points.append(dict(row, marker=marker, color=color, label=f"{name}, batch {batch}"))
    args.png.parent.mkdir(parents=True, exist_ok=True)
    draw(args.png, bandwidth, peak, points)
    print(f"  roofline written to {args.png}")
    return out


if __name__ == "__main__":
    main()
