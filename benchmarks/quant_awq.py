"""Activation-aware int4 (AWQ) against plain round-to-nearest int4 and int8, on a trained model.

The model is the GPT chapter's character model (``train_char_gpt``: 4 layers of width 128,
trained on Tiny Shakespeare's first 90%; reused from the run cache when it is there, trained
otherwise, a few minutes of one core). Its linear layers inside the blocks are quantized
(embeddings and the tied head stay fp32) four ways: fp32 (none), int8 per output channel, int4
per group of ``--group`` columns by round-to-nearest, and int4 with AWQ's per-input-channel
scales searched on ``--calibration`` windows of 64 characters of the *training* text
(``quantize_linears_awq``). The held-out loss is the mean next-character loss over the chapter's
held-out windows (4 batches of 64 windows of 64, never seen in training or calibration).

Printed: each loss; int8's change against fp32 (target within 1%); the share of the int4 gap
recovered, (loss RTN - loss AWQ) / (loss RTN - loss fp32) (target >= 50%); and, per quantized
layer, its largest input channel's mean |x| over the median channel's. AWQ gains where a few
channels carry much larger activations than the rest (large language models' outlier features);
this model's are 1.5-6.3x the median (median 2.6x), its weights near Gaussian, and int4 costs
it about 0.5% of loss, so AWQ has little to recover here: 16% of the gap with groups of 32, 17%
with 64, none with 128 (2000 steps, 2026-12-01; a 300-step model's 0.0035-nat gap gave 64% and
-7%, noise at that size). No timing: these are losses, deterministic for a given model.

Run: ``.venv/bin/python benchmarks/quant_awq.py [--group 32 64 128] [--calibration 32] [--steps N]``
"""

from __future__ import annotations

import argparse
import copy
from statistics import median

import torch
from torch.nn import functional as F

from coursepkg.chapters.char_gpt import train_char_gpt
from coursepkg.serving.quant import calibration_inputs, quantize_linears, quantize_linears_awq


def heldout_loss(model, windows) -> float:
    with torch.inference_mode():
        losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()) for x, y in windows]
    return float(torch.stack(losses).mean())


def _channel_means(model, calibration) -> list:
    """Each quantized layer's mean |x| per input channel on the calibration windows."""
    return [x.abs().mean(0) for x in calibration_inputs(model, calibration)]  # (I,) each


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--calibration", type=int, default=32, help="windows of 64 characters")
    parser.add_argument("--steps", type=int, default=2000, help="training steps (the chapter's)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    run = train_char_gpt(args.steps, cache="reuse", progress=False)
    model, windows = run.model.eval(), run.eval_windows["held-out"]
    starts = torch.randint(0, len(run.train_ids) - 64, (args.calibration,))
    calibration = torch.stack([run.train_ids[s : s + 64] for s in starts.tolist()])  # (B, 64)
    fp32 = heldout_loss(model, windows)
    int8 = heldout_loss(quantize_linears(copy.deepcopy(model), 8), windows)
    change8 = int8 / fp32 - 1
    print(f"held-out loss over {sum(x.numel() for x, _ in windows)} characters (nats):")
    print(f"  fp32 {fp32:.4f}; int8 {int8:.4f} ({100 * change8:+.2f}%, target within 1%)")
    out = {"fp32": fp32, "int8": int8, "int8_change": change8}
    # AWQ's premise: a few input channels carry far larger activations than the rest
    peaks = [float(m.max() / m.median()) for m in _channel_means(model, calibration)]
    print(
        f"  input channels' mean |x|, largest over median, per linear layer: "
        f"{min(peaks):.1f}-{max(peaks):.1f} (median {median(peaks):.1f})"
    )
    out["channel_peaks"] = peaks
    for group in args.group:
        rtn = heldout_loss(quantize_linears(copy.deepcopy(model), 4, group), windows)
        awq = heldout_loss(
            quantize_linears_awq(copy.deepcopy(model), calibration, 4, group), windows
        )
        recovered = (rtn - awq) / (rtn - fp32)
        print(
            f"  int4, groups of {group:>3}: round-to-nearest {rtn:.4f} "
            f"({100 * (rtn / fp32 - 1):+.2f}%), AWQ {awq:.4f} ({100 * (awq / fp32 - 1):+.2f}%): "
            f"{100 * recovered:.0f}% of the gap recovered (target >= 50%)"
        )
        out[f"int4_g{group}"] = {"rtn": rtn, "awq": awq, "recovered": recovered}
    return out


if __name__ == "__main__":
    main()
