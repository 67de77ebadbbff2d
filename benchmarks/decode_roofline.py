"""Batch-1 decoding against the memory wall: a roofline for the GPT-2-small shape.

Batch-1 decoding reads every weight once per token and does two FLOPs per weight read (one
multiply-add), an arithmetic intensity of 0.5 FLOP/byte in fp32: far below what the CPU's
arithmetic could sustain, so its speed limit is memory bandwidth. This measures, in one run,
with ``coursepkg.chapters.roofline`` (the serving chapter's page calls the same functions):

* the machine's memory bandwidth, STREAM's copy: ``dst.copy_(src)`` of two ``--mib`` MiB fp32
  tensors (larger than the L3 cache), counted as 2 x the size (read + write), best of rounds;
* the fp32 matmul peak (``roofline.matmul_peak_flops``), the roof's flat part;
* coursepkg's ``DecoderOnlyLM`` of GPT-2 small's shape (12 layers, D=768, 12 heads, F=3072,
  V=50,257, tied head; ``roofline.gpt2_small_config``, random weights, nothing downloaded)
  decoding one token at a time from a KV cache holding ``--context`` positions, in fp32 and in
  bf16: the time per token (the best of ``--rounds`` x ``--steps`` steps timed one by one),
  the bytes a token must read (``roofline.decode_step_bytes``: every weight, the tied
  embedding once as the output layer, one position row, and the cache's keys and values) and
  the share of the measured bandwidth those bytes per second reach (target >= 50% in fp32);
* the same step at batch 4 and 16 (fp32, ``--batches``): the weights are read once per step
  for all rows, so the intensity grows with the batch and the step moves from the bandwidth
  roof towards the arithmetic one;
* the peer that says where a batch-1 step loses time against streaming its weights: the bare
  matrix-vector products of the step (every linear layer's weight and the output layer, in the
  model's order, on a random vector), timed alternately with the step in the same rounds; the
  step's time over theirs is the cost of everything else (attention over the cache, norms,
  activations, the argmax, Python). ``--profile`` also prints the step's operators
  (torch.profiler, self CPU time).

Writes the roofline (intensity against attained FLOP/s, log-log) to ``--png``.
Threads: ``--threads`` (2 by default, this machine's cores). Clock: wall time (a bandwidth
needs it), so a loaded machine lowers both sides of the share alike only roughly: run it quiet.

Run: ``.venv/bin/python benchmarks/decode_roofline.py [--rounds N] [--png PATH]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import setup_threads  # noqa: E402

from coursepkg import DecoderOnlyLM  # noqa: E402
from coursepkg.chapters.measure import best_seconds  # noqa: E402
from coursepkg.chapters.roofline import (  # noqa: E402
    decode_points,
    draw_roofline,
    gpt2_small_config,
    measure_roofline,
)


def report(point, bandwidth: float, target: bool) -> str:
    return (
        f"  {point.label:>15}: {1e3 * point.seconds:7.2f} ms a step, "
        f"{point.bytes / 1e6:6.1f} MB read, {point.bytes_per_s / 1e9:5.2f} GB/s = "
        f"{100 * point.share(bandwidth):3.0f}% of the copy bandwidth"
        f"{' (target >= 50%)' if target else ''}; {point.flops_per_s / 1e9:5.1f} GFLOP/s "
        f"at {point.intensity:.2f} FLOP/byte"
    )


def step_against_matmuls(lm, context: int, steps: int, rounds: int) -> dict[str, float]:
    """Seconds of one batch-1 decoding step and of its bare matrix-vector products, best of
    ``rounds`` x ``steps`` of each, timed one by one, alternately."""
    prompt = torch.randint(0, lm.config.vocab_size, (1, context))
    weights = [(m.weight, m.bias) for m in lm.modules() if isinstance(m, torch.nn.Linear)]
    vectors = {w.size(1): torch.ones(1, 1, w.size(1)) for w, _ in weights}  # (1, 1, in)
    with torch.inference_mode():
        cache = lm.new_cache(capacity=context + 1 + rounds * steps)  # one step a call
        state = [lm(prompt, cache=cache)[:, -1:].argmax(-1)]  # (1, 1)

        def step() -> None:
            state[0] = lm(state[0], cache=cache)[:, -1:].argmax(-1)  # (1, 1)

        def matmuls() -> None:
            for weight, bias in weights:
                F.linear(vectors[weight.size(1)], weight, bias)  # (1, 1, out)

        return best_seconds({"step": step, "matmuls": matmuls}, rounds * steps)


def profile_step(lm, context: int, steps: int) -> str:
    """The operators of ``steps`` batch-1 decoding steps, by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    prompt = torch.randint(0, lm.config.vocab_size, (1, context))
    with torch.inference_mode():
        cache = lm.new_cache(capacity=context + steps + 1)
        token = lm(prompt, cache=cache)[:, -1:].argmax(-1)  # (1, 1)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(steps):
                token = lm(token, cache=cache)[:, -1:].argmax(-1)  # (1, 1)
    averages = prof.key_averages(group_by_input_shape=True)
    return averages.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="*", default=[4, 16])
    parser.add_argument("--profile", action="store_true", help="print a step's operators")
    parser.add_argument(
        "--png", type=Path, default=Path(__file__).parent / "figures" / "decode_roofline.png"
    )
    args = parser.parse_args(argv)
    setup_threads(args.threads)
    torch.manual_seed(0)
    lm = DecoderOnlyLM(gpt2_small_config()).eval()
    batches = [1, *args.batches]
    roof = measure_roofline(lm, batches, args.context, args.steps, args.rounds, args.mib)
    peak = roof.peak_flops / 1e9
    print(
        f"STREAM copy ({args.mib} MiB x 2): {roof.bandwidth / 1e9:.2f} GB/s; "
        f"fp32 matmul peak {peak:.1f} GFLOP/s; {args.threads} threads"
    )
    for point in roof.points:
        print(report(point, roof.bandwidth, point.batch == 1))
    peer = step_against_matmuls(lm, args.context, args.steps, args.rounds)
    print(
        f"  fp32 batch-1 step {1e3 * peer['step']:.2f} ms against its bare matrix-vector "
        f"products {1e3 * peer['matmuls']:.2f} ms, alternated: "
        f"{peer['step'] / peer['matmuls']:.2f} times their time"
    )
    if args.profile:
        print(profile_step(lm, args.context, args.steps))
    half = lm.to(torch.bfloat16)  # last: the conversion is in place
    (bf16,) = decode_points(half, [1], args.context, args.steps, args.rounds, label="bf16")
    print(report(bf16, roof.bandwidth, False))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    draw_roofline(ax, roof, [bf16])
    ax.set_title("Decoding GPT-2 small on this CPU, under the roofline")
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(f"  roofline written to {args.png}")
    out = {"bandwidth": roof.bandwidth, "peak_flops": roof.peak_flops}
    for point in (*roof.points, bf16):
        out[point.label] = dict(
            seconds=point.seconds,
            bytes=point.bytes,
            flops=point.flops,
            share=point.share(roof.bandwidth),
        )
    return out


if __name__ == "__main__":
    main()
