"""The capstone chapter's runs: the course's baseline recipe trained briefly, with its held-out
bits per byte recorded along the way, against steps and training seconds.

The recipe is the one the capstone's notebook states (a 2-layer byte-level model of width 64,
AdamW with a linear warm-up over the first 10% of the steps and a cosine decay to zero, batches
of 16 windows of 64 bytes from a seeded generator); the data are the grader's own split
(:func:`coursepkg.grading.classroom.capstone.corpus_splits`), its held-out part scored as the
grader scores it, in bits per byte.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from coursepkg.chapters.run_cache import cache_file, check_cache_mode, reuse_run, save_run
from coursepkg.config import TransformerConfig
from coursepkg.decoder_only import DecoderOnlyLM
from coursepkg.grading.classroom.capstone import corpus_splits

__all__ = ["BASELINE_MODEL", "BaselineCurve", "baseline_curve", "heldout_bpb"]

#: The baseline's model: 116,480 parameters.
BASELINE_MODEL: dict[str, Any] = dict(
    vocab_size=256, d_model=64, n_heads=4, d_ff=256, n_layers=2, dropout=0.0, max_len=64
)


@dataclass
class BaselineCurve:
    """One run of the recipe: the held-out score at each checkpoint.

    ``steps[i]`` optimisation steps had been taken, in ``seconds[i]`` seconds of training (the
    scoring not counted), when the held-out text scored ``bpb[i]`` bits per byte.
    """

    steps: list[int]
    seconds: list[float]
    bpb: list[float]
    n_parameters: int
    settings: dict = field(default_factory=dict)


def heldout_bpb(model: DecoderOnlyLM, held_out: Tensor, width: int) -> float:
    """Mean bits per predicted byte of ``model`` on ``held_out`` cut into windows.

    Args:
        model: a byte-level language model (its scores over 256 bytes).
        held_out: the byte ids, (N,) int64.
        width: bytes per window; each window's bytes after its first are predicted.

    Returns:
        The mean negative log-likelihood per predicted byte, in bits.
    """
    windows = held_out[: len(held_out) // width * width].view(-1, width)  # (W, width)
    if len(windows) == 0:
        raise ValueError(f"held_out has {len(held_out)} bytes, fewer than one window of {width}")
    was_training = model.training
    model.eval()
    with torch.no_grad():
        scores = model(windows[:, :-1])  # (W, width-1, 256)
        nats = F.cross_entropy(scores.reshape(-1, 256), windows[:, 1:].reshape(-1))
    model.train(was_training)
    return nats.item() / math.log(2)


def _warmup_cosine(steps: int):
    """The baseline's learning-rate factor: linear warm-up over 10% of ``steps``, cosine to 0."""
    warmup = max(1, steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    return factor


def baseline_curve(
    *,
    steps: int = 600,
    every: int = 50,
    lr: float = 3e-3,
    batch_size: int = 16,
    model: dict[str, Any] | None = None,
    seed: int = 0,
    heldout_bytes: int = 16_384,
    cache: str | None = None,
) -> BaselineCurve:
    """Train the baseline recipe for ``steps`` steps, scoring the held-out text every ``every``.

    Args:
        steps: optimisation steps; the schedule (warm-up, cosine decay) spans all of them.
        every: steps between two scorings (and one before the first step).
        lr: AdamW's peak learning rate.
        batch_size: windows per step (B); each window is the model's ``max_len`` bytes (L).
        model: :class:`~coursepkg.config.TransformerConfig` fields replacing the baseline's
            (None: :data:`BASELINE_MODEL`).
        seed: the weights' and the windows' seed.
        heldout_bytes: how much of the grader's held-out split is scored.
        cache: None, ``"save"`` or ``"reuse"`` (:mod:`coursepkg.chapters.run_cache`).

    Returns:
        A :class:`BaselineCurve`.
    """
    check_cache_mode(cache)
    if steps < 1 or every < 1:
        raise ValueError(f"steps and every must be >= 1, got steps={steps}, every={every}")
    shape = {**BASELINE_MODEL, **(model or {}), "norm_first": True}
    settings = dict(model=shape, steps=steps, every=every, lr=lr, batch_size=batch_size)
    settings.update(seed=seed, heldout_bytes=heldout_bytes)
    path = cache_file(settings, "capstone-baseline") if cache is not None else None
    saved: dict[str, Any] = {}
    if cache == "reuse" and reuse_run(path, saved.update):
        return BaselineCurve(**saved)
    train, held_out, _ = corpus_splits()
    ids = torch.frombuffer(bytearray(train), dtype=torch.uint8).long()  # (N,)
    scored = torch.frombuffer(bytearray(held_out[:heldout_bytes]), dtype=torch.uint8).long()
    torch.manual_seed(seed)
    net = DecoderOnlyLM(TransformerConfig(**shape))
    context = shape["max_len"]
    generator = torch.Generator().manual_seed(seed)
    # foreach: the same numbers as the per-parameter loop, with far fewer calls per step
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01, foreach=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_cosine(steps))
    curve = BaselineCurve([0], [0.0], [heldout_bpb(net, scored, min(context, 256))], 0, settings)
    curve.n_parameters = sum(p.numel() for p in net.parameters())
    seconds = 0.0
    for step in range(1, steps + 1):
        begun = time.perf_counter()
        starts = torch.randint(0, len(ids) - context - 1, (batch_size,), generator=generator)
        windows = torch.stack([ids[s : s + context + 1] for s in starts.tolist()])  # (B, L+1)
        scores = net(windows[:, :-1])  # (B, L, 256)
        loss = F.cross_entropy(scores.reshape(-1, 256), windows[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        seconds += time.perf_counter() - begun
        if step % every == 0 or step == steps:
            curve.steps.append(step)
            curve.seconds.append(seconds)
            curve.bpb.append(heldout_bpb(net, scored, min(context, 256)))
    if path is not None:
        save_run(path, asdict(curve), "the capstone's baseline curve")
    return curve
