"""The settings of a training run: a dataclass, filled from a YAML/TOML file and flags.

Model options are passed to :class:`~coursepkg.TransformerConfig` as they are, so every option
it has (and any it gains) can be set without touching the trainer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coursepkg.config import TransformerConfig
from coursepkg.training.data import is_tokenizer_folder

__all__ = ["GPT_DEFAULTS", "TrainSettings", "load_settings", "model_config"]

#: Chapter 12's GPT: pre-LN, GELU, learned positions, a final LayerNorm, a tied head.
GPT_DEFAULTS: dict[str, Any] = dict(
    d_model=64,
    n_heads=4,
    d_ff=256,
    n_layers=2,
    dropout=0.0,
    norm_first=True,
    positional="learned",
    activation="gelu",
)


#: The data-parallel schemes ``coursepkg train --parallel`` offers.
PARALLEL = ("ddp", "course-ddp", "course-bucketed", "zero1", "course-zero1", "fsdp", "course-fsdp")


@dataclass
class TrainSettings:
    """Everything that defines a run.

    ``batch_size`` is the number of windows per optimiser step in all: each of the
    ``world_size`` ranks takes ``batch_size / (world_size * grad_accum)`` of them per
    micro-step, so the same settings train the same model on any number of processes.

    Attributes:
        data: a text file, or a folder whose ``*.txt`` files are read in sorted order.
        out: the run's folder (tokens, log, plot, checkpoint, samples).
        tokenizer: ``"char"`` (characters), ``"bpe"`` (GPT-2's byte-level BPE) or the folder
            of a BPE learned on a corpus (``vocab.json``, ``merges.txt``; the run keeps a copy).
        steps: optimiser steps.
        batch_size: windows per optimiser step, over all ranks and micro-steps.
        block_size: tokens per window (the context length).
        grad_accum: micro-steps whose gradients are summed before each update.
        lr: the peak learning rate; min_lr: the floor of the cosine decay.
        warmup_steps: updates of linear warm-up.
        weight_decay, beta1, beta2: AdamW's settings.
        clip_norm: the global gradient norm is clipped to this (0: no clipping).
        val_fraction: the last part of the token stream held out.
        eval_every: steps between evaluations; eval_batches: batches per evaluation.
        checkpoint_every: steps between checkpoints (one is written at the end too).
        seed: seeds the initialisation, the batches and the sampling.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
        compile: wrap the model in ``torch.compile``.
        parallel: how ranks under ``torchrun`` share the work: ``"ddp"`` (PyTorch's
            DistributedDataParallel), ``"course-ddp"`` or ``"course-bucketed"`` (the course's
            :class:`~coursepkg.parallel.ddp.NaiveDDP` and
            :class:`~coursepkg.parallel.ddp.BucketedDDP`, the same model from the same data);
            ``"zero1"`` / ``"course-zero1"`` shard the optimizer state over the ranks
            (PyTorch's ``ZeroRedundancyOptimizer``, the course's
            :class:`~coursepkg.parallel.zero.ShardedOptimizer`), ``"fsdp"`` /
            ``"course-fsdp"`` shard everything (PyTorch's FSDP2 ``fully_shard``, the course's
            :class:`~coursepkg.parallel.fsdp.FSDP`); see :mod:`coursepkg.training.schemes`.
        checkpoint_activations: the blocks keep only their input for backward and recompute
            the rest then (:mod:`coursepkg.parallel.checkpointing`): less memory, the same
            gradients, about one more forward per step.
        sample_tokens: tokens sampled at the end (0: none); samples: how many samples.
        stop_after: end this job after that step, with a checkpoint, as if the run had
            ``steps`` steps (0: run to the end); ``--resume`` continues it. For machines that
            grant jobs a limited time.
        aux_loss_coef: with experts in ``model`` (``moe.n_experts``), the load-balancing loss
            is added to the language-modelling loss times this (Mixtral's and Qwen3-MoE's
            ``router_aux_loss_coef`` is 0.001 or 0.02; 0 trains without it); the log gets an
            ``aux_loss`` column and two expert-load columns per MoE layer
            (:func:`~coursepkg.training.loop.load_fields`).
        model: options of :class:`~coursepkg.TransformerConfig` (over :data:`GPT_DEFAULTS`),
            as :meth:`~coursepkg.TransformerConfig.from_dict` reads them: a group's field by a
            dotted name (``moe.n_experts``) or the group as a mapping, and the flat names of
            configs written before the groups (``n_experts``, ``kv_rank``).
    """

    data: str = ""
    out: str = "runs/train"
    tokenizer: str = "char"
    steps: int = 1000
    batch_size: int = 32
    block_size: int = 64
    grad_accum: int = 1
    lr: float = 1e-2
    min_lr: float = 1e-3
    warmup_steps: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    clip_norm: float = 1.0
    val_fraction: float = 0.1
    eval_every: int = 100
    eval_batches: int = 4
    checkpoint_every: int = 200
    seed: int = 0
    device: str = "auto"
    compile: bool = False
    parallel: str = "ddp"
    checkpoint_activations: bool = False
    sample_tokens: int = 300
    stop_after: int = 0
    samples: int = 2
    aux_loss_coef: float = 0.01
    model: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        positive = ("steps", "batch_size", "block_size", "grad_accum", "eval_every")
        for name in (*positive, "eval_batches", "checkpoint_every", "samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.tokenizer not in ("char", "bpe") and not is_tokenizer_folder(self.tokenizer):
            raise ValueError(
                "tokenizer must be 'char', 'bpe' or a folder holding vocab.json and merges.txt, "
                f"got {self.tokenizer!r}"
            )
        if self.parallel not in PARALLEL:
            raise ValueError(f"parallel must be one of {PARALLEL}, got {self.parallel!r}")
        for flag in ("checkpoint_activations", "compile"):
            if self.parallel.endswith("fsdp") and getattr(self, flag):
                raise ValueError(
                    f"parallel={self.parallel!r} does not combine with {flag}=True (the "
                    "recomputation and the compiled graph would skip its gathering hooks); "
                    "use ddp, zero1 or course-zero1 for that"
                )
        if self.device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {self.device!r}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.warmup_steps < 0 or self.warmup_steps >= self.steps:
            raise ValueError(
                f"warmup_steps must be in [0, steps={self.steps}), got {self.warmup_steps}"
            )
        if isinstance(self.stop_after, bool) or not 0 <= self.stop_after <= self.steps:
            raise ValueError(
                f"stop_after must be in [0, steps={self.steps}], got {self.stop_after}"
            )
        if isinstance(self.aux_loss_coef, bool) or not (
            isinstance(self.aux_loss_coef, int | float) and self.aux_loss_coef >= 0
        ):
            raise ValueError(f"aux_loss_coef must be a number >= 0, got {self.aux_loss_coef!r}")
        if not self.data:
            raise ValueError("data must name a text file or a folder of .txt files, got none")

    def identity(self) -> dict[str, Any]:
        """The settings a checkpoint must agree with to be resumed (not the run's length,
        evaluation or checkpoint cadence, device or sampling, which may change)."""
        keep = ("tokenizer", "batch_size", "block_size", "grad_accum", "lr", "min_lr")
        keep += ("warmup_steps", "weight_decay", "beta1", "beta2", "clip_norm", "seed")
        return {name: getattr(self, name) for name in keep} | {"model": dict(self.model)}


def model_config(settings: TrainSettings, vocab_size: int) -> TransformerConfig:
    """The model's :class:`~coursepkg.TransformerConfig`: :data:`GPT_DEFAULTS`, then the
    settings' ``model`` options, with the vocabulary's size and ``max_len >= block_size``."""
    options = {**GPT_DEFAULTS, "max_len": settings.block_size, **settings.model}
    if options["max_len"] < settings.block_size:
        raise ValueError(
            f"model max_len must be >= block_size={settings.block_size}, got {options['max_len']}"
        )
    return TransformerConfig.from_dict({**options, "vocab_size": vocab_size})


def _read_file(path: str | Path) -> dict[str, Any]:
    """A YAML (``.yaml``/``.yml``) or TOML (``.toml``) file as a dict."""
    path = Path(path)
    if path.suffix == ".toml":
        try:
            import tomllib
        except ImportError as err:  # Python 3.10
            raise ValueError(f"a TOML config needs Python >= 3.11; use YAML: {path}") from err
        with path.open("rb") as f:
            loaded = tomllib.load(f)
    elif path.suffix in (".yaml", ".yml"):
        import yaml

        loaded = yaml.safe_load(path.read_text()) or {}
    else:
        raise ValueError(f"config must be a .yaml, .yml or .toml file, got {str(path)!r}")
    if not isinstance(loaded, dict):
        raise ValueError(f"config {str(path)!r} must hold a mapping, got {type(loaded).__name__}")
    return loaded


def load_settings(config: str | Path | None = None, **overrides: Any) -> TrainSettings:
    """Settings from a YAML/TOML file (optional), then ``overrides`` (flags; None = not given).

    A ``model`` mapping in the file and one in ``overrides`` are merged key by key.

    Raises:
        ValueError: for an unknown setting (naming it and the known ones) or a bad value.
    """
    values = _read_file(config) if config is not None else {}
    given = {k: v for k, v in overrides.items() if v is not None}
    model = {**values.get("model", {}), **given.pop("model", {})}
    values = {**values, **given, "model": model}
    known = {f.name for f in dataclasses.fields(TrainSettings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown settings {unknown}; expected some of {sorted(known)}")
    return TrainSettings(**values)
