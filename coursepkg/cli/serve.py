"""``coursepkg serve``: the command line of :mod:`coursepkg.serving.http`.

It loads the checkpoint, builds the continuous-batching engine and runs the FastAPI application
with uvicorn. The model is loaded and the socket listening before the line
``coursepkg serve: ready on http://HOST:PORT`` is written (on stderr): from then on requests are
accepted, so a script (or a test) waits for that line instead of sleeping; ``--port 0`` picks
a free port.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys

__all__ = ["ARGUMENTS", "COMMANDS"]

#: The commands of this home and their line in ``coursepkg --help``.
COMMANDS = {
    "serve": "serve a trained model over an OpenAI-compatible HTTP API, with a chat page",
}


def _add_serve(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg serve`` subcommand."""
    p.description = (
        "Serve CHECKPOINT (a `coursepkg finetune` run, or a `coursepkg train "
        "--tokenizer bpe --model positional=rope` run) at /v1/chat/completions, "
        "/v1/completions and /v1/models, as OpenAI's API (streaming as server-sent events), "
        "with continuous batching underneath; a chat page is at /."
    )
    p.add_argument("checkpoint", help="a run folder, or its model.pt or checkpoint.pt")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one)")
    p.add_argument("--name", help="the model's id in the API (default: the run folder's name)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together (default 8)")
    p.add_argument(
        "--max-waiting",
        type=int,
        default=64,
        help="requests that may wait for a row; more are answered 429 (default 64)",
    )
    p.add_argument("--block-size", type=int, default=16, help="positions per cache block")
    p.add_argument(
        "--cache-tokens",
        type=int,
        help="positions in the key/value cache, all requests together (default: max-batch "
        "times the model's context)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from coursepkg.serving.http import OnlineBatcher, create_app, load_served_model

    served = load_served_model(args.checkpoint, args.name)
    tokens = args.cache_tokens or args.max_batch * served.context
    if tokens < 1:
        raise ValueError(f"--cache-tokens must be positive, got {tokens}")
    engine = OnlineBatcher(
        served.model,
        n_blocks=math.ceil(tokens / args.block_size),
        block_size=args.block_size,
        max_batch=args.max_batch,
        stop_ids=served.stop_ids,
        max_waiting=args.max_waiting,
        generator=torch.Generator().manual_seed(args.seed),
    )
    app = create_app(served, engine)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {err.strerror}") from None
    sock.listen(128)  # connections wait in the backlog until uvicorn takes them
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    sys.stderr.write(
        f"coursepkg serve: ready on http://{args.host}:{port} (model {served.name!r}, "
        f"{engine.capacity} cache positions, {args.max_batch} at once; chat page at /)\n"
    )
    sys.stderr.flush()
    server.run(sockets=[sock])
    return 0


#: How each command of this home declares its arguments, on the subparser ``coursepkg``
#: makes for it (its :data:`COMMANDS` line as help).
ARGUMENTS = {"serve": _add_serve}
