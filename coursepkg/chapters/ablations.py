"""Small character models that differ in one design choice, trained alike (chapter 16).

Chapter 16 measures each change from the 2017 block to today's decoder (pre-norm, RMSNorm, rotary
positions, the gated feed-forward, grouped-query attention) by training two or three tiny
:class:`~coursepkg.DecoderOnlyLM` on Tiny Shakespeare's characters that are the same in everything
but that choice: the same steps, windows, learning-rate schedule and seed.
:func:`train_variant` trains one (and keeps it on disk with :mod:`coursepkg.chapters.run_cache` when
asked); :func:`position_losses` measures a trained one on held-out windows, position by position,
which is how the chapter reads length generalisation.

Dimension legend: B windows, L characters per window, V vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from coursepkg.chapters.char_gpt import next_char_loss, shakespeare_split
from coursepkg.chapters.train import History, fit_warmup_decay, seed_everything
from coursepkg.config import TransformerConfig
from coursepkg.data.text import char_lm_batches
from coursepkg.data.vocab import CharVocab
from coursepkg.decoder_only import DecoderOnlyLM

from .run_cache import cache_file, check_cache_mode, restore_run, reuse_run, run_record, save_run

__all__ = ["BASE", "Variant", "position_losses", "train_variant"]

#: The shared small model: pre-LN, GELU, learned positions, tied head (chapter 12's GPT, smaller).
BASE: dict[str, Any] = dict(
    d_model=48,
    n_heads=4,
    d_ff=192,
    n_layers=2,
    dropout=0.0,
    max_len=256,
    norm_first=True,
    positional="learned",
    activation="gelu",
)


@dataclass
class Variant:
    """One trained variant and what its training measured.

    Attributes:
        model: the :class:`~coursepkg.DecoderOnlyLM`, in eval mode.
        vocab: Tiny Shakespeare's characters plus the special ids.
        history: the run's :class:`~coursepkg.chapters.train.History` (``loss``: the training loss
            of every step; ``metrics["held-out"]``: the mean loss on fixed held-out windows).
        heldout_ids: the last 10% of the corpus, encoded (never trained on).
    """

    model: DecoderOnlyLM
    vocab: CharVocab
    history: History
    heldout_ids: Tensor = field(repr=False)

    @property
    def parameters(self) -> int:
        """The model's distinct trainable parameters."""
        return sum(p.numel() for p in self.model.parameters())


def train_variant(
    changes: dict[str, Any] | None = None,
    *,
    steps: int = 300,
    block_size: int = 64,
    batch_size: int = 16,
    lr: float = 3e-3,
    warmup_steps: int = 30,
    seed: int = 0,
    cache: str | None = None,
    progress: bool = False,
) -> Variant:
    """Train :data:`BASE` with ``changes`` on Tiny Shakespeare's characters.

    Adam at ``lr`` with a linear warm-up over ``warmup_steps`` and a linear decay to 10% at the
    last step, gradients clipped at norm 1, random windows of the first 90% of the corpus
    (seeded by ``seed``, so every variant sees the same windows). The held-out loss is measured
    every 50 steps on 2 fixed batches of 64 windows of the last 10%.

    Args:
        changes: :class:`~coursepkg.TransformerConfig` fields that differ from :data:`BASE`.
        steps: optimisation steps.
        block_size: characters per training window (L).
        batch_size: windows per step (B).
        lr: peak learning rate.
        warmup_steps: steps of linear warm-up.
        seed: seeds the initialisation and the windows.
        cache: ``None`` trains and keeps nothing; ``"save"`` trains and saves; ``"reuse"`` loads
            a run saved with the same arguments, source and CPU setting
            (:func:`~coursepkg.chapters.run_cache.cache_file`), else trains and saves it.
        progress: show the progress bar.

    Returns:
        A :class:`Variant` with the model in eval mode.

    Raises:
        ValueError: for a change the configuration rejects or an unknown ``cache`` mode.
    """
    check_cache_mode(cache)
    vocab, train_ids, heldout_ids, windows = shakespeare_split(block_size)
    config = TransformerConfig(vocab_size=len(vocab), **{**BASE, **(changes or {})})
    settings = dict(
        config=asdict(config),
        steps=steps,
        block_size=block_size,
        batch_size=batch_size,
        lr=lr,
        warmup_steps=warmup_steps,
        seed=seed,
    )
    path = cache_file(settings, "ablation") if cache is not None else None
    generator = seed_everything(seed)
    result = Variant(DecoderOnlyLM(config), vocab, History(), heldout_ids)
    if cache == "reuse" and reuse_run(path, partial(restore_run, result)):
        return result
    result.history = fit_warmup_decay(
        result.model,
        char_lm_batches(train_ids, vocab, block_size, batch_size, generator=generator),
        next_char_loss,
        next_char_loss,
        windows["held-out"][:2],
        steps=steps,
        lr=lr,
        warmup=warmup_steps,
        eval_every=50,
        progress=progress,
        desc="variant",
    )
    if path is not None:
        save_run(path, run_record(result), "the trained variant")
    return result


def position_losses(
    model: DecoderOnlyLM, ids: Tensor, length: int, windows: int = 32, seed: int = 7
) -> Tensor:
    """Mean next-character loss at each position of ``windows`` random windows of ``ids``.

    Args:
        model: a trained decoder-only model over the same vocabulary.
        ids: the encoded text to measure on (held-out text for a fair measure).
        length: characters per window (may exceed the training length).
        windows: how many windows are averaged.
        seed: seeds the windows' offsets (the same windows for every model measured alike).

    Shape:
        ids (N,) long; returns (length,): entry i is the loss of predicting character i + 1
        of a window from characters 0..i.

    Returns:
        Losses in nats, averaged over the windows.
    """
    if length >= len(ids):
        raise ValueError(f"length must be shorter than the text ({len(ids)}), got {length}")
    offsets = torch.randint(
        len(ids) - length, (windows,), generator=torch.Generator().manual_seed(seed)
    )
    rows = offsets[:, None] + torch.arange(length + 1)  # (B, L + 1)
    x, y = ids[rows[:, :-1]], ids[rows[:, 1:]]  # (B, L) each
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(x)  # (B, L, V)
        loss = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), y, reduction="none"
        )  # (B, L)
    model.train(was_training)
    return loss.mean(dim=0)  # (L,)
