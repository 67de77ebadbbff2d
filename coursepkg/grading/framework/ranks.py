"""What a check that forks ranks joined over gloo needs from the machine: the loopback network
(:func:`probe_loopback`, so that a sandbox without it is said to be the machine's, not the
student's), and a stderr the ranks may write to without failing a notebook's test cell
(:func:`stderr_without_hostname_warning`), and reading what the ranks left in their folder
(:func:`rank_errors`, :func:`where_ranks_were`). Nothing here imports the rest of the framework.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["probe_loopback", "rank_errors", "stderr_without_hostname_warning", "where_ranks_were"]


def probe_loopback() -> None:
    """Raise ``OSError`` unless a connection to a port on 127.0.0.1 succeeds."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        socket.create_connection(server.getsockname(), timeout=10).close()


#: What PyTorch's TCPStore writes to the process' stderr (file descriptor 2, beneath Python's
#: ``sys.stderr``) when it cannot name a peer's address, as in the grader's network namespace,
#: which has no DNS to ask. nbgrader scores a test cell with any stderr output 0, so this line
#: must not reach the cell.
_HOSTNAME_WARNING = b"The hostname of the client socket cannot be retrieved"


@contextlib.contextmanager
def stderr_without_hostname_warning() -> Iterator[None]:
    """Hold file descriptor 2 in a temporary file while the ranks run (they inherit it), then
    pass on every line written there but :data:`_HOSTNAME_WARNING`'s."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().splitlines(keepends=True)
            kept = b"".join(line for line in lines if _HOSTNAME_WARNING not in line)
            if kept:
                os.write(2, kept)


def rank_errors(out: Path) -> list[tuple[str, str]]:
    """The ``[kind, message]`` pairs the ranks wrote to ``out/rank<r>.error``, oldest first."""
    files = sorted(out.glob("rank*.error"), key=lambda f: f.stat().st_mtime_ns)
    return [tuple(json.loads(f.read_text())) for f in files]  # type: ignore[misc]


def where_ranks_were(out: Path, world: int) -> str:
    """Where each of ``world`` ranks was, from the files it left in ``out``: ``rank<r>.pt``
    (finished), ``rank<r>.where`` (the call it was in), ``rank<r>.joined`` (in the group)."""
    notes = []
    for rank in range(world):
        note = out / f"rank{rank}.where"
        if (out / f"rank{rank}.pt").exists():
            notes.append(f"rank {rank} had finished")
        elif note.exists():
            notes.append(f"rank {rank} was in {note.read_text()}")
        elif not (out / f"rank{rank}.joined").exists():
            notes.append(f"rank {rank} had not joined the group")
    return "; ".join(notes)
