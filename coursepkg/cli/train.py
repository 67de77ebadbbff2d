"""``coursepkg train``: the command line of :mod:`coursepkg.training`.

Every setting of :class:`~coursepkg.training.TrainSettings` is a flag (``--batch-size 64``), a
YAML/TOML file gives any of them (``--config run.yaml``; flags win), and ``--model KEY=VALUE``
sets any :class:`~coursepkg.TransformerConfig` option. The same command runs under ``torchrun``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Collection
from typing import Any

__all__ = ["ARGUMENTS", "COMMANDS", "add_settings_flags"]

#: The commands of this home and their line in ``coursepkg --help``.
COMMANDS = {
    "train": "train a decoder-only language model on a text file or folder",
}


_HELP = {
    "out": "the run's folder: tokens, log.csv, loss.png, checkpoint.pt, samples.txt",
    "tokenizer": "char (characters), bpe (GPT-2's byte-level BPE) or the folder of a learned BPE "
    "(vocab.json, merges.txt)",
    "batch_size": "windows per optimiser step, over all ranks and micro-steps",
    "block_size": "tokens per window (context length)",
    "grad_accum": "micro-steps whose gradients are summed before each update",
    "clip_norm": "clip the global gradient norm to this (0: no clipping)",
    "device": "cpu, cuda or auto (CUDA when there is one); bf16 autocast on CUDA",
    "compile": "wrap the model in torch.compile",
    "parallel": "ddp (PyTorch's), course-ddp or course-bucketed (the course's own); sharded: "
    "zero1 or fsdp (PyTorch's), course-zero1 or course-fsdp (the course's)",
    "checkpoint_activations": "recompute each block's activations in backward (less memory)",
    "aux_loss_coef": "with --model moe.n_experts=E: the load-balancing loss's weight in the loss",
}


def _model_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as YAML (``64`` -> int, ``true`` -> bool, ``gelu`` -> str)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip().replace("-", "_"), yaml.safe_load(value)


def add_settings_flags(
    p: argparse.ArgumentParser, settings: type, helps: dict[str, str], skip: Collection[str]
) -> None:
    """Declare a flag on ``p`` for every field of the dataclass ``settings`` (``--batch-size``
    sets ``batch_size``; a bool is a switch): ``coursepkg train``'s :class:`TrainSettings` and
    ``coursepkg finetune``'s :class:`FinetuneSettings` alike.

    Args:
        p: the command's parser.
        settings: the settings class (fields of type bool, int, float or str).
        helps: a field's help, which its default follows.
        skip: the fields given otherwise (positional arguments, ``--model``).
    """
    for f in dataclasses.fields(settings):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        text = (helps.get(f.name, "") + f" (default {f.default!r})").strip()
        if f.type in ("bool", bool):
            p.add_argument(flag, action="store_true", default=None, help=text)
        else:
            kind = {"int": int, "float": float, "str": str}[str(f.type)]
            p.add_argument(flag, type=kind, help=text)


def _add_train(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg train`` subcommand."""
    from coursepkg.training.settings import GPT_DEFAULTS, TrainSettings

    p.description = (
        "Train a GPT (chapter 12's by default) on a text file or folder of .txt "
        "files, with AdamW, warm-up + cosine, clipping and gradient accumulation; evaluate "
        "on a held-out split, log to OUT/log.csv, plot OUT/loss.png, checkpoint to "
        "OUT/checkpoint.pt and sample at the end. Under `torchrun --nproc-per-node N` the "
        "same command trains with DistributedDataParallel (gloo on CPU, nccl on CUDA)."
    )
    p.epilog = f"model defaults: {GPT_DEFAULTS}"
    p.add_argument("data", nargs="?", help="a text file or a folder of .txt files")
    p.add_argument("--config", help="a YAML or TOML file of settings (flags override it)")
    add_settings_flags(p, TrainSettings, _HELP, skip=("data", "model"))
    p.add_argument(
        "--model",
        action="append",
        type=_model_option,
        default=[],
        metavar="KEY=VALUE",
        help="a TransformerConfig option, e.g. --model d_model=128 --model moe.n_experts=4",
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    import logging

    from coursepkg.training import CheckpointError, load_settings, train

    logging.basicConfig(level=logging.INFO, format="coursepkg train: %(message)s")
    flags = {
        k: v
        for k, v in vars(args).items()
        if k not in ("command", "func", "config", "resume", "no_progress", "model")
    }
    settings = load_settings(args.config, **flags, model=dict(args.model))
    try:
        result = train(settings, resume=args.resume, progress=not args.no_progress)
    except CheckpointError as err:
        sys.stderr.write(f"coursepkg train: error: {err}\n")
        return 2
    if result.rows and result.rows[-1]["step"] == settings.steps:
        last = [r for r in result.rows if r["val_loss"] is not None][-1]
        sys.stdout.write(
            f"step {last['step']}: held-out loss {last['val_loss']:.4f}, perplexity "
            f"{last['val_perplexity']:.2f}; log, loss.png and samples.txt in {result.out}\n"
        )
        sys.stdout.write("".join(f"-----\n{sample}\n" for sample in result.samples))
    elif result.rows:
        sys.stdout.write(f"stopped after step {result.rows[-1]['step']}; continue with --resume\n")
    return 0


#: How each command of this home declares its arguments, on the subparser ``coursepkg``
#: makes for it (its :data:`COMMANDS` line as help).
ARGUMENTS = {"train": _add_train}
