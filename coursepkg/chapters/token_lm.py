"""What the tokenizer does to a language model: the same small GPT trained on Tiny Shakespeare's
characters and on its byte-level BPE tokens, with the same budget, compared in bits per byte
(chapter "Tokens").

A loss per token cannot compare the two: a BPE token stands for several characters, so
predicting it is harder *and* worth more text. Bits per byte divides the total information the
model needs (the summed loss, in bits) by the amount of text it encodes (the bytes the tokens
stand for), which is the same for both.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from coursepkg.chapters.measure import best_seconds
from coursepkg.chapters.train import History, fit, seed_everything
from coursepkg.config import TransformerConfig
from coursepkg.data.text import load_tinyshakespeare
from coursepkg.decoder_only import DecoderOnlyLM
from coursepkg.tokenizer import Tokenizer, train_bpe

from .run_cache import cache_file, check_cache_mode, restore_run, reuse_run, run_record, save_run

__all__ = ["TokenLMRun", "bits_per_byte", "compare_tokenizations", "encode_seconds_by_length"]


@dataclass
class TokenLMRun:
    """One of the two language models and what it measured.

    Attributes:
        name: ``"characters"`` or ``"BPE <vocab size>"``.
        model: the trained :class:`~coursepkg.DecoderOnlyLM`, in eval mode.
        token_bytes: id -> the number of bytes of text it stands for.
        history: the run's :class:`~coursepkg.chapters.train.History`; ``metrics["bits per byte"]``
            is measured on the first windows of the held-out text during training.
        heldout_bpb: bits per byte over the whole held-out text at the end.
        heldout_loss: mean loss per held-out token (nats) at the end.
        bytes_per_token: held-out bytes over held-out tokens.
        seconds: wall-clock time of the training.
        train_ids: the training text (the first 90%), encoded.
        heldout_ids: the held-out text (the last 10%), encoded.
    """

    name: str
    model: DecoderOnlyLM
    token_bytes: Tensor = field(repr=False)
    history: History = field(default_factory=History, repr=False)
    heldout_bpb: float = math.nan
    heldout_loss: float = math.nan
    bytes_per_token: float = math.nan
    seconds: float = 0.0
    train_ids: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long), repr=False)
    heldout_ids: Tensor = field(
        default_factory=lambda: torch.zeros(0, dtype=torch.long), repr=False
    )


def fit_on_windows(
    model: DecoderOnlyLM,
    ids: Tensor,
    *,
    block: int,
    batch: int,
    steps: int,
    lr: float,
    generator: torch.Generator,
    min_lr: float | None = None,
) -> None:
    """Train ``model`` to predict each next id of random windows of ``ids`` with AdamW (no
    weight decay): the training step of chapter runs that only differ by their model and text.

    Args:
        model: a decoder-only LM over ``ids``' vocabulary.
        ids: the training text as ids.
        block: the window's length L.
        batch: windows per step B.
        steps: optimiser steps.
        lr: the learning rate.
        generator: draws the windows' starts.
        min_lr: when given, the rate decays to it along a cosine over ``steps``.

    Shape:
        ids (N,); each step reads (B, L + 1) ids.
    """

    def windows():
        while True:
            start = torch.randint(0, len(ids) - block - 1, (batch,), generator=generator)
            rows = start[:, None] + torch.arange(block + 1)  # (B, L + 1)
            yield ids[rows[:, :-1]], ids[rows[:, 1:]]  # (B, L), (B, L)

    def loss_fn(m: DecoderOnlyLM, pair: tuple[Tensor, Tensor]) -> Tensor:
        x, y = pair
        return torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = None
    if min_lr is not None:
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps, min_lr)
    fit(model, windows(), loss_fn, steps, optimizer=optimizer, scheduler=schedule, progress=False)


def bits_per_byte(
    model: DecoderOnlyLM, ids: Tensor, token_bytes: Tensor, block_size: int
) -> tuple[float, float]:
    """Bits per byte and nats per token of ``model`` on a token stream, read in windows.

    The stream is cut into consecutive windows of ``block_size + 1`` tokens; each window's last
    ``block_size`` tokens are predicted from those before them. The summed loss, in bits, is
    divided by the bytes the predicted tokens stand for.

    Args:
        model: a decoder-only language model.
        ids: the token stream.
        token_bytes: id -> bytes of text that id stands for.
        block_size: the context length L.

    Shape:
        ids: (N,) long; token_bytes: (V,) long.

    Returns:
        ``(bits per byte, mean loss per token in nats)``.
    """
    usable = (len(ids) - 1) // block_size * block_size
    x = ids[:usable].view(-1, block_size)  # (W, L)
    y = ids[1 : usable + 1].view(-1, block_size)  # (W, L)
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(x), 64):
            logits = model(x[start : start + 64])  # (b, L, V)
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), y[start : start + 64].flatten(), reduction="sum"
            ).item()
    n_bytes = int(token_bytes[y].sum())
    return total / (n_bytes * math.log(2)), total / y.numel()


def _windows(ids: Tensor, block_size: int, batch_size: int, generator: torch.Generator):
    """Random training windows and their next-token targets, forever."""
    while True:
        start = torch.randint(0, len(ids) - block_size - 1, (batch_size,), generator=generator)
        rows = start[:, None] + torch.arange(block_size + 1)  # (B, L + 1)
        window = ids[rows]  # (B, L + 1)
        yield window[:, :-1], window[:, 1:]  # (B, L), (B, L)


def _lm_loss(model: DecoderOnlyLM, batch: tuple[Tensor, Tensor]) -> Tensor:
    x, y = batch  # (B, L), (B, L)
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def _encodings(vocab_size: int) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
    """For characters and for BPE trained on the first 90% of the text: the training ids, the
    held-out ids and each id's length in bytes."""
    text = load_tinyshakespeare()
    split = int(0.9 * len(text))
    train_text, heldout_text = text[:split], text[split:]
    chars = sorted(set(text))  # Tiny Shakespeare is ASCII: one byte per character
    index = {c: i for i, c in enumerate(chars)}
    encodings = {
        "characters": (
            torch.tensor([index[c] for c in train_text]),
            torch.tensor([index[c] for c in heldout_text]),
            torch.tensor([len(c.encode()) for c in chars]),
        )
    }
    vocab, merges = train_bpe(train_text, vocab_size)
    tokenizer = Tokenizer(vocab, merges)
    sizes = torch.tensor([len(vocab[i]) for i in range(len(vocab))])  # (V,)
    encodings[f"BPE {vocab_size}"] = (
        torch.tensor(tokenizer.encode(train_text)),
        torch.tensor(tokenizer.encode(heldout_text)),
        sizes,
    )
    return encodings


def compare_tokenizations(
    vocab_size: int = 512,
    steps: int = 300,
    seed: int = 0,
    progress: bool = False,
    *,
    d_model: int = 64,
    n_heads: int = 4,
    d_ff: int = 256,
    n_layers: int = 2,
    block_size: int = 64,
    batch_size: int = 32,
    lr: float = 1e-2,
    eval_every: int = 50,
    cache: str | None = None,
) -> dict[str, TokenLMRun]:
    """Train chapter 12's small GPT on characters and on BPE tokens with the same budget.

    Both models have the same shape (apart from the embedding table, V x D) and take the same
    ``steps`` of ``batch_size`` windows of ``block_size`` tokens, so each step costs about the same;
    a BPE window holds more text. BPE is trained on the first 90% of the corpus only; the last
    10% is held out for the comparison. Adam at ``lr`` with a linear warm-up (30 steps) and a
    linear decay to 10%, gradients clipped at norm 1.

    Args:
        vocab_size: the BPE vocabulary (at least 256).
        steps: optimisation steps of each model.
        seed: seeds the initialisation and the windows (the same for both).
        progress: show the training progress bars.
        d_model: D.
        n_heads: H.
        d_ff: F.
        n_layers: N.
        block_size: tokens per window (L).
        batch_size: windows per step (B).
        lr: peak learning rate.
        eval_every: steps between the held-out measurements of the history.
        cache: ``None``, ``"save"`` or ``"reuse"``, as in
            :func:`coursepkg.chapters.char_gpt.train_char_gpt`.

    Returns:
        ``{"characters": run, "BPE <vocab_size>": run}``.
    """
    settings = {k: v for k, v in locals().items() if k not in ("progress", "cache")}
    check_cache_mode(cache)
    path = cache_file(settings, "token_lm") if cache is not None else None
    runs = {}
    for name, (train_ids, heldout_ids, token_bytes) in _encodings(vocab_size).items():
        config = TransformerConfig(
            vocab_size=len(token_bytes),
            d_model=d_model,
            n_heads=n_heads,
            d_ff=d_ff,
            n_layers=n_layers,
            dropout=0.0,
            max_len=block_size,
            norm_first=True,
            positional="learned",
            activation="gelu",
        )
        seed_everything(seed)
        runs[name] = TokenLMRun(
            name, DecoderOnlyLM(config), token_bytes, train_ids=train_ids, heldout_ids=heldout_ids
        )
        runs[name].bytes_per_token = float(token_bytes[heldout_ids].sum()) / len(heldout_ids)
    if cache == "reuse" and reuse_run(path, partial(_restore, runs)):
        return runs
    for run in runs.values():
        _train(run, settings, progress)
    if path is not None:
        save_run(path, _record(runs), "the tokenization comparison")
    return runs


def _train(run: TokenLMRun, settings: dict[str, Any], progress: bool) -> None:
    """Train one model of the comparison and measure it on the held-out text."""
    train_ids, heldout_ids = run.train_ids, run.heldout_ids
    block, steps = settings["block_size"], settings["steps"]
    probe = heldout_ids[: 16 * block + 1]  # a fixed slice for the curve, (16 L + 1,)

    def evaluate(model: DecoderOnlyLM) -> dict[str, float]:
        return {"bits per byte": bits_per_byte(model, probe, run.token_bytes, block)[0]}

    def warmup_then_decay(step: int) -> float:
        return min(1.0, (step + 1) / 30) * max(0.1, 1 - step / steps)

    generator = torch.Generator().manual_seed(settings["seed"])
    optimizer = torch.optim.Adam(run.model.parameters(), lr=settings["lr"])
    started = time.perf_counter()
    run.history = fit(
        run.model,
        _windows(train_ids, block, settings["batch_size"], generator),
        _lm_loss,
        steps=steps,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay),
        eval_fn=evaluate,
        eval_every=settings["eval_every"],
        progress=progress,
        desc=run.name,
    )
    run.seconds = time.perf_counter() - started
    run.model.eval()
    run.heldout_bpb, run.heldout_loss = bits_per_byte(
        run.model, heldout_ids, run.token_bytes, block
    )


def _record(runs: dict[str, TokenLMRun]) -> dict[str, Any]:
    return {
        name: {**run_record(run), "numbers": [run.heldout_bpb, run.heldout_loss, run.seconds]}
        for name, run in runs.items()
    }


def _restore(runs: dict[str, TokenLMRun], saved: dict[str, Any]) -> None:
    for name, run in runs.items():
        restore_run(run, saved[name])
        run.heldout_bpb, run.heldout_loss, run.seconds = saved[name]["numbers"]


def encode_seconds_by_length(
    tokenizer: Tokenizer,
    lengths: tuple[int, ...] = (250, 500, 1000, 2000, 4000),
    rounds: int = 2,
    seed: int = 0,
    min_time: float = 0.01,
) -> dict[str, list[float]]:
    """Seconds to encode one chunk of ``n`` random letters a-j, by the plain merge loop, by the
    heap (:func:`~coursepkg.tokenizer_long.merge_by_heap`) and by the backtracker
    (:class:`~coursepkg.tokenizer_long.Backtracker`), for each ``n``.

    Letters without a space are one pre-token, the worst case of the plain loop: each of its
    passes rereads the whole chunk. The tokenizers share ``tokenizer``'s merges and keep no
    cache, so each call encodes from scratch (``tests/reference/test_tokenizer_long.py`` holds
    their ids equal); the backtracker's tables are built before the timing.

    Args:
        tokenizer: gives the vocabulary and the merges (GPT-2's in the chapter).
        lengths: the chunk lengths, in characters.
        rounds: each time is the best of this many interleaved rounds.
        seed: seeds the letters.
        min_time: a call shorter than this is repeated (:func:`~.measure.best_seconds`).

    Returns:
        ``{"length": lengths, "plain loop": seconds, "heap": seconds, "backtracking":
        seconds}``, in ``lengths``' order.
    """
    rng = random.Random(seed)
    routes = {
        "plain loop": {"long_above": None},
        "heap": {"long_above": 0, "long_route": "heap"},
        "backtracking": {"long_above": 0, "long_route": "backtrack"},
    }
    made = {
        name: Tokenizer(tokenizer.vocab, tokenizer.merges, cache_size=0, **options)
        for name, options in routes.items()
    }
    made["backtracking"].encode("ab")  # builds its tables (once per vocabulary)
    out: dict[str, list[float]] = {"length": list(lengths)} | {name: [] for name in made}
    for n in lengths:
        text = "".join(rng.choice("abcdefghij") for _ in range(n))
        calls = {name: partial(t.encode, text) for name, t in made.items()}
        seconds = best_seconds(calls, rounds, min_time=min_time)
        for name in made:
            out[name].append(seconds[name])
    return out
