"""The training loop of ``coursepkg train``: AdamW, warm-up + cosine, clipping, accumulation,
DistributedDataParallel, evaluation, checkpoints, exact resume, logs and samples.

Every rank draws the same random windows and trains on its share of them
(:func:`~coursepkg.training.data.get_batch`), DDP averages the gradients, and the update is the
one a single process would make on the whole batch. Rank 0 alone evaluates and writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coursepkg.config import TransformerConfig
from coursepkg.decoder_only import DecoderOnlyLM, sample_next
from coursepkg.functional import cross_entropy
from coursepkg.moe import MoEFeedForward, expert_load, update_choice_bias
from coursepkg.parallel.checkpointing import checkpoint_blocks
from coursepkg.training.checkpoint import check_compatible
from coursepkg.training.data import TokenData, get_batch, prepare_tokens
from coursepkg.training.distributed import Dist, setup, teardown
from coursepkg.training.lifecycle import (
    CHECKPOINT,
    Run,
    Schedule,
    autocast,
    open_checkpoint,
    restore,
    run_steps,
    with_aux,
)
from coursepkg.training.schemes import make_scheme
from coursepkg.training.settings import TrainSettings, model_config

__all__ = ["LOG_FIELDS", "MOE_FIELDS", "TrainResult", "load_fields", "train"]

log = logging.getLogger(__name__)

#: The columns of ``log.csv``: nothing that depends on the clock, so that a resumed run's log
#: is byte for byte the log of an uninterrupted one.
LOG_FIELDS = ("step", "lr", "loss", "val_loss", "val_perplexity")
#: The column a mixture-of-experts run adds: the load-balancing loss of the step (before its
#: coefficient), whose minimum k says the experts share the tokens evenly.
MOE_FIELDS = ("aux_loss",)


@dataclass
class TrainResult:
    """What a run produced (on rank 0; the other ranks get the same model and an empty log).

    Attributes:
        model: the trained model, in eval mode, on CPU.
        rows: one dict per step with :data:`LOG_FIELDS` (``val_*`` None between evaluations),
            and :data:`MOE_FIELDS` and :func:`load_fields` for a mixture of experts.
        samples: the text sampled at the end.
        out: the run's folder.
    """

    model: DecoderOnlyLM
    rows: list[dict[str, Any]] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)
    out: Path = Path(".")


@dataclass
class _Pretraining:
    """What pretraining adds to a :class:`~coursepkg.training.lifecycle.Run`."""

    settings: TrainSettings
    data: TokenData
    run: Run

    @property
    def net(self) -> DecoderOnlyLM:
        return self.run.net

    @property
    def dist(self) -> Dist:
        return self.run.dist


def train(settings: TrainSettings, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train a :class:`~coursepkg.DecoderOnlyLM` as ``settings`` say, on this process or on
    every rank ``torchrun`` started.

    Args:
        settings: the run.
        resume: continue from ``<out>/checkpoint.pt`` if there is one (a fresh start if not).
        progress: show a progress bar (rank 0 only).

    Returns:
        The :class:`TrainResult`.

    Raises:
        CheckpointError: the checkpoint is damaged or belongs to other settings, or there is
            one and ``resume`` is False.
    """
    dist = setup(settings.device)
    try:
        job = _start(settings, dist, resume)
        s = settings
        schedule = Schedule(s.steps, s.lr, s.warmup_steps, s.min_lr)
        run_steps(
            job.run,
            functools.partial(_train_step, job),
            schedule,
            s.stop_after,
            s.checkpoint_every,
            "train",
            progress,
            functools.partial(_after_step, job),
        )
        return _finish(job)
    finally:
        teardown()


def _start(settings: TrainSettings, dist: Dist, resume: bool) -> _Pretraining:
    """Tokens, model, optimiser and data generator: fresh, or as the checkpoint left them."""
    out = Path(settings.out)
    micro = settings.batch_size / (dist.world_size * settings.grad_accum)
    if micro != int(micro):
        raise ValueError(
            f"batch_size={settings.batch_size} must be divisible by world_size * grad_accum = "
            f"{dist.world_size} * {settings.grad_accum}"
        )
    if dist.local_rank == 0:  # every machine tokenises into its own folder (or a shared one)
        out.mkdir(parents=True, exist_ok=True)
        data = prepare_tokens(settings.data, out / "tokens", settings.tokenizer, *_val(settings))
    dist.barrier()
    if dist.local_rank != 0:
        data = prepare_tokens(settings.data, out / "tokens", settings.tokenizer, *_val(settings, 0))
    torch.manual_seed(settings.seed)
    net = DecoderOnlyLM(model_config(settings, len(data.vocab)))
    if settings.checkpoint_activations:
        checkpoint_blocks(net)
    torch.manual_seed(settings.seed + 1 + dist.rank)  # each rank's own dropout masks
    batches = torch.Generator().manual_seed(settings.seed + 1)
    saved = open_checkpoint(out, resume)
    identity = _identity(settings, net, data)
    if saved is not None:  # the weights go in before the scheme shards them
        check_compatible(saved["identity"], identity, out / CHECKPOINT)
        net.load_state_dict(saved["model"])
    net.to(dist.device)
    scheme = make_scheme(net, settings, dist)
    run = Run(out, dist, net, scheme, batches, identity, _fields(net.config))
    if saved is not None:
        restore(run, saved)
    log.info("rank %d of %d (pid %d) on %s", dist.rank, dist.world_size, os.getpid(), dist.device)
    return _Pretraining(settings, data, run)


def _val(settings: TrainSettings, write: bool = True) -> tuple[float, bool]:
    return settings.val_fraction, write


def _identity(settings: TrainSettings, net: DecoderOnlyLM, data: TokenData) -> dict[str, Any]:
    config = dataclasses.asdict(net.config)
    return {**settings.identity(), "config": config, "data": data.digest}


def _fields(config: TransformerConfig) -> tuple[str, ...]:
    """The columns of the run's log: :data:`LOG_FIELDS`, and with experts :data:`MOE_FIELDS`
    and the expert loads (:func:`load_fields`)."""
    return LOG_FIELDS + ((*MOE_FIELDS, *load_fields(config)) if config.moe else ())


def load_fields(config: TransformerConfig) -> tuple[str, ...]:
    """The expert-load columns of a mixture of experts' log: two per MoE layer i (counted from
    0), a compact summary of how evenly the step's tokens spread over its E experts.

    ``load_max_<i>`` is the busiest expert's share of the layer's (token, choice) assignments
    divided by the even share 1/E: 1 when every expert gets as many, E when one gets them all.
    ``load_min_<i>`` is the idlest expert's, likewise: 1 when even, 0 when an expert got no
    token. Plotted against the step, the two lines close in on 1 as the load balances; the
    full histogram per layer is :func:`~coursepkg.moe.expert_load` on
    :meth:`~coursepkg.DecoderOnlyLM.routings`.
    """
    layers = [i for i in range(config.n_layers) if config.is_moe_layer(i)]
    return tuple(f"load_{end}_{i}" for i in layers for end in ("max", "min"))


def _load_columns(counts: torch.Tensor, names: tuple[str, ...]) -> dict[str, float]:
    """:func:`load_fields`'s values from the step's counts, (MoE layers, E)."""
    share = counts / counts.mean(dim=1, keepdim=True)  # (layers, E): 1 = the even share
    ends = torch.stack([share.max(dim=1).values, share.min(dim=1).values], dim=1)  # (layers, 2)
    return dict(zip(names, ends.reshape(-1).tolist(), strict=True))


def _train_step(job: _Pretraining, lr: float) -> dict[str, Any]:
    """One optimiser step over ``grad_accum`` micro-batches; returns the row's numbers: the
    mean language-model loss and, for a mixture of experts, the mean load-balancing loss (added
    to the former times ``aux_loss_coef``) and the experts' loads over the micro-batches and
    ranks (:func:`load_fields`)."""
    s, dist, run = job.settings, job.dist, job.run
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    # One draw of batch_size windows per update, whatever the ranks and micro-steps: micro-step
    # k reads windows [k * draw, (k + 1) * draw), rank r its r-th share of those.
    draw, share = s.batch_size // s.grad_accum, s.batch_size // s.grad_accum // dist.world_size
    mine = torch.cat(
        [torch.arange(share) + k * draw + dist.rank * share for k in range(s.grad_accum)]
    )
    xs, ys = get_batch(job.data.train, s.block_size, s.batch_size, run.batches, mine)  # (A*b, L)
    total = torch.zeros((), device=dist.device)
    aux_total = torch.zeros((), device=dist.device)
    moe = job.net.config.moe is not None
    load = 0
    run.model.train()
    for k in range(s.grad_accum):
        x = xs[k * share : (k + 1) * share].to(dist.device)  # (b, L)
        y = ys[k * share : (k + 1) * share].to(dist.device)  # (b, L)
        last = k == s.grad_accum - 1
        # DDP all-reduces the gradients at the last micro-step only
        sync = contextlib.nullcontext() if last else run.scheme.no_sync()
        with sync:
            with autocast(dist.device):
                logits, aux = run.model(x, return_aux=True)  # (B, L, V), None when dense
                loss = cross_entropy(logits, y) / s.grad_accum
                aux = None if aux is None else aux / s.grad_accum
            with_aux(loss, aux, s.aux_loss_coef).backward()
        total += loss.detach()
        if aux is not None:
            aux_total += aux.detach()
            routings = job.net.routings()
            n_experts = job.net.config.moe.n_experts
            load = load + torch.stack([expert_load(r, n_experts) for r in routings])  # (l, E)
    run.scheme.sync()  # the course's DDP averages when asked
    if s.clip_norm > 0:
        run.scheme.clip(s.clip_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    row = {"loss": dist.mean(total), "val_loss": None, "val_perplexity": None}
    if not moe:
        return row
    load = dist.total(load)  # (l, E): the same counts on every rank
    _balance_choice_biases(job.net, load)
    row["aux_loss"] = dist.mean(aux_total)
    return row | _load_columns(load.cpu(), load_fields(job.net.config))


def _after_step(job: _Pretraining, row: dict[str, Any], bar: Any) -> None:
    """Evaluate every ``eval_every`` steps and at the end, and show it on the bar."""
    s, run = job.settings, job.run
    evaluates = run.dist.is_main or run.scheme.every_rank_computes
    if evaluates and (run.step % s.eval_every == 0 or run.step == s.steps):
        row["val_loss"] = _evaluate(job)
        row["val_perplexity"] = math.exp(row["val_loss"])
        shown = dict(loss=f"{row['loss']:.3f}", val=f"{row['val_loss']:.3f}")
        if "aux_loss" in row:  # the load-balancing loss, k when the load is even
            shown["aux"] = f"{row['aux_loss']:.3f}"
        bar.set_postfix(shown, refresh=False)


def _balance_choice_biases(net: torch.nn.Module, load: torch.Tensor) -> None:
    """With ``moe.bias_update_rate`` set, move each MoE layer's choice bias against its load
    of this step (:func:`~coursepkg.moe.update_choice_bias`); every rank does the same."""
    rate = net.config.moe.bias_update_rate
    if not rate:
        return
    layers = [layer.ffn for layer in net.layers if isinstance(layer.ffn, MoEFeedForward)]
    for ffn, counts in zip(layers, load, strict=True):
        update_choice_bias(ffn.choice_bias, counts.to(ffn.choice_bias.device), rate)


@torch.no_grad()
def _evaluate(job: _Pretraining) -> float:
    """Mean held-out loss over ``eval_batches`` fixed batches (the same at every evaluation)."""
    s, run = job.settings, job.run
    run.net.eval()
    fixed = torch.Generator().manual_seed(s.seed + 2)
    losses = []
    for _ in range(s.eval_batches):
        x, y = get_batch(job.data.val, s.block_size, s.batch_size, fixed)  # (B, L)
        with autocast(run.dist.device):
            logits = run.net(x.to(run.dist.device))  # (B, L, V)
        losses.append(float(cross_entropy(logits, y.to(run.dist.device))))
    return sum(losses) / len(losses)


def _finish(job: _Pretraining) -> TrainResult:
    """The loss-curve plot and the samples (rank 0); the model in eval mode on CPU."""
    run, steps = job.run, job.settings.steps
    rows, out = run.rows if run.dist.is_main else [], run.out
    result = TrainResult(run.net, rows, [], out)
    samples = run.dist.is_main or run.scheme.every_rank_computes  # a forward needs every rank
    if samples and run.step == steps:
        result.samples = _sample(job)
    if run.dist.is_main and run.step == steps:
        _plot(run.rows, out / "loss.png")
        (out / "samples.txt").write_text("\n\n-----\n\n".join(result.samples) + "\n")
    result.model = run.scheme.plain_model().eval().cpu()
    return result


@torch.no_grad()
def _sample(job: _Pretraining) -> list[str]:
    """``samples`` continuations of ``sample_tokens`` tokens each, from the held-out text's
    first token, sampled at temperature 0.8 among the tokens the training text contains (a
    sliding window of ``block_size``)."""
    s, run, data = job.settings, job.run, job.data
    if s.sample_tokens == 0:
        return []
    run.net.eval()
    generator = torch.Generator(device=run.dist.device).manual_seed(s.seed + 3)
    vocab_size = run.net.config.vocab_size
    seen = np.bincount(data.train, minlength=vocab_size) > 0  # (V,) e.g. no <pad>
    unseen = torch.from_numpy(~seen).to(run.dist.device)  # (V,)
    seq = torch.full((s.samples, 1), int(data.val[0]), device=run.dist.device)  # (S, 1)
    for _ in range(s.sample_tokens):
        logits = run.net(seq[:, -s.block_size :])[:, -1]  # (S, V)
        logits = logits.masked_fill(unseen, float("-inf"))  # only tokens the text has
        nxt = sample_next(logits, 0.8, None, generator)  # (S,)
        seq = torch.cat([seq, nxt[:, None]], dim=1)  # (S, T + 1)
    return [data.vocab.decode(row.tolist()) for row in seq.cpu()]


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Training and held-out loss against the step, saved as a PNG."""
    # A Figure of its own, not pyplot: the caller's backend and figures (a notebook's) stay as
    # they are.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="training", lw=1)
    evals = [r for r in rows if r["val_loss"] is not None]
    ax.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="held-out")
    ax.set(xlabel="step", ylabel="loss (nats per token)", title="coursepkg train")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
