"""``coursepkg pipeline``: the command line of :mod:`coursepkg.training.pipeline`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .data import add_cache_option

__all__ = ["ARGUMENTS", "COMMANDS"]

#: The commands of this home and their line in ``coursepkg --help``.
COMMANDS = {
    "pipeline": "from real text to a chat model: corpus, tokenizer, pretraining, fine-tuning, "
    "evaluation, serving and a report card",
}


def _add_pipeline(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg pipeline`` subcommand."""
    p.description = (
        "Prepare the corpus, learn a BPE tokenizer, pretrain a GPT (coursepkg "
        "train's code), fine-tune it into a chat model on generated conversations (coursepkg "
        "finetune's code), evaluate each stage, measure the chat model served by coursepkg serve "
        "and write OUT/report.md and OUT/report.html. "
        "Each stage ends with OUT/STAGE/done.json; a rerun skips the stages done. Serve the "
        "result with `coursepkg serve OUT/finetune`."
    )
    p.add_argument("--out", default="runs/pipeline", help="the run's folder (default %(default)s)")
    p.add_argument(
        "--budget", default="1h", help="the time the whole run may take: 5m, 1h... (default 1h)"
    )
    p.add_argument(
        "--corpus",
        help="a text file, or a folder with train.txt and val.txt (default: coursepkg data "
        "prepare's corpus)",
    )
    add_cache_option(p)
    p.add_argument("--seed", type=int, default=0, help="seeds training and the chat data's split")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto)")
    p.set_defaults(func=_pipeline)


def _pipeline(args: argparse.Namespace) -> int:
    from coursepkg.training.budget import parse_budget
    from coursepkg.training.pipeline import PipelineSettings, run_pipeline

    logging.basicConfig(level=logging.INFO, format="coursepkg pipeline: %(message)s")
    settings = PipelineSettings(
        out=args.out,
        budget=parse_budget(args.budget),
        corpus=args.corpus,
        cache=args.cache,
        seed=args.seed,
        device=args.device,
    )
    figures = run_pipeline(settings, say=lambda line: sys.stdout.write(line + "\n"))
    after = figures["evaluate"]["accuracy"]["after"]
    serve = figures["serve"]
    served = (
        f"served: {serve['greedy_equal']}/{serve['requests']} greedy answers equal offline, "
        f"{serve['ratio']:.2f}x throughput all at once; "
        if "ratio" in serve
        else ""
    )
    out = Path(args.out)
    sys.stdout.write(
        f"held-out bits per byte {figures['pretrain']['heldout_bits_per_byte']:.3f}; chat "
        f"accuracy {', '.join(f'{t} {a:.0%}' for t, a in after.items())}; {served}report "
        f"{out / 'report.md'}; serve with: coursepkg serve {out / 'finetune'}\n"
    )
    return 0


#: How each command of this home declares its arguments, on the subparser ``coursepkg``
#: makes for it (its :data:`COMMANDS` line as help).
ARGUMENTS = {"pipeline": _add_pipeline}
