"""The training loop of ``coursepkg train``: AdamW, warm-up + cosine, clipping, accumulation,
DistributedDataParallel, evaluation, checkpoints, exact resume, logs and samples.

Every rank draws the same random windows and trains on its share of them
(:func:`~coursepkg.training.data.get_batch`), DDP averages the gradients, and the update is the
one a single process would make on the whole batch. Rank 0 alone evaluates and writes.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import logging
import math
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from coursepkg.config import TransformerConfig
from coursepkg.functional import cross_entropy
from coursepkg.model import DecoderOnlyLM, sample_next
from coursepkg.moe import MoEFeedForward, expert_load, update_choice_bias
from coursepkg.optim import warmup_cosine_lr
from coursepkg.parallel.checkpointing import checkpoint_blocks
from coursepkg.training.checkpoint import (
    CheckpointError,
    check_compatible,
    load_checkpoint,
    save_checkpoint,
)
from coursepkg.training.data import TokenData, get_batch, prepare_tokens
from coursepkg.training.distributed import Dist, setup, teardown
from coursepkg.training.schemes import Scheme, make_scheme
from coursepkg.training.settings import TrainSettings, model_config

__all__ = ["LOG_FIELDS", "MOE_FIELDS", "TrainResult", "load_fields", "train"]

log = logging.getLogger(__name__)

#: The columns of ``log.csv``: nothing that depends on the clock, so that a resumed run's log
#: is byte for byte the log of an uninterrupted one.
LOG_FIELDS = ("step", "lr", "loss", "val_loss", "val_perplexity")
#: The column a mixture-of-experts run adds: the load-balancing loss of the step (before its
#: coefficient), whose minimum k says the experts share the tokens evenly.
MOE_FIELDS = ("aux_loss",)
CHECKPOINT = "checkpoint.pt"


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
class _Run:
    """The pieces of a run in progress."""

    settings: TrainSettings
    dist: Dist
    data: TokenData
    net: DecoderOnlyLM  # the model itself (its weights are what is saved)
    scheme: Scheme  # how the ranks share the work: the wrapped model, the optimizer
    batches: torch.Generator  # draws the training windows; the same on every rank
    step: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    last_checkpoint: int = 0

    @property
    def model(self) -> nn.Module:
        """What the step calls: net, wrapped in DDP or sharded, and/or compiled."""
        return self.scheme.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The scheme's optimizer (the course's AdamW, or its sharded form)."""
        return self.scheme.optimizer


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
        run = _start(settings, dist, resume)
        _loop(run, progress)
        return _finish(run)
    finally:
        teardown()


def _start(settings: TrainSettings, dist: Dist, resume: bool) -> _Run:
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
    path = out / CHECKPOINT
    if path.exists() and not resume:
        raise CheckpointError(
            f"{path} exists; pass --resume to continue that run, or choose another --out"
        )
    saved = load_checkpoint(path) if path.exists() else None
    if saved is not None:  # the weights go in before the scheme shards them
        check_compatible(saved["identity"], _identity(settings, net, data), path)
        net.load_state_dict(saved["model"])
    net.to(dist.device)
    run = _Run(settings, dist, data, net, make_scheme(net, settings, dist), batches)
    if saved is not None:
        _restore(run, saved, path)
    log.info("rank %d of %d (pid %d) on %s", dist.rank, dist.world_size, os.getpid(), dist.device)
    return run


def _val(settings: TrainSettings, write: bool = True) -> tuple[float, bool]:
    return settings.val_fraction, write


def _identity(settings: TrainSettings, net: DecoderOnlyLM, data: TokenData) -> dict[str, Any]:
    config = dataclasses.asdict(net.config)
    return {**settings.identity(), "config": config, "data": data.digest}


def _restore(run: _Run, saved: dict[str, Any], path: Path) -> None:
    """Put a checkpoint's optimiser, data position, RNG and log in place (its weights are)."""
    layout = saved.get("optimizer_layout", "replicated")
    if layout != run.scheme.layout:
        raise CheckpointError(
            f"{path} holds optimizer state laid out for {layout!r}, this run's --parallel "
            f"{run.settings.parallel} on {run.dist.world_size} rank(s) uses "
            f"{run.scheme.layout!r}; resume with the scheme that wrote it"
        )
    run.scheme.load_optimizer_state(saved["optimizer"])
    run.batches.set_state(saved["data_rng"])
    run.step = run.last_checkpoint = int(saved["step"])
    fields = _fields(run)
    # A mixture of experts' checkpoint written before the expert-load columns existed has
    # shorter rows: those steps' loads are left empty.
    padded = [[*row, *[None] * (len(fields) - len(row))] for row in saved["rows"]]
    run.rows = [dict(zip(fields, row, strict=True)) for row in padded]
    states = saved["rng"]
    if len(states) == run.dist.world_size:
        torch.set_rng_state(states[run.dist.rank])
    else:
        log.warning(
            "the checkpoint was written by %d ranks, this run has %d: the data and the weights "
            "continue exactly, the dropout masks do not",
            len(states),
            run.dist.world_size,
        )
    if run.dist.device.type == "cuda" and saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"][run.dist.rank % len(saved["cuda_rng"])])
    log.info("resumed from %s at step %d", path, run.step)


def _checkpoint(run: _Run) -> None:
    """Write the checkpoint (rank 0), with every rank's RNG state; then the CSV log."""
    rng = run.dist.gather(torch.get_rng_state())
    cuda = run.dist.device.type == "cuda"
    cuda_rng = run.dist.gather(torch.cuda.get_rng_state()) if cuda else None
    # Collectives when the scheme shards: every rank takes part, rank 0 writes.
    model, optimizer = run.scheme.model_state(), run.scheme.optimizer_state()
    if run.dist.is_main:
        payload = {
            "identity": _identity(run.settings, run.net, run.data),
            "model": model,
            "optimizer": optimizer,
            "optimizer_layout": run.scheme.layout,
            "data_rng": run.batches.get_state(),
            "rng": rng,
            "cuda_rng": cuda_rng,
            "step": run.step,
            "rows": [[row[k] for k in _fields(run)] for row in run.rows],
        }
        save_checkpoint(Path(run.settings.out) / CHECKPOINT, payload)
        _write_log(run)
        log.info("checkpoint at step %d", run.step)
    run.last_checkpoint = run.step


def _fields(run: _Run) -> tuple[str, ...]:
    """The columns of the run's log: :data:`LOG_FIELDS`, and with experts :data:`MOE_FIELDS`
    and the expert loads (:func:`load_fields`)."""
    config = run.net.config
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


def _train_step(run: _Run, lr: float) -> tuple[float, float | None, torch.Tensor | None]:
    """One optimiser step over ``grad_accum`` micro-batches; returns the mean language-model
    loss and, for a mixture of experts, the mean load-balancing loss, which the step adds to
    the former times ``aux_loss_coef``, and the experts' loads over the micro-batches and
    ranks, (MoE layers, E) counts of (token, choice) assignments (both None when dense)."""
    s, dist = run.settings, run.dist
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    # One draw of batch_size windows per update, whatever the ranks and micro-steps: micro-step
    # k reads windows [k * draw, (k + 1) * draw), rank r its r-th share of those.
    draw, share = s.batch_size // s.grad_accum, s.batch_size // s.grad_accum // dist.world_size
    mine = torch.cat(
        [torch.arange(share) + k * draw + dist.rank * share for k in range(s.grad_accum)]
    )
    xs, ys = get_batch(run.data.train, s.block_size, s.batch_size, run.batches, mine)  # (A*b, L)
    total = torch.zeros((), device=dist.device)
    aux_total = torch.zeros((), device=dist.device)
    moe = run.net.config.moe is not None
    load = 0
    run.model.train()
    for k in range(s.grad_accum):
        x = xs[k * share : (k + 1) * share].to(dist.device)  # (b, L)
        y = ys[k * share : (k + 1) * share].to(dist.device)  # (b, L)
        last = k == s.grad_accum - 1
        # DDP all-reduces the gradients at the last micro-step only
        sync = contextlib.nullcontext() if last else run.scheme.no_sync()
        with sync:
            with _autocast(dist.device):
                loss = cross_entropy(run.model(x), y) / s.grad_accum  # (B, L, V) logits
                aux = run.net.load_balancing_loss() / s.grad_accum if moe else None
            (loss if aux is None else loss + s.aux_loss_coef * aux).backward()
        total += loss.detach()
        if aux is not None:
            aux_total += aux.detach()
            routings = run.net.routings()
            n_experts = run.net.config.moe.n_experts
            load = load + torch.stack([expert_load(r, n_experts) for r in routings])  # (l, E)
    run.scheme.sync()  # the course's DDP averages when asked
    if s.clip_norm > 0:
        run.scheme.clip(s.clip_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    if not moe:
        return dist.mean(total), None, None
    load = dist.total(load)  # (l, E): the same counts on every rank
    _balance_choice_biases(run.net, load)
    return dist.mean(total), dist.mean(aux_total), load


def _balance_choice_biases(net: torch.nn.Module, load: torch.Tensor) -> None:
    """With ``moe.bias_update_rate`` set, move each MoE layer's choice bias against its load
    of this step (:func:`~coursepkg.moe.update_choice_bias`); every rank does the same."""
    rate = net.config.moe.bias_update_rate
    if not rate:
        return
    layers = [layer.ffn for layer in net.layers if isinstance(layer.ffn, MoEFeedForward)]
    for ffn, counts in zip(layers, load, strict=True):
        update_choice_bias(ffn.choice_bias, counts.to(ffn.choice_bias.device), rate)


def _autocast(device: torch.device):
    """bf16 autocast on CUDA; nothing on CPU (fp32 there)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def _evaluate(run: _Run) -> float:
    """Mean held-out loss over ``eval_batches`` fixed batches (the same at every evaluation)."""
    s = run.settings
    run.net.eval()
    fixed = torch.Generator().manual_seed(s.seed + 2)
    losses = []
    for _ in range(s.eval_batches):
        x, y = get_batch(run.data.val, s.block_size, s.batch_size, fixed)  # (B, L)
        with _autocast(run.dist.device):
            logits = run.net(x.to(run.dist.device))  # (B, L, V)
        losses.append(float(cross_entropy(logits, y.to(run.dist.device))))
    return sum(losses) / len(losses)


def _loop(run: _Run, progress: bool) -> None:
    """Steps from where the run stands to ``settings.steps``, evaluating and checkpointing."""
    from tqdm import tqdm

    s = run.settings
    bar = tqdm(
        total=s.steps, initial=run.step, desc="train", disable=not (progress and run.dist.is_main)
    )
    previous = _on_sigterm(run)
    try:
        end = s.stop_after or s.steps
        while run.step < end:
            lr = warmup_cosine_lr(run.step, s.lr, s.warmup_steps, s.steps, s.min_lr)
            loss, aux, load = _guarded_step(run, lr)
            run.step += 1
            row = {
                "step": run.step,
                "lr": lr,
                "loss": loss,
                "val_loss": None,
                "val_perplexity": None,
            }
            if aux is not None:
                row["aux_loss"] = aux
                row.update(_load_columns(load.cpu(), load_fields(run.net.config)))
            evaluates = run.dist.is_main or run.scheme.every_rank_computes
            if evaluates and (run.step % s.eval_every == 0 or run.step == s.steps):
                row["val_loss"] = _evaluate(run)
                row["val_perplexity"] = math.exp(row["val_loss"])
                shown = dict(loss=f"{loss:.3f}", val=f"{row['val_loss']:.3f}")
                if aux is not None:  # the load-balancing loss, k when the load is even
                    shown["aux"] = f"{aux:.3f}"
                bar.set_postfix(shown, refresh=False)
            run.rows.append(row)
            if run.step % s.checkpoint_every == 0 or run.step == end:
                _checkpoint(run)
            bar.update(1)
    finally:
        bar.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _on_sigterm(run: _Run):
    """Make SIGTERM (what ``torchrun`` sends the other ranks when one dies) end this rank with
    a message saying where the run stands; returns the previous handler (None off the main
    thread, where no handler can be set)."""

    def stop(signum: int, frame: object) -> None:
        log.error(
            "rank %d stopped by %s at step %d; %s",
            run.dist.rank,
            signal.Signals(signum).name,
            run.step,
            _intact(run),
        )
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, stop)


def _intact(run: _Run) -> str:
    """Where the last checkpoint is, and how to continue from it."""
    return (
        f"the checkpoint of step {run.last_checkpoint} in {run.settings.out} is intact: run "
        "again with --resume (torchrun --max-restarts N does it for you)"
    )


def _guarded_step(run: _Run, lr: float) -> tuple[float, float | None, torch.Tensor | None]:
    """:func:`_train_step`, with a clear message when the loss diverges or a rank is lost."""
    try:
        loss, aux, load = _train_step(run, lr)
    except RuntimeError as err:
        if not run.dist.distributed:
            raise
        message = (
            f"rank {run.dist.rank} lost the other ranks at step {run.step + 1} ({err}); "
            + _intact(run)
        )
        # Said now, while the SIGTERM handler still stands: torchrun's SIGTERM to the ranks
        # left comes within milliseconds, and once the loop has unwound (the default handler
        # back) it would end this process before the traceback below is printed.
        log.error("%s", message)
        raise RuntimeError(message) from err
    if not math.isfinite(loss):
        raise FloatingPointError(f"the loss became {loss} at step {run.step + 1}")
    return loss, aux, load


def _write_log(run: _Run) -> None:
    """``log.csv``: one row per step, floats written exactly (``repr``)."""
    with open(Path(run.settings.out) / "log.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(_fields(run))
        for row in run.rows:
            writer.writerow("" if row[k] is None else repr(row[k]) for k in _fields(run))


def _finish(run: _Run) -> TrainResult:
    """The loss-curve plot and the samples (rank 0); the model in eval mode on CPU."""
    rows, out = run.rows if run.dist.is_main else [], Path(run.settings.out)
    result = TrainResult(run.net, rows, [], out)
    samples = run.dist.is_main or run.scheme.every_rank_computes  # a forward needs every rank
    if samples and run.step == run.settings.steps:
        result.samples = _sample(run)
    if run.dist.is_main and run.step == run.settings.steps:
        _plot(run.rows, out / "loss.png")
        (out / "samples.txt").write_text("\n\n-----\n\n".join(result.samples) + "\n")
    result.model = run.scheme.plain_model().eval().cpu()
    return result


@torch.no_grad()
def _sample(run: _Run) -> list[str]:
    """``samples`` continuations of ``sample_tokens`` tokens each, from the held-out text's
    first token, sampled at temperature 0.8 among the tokens the training text contains (a
    sliding window of ``block_size``)."""
    s = run.settings
    if s.sample_tokens == 0:
        return []
    run.net.eval()
    generator = torch.Generator(device=run.dist.device).manual_seed(s.seed + 3)
    vocab_size = run.net.config.vocab_size
    seen = np.bincount(run.data.train, minlength=vocab_size) > 0  # (V,) e.g. no <pad>
    unseen = torch.from_numpy(~seen).to(run.dist.device)  # (V,)
    seq = torch.full((s.samples, 1), int(run.data.val[0]), device=run.dist.device)  # (S, 1)
    for _ in range(s.sample_tokens):
        logits = run.net(seq[:, -s.block_size :])[:, -1]  # (S, V)
        logits = logits.masked_fill(unseen, float("-inf"))  # only tokens the text has
        nxt = sample_next(logits, 0.8, None, generator)  # (S,)
        seq = torch.cat([seq, nxt[:, None]], dim=1)  # (S, T + 1)
    return [run.data.vocab.decode(row.tolist()) for row in seq.cpu()]


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
