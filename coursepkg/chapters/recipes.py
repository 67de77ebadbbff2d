"""Ready-made training runs the book uses: small, seeded, and fast enough to run at build time.

:func:`train_date_translator` trains an encoder-decoder :class:`~coursepkg.Transformer` to turn
human-written dates ("Sunday, 22 November 2026") into ISO dates ("2026-11-22") with the paper's
recipe scaled down: Adam with beta2 = 0.98, the warm-up schedule of Sec. 5.3
(:func:`~coursepkg.schedule.noam_lr`), label smoothing (Sec. 5.4), and the average of the last
checkpoints as the final model (Sec. 6.1). The calendar dates of the
held-out set never occur in training (:func:`~coursepkg.data.dates.date_split`), so its exact-match
accuracy measures generalisation, not memorisation.

Chapter 12's character GPT and the count bigram model it is compared with are in
:mod:`coursepkg.chapters.char_gpt`; keeping a run on disk is :mod:`coursepkg.chapters.run_cache`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from coursepkg.chapters.train import History, fit, seed_everything
from coursepkg.config import TransformerConfig
from coursepkg.data.batching import Seq2SeqBatch, pad_sequences
from coursepkg.data.dates import date_split, date_vocabs, encode_batch
from coursepkg.data.vocab import BOS_ID, EOS_ID, PAD_ID, CharVocab
from coursepkg.decoding import beam_search, greedy_decode
from coursepkg.model import Transformer
from coursepkg.schedule import label_smoothed_cross_entropy, noam_scheduler

from .run_cache import cache_file, check_cache_mode, restore_run, reuse_run, run_record, save_run

__all__ = [
    "DateTranslator",
    "ISO_LENGTH",
    "date_batches",
    "train_date_translator",
    "translator_config",
]

ISO_LENGTH = 10  # characters of "YYYY-MM-DD"; decoding stops after these and EOS


@dataclass
class DateTranslator:
    """A trained date translator and what its training measured.

    Attributes:
        model: the encoder-decoder, in eval mode.
        src_vocab: characters of the human-written dates.
        tgt_vocab: characters of the ISO dates.
        history: the :class:`~coursepkg.chapters.train.History` of the run (loss, learning rate,
            and the held-out ``exact_match`` at every evaluation).
        test_pairs: the held-out ``(human, iso)`` pairs (their calendar days are not in training).
        accuracy: exact-match accuracy of greedy decoding on ``test_pairs`` with the final
            model (the average of the last checkpoints). The history's last ``exact_match`` is
            that of the weights after the last step alone.
        seconds: wall-clock time of the training run (evaluations included).
        checkpoints: step -> copy of the model's ``state_dict`` after that many updates (the
            steps asked for with ``checkpoints=``); load one with :meth:`at_checkpoint`.
    """

    model: Transformer
    src_vocab: CharVocab
    tgt_vocab: CharVocab
    history: History
    test_pairs: list[tuple[str, str]] = field(repr=False)
    accuracy: float = 0.0
    seconds: float = 0.0
    checkpoints: dict[int, dict[str, Tensor]] = field(default_factory=dict, repr=False)

    def at_checkpoint(self, step: int) -> DateTranslator:
        """A translator whose model holds the weights saved after ``step`` updates.

        Args:
            step: one of the keys of :attr:`checkpoints`.

        Returns:
            A new :class:`DateTranslator` (eval mode) sharing vocabularies, history and test set;
            its ``accuracy`` is recomputed on ``test_pairs``.
        """
        if step not in self.checkpoints:
            raise ValueError(
                f"step must be one of the saved checkpoints {sorted(self.checkpoints)}, got {step}"
            )
        model = Transformer(self.model.config)
        model.load_state_dict(self.checkpoints[step])
        model.eval()
        other = DateTranslator(
            model, self.src_vocab, self.tgt_vocab, self.history, self.test_pairs, 0.0, self.seconds
        )
        other.accuracy = other.exact_match(self.test_pairs)
        return other

    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Source ids and token mask of some human-written dates.

        Args:
            texts: B strings.

        Shape:
            src (B, S), src_mask (B, S), True = real character.
        """
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings; wrap a single date in a list")
        return pad_sequences([self.src_vocab.encode(t) for t in texts])  # (B, S)

    def translate(
        self, texts: Sequence[str], beam_size: int = 1, length_penalty: float = 1.0
    ) -> list[str]:
        """ISO dates for human-written ones: greedy decoding, or beam search if ``beam_size > 1``.

        Args:
            texts: B human-written dates, e.g. ``["22 Nov 2026"]``.
            beam_size: 1 for :func:`~coursepkg.decoding.greedy_decode`, else the beam width of
                :func:`~coursepkg.decoding.beam_search`.
            length_penalty: alpha of beam search's length normalisation.

        Returns:
            B strings (special tokens removed).
        """
        src, src_mask = self.encode(texts)  # (B, S)
        self.model.eval()
        if beam_size == 1:
            out = greedy_decode(
                self.model, src, ISO_LENGTH + 1, BOS_ID, EOS_ID, src_mask=src_mask
            )  # (B, 1 + T)
        else:
            out, _ = beam_search(
                self.model, src, beam_size, ISO_LENGTH + 1, BOS_ID, EOS_ID, length_penalty, src_mask
            )  # (B, 1 + T)
        return [self.tgt_vocab.decode(row) for row in out]

    def exact_match(self, pairs: Sequence[tuple[str, str]], batch_size: int = 500) -> float:
        """Fraction of ``(human, iso)`` pairs whose greedy translation equals ``iso`` exactly."""
        if len(pairs) == 0:
            raise ValueError("pairs must hold at least one (human, iso) pair, got none")
        correct = 0
        for i in range(0, len(pairs), batch_size):
            chunk = pairs[i : i + batch_size]
            guesses = self.translate([human for human, _ in chunk])
            correct += sum(g == iso for g, (_, iso) in zip(guesses, chunk, strict=True))
        return correct / len(pairs)


def date_batches(
    pairs: list[tuple[str, str]],
    batch_size: int,
    src_vocab: CharVocab,
    tgt_vocab: CharVocab,
    seed: int,
    bucket: int = 16,
) -> Iterator[Seq2SeqBatch]:
    """Non-overlapping batches of ``pairs`` (each training pair is used once), length-bucketed.

    Human dates have 8 to 29 characters, and a batch is padded to its longest source. Sorting each
    window of ``bucket`` batches by source length before cutting it into batches (then shuffling
    those batches) puts dates of similar length together, which removes most of the padding and
    so most of the wasted computation.

    Args:
        pairs: ``(human, iso)`` date pairs, in the order they are used.
        batch_size: pairs per batch (B).
        src_vocab: characters of the human-written dates.
        tgt_vocab: characters of the ISO dates.
        seed: seeds the order of the batches within each window.
        bucket: batches per length-sorted window.

    Returns:
        An iterator of encoded batches (:func:`~coursepkg.data.dates.encode_batch`).
    """
    rng = random.Random(seed)
    window = batch_size * bucket
    for start in range(0, len(pairs) - batch_size + 1, window):
        chunk = sorted(pairs[start : start + window], key=lambda p: len(p[0]))
        cuts = list(range(0, len(chunk) - batch_size + 1, batch_size))
        rng.shuffle(cuts)
        for i in cuts:
            yield encode_batch(chunk[i : i + batch_size], src_vocab, tgt_vocab)


def _loss(smoothing: float, checkpoints: set[int], saved: dict[int, dict[str, Tensor]]):
    calls = [0]

    def loss_fn(model: Transformer, batch: Seq2SeqBatch) -> Tensor:
        # Call n comes before update n, so the weights seen here have had n - 1 updates.
        if calls[0] in checkpoints:
            saved[calls[0]] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        calls[0] += 1
        logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (B, T, V)
        return label_smoothed_cross_entropy(logits, batch.tgt_out, smoothing, ignore_index=PAD_ID)

    return loss_fn


def train_date_translator(
    steps: int = 1600,
    seed: int = 0,
    progress: bool = True,
    *,
    d_model: int = 64,
    n_heads: int = 4,
    d_ff: int = 128,
    n_layers: int = 1,
    dropout: float = 0.0,
    batch_size: int = 64,
    warmup_steps: int = 100,
    lr_factor: float = 0.5,
    smoothing: float = 0.1,
    average: int = 5,
    average_every: int = 100,
    n_test: int = 1000,
    eval_every: int = 100,
    eval_size: int = 200,
    checkpoints: Sequence[int] = (),
    cache: str | None = None,
) -> DateTranslator:
    """Train a small Transformer on date normalisation with the paper's recipe, scaled down.

    Adam (beta = (0.9, 0.98), eps = 1e-9, Sec. 5.3) follows ``lr_factor * noam_lr(step, D,
    warmup_steps)``; the loss is label-smoothed cross-entropy (Sec. 5.4) ignoring padding. Every
    training batch is fresh (``steps * batch_size`` pairs are drawn), so dropout is off by
    default: there is nothing to over-fit. As in the paper (Sec. 6.1), the final model is the
    average of the weights of the last ``average`` checkpoints, ``average_every`` steps apart
    (the last one after the last step). Everything is seeded by ``seed``; how accurate the
    result is on other CPUs and thread counts is measured by ``scripts/robustness.py``.

    Args:
        steps: optimisation steps.
        seed: seeds the data split and the model's initialisation.
        progress: show :func:`~coursepkg.chapters.train.fit`'s tqdm progress bar.
        d_model: D.
        n_heads: H.
        d_ff: F.
        n_layers: encoder and decoder layers each.
        dropout: P_drop.
        batch_size: pairs per step.
        warmup_steps: steps of linear warm-up before the inverse-square-root decay.
        lr_factor: multiplies the schedule.
        smoothing: label-smoothing epsilon.
        average: how many checkpoints the final model averages (1: the last weights alone).
        average_every: steps between the averaged checkpoints.
        n_test: held-out pairs (their calendar days never appear in training).
        eval_every: steps between evaluations recorded in the history.
        eval_size: held-out pairs greedily decoded at each intermediate evaluation (the final
            accuracy always uses all ``n_test``).
        checkpoints: steps (in ``[1, steps)``) after which to keep a copy of the weights, e.g.
            an under-trained model to compare decoders on.
        cache: ``None`` (default) trains and keeps nothing on disk; ``"save"`` trains and saves
            the result under ``~/.cache/coursepkg`` (or ``$COURSEPKG_CACHE_DIR``); ``"reuse"``
            loads a run saved with exactly these arguments, the same coursepkg source, PyTorch
            version and thread count (so the same weights as training again), and trains and
            saves one if there is none. Chapter 8 saves, chapter 9 reuses.

    Returns:
        A :class:`DateTranslator` with the model in eval mode; ``history.metrics["exact_match"]``
        holds the held-out exact match at every evaluation, ``accuracy`` the final one.
    """
    # Every argument that shapes the run keys its cache file (read before anything else is bound).
    settings = {k: v for k, v in locals().items() if k not in ("progress", "cache")}
    _check_translator_settings(settings, cache)
    settings["checkpoints"] = sorted(checkpoints)  # validated above
    path = cache_file(settings, "date_translator") if cache is not None else None
    run = SimpleNamespace(**settings)
    translator, train_pairs = _untrained_translator(run)
    if cache == "reuse" and reuse_run(path, partial(_restore_translator, translator)):
        return translator
    _train_translator(translator, train_pairs, run, progress)
    if path is not None:
        save_run(path, _translator_record(translator), "the trained translator")
    return translator


def _check_translator_settings(settings: dict[str, Any], cache: str | None) -> None:
    """Fail with a clear message on an argument of :func:`train_date_translator` out of range."""
    s = SimpleNamespace(**settings)
    for name in ("steps", "batch_size", "n_test"):
        value = settings[name]
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    bad = [c for c in s.checkpoints if not (isinstance(c, int) and 1 <= c < s.steps)]
    if bad:
        raise ValueError(f"checkpoints must be ints in [1, steps={s.steps}), got {bad}")
    for name in ("average", "average_every"):
        value = settings[name]
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    check_cache_mode(cache)
    if (s.average - 1) * s.average_every >= s.steps:
        raise ValueError(
            f"average={s.average} checkpoints {s.average_every} steps apart need more than "
            f"{(s.average - 1) * s.average_every} steps, got steps={s.steps}"
        )


def _untrained_translator(run: SimpleNamespace) -> tuple[DateTranslator, list[tuple[str, str]]]:
    """The seeded data split and the freshly initialised model of a run (in this order, so
    that the same seed gives the same weights), and the training pairs."""
    seed_everything(run.seed)
    src_vocab, tgt_vocab = date_vocabs()
    train_pairs, test_pairs = date_split(run.steps * run.batch_size, run.n_test, seed=run.seed)
    config = translator_config(
        len(src_vocab),
        len(tgt_vocab),
        d_model=run.d_model,
        n_heads=run.n_heads,
        d_ff=run.d_ff,
        n_layers=run.n_layers,
        dropout=run.dropout,
    )
    model = Transformer(config)
    return DateTranslator(model, src_vocab, tgt_vocab, History(), test_pairs), train_pairs


def translator_config(
    src_vocab_size: int,
    tgt_vocab_size: int,
    *,
    max_len: int = 64,
    d_model: int = 64,
    n_heads: int = 4,
    d_ff: int = 128,
    n_layers: int = 1,
    dropout: float = 0.0,
) -> TransformerConfig:
    """The configuration of the date translator (:func:`train_date_translator`'s defaults).

    Args:
        src_vocab_size: characters of the human-written dates.
        tgt_vocab_size: characters of the ISO dates, V.
        max_len: the longest sequence the positional encoding covers (the longest human date
            has 29 characters).
        d_model: D.
        n_heads: H.
        d_ff: F.
        n_layers: encoder and decoder layers each.
        dropout: P_drop.

    Returns:
        A :class:`~coursepkg.config.TransformerConfig` with separate source and target
        embeddings (the two alphabets differ) and the output head tied to the target embedding
        (Sec. 3.4).
    """
    return TransformerConfig(
        vocab_size=tgt_vocab_size,
        src_vocab_size=src_vocab_size,
        share_embeddings=False,
        tie_embeddings=True,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        dropout=dropout,
        max_len=max_len,
        pad_id=PAD_ID,
    )


def _train_translator(
    translator: DateTranslator,
    train_pairs: list[tuple[str, str]],
    run: SimpleNamespace,
    progress: bool,
) -> None:
    """Train the translator's model with the paper's recipe, average the last checkpoints
    into it, and record the history, the kept checkpoints, the accuracy and the time."""
    model, test_pairs = translator.model, translator.test_pairs
    # foreach: one call per operation for all parameters instead of one per parameter (same
    # numbers; on a model this small the number of calls is much of a step's cost).
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, foreach=True
    )
    scheduler = noam_scheduler(optimizer, run.d_model, run.warmup_steps, run.lr_factor)
    monitor = test_pairs[: run.eval_size]
    # fit evaluates at every multiple of eval_every and at the last step; the last one uses the
    # whole held-out set.
    n_evals = run.steps // run.eval_every + (run.steps % run.eval_every != 0)
    calls = [0]
    started = time.perf_counter()

    def evaluate(_model: Transformer) -> dict[str, float]:
        calls[0] += 1
        return {
            "exact_match": translator.exact_match(test_pairs if calls[0] == n_evals else monitor)
        }

    # The checkpoints averaged with the final weights, before the last step.
    averaged = [run.steps - k * run.average_every for k in range(1, run.average)]
    kept: dict[int, dict[str, Tensor]] = {}
    src_vocab, tgt_vocab = translator.src_vocab, translator.tgt_vocab
    history = fit(
        model,
        date_batches(train_pairs, run.batch_size, src_vocab, tgt_vocab, run.seed),
        _loss(run.smoothing, set(run.checkpoints) | set(averaged), kept),
        steps=run.steps,
        optimizer=optimizer,
        scheduler=scheduler,
        clip_norm=1.0,
        eval_fn=evaluate,
        eval_every=run.eval_every,
        progress=progress,
        desc="date translator",
    )
    translator.checkpoints = {step: kept[step] for step in run.checkpoints}
    if averaged:
        _average_into(model, [kept[step] for step in averaged])
    model.eval()
    translator.history = history
    translator.accuracy = (
        translator.exact_match(test_pairs) if averaged else history.metrics["exact_match"][-1]
    )
    translator.seconds = time.perf_counter() - started


def _average_into(model: torch.nn.Module, states: list[dict[str, Tensor]]) -> None:
    """Replace each floating-point weight of ``model`` by its mean over ``states`` and the
    model's own (Sec. 6.1 of the paper); integer buffers keep the model's values."""
    states = [*states, model.state_dict()]
    model.load_state_dict(
        {
            name: torch.stack([s[name] for s in states]).mean(0)
            if value.is_floating_point()
            else value
            for name, value in states[-1].items()
        }
    )


def _translator_record(translator: DateTranslator) -> dict[str, Any]:
    """What the cache keeps of a trained translator."""
    return {
        **run_record(translator),
        "checkpoints": translator.checkpoints,
        "accuracy": translator.accuracy,
        "seconds": translator.seconds,
    }


def _restore_translator(translator: DateTranslator, saved: dict[str, Any]) -> None:
    """Put a saved translator's weights and measurements in place (the model in eval mode)."""
    restore_run(translator, saved)
    translator.accuracy, translator.seconds = saved["accuracy"], saved["seconds"]
    translator.checkpoints = saved["checkpoints"]
