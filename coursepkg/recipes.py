"""Ready-made training runs the book uses: small, seeded, and fast enough to run at build time.

:func:`train_date_translator` trains an encoder-decoder :class:`~coursepkg.Transformer` to turn
human-written dates ("Sunday, 22 November 2026") into ISO dates ("2026-11-22") with the paper's
recipe scaled down: Adam with beta2 = 0.98, the warm-up schedule of Sec. 5.3
(:func:`~coursepkg.schedule.noam_lr`), label smoothing (Sec. 5.4), and the average of the last
checkpoints as the final model (Sec. 6.1). The calendar dates of the
held-out set never occur in training (:func:`~coursepkg.data.dates.date_split`), so its exact-match
accuracy measures generalisation, not memorisation.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from coursepkg.config import TransformerConfig
from coursepkg.data.batching import Seq2SeqBatch, pad_sequences
from coursepkg.data.dates import date_split, date_vocabs, encode_batch
from coursepkg.data.text import char_lm_batches, load_tinyshakespeare
from coursepkg.data.vocab import BOS_ID, EOS_ID, PAD_ID, CharVocab
from coursepkg.decoding import beam_search, greedy_decode
from coursepkg.model import DecoderOnlyLM, Transformer
from coursepkg.schedule import label_smoothed_cross_entropy, noam_scheduler
from coursepkg.train import History, fit, seed_everything

__all__ = [
    "CharGPT",
    "DateTranslator",
    "ISO_LENGTH",
    "count_bigram",
    "train_char_gpt",
    "train_date_translator",
]

ISO_LENGTH = 10  # characters of "YYYY-MM-DD"; decoding stops after these and EOS


@dataclass
class DateTranslator:
    """A trained date translator and what its training measured.

    Attributes:
        model: the encoder-decoder, in eval mode.
        src_vocab: characters of the human-written dates.
        tgt_vocab: characters of the ISO dates.
        history: the :class:`~coursepkg.train.History` of the run (loss, learning rate, and the
            held-out ``exact_match`` at every evaluation).
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


def _batches(
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


#: Where ``train_date_translator(cache=...)`` keeps trained translators (override with the
#: environment variable ``COURSEPKG_CACHE_DIR``).
CACHE_ENV = "COURSEPKG_CACHE_DIR"


def _cache_file(settings: dict, name: str = "date_translator") -> Path:
    """The cache file of a training run: a hash of its settings, the thread count, the CPU
    kernels PyTorch dispatches to, PyTorch's version and the source of every coursepkg module it
    could depend on, so that a change to any of them means a new run rather than a stale one.

    The kernels matter: ``ATEN_CPU_CAPABILITY=avx2`` on a CPU with AVX-512 selects other
    vectorised kernels, whose rounding differs in the last bits, and after a thousand steps the
    weights differ too."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "coursepkg")
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    digest.update(
        f"{torch.__version__} threads={torch.get_num_threads()} "
        f"cpu={torch.backends.cpu.get_cpu_capability()}".encode()
    )
    package = Path(__file__).resolve().parent
    for source in sorted(package.rglob("*.py")):
        if "grading" not in source.relative_to(package).parts:
            digest.update(source.relative_to(package).as_posix().encode() + source.read_bytes())
    return root / f"{name}-{digest.hexdigest()[:20]}.pt"


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
        progress: show :func:`~coursepkg.train.fit`'s tqdm progress bar.
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
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if not isinstance(n_test, int) or n_test < 1:
        raise ValueError(f"n_test must be a positive int, got {n_test!r}")
    bad = [c for c in checkpoints if not (isinstance(c, int) and 1 <= c < steps)]
    if bad:
        raise ValueError(f"checkpoints must be ints in [1, steps={steps}), got {bad}")
    if not isinstance(average, int) or average < 1:
        raise ValueError(f"average must be a positive int, got {average!r}")
    if not isinstance(average_every, int) or average_every < 1:
        raise ValueError(f"average_every must be a positive int, got {average_every!r}")
    if cache not in (None, "save", "reuse"):
        raise ValueError(f"cache must be None, 'save' or 'reuse', got {cache!r}")
    if (average - 1) * average_every >= steps:
        raise ValueError(
            f"average={average} checkpoints {average_every} steps apart need more than "
            f"{(average - 1) * average_every} steps, got steps={steps}"
        )
    settings["checkpoints"] = sorted(checkpoints)  # validated above
    cache_file = _cache_file(settings) if cache is not None else None
    seed_everything(seed)
    src_vocab, tgt_vocab = date_vocabs()
    train_pairs, test_pairs = date_split(steps * batch_size, n_test, seed=seed)
    config = TransformerConfig(
        vocab_size=len(tgt_vocab),
        src_vocab_size=len(src_vocab),
        share_embeddings=False,  # the two alphabets differ
        tie_embeddings=True,  # the output head reuses the target embedding (Sec. 3.4)
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        dropout=dropout,
        max_len=64,  # the longest human date has 29 characters
        pad_id=PAD_ID,
    )
    model = Transformer(config)
    translator = DateTranslator(model, src_vocab, tgt_vocab, History(), test_pairs)
    if cache == "reuse" and cache_file is not None and cache_file.is_file():
        try:
            saved = torch.load(cache_file, weights_only=True)
            model.load_state_dict(saved["model"])
            translator.history = History(**saved["history"])
            translator.accuracy, translator.seconds = saved["accuracy"], saved["seconds"]
            translator.checkpoints = saved["checkpoints"]
            model.eval()
            return translator
        except Exception as err:  # noqa: BLE001 - a cache that cannot be read is retrained
            warnings.warn(f"ignoring the unreadable cache {cache_file}: {err}", stacklevel=2)
    # foreach: one call per operation for all parameters instead of one per parameter (same
    # numbers; on a model this small the number of calls is much of a step's cost).
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, foreach=True
    )
    scheduler = noam_scheduler(optimizer, d_model, warmup_steps, lr_factor)
    monitor = test_pairs[:eval_size]
    # fit evaluates at every multiple of eval_every and at the last step; the last one uses the
    # whole held-out set.
    n_evals = steps // eval_every + (steps % eval_every != 0)
    calls = [0]
    started = time.perf_counter()

    def evaluate(_model: Transformer) -> dict[str, float]:
        calls[0] += 1
        return {
            "exact_match": translator.exact_match(test_pairs if calls[0] == n_evals else monitor)
        }

    averaged = [steps - k * average_every for k in range(1, average)]  # before the last step
    kept: dict[int, dict[str, Tensor]] = {}
    history = fit(
        model,
        _batches(train_pairs, batch_size, src_vocab, tgt_vocab, seed),
        _loss(smoothing, set(checkpoints) | set(averaged), kept),
        steps=steps,
        optimizer=optimizer,
        scheduler=scheduler,
        clip_norm=1.0,
        eval_fn=evaluate,
        eval_every=eval_every,
        progress=progress,
        desc="date translator",
    )
    translator.checkpoints = {step: kept[step] for step in sorted(checkpoints)}
    if averaged:
        # The mean of each weight over the checkpoints (Sec. 6.1 of the paper).
        states = [kept[step] for step in averaged] + [model.state_dict()]
        model.load_state_dict(
            {
                name: torch.stack([s[name] for s in states]).mean(0)
                if value.is_floating_point()
                else value
                for name, value in states[-1].items()
            }
        )
    model.eval()
    translator.history = history
    translator.accuracy = (
        translator.exact_match(test_pairs) if averaged else history.metrics["exact_match"][-1]
    )
    translator.seconds = time.perf_counter() - started
    if cache_file is not None:
        saved = {
            "model": model.state_dict(),
            "checkpoints": translator.checkpoints,
            "history": asdict(history),
            "accuracy": translator.accuracy,
            "seconds": translator.seconds,
        }
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            partial = cache_file.with_suffix(f".{os.getpid()}.part")
            torch.save(saved, partial)
            partial.replace(cache_file)  # whole or not at all
        except OSError as err:
            warnings.warn(
                f"could not save the trained translator to {cache_file}: {err}", stacklevel=2
            )
    return translator


@dataclass
class CharGPT:
    """A character-level GPT trained on Tiny Shakespeare, and what its training measured.

    Attributes:
        model: the :class:`~coursepkg.DecoderOnlyLM`, in eval mode.
        vocab: the corpus' characters plus the special ids.
        history: the :class:`~coursepkg.train.History` of the run; ``metrics["train"]`` and
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


def _next_char_loss(model: DecoderOnlyLM, batch: tuple[Tensor, Tensor]) -> Tensor:
    x, y = batch  # (B, L), (B, L)
    logits = model(x)  # (B, L, V)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def train_char_gpt(
    steps: int = 350,
    seed: int = 0,
    progress: bool = True,
    *,
    d_model: int = 64,
    n_heads: int = 4,
    d_ff: int = 256,
    n_layers: int = 2,
    block_size: int = 64,
    batch_size: int = 32,
    lr: float = 1e-2,
    warmup_steps: int = 30,
    eval_every: int = 50,
    cache: str | None = None,
) -> CharGPT:
    """Train a small GPT-2-shaped character model on Tiny Shakespeare (chapter 11's run).

    Pre-LN layers with GELU, learned positions, a final LayerNorm and a tied head (GPT-2's
    design, at a small scale). The first 90% of the corpus trains, the last 10% is held out.
    Adam at ``lr`` follows a linear warm-up over ``warmup_steps`` and then a linear decay to
    10% at the last step; gradients are clipped at norm 1 (:func:`~coursepkg.train.fit`).
    Every ``eval_every`` steps the mean loss on 4 fixed batches of 64 windows of the training
    and of the held-out text is recorded.

    Args:
        steps: optimisation steps.
        seed: seeds the initialisation and the training windows.
        progress: show :func:`~coursepkg.train.fit`'s progress bar.
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
            count, and trains and saves one if there is none. Chapter 11 saves, chapter 12
            reuses.

    Returns:
        A :class:`CharGPT` with the model in eval mode.
    """
    settings = {k: v for k, v in locals().items() if k not in ("progress", "cache")}
    for name in ("steps", "d_model", "n_heads", "d_ff", "n_layers", "block_size", "batch_size"):
        value = settings[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if cache not in (None, "save", "reuse"):
        raise ValueError(f"cache must be None, 'save' or 'reuse', got {cache!r}")
    cache_file = _cache_file(settings, "char_gpt") if cache is not None else None
    text = load_tinyshakespeare()
    vocab = CharVocab.from_corpus(text)
    ids = torch.tensor(vocab.encode(text))  # (N,)
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
    if cache == "reuse" and cache_file is not None and cache_file.is_file():
        try:
            saved = torch.load(cache_file, weights_only=True)
            model.load_state_dict(saved["model"])
            result.history, result.seconds = History(**saved["history"]), saved["seconds"]
            model.eval()
            return result
        except Exception as err:  # noqa: BLE001 - a cache that cannot be read is retrained
            warnings.warn(f"ignoring the unreadable cache {cache_file}: {err}", stacklevel=2)

    def evaluate(trained: DecoderOnlyLM) -> dict[str, float]:
        return {
            name: sum(_next_char_loss(trained, b).item() for b in batches) / len(batches)
            for name, batches in windows.items()
        }

    def warmup_then_decay(step: int) -> float:
        return min(1.0, (step + 1) / warmup_steps) * max(0.1, 1 - step / steps)

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    started = time.perf_counter()
    result.history = fit(
        model,
        char_lm_batches(train_ids, vocab, block_size, batch_size, generator=generator),
        _next_char_loss,
        steps=steps,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay),
        eval_fn=evaluate,
        eval_every=eval_every,
        progress=progress,
        desc="char GPT",
    )
    result.seconds = time.perf_counter() - started
    model.eval()
    if cache_file is not None:
        saved = {
            "model": model.state_dict(),
            "history": asdict(result.history),
            "seconds": result.seconds,
        }
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            partial = cache_file.with_suffix(f".{os.getpid()}.part")
            torch.save(saved, partial)
            partial.replace(cache_file)  # whole or not at all
        except OSError as err:
            warnings.warn(f"could not save the trained GPT to {cache_file}: {err}", stacklevel=2)
    return result


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
