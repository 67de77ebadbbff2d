"""A character-level GPT trained on Tiny Shakespeare (chapter 12's run, reopened by chapter 13)
and the count bigram model it has to beat.

:func:`train_char_gpt` trains a small GPT-2-shaped :class:`~coursepkg.DecoderOnlyLM` with Adam,
a linear warm-up and decay, and clipped gradients, keeping the run on disk when asked
(:mod:`coursepkg.chapters.run_cache`); :func:`count_bigram` is the table of next-character counts
the book compares it with.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from coursepkg.chapters.train import History, fit, seed_everything
from coursepkg.config import TransformerConfig
from coursepkg.data.text import char_lm_batches, load_tinyshakespeare
from coursepkg.data.vocab import CharVocab
from coursepkg.decoder_only import DecoderOnlyLM

from .run_cache import cache_file, check_cache_mode, restore_run, reuse_run, run_record, save_run

__all__ = ["CharGPT", "count_bigram", "next_char_loss", "shakespeare_split", "train_char_gpt"]


@dataclass
class CharGPT:
    """A character-level GPT trained on Tiny Shakespeare, and what its training measured.

    Attributes:
        model: the :class:`~coursepkg.DecoderOnlyLM`, in eval mode.
        vocab: the corpus' characters plus the special ids.
        history: the :class:`~coursepkg.chapters.train.History` of the run; ``metrics["train"]`` and
            ``metrics["held-out"]`` hold the mean next-character loss (nats) on fixed windows.
        train_ids: the first 90% of the corpus, encoded (what the model was trained on).
        heldout_ids: the last 10%, never seen in training.
        eval_windows: name -> the fixed ``(x, y)`` batches each evaluation measures.
        seconds: wall-clock time of the training run (evaluations included).
    """

    model: DecoderOnlyLM
    vocab: CharVocab
    history: History
    train_ids: Tensor = field(repr=False)
    heldout_ids: Tensor = field(repr=False)
    eval_windows: dict[str, list[tuple[Tensor, Tensor]]] = field(repr=False)
    seconds: float = 0.0


def next_char_loss(model: DecoderOnlyLM, batch: tuple[Tensor, Tensor]) -> Tensor:
    """The mean cross-entropy of the next character over a batch of windows (the runs' loss).

    Args:
        model: the decoder-only model being trained.
        batch: ``(x, y)``, the windows and the same windows shifted by one character.

    Shape:
        x, y: (B, L).

    Returns:
        A scalar tensor, in nats.
    """
    x, y = batch  # (B, L), (B, L)
    logits = model(x)  # (B, L, V)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def _check_sizes(settings: dict) -> None:
    # Every count among train_char_gpt's settings is a positive int.
    for name in ("steps", "d_model", "n_heads", "d_ff", "n_layers", "block_size", "batch_size"):
        value = settings[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def train_char_gpt(
    steps: int = 2000,
    seed: int = 0,
    progress: bool = True,
    *,
    d_model: int = 128,
    n_heads: int = 4,
    d_ff: int = 512,
    n_layers: int = 4,
    block_size: int = 64,
    batch_size: int = 12,
    lr: float = 2e-3,
    warmup_steps: int = 100,
    eval_every: int = 250,
    cache: str | None = None,
) -> CharGPT:
    """Train a small GPT-2-shaped character model on Tiny Shakespeare (chapter 12's run).

    Pre-LN layers with GELU, learned positions, a final LayerNorm and a tied head (GPT-2's
    design, at a small scale). The defaults are nanoGPT's recipe for this corpus on a CPU (4
    layers of width 128, windows of 64 characters, 12 per step, 2,000 steps, with twice its
    peak learning rate), which reaches about 1.8 nats per held-out character in a few minutes
    of one core. The first 90% of the corpus trains, the last 10% is held out. Adam at ``lr``
    follows a linear warm-up over ``warmup_steps`` and then a linear decay to 10% at the last
    step; gradients are clipped at norm 1 (:func:`~coursepkg.chapters.train.fit`).
    Every ``eval_every`` steps the mean loss on 4 fixed batches of 64 windows of the training
    and of the held-out text is recorded.

    Args:
        steps: optimisation steps.
        seed: seeds the initialisation and the training windows.
        progress: show :func:`~coursepkg.chapters.train.fit`'s progress bar.
        d_model: D.
        n_heads: H.
        d_ff: F.
        n_layers: N.
        block_size: characters per training window (L).
        batch_size: windows per step (B).
        lr: peak learning rate.
        warmup_steps: steps of linear warm-up.
        eval_every: steps between evaluations.
        cache: ``None`` trains and keeps nothing; ``"save"`` trains and saves the result under
            ``~/.cache/coursepkg`` (or ``$COURSEPKG_CACHE_DIR``); ``"reuse"`` loads a run saved
            with the same arguments, coursepkg source, PyTorch version, CPU kernels and thread
            count, and trains and saves one if there is none. Chapter 12 saves, chapter 13
            reuses.

    Returns:
        A :class:`CharGPT` with the model in eval mode.
    """
    settings = {k: v for k, v in locals().items() if k not in ("progress", "cache")}
    _check_sizes(settings)
    check_cache_mode(cache)
    path = cache_file(settings, "char_gpt") if cache is not None else None
    vocab, train_ids, heldout_ids, windows = shakespeare_split(block_size)
    config = TransformerConfig(
        vocab_size=len(vocab),
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        dropout=0.0,
        max_len=512,
        norm_first=True,  # pre-LN with a final LayerNorm, as in GPT-2
        positional="learned",  # GPT learns its position table
        activation="gelu",
    )
    generator = seed_everything(seed)
    model = DecoderOnlyLM(config)
    result = CharGPT(model, vocab, History(), train_ids, heldout_ids, windows)
    if cache == "reuse" and reuse_run(path, partial(_restore_char_gpt, result)):
        return result
    batches = char_lm_batches(train_ids, vocab, block_size, batch_size, generator=generator)
    _train_char_gpt(result, batches, SimpleNamespace(**settings), progress)
    if path is not None:
        save_run(path, {**run_record(result), "seconds": result.seconds}, "the trained GPT")
    return result


def shakespeare_split(
    block_size: int,
) -> tuple[CharVocab, Tensor, Tensor, dict[str, list[tuple[Tensor, Tensor]]]]:
    """Tiny Shakespeare's vocabulary, its first 90% and last 10% encoded, and 4 fixed batches
    of 64 windows of each part for the evaluations (the split every character run shares).

    Args:
        block_size: characters per window (L).

    Returns:
        ``(vocab, train_ids, heldout_ids, windows)``: ``windows["train"]`` and
        ``windows["held-out"]`` are lists of 4 ``(x, y)`` pairs of shape (64, L).
    """
    vocab = CharVocab.from_corpus(load_tinyshakespeare())
    ids = _shakespeare_ids().clone()  # (N,) a copy: the encoded corpus stays as it was read
    split = int(0.9 * len(ids))
    train_ids, heldout_ids = ids[:split], ids[split:]  # (N_train,), (N_heldout,)
    windows = {
        name: list(
            char_lm_batches(
                part,
                vocab,
                block_size,
                64,
                generator=torch.Generator().manual_seed(k),
                num_batches=4,
            )
        )
        for k, (name, part) in enumerate((("train", train_ids), ("held-out", heldout_ids)), 1)
    }
    return vocab, train_ids, heldout_ids, windows


@functools.lru_cache(maxsize=1)
def _shakespeare_ids() -> Tensor:
    """The whole corpus encoded, once per process: encoding its 1.1 million characters one by
    one takes about half a second, and chapter 16 splits it for each of its dozen runs.

    Shape:
        returns (N,) long.
    """
    text = load_tinyshakespeare()
    return torch.tensor(CharVocab.from_corpus(text).encode(text))  # (N,)


def _train_char_gpt(
    result: CharGPT,
    train_batches: Iterator[tuple[Tensor, Tensor]],
    run: SimpleNamespace,
    progress: bool,
) -> None:
    """Train the GPT on ``train_batches`` (Adam, linear warm-up then linear decay to 10%, clipped
    gradients), recording the history and the time; the model ends in eval mode."""
    model, windows = result.model, result.eval_windows

    def evaluate(trained: DecoderOnlyLM) -> dict[str, float]:
        return {
            name: sum(next_char_loss(trained, b).item() for b in batches) / len(batches)
            for name, batches in windows.items()
        }

    def warmup_then_decay(step: int) -> float:
        return min(1.0, (step + 1) / run.warmup_steps) * max(0.1, 1 - step / run.steps)

    # foreach: the same numbers as the per-parameter loop, with far fewer calls per step
    optimizer = torch.optim.Adam(model.parameters(), lr=run.lr, foreach=True)
    started = time.perf_counter()
    result.history = fit(
        model,
        train_batches,
        next_char_loss,
        steps=run.steps,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay),
        eval_fn=evaluate,
        eval_every=run.eval_every,
        progress=progress,
        desc="char GPT",
    )
    result.seconds = time.perf_counter() - started
    model.eval()


def _restore_char_gpt(result: CharGPT, saved: dict[str, Any]) -> None:
    """Put a saved GPT's weights, history and time in place (the model in eval mode)."""
    restore_run(result, saved)
    result.seconds = saved["seconds"]


def count_bigram(ids: Tensor, vocab_size: int, smoothing: float = 1.0) -> Tensor:
    """A count bigram model: log P(next | current) from how often each pair occurs in ``ids``.

    Each row adds ``smoothing`` to every count (add-one smoothing by default), so a pair the
    text never shows keeps a small probability instead of an infinite loss.

    Args:
        ids: the training text, encoded.
        vocab_size: V.
        smoothing: pseudo-count added to every pair (> 0).

    Shape:
        ids: (N,) long; returns (V, V), row = current id, column = next id.

    Returns:
        Log-probabilities; ``table[x, y]`` is the model's log P(y | x) and each row's
        probabilities sum to 1.
    """
    if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype != torch.long:
        raise TypeError("ids must be a 1-D torch.long tensor")
    if len(ids) < 2:
        raise ValueError(f"ids must hold at least 2 tokens, got {len(ids)}")
    if not smoothing > 0:
        raise ValueError(f"smoothing must be > 0, got {smoothing!r}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"ids must lie in [0, vocab_size={vocab_size})")
    pairs = ids[:-1] * vocab_size + ids[1:]  # (N - 1,) one index per (current, next)
    counts = torch.bincount(pairs, minlength=vocab_size * vocab_size).view(vocab_size, -1)
    counts = counts.double() + smoothing  # (V, V)
    return (counts / counts.sum(dim=1, keepdim=True)).log().float()  # (V, V)
