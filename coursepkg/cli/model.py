"""The model's commands: ``coursepkg info`` (versions and device) and ``coursepkg params`` (the
closed-form parameter breakdown of a preset, or of a configuration given as flags).

Each command is a pair, ``_add_<verb>(sub)`` that declares its arguments and ``_<verb>(args)``
that runs it (its exit status), listed in :data:`COMMANDS` and declared by :func:`add_parser`
on the ``coursepkg`` parser (:mod:`coursepkg.cli`). The other homes keep the same form:
``coursepkg train`` in :mod:`coursepkg.cli.train`, the grading commands in
:mod:`coursepkg.cli.grading` and :mod:`coursepkg.cli.term`.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["ARGUMENTS", "COMMANDS"]

#: The commands of this home and their line in ``coursepkg --help``.
COMMANDS = {
    "info": "versions and device",
    "params": "closed-form parameter counts",
}


def _add_info(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg info`` subcommand."""
    p.description = (
        "Print the versions of coursepkg and torch, the device PyTorch would use "
        "(cuda or cpu) and its number of threads."
    )
    p.set_defaults(func=_info)


def _report(lines: list[str]) -> None:
    """Write a command's report, its result, to standard output (the library never prints)."""
    sys.stdout.write("".join(f"{line}\n" for line in lines))


def _info(_: argparse.Namespace) -> int:
    import torch

    from .. import __version__

    device = "cuda" if torch.cuda.is_available() else "cpu"
    threads = torch.get_num_threads()
    _report(
        [
            f"coursepkg {__version__}",
            f"torch {torch.__version__} (device: {device}, threads: {threads})",
        ]
    )
    return 0


def _add_params(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg params`` subcommand."""
    p.description = (
        "Print the parameter count of a Transformer part by part, from the closed "
        "forms of coursepkg.params (nothing is built): the base or big preset of the paper, "
        "with any of its sizes changed by the flags."
    )
    p.add_argument("--preset", choices=("base", "big"), default="base")
    p.add_argument("--vocab-size", type=int, default=37000)
    p.add_argument("--d-model", type=int)
    p.add_argument("--n-heads", type=int)
    p.add_argument("--d-ff", type=int)
    p.add_argument("--n-layers", type=int)
    p.add_argument("--untied", action="store_true", help="separate output projection")
    p.add_argument("--decoder-only", action="store_true", help="GPT-style model")
    p.set_defaults(func=_params)


def _params(args: argparse.Namespace) -> int:
    from ..config import TransformerConfig
    from ..params import count_parameters, layer_breakdown, parameter_breakdown

    fields = {
        k: v
        for k, v in vars(args).items()
        if k in ("d_model", "n_heads", "d_ff", "n_layers") and v is not None
    }
    make = TransformerConfig.big if args.preset == "big" else TransformerConfig.base
    config = make(vocab_size=args.vocab_size, tie_embeddings=not args.untied, **fields)
    kind = "decoder-only" if args.decoder_only else "encoder-decoder"
    parts = parameter_breakdown(config, kind)
    width = max(len(k) for k in [*parts, *layer_breakdown(config)]) + 2
    lines = [
        f"{kind} model: D={config.d_model} H={config.n_heads} F={config.d_ff} "
        f"N={config.n_layers} V={config.vocab_size} tied={config.tie_embeddings}"
    ]
    lines += [f"  {name:<{width}}{n:>14,}" for name, n in parts.items()]
    lines.append(f"  {'total':<{width}}{count_parameters(config, kind):>14,}")
    if not args.decoder_only:
        lines.append("one layer:")
        lines += [f"  {name:<{width}}{n:>14,}" for name, n in layer_breakdown(config).items()]
    _report(lines)
    return 0


#: How each command of this home declares its arguments, on the subparser ``coursepkg``
#: makes for it (its :data:`COMMANDS` line as help).
ARGUMENTS = {"info": _add_info, "params": _add_params}
