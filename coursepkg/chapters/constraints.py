"""Which choice wins depends on the constraint: three pairs of choices (a ReLU^2 or a SwiGLU
feed-forward, a dense feed-forward or a mixture of experts, AdamW or Muon), each compared at fixed
data (the same training tokens), at fixed parameter count and at fixed compute time (the CPU
seconds of one thread, so that other work on the machine does not decide it), over several seeds,
in held-out bits per byte of small byte-level GPTs trained on Tiny Shakespeare.

A side "wins" under a constraint only where the seeds separate the two: the difference of the
means is larger than :data:`SEPARATION` combined standard errors (Welch's, sqrt(s_a^2 / n_a +
s_b^2 / n_b) with each side's sample standard deviation). Otherwise the verdict is "no
separation", whatever the means say.

How each constraint is met (the baseline is the first of each pair):

- **data**: both sides train ``steps`` steps of the same windows (the same seed draws the same
  windows), each in its natural shape: SwiGLU with the baseline's hidden width F (three matrices:
  1.5 times the feed-forward's parameters); the mixture with E experts of width F k / E, k of
  them per token (the dense model's active feed-forward, E / k times its parameters).
- **params**: the challenger is resized to the baseline's parameter count (SwiGLU's F times 2/3;
  experts of width F / E), within :data:`PARAM_TOLERANCE`, and trains the same steps.
- **time**: the baseline trains ``steps`` steps; the challenger trains as many steps as the
  baseline's mean CPU time buys at the challenger's own measured CPU seconds per step (both from
  the fixed-data runs), so both spend the same CPU time whatever their speed.

AdamW and Muon train the same model, so for that pair the fixed-parameter comparison is the
fixed-data one (the table says so rather than training it twice). Muon updates the 2-D matrices
inside the blocks; the embeddings, the position table, the norms and any bias stay on AdamW, as
Muon's authors and ``torch.optim.Muon``'s documentation advise. Its learning rate is AdamW's,
rescaled per matrix to match AdamW's update size (``adjust_lr_fn="match_rms_adamw"``).

Dimension legend: B windows, L bytes per window, D d_model, F d_ff, E experts, V = 256 bytes.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from coursepkg.chapters.run_cache import cache_file, check_cache_mode, reuse_run, save_run
from coursepkg.chapters.token_lm import bits_per_byte
from coursepkg.chapters.train import seed_everything
from coursepkg.config import TransformerConfig
from coursepkg.config_groups import MoEConfig
from coursepkg.data.text import tinyshakespeare_bytes
from coursepkg.decoder_only import DecoderOnlyLM

__all__ = [
    "CONSTRAINTS",
    "PAIRS",
    "PARAM_TOLERANCE",
    "SEPARATION",
    "arm_config",
    "compare",
    "constraint_verdicts",
    "count_params",
    "muon_parameters",
    "winner_changes",
]

#: Combined standard errors the difference of means must exceed to name a winner.
SEPARATION = 2.0
#: The largest relative gap between the two sides' parameter counts at fixed parameters.
PARAM_TOLERANCE = 0.02
#: The three constraints, in the table's order.
CONSTRAINTS = ("data", "params", "time")
#: Each pair: its name -> (baseline, challenger).
PAIRS = {
    "ffn": ("ReLU^2", "SwiGLU"),
    "experts": ("dense", "mixture of experts"),
    "optimizer": ("AdamW", "Muon"),
}
#: The load-balancing loss's coefficient in the mixture's training loss (Switch: 0.01).
AUX_COEFFICIENT = 0.01


def arm_config(pair: str, side: int, constraint: str, settings: dict[str, Any]) -> dict:
    """The model and optimiser of one side of a pair under a constraint.

    Args:
        pair: a key of :data:`PAIRS`.
        side: 0 the baseline, 1 the challenger.
        constraint: ``"data"`` or ``"params"`` (``"time"`` trains the fixed-data shapes).
        settings: ``d_model``, ``experts`` (E) and ``top_k`` (k) at least.

    Returns:
        ``activation``, ``d_ff``, ``moe`` (None or (E, k, expert width)) and ``optimizer``.
    """
    if pair not in PAIRS or side not in (0, 1) or constraint not in CONSTRAINTS:
        raise ValueError(f"unknown pair, side or constraint: {pair!r}, {side!r}, {constraint!r}")
    d_ff = 4 * settings["d_model"]
    arm = dict(activation="relu2", d_ff=d_ff, moe=None, optimizer="adamw")
    if side == 0:
        return arm
    fixed_params = constraint == "params"
    if pair == "ffn":  # three matrices of width 2F/3 hold what two of width F hold
        arm["activation"] = "swiglu"
        arm["d_ff"] = round(2 * d_ff / 3) if fixed_params else d_ff
    elif pair == "experts":
        e, k = settings["experts"], settings["top_k"]
        width = d_ff // e if fixed_params else d_ff * k // e  # all E, or the k active, hold F
        arm["moe"] = (e, k, width)
    else:
        arm["optimizer"] = "muon"
    return arm


def _config(arm: dict, settings: dict[str, Any]) -> TransformerConfig:
    moe = None
    if arm["moe"] is not None:
        e, k, width = arm["moe"]
        moe = MoEConfig(n_experts=e, top_k=k, d_ff=width)
    return TransformerConfig(
        vocab_size=256,
        d_model=settings["d_model"],
        n_heads=4,
        d_ff=arm["d_ff"],
        n_layers=settings["n_layers"],
        dropout=0.0,
        max_len=settings["block_size"],
        norm_first=True,
        norm="rmsnorm",
        bias=False,
        positional="learned",
        activation=arm["activation"],
        moe=moe,
    )


def count_params(arm: dict, settings: dict[str, Any]) -> int:
    """The parameter count of one side's model (embeddings and routers included)."""
    return sum(p.numel() for p in DecoderOnlyLM(_config(arm, settings)).parameters())


def muon_parameters(model: DecoderOnlyLM) -> tuple[list[Tensor], list[Tensor]]:
    """Split ``model``'s parameters into the 2-D matrices inside its blocks (for Muon) and the
    rest (the embeddings, the position table, norms, biases: for AdamW)."""
    hidden, rest = [], []
    for name, p in model.named_parameters():
        inside = name.startswith("layers.")
        (hidden if inside and p.ndim == 2 else rest).append(p)
    return hidden, rest


def _optimizers(model: DecoderOnlyLM, kind: str, lr: float) -> list[torch.optim.Optimizer]:
    if kind == "adamw":
        return [torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)]
    hidden, rest = muon_parameters(model)
    muon = torch.optim.Muon(hidden, lr=lr, weight_decay=0.0, adjust_lr_fn="match_rms_adamw")
    return [muon, torch.optim.AdamW(rest, lr=lr, weight_decay=0.0)]


def _train(arm: dict, steps: int, seed: int, data: tuple[Tensor, Tensor], settings: dict) -> dict:
    """One run: ``steps`` steps with a cosine decay to lr / 10; its training CPU seconds (this
    thread only) and held-out bits per byte."""
    train, heldout = data
    generator = seed_everything(seed)
    model = DecoderOnlyLM(_config(arm, settings))
    block, batch, lr = settings["block_size"], settings["batch_size"], settings["lr"]
    optimizers = _optimizers(model, arm["optimizer"], lr)
    schedules = [torch.optim.lr_scheduler.CosineAnnealingLR(o, steps, lr / 10) for o in optimizers]
    model.train()
    start = time.thread_time()
    for _ in range(steps):
        first = torch.randint(0, len(train) - block - 1, (batch,), generator=generator)
        rows = first[:, None] + torch.arange(block + 1)  # (B, L + 1)
        x, y = train[rows[:, :-1]], train[rows[:, 1:]]  # (B, L), (B, L)
        out = model(x, return_aux=True)
        loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten())
        if out.aux_loss is not None:
            loss = loss + AUX_COEFFICIENT * out.aux_loss
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for optimizer, schedule in zip(optimizers, schedules, strict=True):
            optimizer.step()
            schedule.step()
    seconds = time.thread_time() - start
    model.eval()
    bpb = bits_per_byte(model, heldout, torch.ones(256, dtype=torch.long), block)[0]
    params = sum(p.numel() for p in model.parameters())
    return dict(bpb=bpb, seconds=seconds, steps=steps, params=params)


def compare(a: Sequence[float], b: Sequence[float], separation: float = SEPARATION) -> dict:
    """The decision rule: which side has the lower mean, if the seeds separate them.

    Args:
        a, b: each side's held-out bits per byte, one per seed (two or more each).
        separation: how many combined standard errors the difference must exceed.

    Returns:
        ``mean_a``, ``mean_b``, ``diff`` (b - a), ``se`` (Welch's combined standard error),
        ``z`` (diff / se) and ``winner``: 0 (a lower), 1 (b lower) or None (no separation).
    """
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"need two or more seeds a side, got {len(a)} and {len(b)}")
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    diff = mean_b - mean_a
    z = diff / se if se > 0 else math.copysign(math.inf, diff) if diff else 0.0
    winner = None if abs(z) <= separation else int(diff < 0)
    return dict(mean_a=mean_a, mean_b=mean_b, diff=diff, se=se, z=z, winner=winner)


def winner_changes(verdicts: Sequence[int | None]) -> bool:
    """Whether a pair's winner changes with the constraint: each side wins (separated) under at
    least one constraint. A winner under one and "no separation" under another is no change."""
    return 0 in verdicts and 1 in verdicts


def _pair_rows(pair: str, data: tuple, settings: dict, base: list[dict]) -> dict[str, dict]:
    """A pair's three comparisons: the challenger's runs, and the decision under each."""
    seeds, steps = settings["seeds"], settings["steps"]
    chal = {c: arm_config(pair, 1, c, settings) for c in ("data", "params")}
    runs = {"data": [_train(chal["data"], steps, s, data, settings) for s in seeds]}
    if chal["params"] == chal["data"]:  # the optimiser pair: one model, one count
        runs["params"] = runs["data"]
    else:
        runs["params"] = [_train(chal["params"], steps, s, data, settings) for s in seeds]
    per_step = statistics.fmean(r["seconds"] for r in runs["data"]) / steps
    budget = statistics.fmean(r["seconds"] for r in base)
    time_steps = max(1, round(budget / per_step))
    runs["time"] = [_train(chal["data"], time_steps, s, data, settings) for s in seeds]
    rows = {}
    for constraint in CONSTRAINTS:
        verdict = compare([r["bpb"] for r in base], [r["bpb"] for r in runs[constraint]])
        rows[constraint] = dict(verdict, baseline=base, challenger=runs[constraint])
    rows["params"]["same_as_data"] = runs["params"] is runs["data"]
    return rows


def constraint_verdicts(
    *,
    d_model: int = 32,
    n_layers: int = 2,
    block_size: int = 64,
    batch_size: int = 16,
    steps: int = 200,
    lr: float = 1e-2,
    experts: int = 4,
    top_k: int = 2,
    seeds: Sequence[int] = (0, 1, 2),
    heldout_bytes: int = 16_384,
    cache: str | None = None,
) -> dict[str, Any]:
    """Train the three pairs under the three constraints over ``seeds`` and decide each.

    Every run uses one thread (restored afterwards), so that its CPU time is the time of one
    computation, and trains on the first 90% of Tiny Shakespeare; it is scored on
    ``heldout_bytes`` of the last 10%.

    Args:
        d_model, n_layers, block_size, batch_size, lr: the baseline model and its training
            (pre-norm RMSNorm blocks, 4 heads, no biases, learned positions, F = 4 D).
        steps: the fixed-data and fixed-parameter runs' length, and the baseline's at fixed time.
        experts, top_k: the mixture's E and k.
        seeds: one run per seed and side (two or more).
        heldout_bytes: how much held-out text is scored.
        cache: None, ``"save"`` or ``"reuse"`` (:mod:`coursepkg.chapters.run_cache`).

    Returns:
        ``settings``, ``baseline`` (the baseline's runs: ``bpb``, ``seconds``, ``steps``,
        ``params`` each) and ``pairs``: pair -> constraint -> the :func:`compare` dict with the
        ``baseline`` and ``challenger`` runs.
    """
    check_cache_mode(cache)
    if len(seeds) < 2:
        raise ValueError(f"need two or more seeds to measure a spread, got {list(seeds)}")
    settings = dict(
        d_model=d_model,
        n_layers=n_layers,
        block_size=block_size,
        batch_size=batch_size,
        steps=steps,
        lr=lr,
        experts=experts,
        top_k=top_k,
        seeds=list(seeds),
        heldout_bytes=heldout_bytes,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = cache_file(settings, "constraint-verdicts") if cache is not None else None
        saved: dict[str, Any] = {}
        if cache == "reuse" and reuse_run(path, saved.update):
            return saved
        data = tinyshakespeare_bytes(heldout_bytes)
        base_arm = arm_config("ffn", 0, "data", settings)
        base = [_train(base_arm, steps, s, data, settings) for s in seeds]
        pairs = {pair: _pair_rows(pair, data, settings, base) for pair in PAIRS}
    finally:
        torch.set_num_threads(threads)
    result = dict(settings=settings, baseline=base, pairs=pairs)
    if path is not None:
        save_run(path, result, "the constraint verdicts")
    return result
