"""``coursepkg curate IN OUT``: the command line of :mod:`coursepkg.curation`.

IN is a file or a folder of web pages and text files (any encoding, HTML or not); OUT is a folder
that receives one ``.txt`` file per kept document (its path under IN, with ``.txt`` added) and
``summary.json``, the counts of what each filter removed, which the command also prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["ARGUMENTS", "COMMANDS"]

#: The commands of this home and their line in ``coursepkg --help``.
COMMANDS = {
    "curate": "filter, mask and deduplicate a corpus of web pages or text",
}


def _add_curate(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg curate`` subcommand."""
    p.description = (
        "Extract text from HTML, keep one language, apply the Gopher rules and the "
        "quality classifier, mask e-mail addresses, phone numbers and IPv4 addresses, remove "
        "repeated lines and near-duplicate documents; print what each step removed."
    )
    p.add_argument("input", type=Path, help="a file or a folder (read recursively)")
    p.add_argument("out", type=Path, help="the folder for the kept documents and summary.json")
    p.add_argument("--language", default="en", help="ISO 639-1 code to keep (default: en)")
    p.add_argument("--min-language-prob", type=float, default=0.5)
    p.add_argument(
        "--min-quality", type=float, default=0.5, help="quality classifier's least probability"
    )
    p.add_argument("--no-quality", action="store_true", help="skip the quality classifier")
    p.add_argument("--dedup-threshold", type=float, default=0.8, help="Jaccard of near-duplicates")
    p.add_argument(
        "--line-min-chars", type=int, default=0, help="spare repeated lines shorter than this"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_curate)


def _curate(args: argparse.Namespace) -> int:
    from ..curation import curate, read_documents

    for name in ("min_language_prob", "min_quality", "dedup_threshold"):
        value = getattr(args, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1], got {value}")
    if not args.input.exists():
        raise ValueError(f"input: no file or folder at {args.input}")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"out: {args.out} exists and is not a folder")
    result = curate(
        read_documents(args.input),
        language=args.language,
        min_language_prob=args.min_language_prob,
        min_quality=None if args.no_quality else args.min_quality,
        dedup_threshold=args.dedup_threshold,
        line_min_chars=args.line_min_chars,
        progress=not args.no_progress,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in result.kept:
        target = args.out / f"{name}.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n", encoding="utf-8")
    summary = {
        "documents_in": result.documents_in,
        "documents_kept": len(result.kept),
        "removed": dict(result.removed),
        "details": dict(result.details),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    sys.stdout.write("".join(f"{line}\n" for line in result.summary()))
    return 0


#: How each command of this home declares its arguments, on the subparser ``coursepkg``
#: makes for it (its :data:`COMMANDS` line as help).
ARGUMENTS = {"curate": _add_curate}
