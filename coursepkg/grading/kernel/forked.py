"""Kernels from the fork server (:mod:`.forkserver`): the client side.

* :class:`ForkProvisioner` is a jupyter_client kernel provisioner that launches the sandbox
  kernelspec through this process's server (``forkserver._current``), and falls back to an
  ordinary launch when there is no server or the command is not the sandbox kernel. It keeps
  the connection it asked on open while the kernel lives: the server kills a kernel whose
  connection closes.
* :class:`ReadyKernelClient` is jupyter_client's client, ready as soon as the kernel is.
* :class:`ForkKernelManager` uses both, and :class:`ForkExecute` is nbgrader's ``Execute``
  preprocessor with that kernel manager.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from queue import Empty
from typing import Any

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Type

from . import forkserver
from .confine import kernel_environment, kill_process_group_cgroup
from .execute import RestartingExecute
from .forkserver import SANDBOX_MODULE, read_line
from .replies import ShortPollKernelClient

__all__ = ["ForkExecute", "ForkKernelManager", "ForkProvisioner", "ReadyKernelClient"]


class _ForkedKernel:
    """What :class:`~jupyter_client.provisioning.LocalProvisioner` needs of a ``Popen``, for a
    kernel the fork server started (its exit code arrives on the connection)."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int, conn: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn
        self._conn.setblocking(False)
        self._buffer = b""

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                data = self._conn.recv(1 << 12)
            except BlockingIOError:
                return None
            except OSError:
                data = b""
            if data:
                self._buffer += data
                if not self._buffer.endswith(b"\n"):
                    return None
                self.returncode = int(json.loads(self._buffer.splitlines()[-1])["exit"])
            else:  # the server is gone, and its children with it
                self.returncode = -signal.SIGKILL
            self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkProvisioner(LocalProvisioner):
    """Launch the sandbox kernel through this process's :class:`ForkServer` (if there is one
    and the command is the sandbox kernel's); otherwise exactly like ``LocalProvisioner``."""

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        server = forkserver._current
        forkable = SANDBOX_MODULE in cmd and cmd[0] == sys.executable
        conn = server.connect() if server is not None and forkable else None
        if forkable:  # nothing secret of the worker's reaches a sandbox kernel
            kwargs["env"] = kernel_environment(kwargs.get("env") or os.environ)
        if conn is None:
            if server is not None and forkable:
                self.log.warning("the fork server is not running; starting the kernel anew")
            return await super().launch_kernel(cmd, **kwargs)
        env = kernel_environment(kwargs.get("env") or os.environ)
        request = {"argv": cmd, "env": env, "cwd": str(kwargs.get("cwd") or os.getcwd())}
        conn.settimeout(60)
        try:
            conn.sendall((json.dumps(request) + "\n").encode())
            answer = json.loads(read_line(conn))
        except (OSError, ValueError) as err:
            conn.close()
            self.log.warning("the fork server failed (%s); starting the kernel anew", err)
            return await super().launch_kernel(cmd, **kwargs)
        if "pid" not in answer:
            conn.close()
            raise RuntimeError(f"the fork server refused the kernel: {answer.get('error')}")
        self.process = _ForkedKernel(answer["pid"], conn)  # type: ignore[assignment]
        self.pid = self.pgid = answer["pid"]  # the child called setsid()
        self.cwd = kwargs.get("cwd", os.getcwd())
        return self.connection_info


class ReadyKernelClient(ShortPollKernelClient):
    """jupyter_client's asynchronous kernel client, ready as soon as the kernel is (and waiting
    for replies in short polls, :mod:`.replies`).

    jupyter_client's ``wait_for_ready`` asks for ``kernel_info`` until the kernel replies and
    its iopub channel is connected, then drains iopub until no message has come for 0.2 s:
    0.2 s of idle wait in every kernel start, once per student. Here the drain ends at the
    last message the kernel publishes for the request it answered (ipykernel's status
    ``busy``, the reply, status ``idle``); whatever came before it is drained, as there. A
    startup message arriving later changes nothing: nbclient keeps only the messages whose
    parent is the cell it runs.
    """

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        """Wait until the kernel answers ``kernel_info`` and its iopub channel is connected.

        Args:
            timeout: seconds to wait (None: no limit).

        Raises:
            RuntimeError: the kernel died or did not answer within ``timeout`` (jupyter_client's
                messages, which the grader recognises as a failed start).
        """
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        while True:
            self.kernel_info()
            try:
                reply = await self.shell_channel.get_msg(timeout=1)
            except Empty:
                reply = None
            if reply is not None and reply["msg_type"] == "kernel_info_reply":
                if await self._idle_after(reply["parent_header"].get("msg_id")):
                    self._handle_kernel_info_reply(reply)
                    return
            if not await self.is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")

    async def _idle_after(self, msg_id: str | None) -> bool:
        """Drain iopub up to the kernel's ``idle`` status for request ``msg_id``; False when
        iopub stays silent for 0.2 s (not connected yet: the caller asks again, as
        jupyter_client does)."""
        while True:
            try:
                msg = await self.iopub_channel.get_msg(timeout=0.2)
            except Empty:
                return False
            if (
                msg["msg_type"] == "status"
                and msg["content"].get("execution_state") == "idle"
                and msg["parent_header"].get("msg_id") == msg_id
            ):
                return True


class ForkKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, with :class:`ForkProvisioner` as its provisioner and
    :class:`ReadyKernelClient` as its client.

    It talks to its kernel over Unix sockets (transport ``ipc``) in a private folder, not TCP:
    the sandbox kernel has no network beyond the loopback of a network namespace of its own.
    """

    client_factory = Type(ReadyKernelClient, klass=AsyncKernelClient, config=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ipc_folder: str | None = None
        if "transport" not in self.config.get("KernelManager", {}):
            self.transport = "ipc"

    async def _async_pre_start_kernel(self, **kw: Any) -> Any:
        if self.transport == "ipc" and self._ipc_folder is None:
            import tempfile

            # Short (a socket's path has at most 107 bytes) and private to this kernel.
            self._ipc_folder = tempfile.mkdtemp(prefix="cgk-", dir="/tmp")
            self.ip = os.path.join(self._ipc_folder, "k")
        if self.provisioner is None:
            import uuid

            self.kernel_id = self.kernel_id or kw.pop("kernel_id", str(uuid.uuid4()))
            self.provisioner = ForkProvisioner(
                kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self
            )
        return await super()._async_pre_start_kernel(**kw)

    async def _async_wait(self, pollinterval: float = 0.1) -> None:
        # jupyter_client polls a kernel that was asked to shut down every 0.1 s; a sandbox
        # kernel exits within some tens of ms of the request, so polling every 0.01 s (a read
        # of the fork server's connection, or a waitpid) ends each student's run sooner.
        await super()._async_wait(pollinterval=min(pollinterval, 0.01))

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        pid = getattr(self.provisioner, "pid", None)
        await super()._async_cleanup_resources(restart=restart)
        if pid:  # what the kernel left running (a fork bomb) goes, and its pids cgroup
            kill_process_group_cgroup(pid)
        if self._ipc_folder and not restart:
            import shutil

            shutil.rmtree(self._ipc_folder, ignore_errors=True)
            self._ipc_folder = None


class ForkExecute(RestartingExecute):
    """nbgrader's ``Execute`` preprocessor (one that starts a kernel again when it never
    answered), starting kernels with :class:`ForkKernelManager`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("kernel_manager_class", ForkKernelManager)
        super().__init__(*args, **kwargs)
