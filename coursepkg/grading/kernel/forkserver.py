"""Start grading kernels in milliseconds: fork them from a process that has imported PyTorch.

A fresh Python kernel spends most of a short notebook's grading time before the first cell:
starting the interpreter, importing IPython and ipykernel (~0.4 s of CPU here) and, in
every exercise of this course, ``import torch`` and ``coursepkg.grading`` (~2.5 s). With forty
students that is two minutes of CPU per assignment spent importing the same modules.

``coursepkg grade`` therefore starts a *fork server* for its grading workers. The server imports
those modules once, then waits on a Unix socket; for each notebook the worker's kernel manager
asks it for a kernel, and the server ``fork()``s a child that becomes the sandbox kernel of
:mod:`coursepkg.grading.kernel.sandbox` exactly as a freshly started one would (the same command
line, environment, working directory, limits and confinement, applied in the child before any
student code runs). Each notebook still gets a process of its own: the child's memory is a
copy-on-write copy of the server's, and nothing it does reaches the server, the worker or
another student's kernel.

The pieces:

* :func:`serve` runs the server (``python -m coursepkg.grading.kernel.forkserver SOCKET``); it
  answers only its parent process (the peer's pid is checked with ``SO_PEERCRED``), so a
  student's kernel that finds the socket cannot ask it for an unconfined process. Started with
  ``--siblings``, it answers its parent's other children too: ``coursepkg grade`` on a
  ``LocalCluster`` starts one server for all its workers (the workers are the grader's
  children), which imports torch once instead of once a worker, and while the cluster starts.
  A kernel lives as long as the connection of the process that asked for it: a worker that
  dies takes its kernels with it.
* :class:`ForkServer` starts and stops a server; :meth:`ForkServer.attach` is a worker's
  handle on a server its parent started.
* :mod:`.forked` is the client side: the kernel provisioner, kernel manager and nbgrader
  ``Execute`` that ask the server for kernels.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import sandbox
from .confine import (
    ENDED,
    die_with_parent,
    kernel_environment,
    kill_process_group_cgroup,
    libc,
    process_alive,
)

__all__ = ["ForkServer", "may_ask", "orphans_become_children", "read_line", "serve"]

#: The module whose ``-m`` command line the server knows how to run in a forked child.
SANDBOX_MODULE = sandbox.MODULE
#: What the server imports before it forks (what every exercise notebook and kernel imports).
PRELOAD = (
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch._dynamo",  # see sandbox._in_kernel_setup: imported here, a forked kernel pays nothing
    "coursepkg",
    "coursepkg.grading",
    "coursepkg.grading.kernel.sandbox",
    "coursepkg.grading.kernel.guard",  # the guard each kernel installs before its first cell
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    "ipykernel.debugger",  # what each kernel's IPythonKernel imports as it starts (~0.2 s)
    "pdb",
    "sqlite3",  # IPython's history
)

_PR_GET_CHILD_SUBREAPER = 37

# The server of this process (set by ForkServer.start), used by every provisioner of
# :mod:`.forked` in it.
_current: ForkServer | None = None


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


def _peer_pid(conn: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket (Linux ``SO_PEERCRED``)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[:4], sys.byteorder, signed=True)


def _parent_of(pid: int) -> int | None:
    """The parent pid of process ``pid`` (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])  # after "pid (comm) state"


def may_ask(peer: int, parent: int, siblings: bool) -> bool:
    """Whether process ``peer`` may ask the server started by ``parent`` for a kernel: the
    parent itself, and with ``siblings`` the parent's other children (never their children,
    such as a student's kernel or what it starts)."""
    return peer == parent or (siblings and _parent_of(peer) == parent)


def orphans_become_children() -> bool:
    """Whether an orphaned process would be re-parented to this one (it is pid 1 of its pid
    namespace, or a child subreaper): then "a child of this process" says nothing of where a
    process came from, and a server of siblings (``serve(..., siblings=True)``) must not be
    started from it."""
    if os.getpid() == 1:
        return True
    import ctypes

    flag = ctypes.c_int(0)
    if libc().prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
        return True  # cannot tell: assume the worst
    return flag.value != 0


def read_line(conn: socket.socket, limit: int = 1 << 24) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the connection closed before a whole request arrived")
        data += chunk
        if len(data) > limit:
            raise ConnectionError("request too large")
    return data


def _become_kernel(request: dict, own_fds: list[int]) -> None:
    """In the forked child: turn into the kernel ``request["argv"]`` describes. Never returns."""
    code = 1
    try:
        for fd in own_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        os.setsid()  # a process group of its own, as jupyter_client gives a launched kernel
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import random
        import tempfile

        tempfile.tempdir = None  # the kernel's TMPDIR, not the server's
        # Random states seeded anew, as in a fresh process (a copy of the server's would be
        # the same in every child): Python's, NumPy's and PyTorch's.
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        import torch

        torch.seed()
        threads = request["env"].get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))  # the kernel's share of the cores
        argv = list(request["argv"])
        sys.argv = argv
        if sys.path and sys.path[0] == request["server_dir"]:
            sys.path[0] = os.getcwd()  # what `python -m` in the kernel's folder would put
        from .sandbox import launch

        # The kernel's parent is this server: ipykernel watches it (it read JPY_PARENT_PID
        # when the server imported it, so it is told on the command line).
        os.environ["JPY_PARENT_PID"] = str(os.getppid())
        launch(
            [*argv[argv.index(SANDBOX_MODULE) + 1 :], f"--IPKernelApp.parent_handle={os.getppid()}"]
        )
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported on stderr, then the child exits
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - exiting anyway
                pass
        os._exit(code)


def _preload() -> None:
    """Import :data:`PRELOAD`, then freeze what the imports made: it lives as long as the
    server and every kernel, so the kernels' collections skip it and its pages stay shared
    with the server (Python's advice for a process that forks without exec)."""
    # debugpy (under ipykernel.debugger) warns as it is imported that frozen modules may hide
    # breakpoints: true of every kernel, of no use in a grader's log; said off while importing.
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    try:
        for name in PRELOAD:
            __import__(name)
    finally:
        del os.environ["PYDEVD_DISABLE_FILE_VALIDATION"]
    # What every kernel's guard reads before the first cell (sandbox.install_guard takes each
    # check_* name of coursepkg.grading): every assignment's checks and their catalogues (the
    # post-training ones import transformers), imported once here instead of in each kernel
    # (~0.4 s of CPU a student on a quiet machine, 1.7 s of wall time on a busy one).
    import coursepkg.grading as grading

    grading.load_every_check()
    for name in grading.__all__:
        getattr(grading, name)
    # The guard's snapshot of all that, taken once here rather than in each kernel.
    from .guard import preload_snapshot

    preload_snapshot()
    gc.freeze()


def serve(path: str | Path, siblings: bool = False) -> None:
    """Run a fork server on the Unix socket ``path`` until the parent process dies.

    Protocol, one connection per kernel: the client sends one JSON line ``{"argv": [...],
    "env": {...}, "cwd": "..."}`` (``argv`` is the sandbox kernelspec's command line); the
    server forks, answers ``{"pid": N}``, and when that child exits ``{"exit": code}``, then
    closes the connection. The client keeps the connection open while it uses the kernel: when
    it closes it first (the client died), the kernel is killed. A request from any process but
    the server's parent (or, with ``siblings``, the parent's other children), or that is not the
    sandbox kernel's command line, is answered ``{"error": "..."}``.

    Args:
        path: where to create the socket (its directory should be private to the grader).
        siblings: answer the parent's children too (the parent must not be a process orphans
            are re-parented to: :func:`orphans_become_children`).
    """
    die_with_parent()  # die with the process that started the server
    parent = os.getppid()
    here = os.getcwd()  # `python -m` put it first on sys.path; each kernel gets its own
    _preload()
    # Bound and listening under a temporary name, then renamed into place: whoever finds the
    # socket at ``path`` can connect at once, and the line on stdout says so to the parent.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}"
    listener.bind(staging)
    os.chmod(staging, 0o600)
    listener.listen(16)
    os.rename(staging, path)
    sys.stdout.write("ready\n")  # the readiness line the parent waits for (wait_ready)
    sys.stdout.flush()
    serving = _Serving(listener, parent, siblings, here)
    while True:
        for key, _ in serving.chooser.select(timeout=5.0):
            kind, fd = key.data
            if kind == "listener":
                if serving.accept() == "stop":
                    return
            elif kind == "client":  # the client wrote (nothing is expected) or is gone
                serving.hear(fd)
            else:  # a kernel exited
                serving.reap(fd)
        if os.getppid() != parent:  # the parent is gone (PDEATHSIG should have fired)
            return


class _Serving:
    """The state of :func:`serve`'s loop: the listener, the kernels and their clients."""

    def __init__(self, listener: socket.socket, parent: int, siblings: bool, here: str) -> None:
        self.listener, self.parent, self.siblings, self.here = listener, parent, siblings, here
        self.chooser = selectors.DefaultSelector()
        self.chooser.register(listener, selectors.EVENT_READ, ("listener", 0))
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
        self.abandoned: set[int] = set()  # the kernels whose client closed its connection

    def _request(self, conn: socket.socket) -> dict | None:
        """The client's request, or None once a refusal is sent."""
        try:
            # The request is read first, refused or not: closing a connection with unread
            # data resets it, and the refusal might never reach the client.
            line = read_line(conn)
            peer = _peer_pid(conn)
            if not may_ask(peer, self.parent, self.siblings):
                raise PermissionError("only the grading worker may ask for kernels")
            request = json.loads(line)
            if request.get("stop") and peer == self.parent:
                return request
            argv = request.get("argv", [])
            if SANDBOX_MODULE not in argv or argv[0] != sys.executable:
                raise ValueError(f"not the sandbox kernel's command line: {argv}")
            return request
        except (OSError, ValueError) as err:
            try:
                conn.sendall((json.dumps({"error": str(err)}) + "\n").encode())
            except OSError:
                pass
            conn.close()
            return None

    def accept(self) -> str | None:
        """A new connection: fork the kernel it asks for, and answer its pid; or, asked by the
        parent to stop, end every kernel and answer, then return ``"stop"``."""
        conn, _ = self.listener.accept()
        conn.settimeout(30)
        request = self._request(conn)
        if request is None:
            return None
        if request.get("stop"):
            self._end_all()
            try:
                conn.sendall(b'{"stopped": true}\n')
            except OSError:
                pass
            conn.close()
            return "stop"
        request["server_dir"] = self.here
        own = [self.listener.fileno(), self.chooser.fileno(), conn.fileno()]
        own += [*self.children, *(c.fileno() for _, c in self.children.values())]
        pid = os.fork()
        if pid == 0:
            _become_kernel(request, own)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, conn)
        self.chooser.register(pidfd, selectors.EVENT_READ, ("child", pidfd))
        try:
            conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
            self.chooser.register(conn, selectors.EVENT_READ, ("client", pidfd))
        except OSError:
            self._abandon(pid)
        return None

    def _end_all(self) -> None:
        """Kill every kernel, reap it and remove its cgroups: nothing of them outlives the
        server (a kernel orphaned by a server's kill would leave its cgroups behind)."""
        for pid, _ in self.children.values():
            self._abandon(pid)
        for pidfd in list(self.children):
            self.reap(pidfd)

    def hear(self, pidfd: int) -> None:
        """The client of kernel ``pidfd`` is readable: gone (its kernel is killed) or not."""
        pid, conn = self.children[pidfd]
        try:
            gone = not conn.recv(1 << 12)
        except OSError:
            gone = True
        if gone:
            self.chooser.unregister(conn)
            self._abandon(pid)

    def reap(self, pidfd: int) -> None:
        """Kernel ``pidfd`` exited: tell its client the exit code (if it is still there)."""
        pid, conn = self.children.pop(pidfd)
        self.chooser.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if pid in self.abandoned:  # what it left running, and its cgroups, go too
            self.abandoned.discard(pid)
            kill_process_group_cgroup(pid)
            # Its record is nobody's here, and the kernels forked next would inherit it: the
            # guard compares the module's state with the snapshot taken before any kernel.
            ENDED.pop(pid, None)
        else:
            self.chooser.unregister(conn)
            try:
                code = os.waitstatus_to_exitcode(status)
                conn.sendall((json.dumps({"exit": code}) + "\n").encode())
            except OSError:
                pass
        conn.close()

    def _abandon(self, pid: int) -> None:
        """Kill the kernel ``pid`` (and its process group) whose client is gone."""
        self.abandoned.add(pid)
        try:
            os.killpg(pid, signal.SIGKILL)  # the child called setsid(): its group is its pid
        except (ProcessLookupError, PermissionError):
            pass


class _Elsewhere:
    """What :class:`ForkServer` needs of a ``Popen``, for a server another process started."""

    stdout = None

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        return None if process_alive(self.pid) else -signal.SIGKILL  # a zombie has exited


class ForkServer:
    """A fork server started by the current process, or (:meth:`attach`) by its parent.

    It inherits ``env`` (default: this process's environment), filtered as a kernel's is; the
    kernels get their own from each request (what is read at import time, such as
    ``OMP_NUM_THREADS``, comes from the server's).

    Args:
        path: the socket's path (in a private directory).
        siblings: serve this process's other children too (:func:`serve`).
        env: the environment to start it with.
    """

    def __init__(
        self, path: str | Path, *, siblings: bool = False, env: dict[str, str] | None = None
    ) -> None:
        self.path = Path(path)
        # Started with a kernel's environment: a forked kernel's /proc/self/environ is the
        # server's, so nothing secret of the worker's may be in it.
        command = [sys.executable, "-m", "coursepkg.grading.kernel.forkserver", str(self.path)]
        self.proc: Any = subprocess.Popen(
            [*command, *(["--siblings"] if siblings else [])],
            cwd=self.path.parent,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=kernel_environment(os.environ if env is None else env),
        )
        self._ready = False
        self._owned = True

    @classmethod
    def attach(cls, path: str | Path, pid: int) -> ForkServer:
        """A handle on the server ``pid`` that this process's parent started with
        ``siblings`` on the socket ``path``; :meth:`stop` leaves it running."""
        server = cls.__new__(cls)
        server.path, server.proc = Path(path), _Elsewhere(pid)
        server._ready, server._owned = False, False
        return server

    def start(self) -> ForkServer:
        """Make this the server the provisioners of this process use."""
        global _current
        _current = self
        return self

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Wait until the server has finished its imports and listens (it says so on its
        stdout); False when it died or did not within ``timeout`` seconds."""
        if not self._ready and self.proc.stdout is not None:
            chooser = selectors.DefaultSelector()
            chooser.register(self.proc.stdout, selectors.EVENT_READ)
            if chooser.select(timeout=timeout):
                self._ready = self.proc.stdout.readline().strip() == b"ready"
            chooser.close()
        elif not self._ready:  # another process's server: ready once its socket is in place
            deadline = time.monotonic() + timeout
            while not self.path.exists() and self.proc.poll() is None:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.02)
            self._ready = self.path.exists()
        return self._ready and self.proc.poll() is None

    def connect(self, timeout: float = 120.0) -> socket.socket | None:
        """A connection to the server, waiting for it to finish its imports; None when it
        died or did not start within ``timeout`` seconds."""
        if not self.wait_ready(timeout):
            return None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(str(self.path))
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                time.sleep(0.05)
        return None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server: it kills its kernels, reaps them and removes their cgroups, then
        exits (killed if it has not within ``timeout`` seconds); a handle from :meth:`attach`
        only forgets it."""
        global _current
        if _current is self:
            _current = None
        if not self._owned:
            return
        if self.proc.poll() is None:
            # Listening once its socket is in place; before that it has started no kernel.
            conn = self.connect(timeout=5) if self.path.exists() else None
            if conn is not None:
                try:
                    conn.settimeout(timeout)
                    conn.sendall(b'{"stop": true}\n')
                    read_line(conn)  # {"stopped": true}: every kernel has ended
                    self.proc.wait(timeout=timeout)
                except (OSError, subprocess.TimeoutExpired):
                    pass
                finally:
                    conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.path.unlink(missing_ok=True)


if __name__ == "__main__":
    serve(sys.argv[1], siblings="--siblings" in sys.argv[2:])
