"""Run an assignment notebook outside nbgrader and report its test cells: ``coursepkg check``.

A student's notebook is executed top to bottom in a fresh kernel, every cell even after an error
(as nbgrader's autograder does), with a time limit per cell. Then each of nbgrader's test cells
(``grade: true`` code cells) is reported: passed or failed, its points, and the check's message.
Hidden test cells, which the released notebook holds only as a comment, are listed as graded
later. A kernel that dies or a cell that runs too long ends the run with a clear message; the cells
not reached are reported as not run.
"""

from __future__ import annotations

import atexit
import gc
import html
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # nbformat is imported where a notebook is read: the kernel that only
    # runs check_notebook()'s "nothing checked here" skips its ~2 s import (jsonschema's formats)
    from nbformat import NotebookNode

__all__ = [
    "CellOutcome",
    "NotebookError",
    "Report",
    "check_notebook",
    "find_test_cells",
    "load_ipython_extension",
    "load_notebook",
    "run_notebook",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Set by Jupyter Server in the environment of a notebook's kernel: the notebook's path.
_SESSION_ENV = "JPY_SESSION_NAME"


class NotebookError(ValueError):
    """The file is not a notebook that can be checked (missing, not JSON, not nbformat 4)."""


@dataclass
class CellOutcome:
    """What happened to one test cell.

    Attributes:
        grade_id: nbgrader's id of the cell (e.g. ``test_noam_lr_visible``).
        points: nbgrader points of the cell.
        status: ``"passed"``, ``"failed"``, ``"not run"`` or ``"hidden"``.
        message: the check's message (its result, or the error a student can act on).
    """

    grade_id: str
    points: float
    status: str
    message: str = ""

    @property
    def score(self) -> float:
        """Points earned: all of them for a passed cell, none otherwise."""
        return self.points if self.status == "passed" else 0.0


@dataclass
class Report:
    """The outcome of checking one notebook.

    Attributes:
        path: the notebook checked.
        cells: one outcome per test cell, in notebook order.
        problem: why the run stopped early (kernel died, time limit), or ``""``.
        by_hand: the points of the written answers, which a person grades.
    """

    path: Path
    cells: list[CellOutcome] = field(default_factory=list)
    problem: str = ""
    by_hand: float = 0.0

    @property
    def visible(self) -> list[CellOutcome]:
        """The test cells a student can run (hidden ones excluded)."""
        return [c for c in self.cells if c.status != "hidden"]

    @property
    def score(self) -> float:
        """Points earned on the visible tests."""
        return sum(c.score for c in self.visible)

    @property
    def max_score(self) -> float:
        """Points available on the visible tests."""
        return sum(c.points for c in self.visible)

    @property
    def passed(self) -> bool:
        """Whether every visible test passed and the run was not cut short."""
        return not self.problem and all(c.status == "passed" for c in self.visible)

    def format(self) -> str:
        """A plain-text report: one line per test cell, its message indented, and a total."""
        lines = [f"{self.path}"]
        for cell in self.cells:
            if cell.status == "hidden":
                lines.append(f"  [hidden] {cell.grade_id}: {_points(cell.points)} graded later")
                continue
            mark = {"passed": "PASS", "failed": "FAIL", "not run": "SKIP"}[cell.status]
            lines.append(
                f"  [{mark}] {cell.grade_id}: {_points(cell.score)}/{_points(cell.points)}"
            )
            lines.extend(f"         {line}" for line in cell.message.splitlines() if line.strip())
        if self.problem:
            lines.append(f"  Stopped early: {self.problem}")
        hidden = sum(c.points for c in self.cells if c.status == "hidden")
        total = (
            f"Total: {_points(self.score)}/{_points(self.max_score)} points on the visible tests"
        )
        later = [f"{_points(hidden)} more points in hidden tests when your notebook is graded"]
        later += [f"{_points(self.by_hand)} in written answers graded by hand"]
        later = [text for text, n in zip(later, (hidden, self.by_hand), strict=True) if n]
        if later:
            total += f" ({', '.join(later)})"
        lines.append(total + ".")
        return "\n".join(lines)


def _points(x: float) -> str:
    return f"{x:g}"


def load_notebook(path: str | Path) -> NotebookNode:
    """Read a notebook, or fail with a message saying what is wrong with the file.

    Raises:
        NotebookError: the file is missing, empty, not JSON, or not an nbformat-4 notebook.
    """
    path = Path(path)
    return _parse(_notebook_text(path))


def _notebook_text(path: Path) -> str:
    """The text of the notebook at ``path``, once it is known to be JSON of nbformat 4 (what
    :func:`load_notebook` raises otherwise, before anything slow is imported or started)."""
    if not path.is_file():
        raise NotebookError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise NotebookError(f"{path}: the file is empty (expected a Jupyter notebook)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise NotebookError(
            f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
            "is it a Jupyter notebook? Restore it from your last checkpoint or fetch the "
            "assignment again"
        ) from None
    if not isinstance(data, dict) or "cells" not in data or data.get("nbformat") != 4:
        raise NotebookError(f"{path}: valid JSON but not a Jupyter notebook (nbformat 4)")
    return text


def _parse(text: str) -> NotebookNode:
    """A notebook's text, checked by :func:`_notebook_text`, read by nbformat."""
    _import_jupyter()
    import nbformat

    return nbformat.reads(text, as_version=4)


def _import_jupyter() -> None:
    """Import nbformat and nbclient without ``rfc3987_syntax``.

    nbformat imports jsonschema, whose format checkers import ``rfc3987_syntax`` when it is
    installed (Jupyter Server's events pull it in), and that module builds a Lark grammar for
    IRIs at import: about 2 s of CPU, the largest part of ``coursepkg check``'s own start-up,
    for a format no notebook schema uses. The module is hidden during this import only, so
    jsonschema skips its ``iri`` format here and any later import of it still works.
    """
    if "nbclient" in sys.modules:
        return
    hide = "rfc3987_syntax" not in sys.modules
    if hide:
        sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # import -> ImportError
    try:
        import nbclient  # noqa: F401 - imports nbformat and jsonschema
    finally:
        if hide and sys.modules.get("rfc3987_syntax", 0) is None:
            del sys.modules["rfc3987_syntax"]


def _nbgrader(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _is_hidden(source: str) -> bool:
    """A released hidden-test cell: nothing but comments (nbgrader removed the tests)."""
    code = [ln for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return not code


def find_test_cells(nb: NotebookNode) -> list[tuple[int, NotebookNode]]:
    """The nbgrader test cells (autograded code cells) of a notebook, with their indices."""
    return [
        (i, cell)
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        and _nbgrader(cell).get("grade")
        and not _nbgrader(cell).get("solution")
    ]


def _error_message(cell: NotebookNode) -> str | None:
    """The message of the cell's error output, or None if it raised nothing."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            name, value = output.get("ename", "Error"), output.get("evalue", "")
            if name in ("CheckFailure", "NotImplementedYet", "AssertionError") and value:
                return _ANSI.sub("", value)
            return _ANSI.sub("", f"{name}: {value}".rstrip(": "))
    return None


def _result_text(cell: NotebookNode) -> str:
    """The plain-text result a passing check displayed (its CheckResult)."""
    for output in cell.get("outputs", []):
        # A CheckResult displays itself (display_data); an older one was the cell's value.
        if output.get("output_type") in ("display_data", "execute_result"):
            return _ANSI.sub("", output.get("data", {}).get("text/plain", ""))
    return ""


#: Seconds a single cell may run unless the notebook asks for more (see :func:`cell_timeout`).
DEFAULT_CELL_TIMEOUT = 120


def cell_timeout(nb: NotebookNode | dict) -> int:
    """The seconds a single cell of ``nb`` may run: the notebook's own
    ``metadata.coursepkg.cell_timeout`` (an assignment that trains a model asks for more), else
    :data:`DEFAULT_CELL_TIMEOUT`.

    Raises:
        NotebookError: the metadata's value is not a positive number of seconds.
    """
    value = nb.get("metadata", {}).get("coursepkg", {}).get("cell_timeout", DEFAULT_CELL_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise NotebookError(
            f"metadata.coursepkg.cell_timeout must be a positive number of seconds, not {value!r}"
        )
    return int(value)


def run_notebook(
    path: str | Path, *, timeout: float | None = None, startup_timeout: float = 180.0
) -> Report:
    """Execute a notebook in a fresh kernel and report its test cells.

    The notebook on disk is not modified; outputs are kept only in the report.

    Args:
        path: the notebook (.ipynb).
        timeout: the longest a single cell may run, in seconds (default: the notebook's
            :func:`cell_timeout`).
        startup_timeout: the longest the kernel may take to start.

    Returns:
        A :class:`Report`.

    Raises:
        NotebookError: the file cannot be read as a notebook.
    """
    path = Path(path)
    text = _notebook_text(path)
    # The kernel starts first: it imports ipykernel (then the notebook's torch) on one core
    # while this process imports nbformat and nbclient and reads the notebook on the other.
    kernel = _start_kernel(path)
    try:
        nb = _parse(text)
        timeout = cell_timeout(nb) if timeout is None else timeout
    except BaseException:
        _stop_kernel(kernel)
        raise
    problem, started, finished = _execute(nb, path, timeout, startup_timeout, kernel)
    report = Report(path=path, problem=problem)
    report.by_hand = sum(
        float(_nbgrader(c).get("points", 0) or 0)
        for c in nb.cells
        if _nbgrader(c).get("grade") and _nbgrader(c).get("solution")
    )
    stuck = started[-1] if started and started[-1] not in finished else None
    tests = find_test_cells(nb)
    first_error = _first_error(nb, {index for index, _ in tests})
    for index, cell in tests:
        meta = _nbgrader(cell)
        grade_id = meta.get("grade_id", "?")
        points = float(meta.get("points", 0) or 0)
        if _is_hidden(cell.source):
            report.cells.append(CellOutcome(grade_id, points, "hidden"))
            continue
        error = _error_message(cell)
        if index == stuck:
            report.cells.append(CellOutcome(grade_id, points, "failed", f"this cell: {problem}"))
        elif error is not None:
            if first_error is not None and first_error[0] < index and error.startswith("NameError"):
                where, cause = first_error
                error += f"\n(an earlier cell failed first: cell {where + 1} raised {cause})"
            report.cells.append(CellOutcome(grade_id, points, "failed", error))
        elif index not in finished:
            report.cells.append(CellOutcome(grade_id, points, "not run", "not run"))
        else:
            report.cells.append(CellOutcome(grade_id, points, "passed", _result_text(cell)))
    return report


#: Kernel starts tried before a check gives up: a kernel that dies or stays silent before it
#: answers has run none of the notebook (another process may have taken one of the ports it
#: was given, or the machine is too busy for it to answer in time), so starting it again is safe.
KERNEL_STARTS = 3


#: The check's kernel: its own startup warnings (ipykernel's note that it talks over local TCP)
#: are not the student's to act on (their code's output still shows in the report), and it
#: loads this module as an IPython extension (:func:`load_ipython_extension`) to exit at once.
KERNEL_ARGUMENTS = [
    "--IPKernelApp.log_level=ERROR",
    f"--IPKernelApp.extra_extensions={__name__}",
]


#: The threads of the check's kernel, as ``coursepkg grade`` gives each kernel by default (one
#: worker per core, ``cores // workers`` threads each): the notebook runs as it is graded. Its
#: checks' tensors are tiny, and torch's thread pool only waits on them: on a busy 2-core
#: machine (load 5) a softmax of 210 numbers took 12 ms with 2 threads, waiting for the
#: second, and 28 us with 1. A student's own ``OMP_NUM_THREADS`` is kept.
KERNEL_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def load_ipython_extension(ipython: object) -> None:
    """Let the check's kernel end without its last garbage collection (an IPython extension,
    which :data:`KERNEL_ARGUMENTS` loads).

    When a Python process ends, it collects its garbage one last time, walking every object
    its imports made, torch's above all: about a second, which ``coursepkg check`` waited for
    after the notebook's last cell. Freezing the objects (``gc.freeze``) at exit skips that
    walk and nothing else: the exit handlers the notebook registered (a ``weakref.finalize``,
    multiprocessing's clean-up) run before it, the kernel's own after it, and objects no cycle
    holds are still freed, their files flushed and closed; only garbage in reference cycles
    is left to the operating system, as Python allows at exit. The report does not depend on it.

    Args:
        ipython: the kernel's shell (unused: nothing is added to the notebook's namespace).
    """
    atexit.register(gc.freeze)


def _start_kernel(path: Path) -> Any:
    """Start the check's "python3" kernel in the notebook's folder, without waiting for it to
    answer (nbclient waits for that before the first cell).

    Returns:
        Its kernel manager (jupyter_client's asynchronous one, as nbclient's own), or the
        error that kept it from starting, which :func:`_execute` counts as a failed start.
    """
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync

    from .kernel.replies import CLIENT_CLASS

    try:
        # Its client waits for replies in short polls (.kernel.replies: a notebook printing
        # into an ipywidgets Output would otherwise be stopped by its cell limit).
        manager = AsyncKernelManager(kernel_name="python3", client_class=CLIENT_CLASS)
        arguments = list(KERNEL_ARGUMENTS)
        if manager.ipykernel:  # as nbclient does: the kernel's history in memory
            arguments.append("--HistoryManager.hist_file=:memory:")
        env = {**KERNEL_THREADS, **os.environ}  # the environment's own setting wins
        run_sync(manager.start_kernel)(
            extra_arguments=arguments, cwd=str(path.resolve().parent), env=env
        )
    except Exception as err:  # noqa: BLE001 - reported by _execute, which starts another
        return err
    return manager


def _stop_kernel(kernel: Any) -> None:
    """End a kernel :func:`_start_kernel` started for a notebook that is not run after all."""
    if isinstance(kernel, Exception):
        return
    from jupyter_core.utils import run_sync

    try:
        run_sync(kernel.shutdown_kernel)(now=True)
    except RuntimeError:  # jupyter_client's "No kernel is running!": it has already ended
        pass


def _execute(
    nb: NotebookNode, path: Path, timeout: float, startup_timeout: float, kernel: Any
) -> tuple[str, list[int], set[int]]:
    """Run every cell of ``nb`` (in place, errors kept as outputs) in ``kernel``, started by
    :func:`_start_kernel` in the notebook's folder; a kernel that never answers is replaced by
    a fresh one, up to :data:`KERNEL_STARTS` starts in all.

    Returns:
        What stopped the run early ("" when nothing did), the indices of the cells that
        started (in order) and of those that finished.
    """
    _import_jupyter()
    for start in range(KERNEL_STARTS):
        if start:
            kernel = _start_kernel(path)
        began = time.monotonic()
        problem, started, finished, ready = _execute_once(nb, timeout, startup_timeout, kernel)
        if ready:
            return problem, started, finished
    waited = time.monotonic() - began
    why = "died before it answered" if waited < startup_timeout else "did not answer"
    problem = (
        f"the Python kernel did not start within {startup_timeout:g} s: it {why}, "
        f"{KERNEL_STARTS} times (a very busy machine, or a broken Jupyter installation); "
        f"run the check again ({problem})"
    )
    return problem, started, finished


def _execute_once(
    nb: NotebookNode, timeout: float, startup_timeout: float, kernel: Any
) -> tuple[str, list[int], set[int], bool]:
    """One run of :func:`_execute` in one started kernel; also whether the kernel answered."""
    if isinstance(kernel, Exception):
        return f"{type(kernel).__name__}: {kernel}", [], set(), False
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    client = NotebookClient(
        nb,
        km=kernel,
        timeout=timeout,
        startup_timeout=math.ceil(startup_timeout),  # nbclient takes whole seconds
        kernel_name="python3",
        allow_errors=True,
    )
    client.owns_km = True  # started for this client: it shuts the kernel down as its own
    started: list[int] = []
    finished: set[int] = set()
    ready: list[bool] = []  # the kernel answered (nbclient's on_notebook_start)
    client.on_notebook_start = lambda notebook: ready.append(True)
    client.on_cell_start = lambda cell, cell_index: started.append(cell_index)
    client.on_cell_executed = lambda cell, cell_index, execute_reply: finished.add(cell_index)
    problem = ""
    try:
        client.execute()
    except CellTimeoutError:
        problem = (
            f"a cell ran longer than the {timeout:g} s limit (an infinite loop, or far too slow); "
            "the cells after it were not run"
        )
    except DeadKernelError:
        problem = (
            "the Python kernel died (out of memory, a crash, or code that exits the process such "
            "as sys.exit() or os._exit()); the cells after it were not run"
        )
    except Exception as err:  # noqa: BLE001 - reported, e.g. a kernel that does not start
        problem = f"{type(err).__name__}: {err}"
        if not ready:
            # nbclient 0.11 cleans a kernel that never answered up twice, and the second
            # time's AssertionError hides the first error (the caller says what happened
            # instead). Its clean-up at exit would fail the same way and print that error
            # when this process ends: nothing is left to clean, so it is taken off.
            atexit.unregister(client._cleanup_kernel)
        else:
            problem = f"the notebook could not be run: {problem}"
    return problem, started, finished, bool(ready)


def _first_error(nb: NotebookNode, test_indices: set[int]) -> tuple[int, str] | None:
    """The first error outside the test cells (a syntax error in an answer, a failed import),
    which usually explains a test's NameError: its cell index and message."""
    return next(
        (
            (i, msg)
            for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and i not in test_indices
            for msg in [_error_message(c)]
            if msg is not None
        ),
        None,
    )


def check_notebook(path: str | Path | None = None, *, timeout: float | None = None) -> None:
    """Check the whole notebook from inside it, as ``coursepkg check`` does from a terminal.

    Meant for the last cell of an assignment notebook opened in JupyterLab: it runs the
    notebook's *saved* file top to bottom in a fresh kernel (so save first) and shows the
    report. Run anywhere else without a path (``coursepkg check``, nbgrader's autograder, a
    plain Python session), it only says so, so it never runs a notebook inside itself.

    Args:
        path: the notebook; by default the one whose kernel this is (JupyterLab tells it).
        timeout: the longest a single cell may run, in seconds (default: the notebook's
            :func:`cell_timeout`).

    Returns:
        Nothing: the report (or why there was nothing to check) is displayed in the cell.
    """
    from IPython.display import display

    if path is None:
        session = os.environ.get(_SESSION_ENV, "")
        candidate = Path.cwd() / Path(session).name if session else None
        if candidate is None or candidate.suffix != ".ipynb" or not candidate.is_file():
            text = (
                "check_notebook(): nothing checked here. In JupyterLab this cell runs the\n"
                "saved notebook in a fresh kernel and lists every visible test; from a\n"
                "terminal, run `coursepkg check <notebook>.ipynb`."
            )
            display({"text/plain": text}, raw=True)
            return
        path = candidate
    # The notebook runs this cell too: its kernel must not find the session and recurse.
    saved = os.environ.pop(_SESSION_ENV, None)
    try:
        report = run_notebook(path, timeout=timeout)
    finally:
        if saved is not None:
            os.environ[_SESSION_ENV] = saved
    report.path = Path(path.name)  # the folder is the student's own; the name says enough
    text = report.format()
    display({"text/plain": text, "text/html": _report_html(report)}, raw=True)


def _report_html(report: Report) -> str:
    """The report as a notebook shows it: one line per test, its message indented under it."""
    marks = {"passed": ("PASS", "#2e7d32"), "failed": ("FAIL", "#c62828")}
    rows = []
    for cell in report.cells:
        if cell.status == "hidden":
            rows.append(
                f"<div>[hidden] {html.escape(cell.grade_id)}: {_points(cell.points)} "
                "points, graded later</div>"
            )
            continue
        mark, colour = marks.get(cell.status, ("SKIP", "#6d6d6d"))
        message = "".join(
            f'<div style="margin-left:2em">{html.escape(line)}</div>'
            for line in cell.message.splitlines()
            if line.strip()
        )
        rows.append(
            f'<div><b style="color:{colour}">[{mark}]</b> {html.escape(cell.grade_id)}: '
            f"{_points(cell.score)}/{_points(cell.points)}{message}</div>"
        )
    if report.problem:
        rows.append(f"<div>Stopped early: {html.escape(report.problem)}</div>")
    total = html.escape(report.format().splitlines()[-1])
    colour = "#2e7d32" if report.passed else "#c62828"
    return (
        f'<div style="border-left:4px solid {colour};padding:6px 10px;font-family:monospace">'
        f"<div>{html.escape(str(report.path))}</div>{''.join(rows)}<div><b>{total}</b></div>"
        "</div>"
    )
