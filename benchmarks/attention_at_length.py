"""Attention at length: the textbook path, tiled_attention, PyTorch's fused SDPA and
linear_attention, timed alternately at each length (one head, Dk = Dv = 64, batch 1).

Reports each one's median time and its ratio to the textbook path measured in the same rounds,
and checks that the three exact kernels agree. Chapter 15 explains the figures: on a CPU the
tiled loop saves memory, not time; on a GPU the fused kernel saves memory traffic, hence time.

Run: ``.venv/bin/python benchmarks/attention_at_length.py [--lengths 1024 4096] [--device cuda]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, median, setup_threads  # noqa: E402

from coursepkg.attention import scaled_dot_product_attention  # noqa: E402
from coursepkg.efficient_attention import linear_attention, tiled_attention  # noqa: E402


def kernels(q, k, v, block: int) -> dict:
    """The four ways, as calls without arguments (results kept for the agreement check)."""
    return {
        "textbook": lambda: scaled_dot_product_attention(q, k, v)[0],
        "tiled": lambda: tiled_attention(q, k, v, block=block),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "linear": lambda: linear_attention(q, k, v),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    setup_threads(args.threads)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    results = {}
    print(f"one head, Dk=Dv=64, device={args.device}, threads={torch.get_num_threads()}")
    for n in args.lengths:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 1, n, 64, generator=g).to(args.device) for _ in range(3))
        calls = kernels(q, k, v, args.block)
        exact = {name: calls[name]() for name in ("textbook", "tiled", "sdpa")}
        for name in ("tiled", "sdpa"):
            torch.testing.assert_close(exact[name], exact["textbook"], atol=1e-5, rtol=1e-5)

        def timed(fn):
            return lambda: (fn(), sync())

        times = alternate({name: timed(fn) for name, fn in calls.items()}, args.rounds)
        medians = {name: median(ts) for name, ts in times.items()}
        base = medians["textbook"]
        row = "  ".join(
            f"{name} {1e3 * t:8.2f} ms ({base / t:5.2f}x)" for name, t in medians.items()
        )
        print(f"L={n:6d}: {row}")
        results[n] = medians
    return results


if __name__ == "__main__":
    main()
