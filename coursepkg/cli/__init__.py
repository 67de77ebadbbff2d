"""The ``coursepkg`` command line.

``coursepkg info`` prints versions and the device; ``coursepkg params`` prints the closed-form
parameter breakdown of a preset or of a configuration given on the command line;
``coursepkg check NOTEBOOK`` runs an assignment notebook and reports its visible tests;
``coursepkg release`` regenerates the students' notebooks (exercises/) from solutions/;
``coursepkg grade ASSIGNMENT`` autogrades a whole class with nbgrader (instructors);
``coursepkg export``, ``regrade`` and ``similarity`` are the rest of the instructor's term.
``coursepkg data prepare`` builds the real-text corpus (Bible, Shakespeare, Milton);
``coursepkg train DATA`` trains a GPT on a text file or folder (also under ``torchrun``);
``coursepkg curate IN OUT`` filters, masks and deduplicates a corpus of web pages;
``coursepkg finetune BASE DATA`` fine-tunes one into an assistant (SFT, LoRA, DPO);
``coursepkg serve CHECKPOINT`` serves it over an OpenAI-compatible HTTP API with a chat page;
``coursepkg pipeline`` runs the whole path from text to a chat model, resumably.

This module builds the parser and runs the command asked for; every command is an
``_add_<verb>``/``_<verb>`` pair in one home, registered by that home's
``add_parsers``: :mod:`coursepkg.cli.model` (info, params), :mod:`coursepkg.cli.data` (data),
:mod:`coursepkg.cli.curate` (curate), :mod:`coursepkg.cli.train` (train),
:mod:`coursepkg.cli.finetune` (finetune), :mod:`coursepkg.cli.serve` (serve),
:mod:`coursepkg.cli.pipeline` (pipeline),
:mod:`coursepkg.grading.commands` (check, release, grade) and
:mod:`coursepkg.grading.term.commands` (export, regrade, similarity).
"""

from __future__ import annotations

import argparse
import gc
import sys

from ..grading import commands as grading_commands
from ..grading.term import commands as term_commands
from . import curate, data, finetune, model, pipeline, serve, train

#: The homes of the commands, in the order ``coursepkg --help`` lists them.
HOMES = (model, grading_commands, term_commands, data, curate, train, finetune, serve, pipeline)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``coursepkg`` command."""
    parser = argparse.ArgumentParser(prog="coursepkg", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for home in HOMES:
        home.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``coursepkg`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        sys.stderr.write(f"coursepkg: error: {err}\n")
        return 2
    finally:
        if argv is None:  # the console script: the process ends next
            # Nothing left needs collecting; without this the collector walks every object
            # of torch, nbgrader and Dask once more at exit (~0.7 s after `coursepkg grade`).
            gc.freeze()
