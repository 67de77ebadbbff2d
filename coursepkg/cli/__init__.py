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
``_add_<verb>``/``_<verb>`` pair in one home, listed in that home's ``COMMANDS`` (its line in
``coursepkg --help``) and ``ARGUMENTS`` (``_add_<verb>``, which declares its arguments on the
subparser made here): :mod:`coursepkg.cli.model` (info, params), :mod:`coursepkg.cli.grading`
(check, release, grade), :mod:`coursepkg.cli.term` (export, regrade, similarity),
:mod:`coursepkg.cli.data` (data), :mod:`coursepkg.cli.curate` (curate), :mod:`coursepkg.cli.train`
(train), :mod:`coursepkg.cli.finetune` (finetune), :mod:`coursepkg.cli.serve` (serve),
:mod:`coursepkg.cli.pipeline` (pipeline). Only the command being run is declared in full, and what
it runs is imported when it runs: ``coursepkg --help`` and an argument's error import neither torch
nor nbgrader.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Collection

from ..grading.kernel import skip_iri_grammar
from . import curate, data, finetune, grading, model, pipeline, serve, term, train

#: The homes of the commands, in the order ``coursepkg --help`` lists them.
HOMES = (model, grading, term, data, curate, train, finetune, serve, pipeline)


def build_parser(verbs: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``coursepkg`` command.

    Args:
        verbs: the commands declared in full (None: all); the others are listed with their
            line only (a train command's flags come from its settings, which import torch).
    """
    parser = argparse.ArgumentParser(prog="coursepkg", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for home in HOMES:
        for verb, line in home.COMMANDS.items():
            if verbs is None or verb in verbs:
                home.ARGUMENTS[verb](sub.add_parser(verb, help=line))
            else:
                sub.add_parser(verb, help=line, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``coursepkg`` console script."""
    words = sys.argv[1:] if argv is None else argv
    if argv is None:  # the console script: a process of its own
        # No command validates an IRI: jsonschema's IRI grammar, built as nbformat or nbgrader
        # import it, is ~2 s of CPU each command would pay (as the grader's processes, skipped).
        skip_iri_grammar()
    parser = build_parser(words[:1])  # the command is the first word (no global option)
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
