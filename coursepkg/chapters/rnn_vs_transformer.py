"""The parallelism argument measured: chapter 2's attention RNN against chapter 8's Transformer.

Section 4 of the paper argues for self-attention by counting sequential operations: a recurrent
layer needs O(L) of them, self-attention O(1) (Vaswani et al. 2017, Table 1). This module puts
numbers on that claim for the two date translators of the book, on the same data:

* :func:`race_to_quality` trains both, each with its own chapter's recipe, on the same stream of
  batches until their held-out exact match first reaches a threshold, and records how many steps
  that took (cached with :mod:`coursepkg.chapters.run_cache`, since the steps do not depend on the
  machine's load);
* :func:`step_seconds` times training steps of the two models on the same batches, interleaved
  so that both see the same load, which gives tokens per second;
* :func:`forward_backward_seconds` times one forward and backward pass of each at growing
  sequence lengths, where the RNN's step-by-step loops show.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from coursepkg.chapters.recipes import ISO_LENGTH, date_batches, translator_config
from coursepkg.chapters.run_cache import cache_file, check_cache_mode, reuse_run, save_run
from coursepkg.chapters.train import seed_everything
from coursepkg.data.batching import Seq2SeqBatch, make_seq2seq_batch
from coursepkg.data.dates import date_split, date_vocabs, encode_batch
from coursepkg.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, CharVocab
from coursepkg.decoding import greedy_decode
from coursepkg.model import Transformer
from coursepkg.rnn import Seq2SeqRNN
from coursepkg.schedule import label_smoothed_cross_entropy, noam_scheduler

__all__ = [
    "CONTENDERS",
    "Contender",
    "attention_rnn",
    "forward_backward_seconds",
    "race_to_quality",
    "step_seconds",
    "tokens_in",
    "transformer",
]


@dataclass
class Contender:
    """A model with its chapter's training recipe: what one training step needs.

    Attributes:
        model: the encoder-decoder.
        optimizer: its optimiser.
        scheduler: its learning-rate schedule, stepped after every update (or None).
        loss_fn: ``loss_fn(model, batch) -> scalar`` (teacher forcing).
        translate: ``translate(model, src, src_mask) -> (B, n) ids`` by greedy decoding.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    loss_fn: Callable[[nn.Module, Seq2SeqBatch], Tensor]
    translate: Callable[[nn.Module, Tensor, Tensor], Tensor]


def attention_rnn(seed: int = 0, src_vocab: int = 0, tgt_vocab: int = 0) -> Contender:
    """Chapter 2's model and recipe: a bidirectional GRU with additive attention (E = 32,
    64 units), Adam at 3e-3, plain cross-entropy (Bahdanau et al. 2015).

    Args:
        seed: seeds the initial weights.
        src_vocab: source vocabulary size (0: the date vocabulary's).
        tgt_vocab: target vocabulary size (0: the ISO vocabulary's).

    Returns:
        The :class:`Contender`.
    """
    src_vocab, tgt_vocab = _vocab_sizes(src_vocab, tgt_vocab)
    seed_everything(seed)
    model = Seq2SeqRNN(src_vocab, tgt_vocab, emb_dim=32, hidden_dim=64, attention=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, foreach=True)

    def loss_fn(m: nn.Module, batch: Seq2SeqBatch) -> Tensor:
        logits = m(batch.src, batch.tgt_in, batch.src_mask)  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD_ID)

    def translate(m: nn.Module, src: Tensor, src_mask: Tensor) -> Tensor:
        tokens, _ = m.greedy(src, ISO_LENGTH + 1, BOS_ID, EOS_ID, src_mask)  # (B, T)
        return tokens

    return Contender(model, optimizer, None, loss_fn, translate)


def transformer(
    seed: int = 0, src_vocab: int = 0, tgt_vocab: int = 0, max_len: int = 64
) -> Contender:
    """Chapter 8's model and recipe (:func:`~coursepkg.chapters.recipes.train_date_translator`'s
    defaults): one encoder and one decoder layer, D = 64, H = 4, F = 128; Adam with
    beta2 = 0.98 on half the warm-up schedule (100 steps), label smoothing 0.1.

    Args:
        seed: seeds the initial weights.
        src_vocab: source vocabulary size (0: the date vocabulary's).
        tgt_vocab: target vocabulary size (0: the ISO vocabulary's).
        max_len: the longest sequence the positional encoding covers.

    Returns:
        The :class:`Contender`.
    """
    src_vocab, tgt_vocab = _vocab_sizes(src_vocab, tgt_vocab)
    seed_everything(seed)
    config = translator_config(src_vocab, tgt_vocab, max_len=max_len)
    model = Transformer(config)
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, foreach=True
    )
    scheduler = noam_scheduler(optimizer, 64, 100, 0.5)

    def loss_fn(m: nn.Module, batch: Seq2SeqBatch) -> Tensor:
        logits = m(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (B, T, V)
        return label_smoothed_cross_entropy(logits, batch.tgt_out, 0.1, ignore_index=PAD_ID)

    def translate(m: nn.Module, src: Tensor, src_mask: Tensor) -> Tensor:
        out = greedy_decode(m, src, ISO_LENGTH + 1, BOS_ID, EOS_ID, src_mask=src_mask)
        return out[:, 1:]  # (B, T)  without BOS

    return Contender(model, optimizer, scheduler, loss_fn, translate)


#: The two contenders, by the name the book gives them.
CONTENDERS: dict[str, Callable[..., Contender]] = {
    "attention RNN": attention_rnn,
    "Transformer": transformer,
}


def _vocab_sizes(src_vocab: int, tgt_vocab: int) -> tuple[int, int]:
    dates_src, dates_tgt = date_vocabs()
    return src_vocab or len(dates_src), tgt_vocab or len(dates_tgt)


def tokens_in(batch: Seq2SeqBatch) -> int:
    """Real (not padding) source and target tokens of a batch: what a step processes."""
    return int(batch.src_mask.sum()) + int(batch.tgt_mask.sum())


def _train_step(c: Contender, batch: Seq2SeqBatch) -> None:
    """One update with the recipe of ``c``: loss, backward, global-norm clip at 1, step."""
    c.model.train()
    loss = c.loss_fn(c.model, batch)
    c.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(c.model.parameters(), 1.0)
    c.optimizer.step()
    if c.scheduler is not None:
        c.scheduler.step()


@torch.no_grad()
def _exact_match(c: Contender, pairs: Sequence[tuple[str, str]], tgt_vocab: CharVocab) -> float:
    """Fraction of held-out pairs whose greedy translation is exactly the ISO date."""
    src_vocab, _ = date_vocabs()
    batch = encode_batch(pairs, src_vocab, tgt_vocab)
    c.model.eval()
    tokens = c.translate(c.model, batch.src, batch.src_mask)  # (B, T)
    guesses = [tgt_vocab.decode(row) for row in tokens]
    return sum(g == iso for g, (_, iso) in zip(guesses, pairs, strict=True)) / len(pairs)


def race_to_quality(
    threshold: float = 0.95,
    seed: int = 0,
    *,
    eval_every: int = 25,
    max_steps: int = 1600,
    n_test: int = 500,
    batch_size: int = 64,
    cache: str | None = None,
) -> dict[str, dict[str, list[float] | int | float]]:
    """Train each contender on the same batches until its held-out exact match reaches
    ``threshold`` (checked every ``eval_every`` steps), or for ``max_steps``.

    Both see the same stream of length-bucketed batches (the translator's, from
    :func:`~coursepkg.data.dates.date_split`) and are judged on the same held-out dates, whose
    calendar days never occur in training.

    Args:
        threshold: the held-out exact match that counts as "trained" (in (0, 1]).
        seed: seeds the data split and both models' initial weights.
        eval_every: steps between held-out evaluations.
        max_steps: the most steps each model gets.
        n_test: held-out dates.
        batch_size: pairs per step.
        cache: None, ``"save"`` or ``"reuse"`` (:mod:`coursepkg.chapters.run_cache`).

    Returns:
        name -> ``{"steps": steps to reach the threshold (0 if never), "eval_step": [...],
        "exact_match": [...], "tokens": training tokens processed until then, "seconds":
        training seconds until then (evaluations excluded; this run's load, not a
        side-by-side timing)}``.
    """
    settings = {k: v for k, v in locals().items() if k != "cache"}
    if not (isinstance(threshold, float | int) and 0 < threshold <= 1):
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
    for name in ("eval_every", "max_steps", "n_test", "batch_size"):
        if not isinstance(settings[name], int) or settings[name] < 1:
            raise ValueError(f"{name} must be a positive int, got {settings[name]!r}")
    check_cache_mode(cache)
    path = cache_file(settings, "rnn_vs_transformer") if cache is not None else None
    saved: dict = {}
    if cache == "reuse" and reuse_run(path, saved.update):
        return saved["results"]
    results = {
        name: _race_one(build(seed), threshold, seed, eval_every, max_steps, n_test, batch_size)
        for name, build in CONTENDERS.items()
    }
    if path is not None:
        save_run(path, {"results": results}, "the RNN-Transformer race")
    return results


def _race_one(
    c: Contender,
    threshold: float,
    seed: int,
    eval_every: int,
    max_steps: int,
    n_test: int,
    batch_size: int,
) -> dict[str, list[float] | int | float]:
    """Train one contender until its held-out exact match reaches ``threshold``."""
    src_vocab, tgt_vocab = date_vocabs()
    train_pairs, test_pairs = date_split(max_steps * batch_size, n_test, seed=seed)
    record: dict = {"steps": 0, "eval_step": [], "exact_match": [], "tokens": 0, "seconds": 0.0}
    batches = date_batches(train_pairs, batch_size, src_vocab, tgt_vocab, seed)
    for step, batch in enumerate(islice(batches, max_steps), start=1):
        started = time.perf_counter()
        _train_step(c, batch)
        record["seconds"] += time.perf_counter() - started
        record["tokens"] += tokens_in(batch)
        if step % eval_every == 0:
            record["eval_step"].append(step)
            record["exact_match"].append(_exact_match(c, test_pairs, tgt_vocab))
            if record["exact_match"][-1] >= threshold:
                record["steps"] = step
                break
    return record


def step_seconds(
    rounds: int = 20,
    seed: int = 0,
    batch_size: int = 64,
    warmup: int = 3,
    *,
    max_steps: int = 1600,
    n_test: int = 500,
) -> dict[str, dict[str, float]]:
    """Training steps of both contenders on the same date batches, interleaved.

    Round r runs one step of each model on batch r, in turn, so that a change in the machine's
    load touches both alike. The batches are the first of :func:`race_to_quality`'s stream with
    the same arguments. The first ``warmup`` rounds are not counted.

    Args:
        rounds: timed rounds.
        seed: seeds the data and the models.
        batch_size: pairs per step.
        warmup: untimed rounds first.
        max_steps: the race's ``max_steps`` (it sizes the data split, hence the batches).
        n_test: the race's held-out dates (likewise).

    Returns:
        name -> ``{"seconds": median seconds per step, "tokens_per_second": real tokens of the
        timed batches over their total time}``.
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    src_vocab, tgt_vocab = date_vocabs()
    train_pairs, _ = date_split(max(max_steps, rounds + warmup) * batch_size, n_test, seed=seed)
    contenders = {name: build(seed) for name, build in CONTENDERS.items()}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    tokens = 0
    batches = date_batches(train_pairs, batch_size, src_vocab, tgt_vocab, seed)
    for r, batch in enumerate(islice(batches, rounds + warmup)):
        for name, c in contenders.items():
            started = time.perf_counter()
            _train_step(c, batch)
            if r >= warmup:
                times[name].append(time.perf_counter() - started)
        tokens += tokens_in(batch) if r >= warmup else 0
    return {
        name: {"seconds": statistics.median(t), "tokens_per_second": tokens / sum(t)}
        for name, t in times.items()
    }


def forward_backward_seconds(
    lengths: Sequence[int], batch_size: int = 64, repeats: int = 3, seed: int = 0
) -> dict[str, list[float]]:
    """One forward and backward pass of each contender's loss at each sequence length.

    Sources and targets are random ids of length L each (no padding), so the RNN's encoder and
    decoder both run L steps; the Transformer's layers take all L positions at once.

    Args:
        lengths: the sequence lengths L.
        batch_size: B.
        repeats: rounds over every length and contender; each time is the best of the rounds.
        seed: seeds the models and the ids.

    Returns:
        name -> seconds at each length.
    """
    if not lengths or any(not isinstance(n, int) or n < 2 for n in lengths):
        raise ValueError(f"lengths must be ints >= 2, got {lengths!r}")
    contenders = {
        name: build(seed, max_len=max(lengths)) if build is transformer else build(seed)
        for name, build in CONTENDERS.items()
    }
    generator = torch.Generator().manual_seed(seed)
    src_vocab, tgt_vocab = _vocab_sizes(0, 0)
    batches = [_random_batch(generator, batch_size, n, src_vocab, tgt_vocab) for n in lengths]
    best = {name: [math.inf] * len(lengths) for name in contenders}
    # Rounds outermost: a burst of load from elsewhere slows one round of every length, not
    # every repeat of one length, and the best of the rounds leaves it out.
    for _ in range(repeats):
        for i, batch in enumerate(batches):
            for name, c in contenders.items():
                c.model.train()
                started = time.perf_counter()
                c.loss_fn(c.model, batch).backward()
                best[name][i] = min(best[name][i], time.perf_counter() - started)
                c.model.zero_grad(set_to_none=True)
    return best


def _random_batch(
    generator: torch.Generator, batch_size: int, length: int, src_vocab: int, tgt_vocab: int
) -> Seq2SeqBatch:
    """A batch of B random sources and targets of ``length`` ordinary ids each."""
    first = UNK_ID + 1  # the ids below are special tokens (pad, bos, eos, unk)
    src = torch.randint(first, src_vocab, (batch_size, length), generator=generator)  # (B, S)
    # L - 1 ids, then EOS: tgt_in and tgt_out have L positions
    tgt = torch.randint(first, tgt_vocab, (batch_size, length - 1), generator=generator)
    return make_seq2seq_batch(src.tolist(), tgt.tolist())
