"""Waiting for a kernel's replies without losing a wake-up (:class:`ShortPollKernelClient`).

A client waits for a cell's ``execute_reply`` on the shell socket with one poll as long as the
cell's time limit (nbclient does). ZeroMQ's file descriptor signals readability by *edges*, and a
send on the same socket may take the edge of a reply already queued: the long poll is then never
woken, though the reply is there, and the kernel sits idle until the limit. nbclient sends on
the shell socket while it waits whenever a cell prints into an ipywidgets ``Output`` (it sends
the widget's outputs back to the kernel; jupyter_client's ``Session.send`` uses a plain socket
shadowing the asyncio one, which the asyncio socket's bookkeeping never sees). Reported upstream
as jupyter/nbclient#312 (open); ipykernel#1529 is the same mechanism on the kernel's side.

Seen here: the book's ``explore`` cells (an ``Output`` per figure) stalled pages of the book
build (CI, 2026-11-30, chapter 5; chapters 5 and 7 in a CI-style run), and a notebook of 40 such
cells stalled in 2 runs of 2. A graded notebook that prints into an ``Output`` would have been
stopped by its cell limit and scored as too slow.

The cure: the shell channel waits in polls of at most :data:`SHELL_POLL_SECONDS`. Each new poll
reads the socket's state afresh, so a lost edge costs at most that long.
"""

from __future__ import annotations

import time
from queue import Empty
from typing import Any

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import Type

__all__ = ["CLIENT_CLASS", "SHELL_POLL_SECONDS", "ShortPollChannel", "ShortPollKernelClient"]

#: The longest single poll of the shell socket: what a lost wake-up can cost.
SHELL_POLL_SECONDS = 1.0


class ShortPollChannel(AsyncZMQSocketChannel):
    """jupyter_client's asyncio channel, waiting for a message in polls of at most
    :data:`SHELL_POLL_SECONDS`."""

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        """The next message, as :meth:`AsyncZMQSocketChannel.get_msg` gives it.

        Args:
            timeout: seconds to wait in all (None: no limit).

        Returns:
            The message (a dict).

        Raises:
            queue.Empty: none came within ``timeout``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SHELL_POLL_SECONDS if deadline is None else deadline - time.monotonic()
            try:
                return await super().get_msg(timeout=max(0.0, min(SHELL_POLL_SECONDS, left)))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise


class ShortPollKernelClient(AsyncKernelClient):
    """jupyter_client's asyncio kernel client whose shell channel is a
    :class:`ShortPollChannel`. A kernel manager takes it as ``client_class`` (the book's build:
    ``KernelManager.client_class`` in its config); the grader's own client derives from it."""

    shell_channel_class = Type(ShortPollChannel)  # type: ignore[assignment]


#: :class:`ShortPollKernelClient`'s dotted name, as a kernel manager's ``client_class`` takes it.
CLIENT_CLASS = f"{__name__}.{ShortPollKernelClient.__qualname__}"
