"""The ``coursepkg`` command line.

``coursepkg info`` prints versions and the device; ``coursepkg params`` prints the closed-form
parameter breakdown of a preset or of a configuration given on the command line.
"""

from __future__ import annotations

import argparse
import sys

from .config import TransformerConfig
from .params import count_parameters, layer_breakdown, parameter_breakdown


def _info(_: argparse.Namespace) -> int:
    import torch

    from . import __version__

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"coursepkg {__version__}")
    print(f"torch {torch.__version__} (device: {device}, threads: {torch.get_num_threads()})")
    return 0


def _params(args: argparse.Namespace) -> int:
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
    print(
        f"{kind} model: D={config.d_model} H={config.n_heads} F={config.d_ff} "
        f"N={config.n_layers} V={config.vocab_size} tied={config.tie_embeddings}"
    )
    for name, n in parts.items():
        print(f"  {name:<{width}}{n:>14,}")
    print(f"  {'total':<{width}}{count_parameters(config, kind):>14,}")
    if not args.decoder_only:
        print("one layer:")
        for name, n in layer_breakdown(config).items():
            print(f"  {name:<{width}}{n:>14,}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``coursepkg`` command."""
    parser = argparse.ArgumentParser(prog="coursepkg", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="versions and device")
    p.set_defaults(func=_info)
    p = sub.add_parser("params", help="closed-form parameter counts")
    p.add_argument("--preset", choices=("base", "big"), default="base")
    p.add_argument("--vocab-size", type=int, default=37000)
    p.add_argument("--d-model", type=int)
    p.add_argument("--n-heads", type=int)
    p.add_argument("--d-ff", type=int)
    p.add_argument("--n-layers", type=int)
    p.add_argument("--untied", action="store_true", help="separate output projection")
    p.add_argument("--decoder-only", action="store_true", help="GPT-style model")
    p.set_defaults(func=_params)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``coursepkg`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        print(f"coursepkg: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
