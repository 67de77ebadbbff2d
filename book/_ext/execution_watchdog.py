"""A local Sphinx extension: a page whose execution stops making progress fails fast, named, and
is retried once.

Why: a cold build once hung in chapter 7 with the kernel idle (its main thread in the event loop,
nothing executing) while myst-nb's notebook client waited for a reply that never came. The only
guard was the per-cell ``timeout`` (900 s, sized for the longest honest cell), so the build would
have failed 15 minutes later, naming no page.

What counts as progress while a cell runs: a message from the kernel about that cell, or CPU time
spent by the kernel or any process it started (a cell that trains, or that waits on ``torchrun``
workers, spends CPU all the time). A cell with neither for ``COURSEPKG_BOOK_STALL_S`` seconds
(default 150) is stalled: its kernel is killed, and the page is executed again from the start in
a new kernel. A second stall fails the page with the page, the cell's number and its code.
The per-cell ``timeout`` in ``_config.yml`` still bounds a cell that keeps working forever.
Every stall seen in the build (CI, 2026-11-30, chapter 5; chapters 5 and 7 in a CI-style run)
was the client's, not the kernel's: the kernel was idle, its reply sent, and the client never
woke to read it (an ``explore`` cell's ipywidgets Output; jupyter/nbclient#312). The pages'
kernels are therefore talked to by :class:`coursepkg.grading.kernel.replies.ShortPollKernelClient`
(``KERNEL_CONFIG``), which waits for replies in polls of at most a second.

Before a stalled kernel is killed it is asked for the stack of each of its threads (Python's
``faulthandler``, registered for ``SIGUSR1`` when the kernel starts, writes them to a file), and
the stall's message carries them: where the kernel waited is in the build's log.

Kernels talk to the client over Unix sockets (``transport = "ipc"``), not TCP ports on
127.0.0.1. With TCP, jupyter_client picks each kernel's five ports by binding port 0 and
closing the socket, and the kernel binds them a moment later; two pages executed at once (the
build's two readers) or any other process taking an ephemeral port in that moment can get the
same port, and the kernel dies with ``ZMQError: Address already in use`` before it answers. A
fresh-clone CI run failed so (2026-11-27, chapter 12: "Kernel died before replying to
kernel_info"). An IPC socket is a file named after the kernel's own connection file, so no two
kernels can share one. Should a kernel still die before it answers (nothing of the page has run
then), the page is started once more in a new kernel.

It wraps the one call myst-nb's ``cache`` execution mode makes to execute a page
(``single_nb_execution``, from jupyter-cache), and is a no-op for pages taken from the cache.
Being that one call, it also records each page's cold time: where ``COURSEPKG_BOOK_PAGE_RUNS``
names a file (``scripts/build_book.py`` sets it), each execution appends a line to it, from
whichever reader process ran the page. (The build once read the times back from jupyter-cache's
database instead, and a CI run found one page of six missing there, though executed.) The line
keeps the seconds of each attempt that was given up and why, apart from the page's own time: a
stall costs its window and a second run, and that is the watchdog's cost, not the page's (a CI
run, 2026-11-30, had chapter 5 stall once: 185.9 s recorded for a page of 20-36 s).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import json
import os
import signal
import sys
import time
import traceback
import uuid

import psutil
from jupyter_cache.executors.utils import ExecutionResult
from jupyter_core.paths import jupyter_runtime_dir
from myst_nb.core.execute import cache as myst_cache
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from traitlets.config import Config

from coursepkg.grading.kernel.replies import CLIENT_CLASS

#: Seconds without a message or CPU time before a cell counts as stalled.
STALL_SECONDS = float(os.environ.get("COURSEPKG_BOOK_STALL_S", "150"))
#: CPU seconds the kernel's process tree must spend in a window to count as working.
CPU_PROGRESS = 0.2
_page: contextvars.ContextVar[str] = contextvars.ContextVar("page", default="?")
#: The variable naming the file each page's execution is appended to (unset: nothing recorded).
PAGE_RUNS = "COURSEPKG_BOOK_PAGE_RUNS"


#: The kernels' transport: Unix sockets named after each kernel's connection file (see above);
#: their client waits for replies in short polls (see above).
KERNEL_CONFIG = Config(
    {
        "KernelManager": {
            "transport": "ipc",
            "client_class": CLIENT_CLASS,
        }
    }
)
#: The signal a kernel answers with the stacks of its threads (``faulthandler``).
STACKS_SIGNAL = signal.SIGUSR1


class PageStalled(CellTimeoutError):
    """A cell made no progress (no message, no CPU) for ``STALL_SECONDS``."""


class KernelNeverAnswered(RuntimeError):
    """The page's kernel died before it answered its first request: no cell has run."""


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process ``pid``, its waited-for children and its live descendants."""
    try:
        root = psutil.Process(pid)
        times = root.cpu_times()
        total = times.user + times.system + times.children_user + times.children_system
        for child in root.children(recursive=True):
            try:
                child_times = child.cpu_times()
                total += child_times.user + child_times.system
            except psutil.Error:
                pass  # it ended between the listing and the read
        return total
    except psutil.Error:
        return 0.0


class WatchedClient(NotebookClient):
    """nbclient's client, with a watcher beside each cell that stops a stalled one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        folder = jupyter_runtime_dir()
        os.makedirs(folder, exist_ok=True)
        self._stacks = os.path.join(folder, f"kernel-book-{uuid.uuid4().hex}-stacks.txt")
        # Run by IPython before the page's first cell, with no name left in the page's namespace.
        register = (
            f"__import__('faulthandler').register({int(STACKS_SIGNAL)}, "
            f"file=open({self._stacks!r}, 'w'), all_threads=True)"
        )
        self.extra_arguments = [*self.extra_arguments, f"--IPKernelApp.exec_lines={[register]!r}"]

    async def _kernel_stacks(self, pid: int) -> str:
        """The stacks of the kernel's threads, as ``faulthandler`` writes them ("" if none came)."""
        try:
            os.kill(pid, STACKS_SIGNAL)
        except OSError:
            return ""
        deadline = time.monotonic() + 5.0
        text = ""
        while time.monotonic() < deadline:  # the handler writes from C at once, GIL or not
            await asyncio.sleep(0.1)
            try:
                with open(self._stacks, encoding="utf-8", errors="replace") as stacks:
                    now = stacks.read()
            except OSError:
                continue
            if now and now == text:
                break  # written and no longer growing
            text = now
        return text.strip()

    def execute(self, *args, **kwargs):
        try:
            return super().execute(*args, **kwargs)
        finally:  # the file the kernel's stacks would go to
            with contextlib.suppress(OSError):
                os.unlink(self._stacks)

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        # The sockets' names: an absolute prefix of this kernel's own (the kernel starts in the
        # page's folder, so a relative name would point elsewhere for it than for the client).
        folder = jupyter_runtime_dir()
        os.makedirs(folder, exist_ok=True)
        km.connection_file = os.path.join(folder, f"kernel-book-{uuid.uuid4().hex}.json")
        km.ip = os.path.splitext(km.connection_file)[0] + "-ipc"
        return km

    def process_message(self, msg, cell, cell_index):
        self._last_progress = time.monotonic()
        return super().process_message(msg, cell, cell_index)

    async def _watch(self, cell, cell_index: int) -> None:
        provisioner = getattr(self.km, "provisioner", None)
        process = getattr(provisioner, "process", None)
        if process is None:
            return  # not a local kernel: nothing to watch
        cpu = _tree_cpu_seconds(process.pid)
        self._last_progress = time.monotonic()
        while True:
            await asyncio.sleep(min(5.0, STALL_SECONDS / 4))
            now_cpu = _tree_cpu_seconds(process.pid)
            if now_cpu - cpu >= CPU_PROGRESS:
                cpu, self._last_progress = now_cpu, time.monotonic()
            idle = time.monotonic() - self._last_progress
            if idle >= STALL_SECONDS:
                text = " | ".join(line.strip() for line in cell.source.strip().splitlines())
                stacks = await self._kernel_stacks(process.pid)
                self._stalled = (
                    f"{_page.get()}: cell {cell_index} made no progress for {idle:.0f} s "
                    f"(no message from the kernel, under {CPU_PROGRESS} s of CPU): {text[:160]!r}"
                    + (f"\nthe kernel's threads when it was stopped:\n{stacks}" if stacks else "")
                )
                # Killed, the kernel takes nbclient's own way out: its liveness poll sees it
                # gone, stops the wait for the reply, and the cell raises DeadKernelError.
                # jupyter_client starts the kernel in a session of its own: its group goes too.
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except OSError:
                    process.kill()
                return

    async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
        self._cells_started = True
        self._stalled = None
        watcher = asyncio.ensure_future(self._watch(cell, cell_index))
        try:
            return await super().async_execute_cell(cell, cell_index, *args, **kwargs)
        except DeadKernelError:
            if self._stalled:
                raise PageStalled(self._stalled) from None
            raise
        finally:
            watcher.cancel()


def _execute_once(nb, cwd, timeout, allow_errors) -> ExecutionResult:
    started = time.monotonic()
    error = exc_string = None
    resources = {"metadata": {"path": cwd}} if cwd is not None else {}
    client = WatchedClient(
        nb, resources=resources, timeout=timeout, allow_errors=allow_errors, config=KERNEL_CONFIG
    )
    client._cells_started = False
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError) as err:  # PageStalled among them
        error, exc_string = err, traceback.format_exc()
    except RuntimeError as err:
        if client._cells_started or "before replying to kernel_info" not in str(err):
            raise
        # nbclient's clean-up at exit would fail a second time on this kernel and print a bare
        # AssertionError when the process ends: nothing is left to clean, so it is taken off.
        atexit.unregister(client._cleanup_kernel)
        error = KernelNeverAnswered(f"{_page.get()}: the kernel died before it answered ({err})")
        exc_string = traceback.format_exc()
    return ExecutionResult(nb, cwd, time.monotonic() - started, error, exc_string)


def watched_execution(nb, cwd, timeout, allow_errors, meta_override=True, record_timing=False):
    """``single_nb_execution``'s contract, with the stall watch, one retry after a stall and one
    after a kernel that died before it answered."""
    if meta_override and "execution" in nb.metadata:
        timeout = nb.metadata.execution.get("timeout", timeout)
        allow_errors = nb.metadata.execution.get("allow_errors", allow_errors)
    started = time.monotonic()
    given_up: list[dict[str, float | str]] = []
    try:
        result = _executed_with_retries(nb, cwd, timeout, allow_errors, given_up)
    except BaseException:
        _record(time.monotonic() - started, False, given_up)
        raise
    _record(time.monotonic() - started, result.err is None, given_up)
    return result


def _record(seconds: float, succeeded: bool, given_up: list[dict[str, float | str]]) -> None:
    """Append this page's execution to :data:`PAGE_RUNS`'s file: its wall seconds, retries
    included, and each attempt given up (its seconds and why); one short write in append mode,
    so the lines of two readers never interleave."""
    path = os.environ.get(PAGE_RUNS)
    if not path:
        return
    row = {
        "page": _page.get(),
        "seconds": seconds,
        "end": time.time(),
        "succeeded": succeeded,
        "given_up": given_up,
    }
    with open(path, "a", encoding="utf-8") as runs:
        runs.write(json.dumps(row) + "\n")


def _executed_with_retries(nb, cwd, timeout, allow_errors, given_up) -> ExecutionResult:
    """Execute the page, once more after a kernel that never answered and once more after a
    stall; each attempt given up is appended to ``given_up`` (its seconds, and why)."""
    result = _execute_once(nb, cwd, timeout, allow_errors)
    if isinstance(result.err, KernelNeverAnswered):
        sys.stderr.write(f"book: {result.err}; starting the page again in a new kernel\n")
        given_up.append({"seconds": result.time, "why": str(result.err)})
        result = _execute_once(nb, cwd, timeout, allow_errors)
        if isinstance(result.err, KernelNeverAnswered):
            raise result.err  # twice: not a race; Sphinx reports it as before
    if isinstance(result.err, PageStalled):
        # A line in the build log (not a Sphinx warning: the build treats those as errors).
        sys.stderr.write(f"book: {result.err}; executing the page again in a new kernel\n")
        given_up.append({"seconds": result.time, "why": str(result.err)})
        result = _execute_once(nb, cwd, timeout, allow_errors)
        if isinstance(result.err, PageStalled):
            sys.stderr.write(f"book: {result.err}; stalled twice, the page fails\n")
    return result


def _remember_page(start_client):
    def wrapped(self):
        token = _page.set(str(self.path))
        try:
            return start_client(self)
        finally:
            _page.reset(token)

    return wrapped


def setup(app):
    myst_cache.single_nb_execution = watched_execution
    client = myst_cache.NotebookClientCache
    client.start_client = _remember_page(client.start_client)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
