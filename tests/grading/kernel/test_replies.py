"""coursepkg.grading.kernel.replies: a reply whose wake-up a send took is read at the next short
poll; a wait still ends with ``queue.Empty`` when asked to; the grader's and ``coursepkg
check``'s kernels get this client."""

from __future__ import annotations

import asyncio
import queue
import time

import pytest
from jupyter_client.manager import AsyncKernelManager

from coursepkg.grading import notebook
from coursepkg.grading.kernel import replies
from coursepkg.grading.kernel.forked import ForkKernelManager


class _LostEdgeSocket:
    """A socket whose reply is queued ``after`` seconds after the first poll starts and seen
    only by a poll that starts after that: a poll already waiting misses it, as one whose
    ZeroMQ edge a send took."""

    def __init__(self, after: float) -> None:
        self.after = after
        self.queued_at: float | None = None
        self.polls = 0

    async def poll(self, timeout_ms: int | None = None, flags: int = 0) -> int:
        self.polls += 1
        if self.queued_at is None:
            self.queued_at = time.monotonic() + self.after
        elif time.monotonic() >= self.queued_at:
            return 1
        await asyncio.sleep(3600 if timeout_ms is None else timeout_ms / 1000)
        return 0


def _channel(cls, socket: _LostEdgeSocket):
    channel = cls.__new__(cls)  # the constructor takes only a zmq.asyncio socket
    channel.socket = socket

    async def recv(**kwargs):
        return {"msg_type": "execute_reply"}

    channel._recv = recv  # what the socket holds, without a session to sign it
    return channel


def test_one_long_poll_never_sees_a_reply_whose_edge_was_lost():
    # The failure itself, with jupyter_client's own channel: the reply is there, the wait is not
    # woken.
    async def scenario():
        channel = _channel(replies.AsyncZMQSocketChannel, _LostEdgeSocket(after=0.2))
        await asyncio.wait_for(channel.get_msg(timeout=None), 3.0)

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(scenario())


def test_a_reply_whose_edge_was_lost_is_read_at_the_next_short_poll():
    async def scenario():
        socket = _LostEdgeSocket(after=0.2)
        channel = _channel(replies.ShortPollChannel, socket)
        started = time.monotonic()
        reply = await asyncio.wait_for(channel.get_msg(timeout=None), 3.0)
        return reply, time.monotonic() - started, socket.polls

    reply, waited, polls = asyncio.run(scenario())
    assert reply == {"msg_type": "execute_reply"}
    assert polls == 2, polls  # the first, which missed it, and the next, which read it
    # One short poll's wait, not the long poll's hour (a loose bound: a busy machine delays
    # the event loop's timers).
    assert replies.SHELL_POLL_SECONDS <= waited < replies.SHELL_POLL_SECONDS + 10, waited


def test_short_polls_still_end_with_empty_when_the_time_is_up():
    async def scenario():
        socket = _LostEdgeSocket(after=3600)
        channel = _channel(replies.ShortPollChannel, socket)
        started = time.monotonic()
        with pytest.raises(queue.Empty):
            await channel.get_msg(timeout=2.5)
        return time.monotonic() - started, socket.polls

    waited, polls = asyncio.run(scenario())
    assert 2.5 <= waited < 2.5 + 10, waited  # not before the time is up, nor long after it
    assert polls >= 2, polls  # in slices of at most 1 s (quiet: 1 s, 1 s, then the 0.5 s left)


def test_the_graders_and_the_checks_kernels_get_the_short_poll_client(tmp_path):
    assert issubclass(ForkKernelManager().client_factory, replies.ShortPollKernelClient)
    manager = AsyncKernelManager(kernel_name="python3", client_class=replies.CLIENT_CLASS)
    assert manager.client_factory is replies.ShortPollKernelClient
    assert manager.client().shell_channel_class is replies.ShortPollChannel
    # coursepkg check's own start of its kernel
    kernel = notebook._start_kernel(tmp_path / "answers.ipynb")
    try:
        assert not isinstance(kernel, Exception), kernel
        assert kernel.client_factory is replies.ShortPollKernelClient
    finally:
        notebook._stop_kernel(kernel)
