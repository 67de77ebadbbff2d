"""A catalogue of broken and hostile submissions, to test a grading setup before a class does.

Each :class:`Hostile` entry turns an assignment's nbgrader source notebook (the solutions) and
its release (the stubs) into the bytes of one student's submission, and says what grading it with
``coursepkg grade`` must give: the exact autograded score and a phrase the student's feedback
must contain (the reason they lost points). :func:`write_submissions` writes the whole catalogue
into an nbgrader course directory as one student per entry, so one ``coursepkg grade`` batch
exercises all of them together with honest students (``tests/test_classroom.py`` does exactly
that).

The entries are written against ex01 (``ex01_attention``): its target item is
``scaled_dot_product_attention`` (8 of the 11 autograded points), the other item
``additive_score`` (3 points); an entry's expected score is in those terms, so the catalogue fits
any assignment whose last answer cell defines a function returning tensors. Some outcomes depend
on the sandbox: without Landlock nothing stops a notebook reading ``solutions/`` or writing
outside its folder; such entries say so (``needs_landlock``), and a test must leave them out
where Landlock is missing rather than expect what the system cannot deliver.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

__all__ = ["Hostile", "expected_score", "hostile_catalogue", "points", "write_submissions"]


def _meta(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def points(nb: NotebookNode, item: str | None = None) -> float:
    """Autograded points of a notebook, or of the test cells of one item (``test_<item>_*``)."""
    return sum(
        float(_meta(c).get("points", 0))
        for c in nb.cells
        if c.cell_type == "code"
        and _meta(c).get("grade")
        and (item is None or _meta(c)["grade_id"].startswith(f"test_{item}_"))
    )


def _answers(nb: NotebookNode) -> list[NotebookNode]:
    return [c for c in nb.cells if _meta(c).get("grade_id", "").startswith("answer_")]


@dataclass(frozen=True)
class Hostile:
    """One broken or hostile submission.

    Attributes:
        id: the student id it is handed in as (``h_<what>``).
        description: what the notebook does.
        make: ``make(source, release, student) -> (file name, bytes)``.
        score: ``score(total, target, other) -> expected autograded points``, from the
            assignment's total points, the points of the target item and of the others.
        phrase: text the student's feedback (and JSON report) must contain.
        graded: False when the notebook cannot be run and gets the fallback zero.
        needs_landlock: the expected outcome relies on Landlock (ABI at least this, 0 = no).
    """

    id: str
    description: str
    make: Callable[[NotebookNode, NotebookNode, str], tuple[str, bytes]]
    score: Callable[[float, float, float], float]
    phrase: str
    graded: bool = True
    needs_landlock: int = 0


def _nb_bytes(nb: NotebookNode) -> bytes:
    return nbformat.writes(nb).encode("utf-8")


def _target(nb: NotebookNode) -> tuple[NotebookNode, str]:
    """The last answer cell (the assignment's main item) and the item's name."""
    cell = _answers(nb)[-1]
    return cell, _meta(cell)["grade_id"].removeprefix("answer_")


def _edit_target(
    edit: Callable[[str, str], str], base: str = "source"
) -> Callable[[NotebookNode, NotebookNode, str], tuple[str, bytes]]:
    """A maker that rewrites the target answer cell's source: ``edit(source, item)``."""

    def make(source: NotebookNode, release: NotebookNode, student: str) -> tuple[str, bytes]:
        nb = nbformat.from_dict(source if base == "source" else release)
        cell, item = _target(nb)
        cell.source = edit(cell.source, item)
        return "", _nb_bytes(nb)

    return make


def _edit_first(edit: str) -> Callable[[NotebookNode, NotebookNode, str], tuple[str, bytes]]:
    """A maker that appends ``edit`` to the first answer cell of the solutions."""

    def make(source: NotebookNode, release: NotebookNode, student: str) -> tuple[str, bytes]:
        nb = nbformat.from_dict(source)
        cell = _answers(nb)[0]
        cell.source += "\n\n" + edit.format(student=student)
        return "", _nb_bytes(nb)

    return make


def _wrap(after: str) -> Callable[[str, str], str]:
    """Keep the correct function but post-process what it returns (``out`` -> ``after``)."""

    def edit(text: str, item: str) -> str:
        return (
            text
            + f"\n\n_correct_{item} = {item}\n\n\n"
            + f"def {item}(*args, **kwargs):\n"
            + f"    out = _correct_{item}(*args, **kwargs)\n"
            + "".join(f"    {line}\n" for line in after.splitlines())
        )

    return edit


def _prefix(code: str) -> Callable[[str, str], str]:
    """Run ``code`` at the top of the target answer cell (before its ``def``)."""
    return lambda text, item: code.rstrip() + "\n\n" + text


def _in_body(code: str) -> Callable[[str, str], str]:
    """Run ``code`` as the first statement of the target function's body."""

    def edit(text: str, item: str) -> str:
        head, sep, rest = text.partition('"""\n    ### BEGIN SOLUTION')
        if not sep:  # no docstring marker: put it after the signature line
            head, sep, rest = text.partition(":\n")
        body = "".join(f"    {line}\n" for line in code.splitlines())
        return head + sep + "\n" + body + rest

    return edit


def _delete_tests(source: NotebookNode, release: NotebookNode, student: str) -> tuple[str, bytes]:
    nb = nbformat.from_dict(source)
    nb.cells = [c for c in nb.cells if not _meta(c).get("grade_id", "").startswith("test_")]
    return "", _nb_bytes(nb)


def _edit_locked_tests(
    source: NotebookNode, release: NotebookNode, student: str
) -> tuple[str, bytes]:
    nb = nbformat.from_dict(release)  # the stubs, with every test cell replaced by a success
    for cell in nb.cells:
        if _meta(cell).get("grade_id", "").startswith("test_"):
            cell.source = 'print("✓ all tests passed")'
    return "", _nb_bytes(nb)


def _duplicate_ids(source: NotebookNode, release: NotebookNode, student: str) -> tuple[str, bytes]:
    nb = nbformat.from_dict(source)
    tests = [c for c in nb.cells if _meta(c).get("grade_id", "").endswith("_visible")]
    # A copy of the last visible test cell (same cell id, same grade id) at the very top,
    # where it fails: only the last copy is graded.
    nb.cells.insert(0, nbformat.from_dict(tests[-1]))
    # Written as plain JSON: nbformat's writer would quietly renumber the duplicated cell id.
    return "", json.dumps(nb, indent=1).encode("utf-8")


def _raw(name: str, data: bytes) -> Callable[[NotebookNode, NotebookNode, str], tuple[str, bytes]]:
    return lambda source, release, student: (name, data)


def _wrong_name(source: NotebookNode, release: NotebookNode, student: str) -> tuple[str, bytes]:
    return "Copy of notebook.ipynb", _nb_bytes(nbformat.from_dict(source))


def _stub_target_other_solved(
    extra: str,
) -> Callable[[NotebookNode, NotebookNode, str], tuple[str, bytes]]:
    """The solutions, but the target answer cell is the stub followed by ``extra``."""

    def make(source: NotebookNode, release: NotebookNode, student: str) -> tuple[str, bytes]:
        nb = nbformat.from_dict(source)
        cell, item = _target(nb)
        stub, _ = _target(release)
        cell.source = stub.source + "\n\n" + extra.format(item=item)
        return "", _nb_bytes(nb)

    return make


def _answers_stubbed(extra_first: str) -> Callable[[NotebookNode, NotebookNode, str], tuple]:
    """The release (stubs, or a wrong target) with ``extra_first`` after the first answer."""

    def make(source: NotebookNode, release: NotebookNode, student: str) -> tuple[str, bytes]:
        nb = nbformat.from_dict(source)
        first = _answers(nb)[0]
        first.source += "\n\n" + extra_first
        cell, item = _target(nb)
        stub, _ = _target(release)
        cell.source = stub.source
        return "", _nb_bytes(nb)

    return make


ALL = lambda total, target, other: total  # noqa: E731 - tiny readable score rules
OTHER = lambda total, target, other: other  # noqa: E731
NONE = lambda total, target, other: 0.0  # noqa: E731


def _slow_cells(
    seconds: float, count: int
) -> Callable[[NotebookNode, NotebookNode, str], tuple[str, bytes]]:
    def make(source: NotebookNode, release: NotebookNode, student: str) -> tuple[str, bytes]:
        nb = nbformat.from_dict(source)
        for _ in range(count):
            nb.cells.append(nbformat.v4.new_code_cell(f"import time\n\ntime.sleep({seconds:g})"))
        return "", _nb_bytes(nb)

    return make


def hostile_catalogue(cell_timeout: int = 8, notebook_timeout: int = 50) -> list[Hostile]:
    """Every broken or hostile submission, with its expected score and feedback phrase.

    Args:
        cell_timeout: the per-cell time limit the grader will use (``--cell-timeout``).
        notebook_timeout: the per-notebook limit (``--notebook-timeout``); one entry is made
            to exceed it with cells that each stay under ``cell_timeout``.
    """
    kernel_died = "the Python kernel died while running your notebook"
    return [
        Hostile(
            "h_syntax_error",
            "a syntax error in the main answer cell (a missing comma)",
            _edit_target(lambda t, item: t.replace("(", "(x y, ", 1)),
            OTHER,
            "SyntaxError",
        ),
        Hostile(
            "h_infinite_loop",
            "the main function loops forever: each of its test cells is interrupted",
            _edit_target(_in_body("while True:\n    pass")),
            OTHER,
            "KeyboardInterrupt",
        ),
        Hostile(
            "h_uninterruptible_loop",
            "a loop that ignores interrupts (SIGINT ignored) at the top of the main answer cell",
            _edit_target(
                _prefix(
                    "import signal\n\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                    "while True:\n    pass"
                )
            ),
            NONE,
            "could not be interrupted",
            graded=False,
        ),
        Hostile(
            "h_too_slow_overall",
            "cells that each stay under the per-cell limit but together exceed the notebook's",
            _slow_cells(0.8 * cell_timeout, math.ceil(notebook_timeout / (0.8 * cell_timeout)) + 1),
            NONE,
            "allowed for a whole notebook",
            graded=False,
        ),
        Hostile(
            "h_memory_bomb",
            "the main function allocates memory until it runs out (256 MiB at a time)",
            _edit_target(_in_body("hog = []\nwhile True:\n    hog.append(bytearray(2**28))")),
            OTHER,
            "MemoryError",
        ),
        Hostile(
            "h_huge_tensor",
            "the main function asks PyTorch for a 1 TiB tensor",
            _edit_target(_in_body("torch.ones(2**38)")),
            OTHER,
            "can't allocate memory",
        ),
        Hostile(
            "h_sys_exit",
            "sys.exit() at the top of the main answer cell (IPython catches it)",
            _edit_target(_prefix("import sys\n\nsys.exit('bye')")),
            OTHER,
            "SystemExit",
        ),
        Hostile(
            "h_kernel_sigkill",
            "the kernel kills itself with SIGKILL",
            _edit_target(
                _prefix("import os\nimport signal\n\nos.kill(os.getpid(), signal.SIGKILL)"),
            ),
            NONE,
            kernel_died,
            graded=False,
        ),
        Hostile(
            "h_os_exit",
            "os._exit(0): the kernel process ends without a word",
            _edit_target(_prefix("import os\n\nos._exit(0)")),
            NONE,
            kernel_died,
            graded=False,
        ),
        Hostile(
            "h_segfault",
            "the kernel crashes (reads address 0 with ctypes)",
            _edit_target(_prefix("import ctypes\n\nctypes.string_at(0)")),
            NONE,
            kernel_died,
            graded=False,
        ),
        Hostile(
            "h_deleted_tests",
            "correct answers, every test cell deleted (nbgrader puts them back)",
            _delete_tests,
            ALL,
            "Test cells missing from your notebook were added back",
        ),
        Hostile(
            "h_edited_locked_tests",
            "the stubs, with every locked test cell replaced by a print of success",
            _edit_locked_tests,
            NONE,
            "had been edited; it was put back",
        ),
        Hostile(
            "h_duplicated_ids",
            "correct answers, and a copy of a test cell (same cell id) at the top",
            _duplicate_ids,
            ALL,
            "Duplicated cell ids",
        ),
        Hostile(
            "h_hidden_test_markers",
            "correct answers with nbgrader's hidden-test markers typed into an answer cell",
            _edit_target(
                lambda t, item: t + "\n\n### BEGIN HIDDEN TESTS\nhidden = 'no end marker'"
            ),
            ALL,
            "hidden-test region here was removed by the grader",
        ),
        Hostile(
            "h_imports_reference",
            "the main answer imports coursepkg's reference implementation",
            _stub_target_other_solved("from coursepkg.attention import {item}  # noqa"),
            OTHER,
            "coursepkg's reference implementation",
        ),
        Hostile(
            "h_redefines_check",
            "the stub, and a fake check of the same name defined in the answer cell",
            _stub_target_other_solved("def check_{item}(*args, **kwargs):\n    return 'passed'"),
            OTHER,
            "not implemented yet",
        ),
        Hostile(
            "h_monkeypatch_grading",
            "replaces every check in coursepkg.grading by one that passes, stubbed answers",
            _answers_stubbed(
                "import coursepkg.grading as _g\n\n"
                "for _name in dir(_g):\n"
                "    if _name.startswith('check_'):\n"
                "        setattr(_g, _name, lambda *a, **k: 'passed')"
            ),
            NONE,
            "the grading code was changed by this notebook",
        ),
        Hostile(
            "h_monkeypatch_torch",
            "makes torch.allclose and torch.testing.assert_close always agree, wrong answer",
            _answers_stubbed(
                "torch.allclose = lambda *a, **k: True\n"
                "torch.testing.assert_close = lambda *a, **k: None"
            ),
            NONE,
            "the grading code was changed by this notebook",
        ),
        Hostile(
            "h_writes_outside",
            "writes a file into the course directory, outside its own folder",
            _edit_target(_prefix("open('../../../HACKED_BY_STUDENT.txt', 'w').write('x')")),
            OTHER,
            "PermissionError",
            needs_landlock=1,
        ),
        Hostile(
            "h_overwrites_submission",
            "overwrites its own handed-in notebook in submitted/",
            _edit_first(
                "open('../../../submitted/{student}/ex01_attention/ex01_attention.ipynb', 'w')"
                ".write('{{}}')"
            ),
            ALL,
            "PermissionError",
            needs_landlock=1,
        ),
        Hostile(
            "h_reads_solutions",
            "copies the main answer out of solutions/ and runs it",
            _stub_target_other_solved(
                "import json\n\n"
                "_nb = json.load(open('../../../solutions/ex01_attention/ex01_attention.ipynb'))\n"
                "_code = [''.join(c['source']) for c in _nb['cells']]\n"
                "exec([c for c in _code if c.startswith('def {item}(')][0])"
            ),
            OTHER,
            "PermissionError",
            needs_landlock=1,
        ),
        Hostile(
            "h_tampers_gradebook",
            "opens the gradebook with sqlite3 and gives everyone full marks",
            _edit_target(
                _prefix(
                    "import sqlite3\n\n"
                    "_db = sqlite3.connect('../../../gradebook.db')\n"
                    "_db.execute('UPDATE grade SET manual_score = 100')\n"
                    "_db.commit()"
                )
            ),
            OTHER,
            "unable to open database file",
            needs_landlock=1,
        ),
        Hostile(
            "h_kills_grader",
            "kills its parent process (the grader) with SIGKILL",
            _edit_target(
                _prefix("import os\nimport signal\n\nos.kill(os.getppid(), signal.SIGKILL)")
            ),
            OTHER,
            "PermissionError",
            needs_landlock=6,
        ),
        Hostile(
            "h_prints_100mb",
            "correct answers that print 100 MB (the output is capped)",
            _edit_target(lambda t, item: t + "\n\nprint('x' * 100_000_000)"),
            ALL,
            "output truncated",
        ),
        Hostile(
            "h_nan_outputs",
            "the main function returns NaN everywhere",
            _edit_target(
                _wrap(
                    "import torch.utils._pytree as _pt\n"
                    "return _pt.tree_map(lambda t: t * float('nan'), out)"
                )
            ),
            OTHER,
            "contains NaN",
        ),
        Hostile(
            "h_wrong_dtype",
            "the main function returns float16 tensors",
            _edit_target(
                _wrap(
                    "import torch.utils._pytree as _pt\n"
                    "return _pt.tree_map(lambda t: t.to(torch.float16), out)"
                )
            ),
            OTHER,
            "has dtype torch.float16",
        ),
        Hostile(
            "h_slow_correct",
            "correct, but sleeps 20 ms in every call (slow is not wrong)",
            _edit_target(_wrap("import time\ntime.sleep(0.02)\nreturn out")),
            ALL,
            "check_scaled_dot_product_attention passed",
        ),
        Hostile(
            "h_not_json",
            "a notebook file that is not valid JSON (cut short)",
            lambda s, r, student: ("", _nb_bytes(nbformat.from_dict(s))[:500]),
            NONE,
            "not valid JSON",
            graded=False,
        ),
        Hostile(
            "h_empty_file",
            "an empty file",
            _raw("", b""),
            NONE,
            "the file is empty",
            graded=False,
        ),
        Hostile(
            "h_not_a_notebook",
            "valid JSON that is not a notebook",
            _raw("", json.dumps({"answer": 42}).encode()),
            NONE,
            "valid JSON but not a Jupyter notebook",
            graded=False,
        ),
        Hostile(
            "h_wrong_file_name",
            "the notebook handed in under another name",
            _wrong_name,
            NONE,
            "no ex01_attention.ipynb in your submission",
            graded=False,
        ),
    ]


def write_submissions(
    course: str | Path, assignment: str, entries: list[Hostile]
) -> dict[str, Hostile]:
    """Write each entry as the submission of student ``entry.id`` in ``course/submitted/``.

    Args:
        course: an nbgrader course directory holding ``solutions/<assignment>/`` and the release
            in ``exercises/<assignment>/`` (after ``nbgrader generate_assignment``).
        assignment: the assignment id (one notebook named like the assignment).
        entries: which entries (e.g. :func:`hostile_catalogue`).

    Returns:
        The entries written, by student id.
    """
    course = Path(course)
    name = f"{assignment}.ipynb"
    source = nbformat.read(str(course / "solutions" / assignment / name), as_version=4)
    release = nbformat.read(str(course / "exercises" / assignment / name), as_version=4)
    written = {}
    for entry in entries:
        file_name, data = entry.make(source, release, entry.id)
        target = course / "submitted" / entry.id / assignment / (file_name or name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written[entry.id] = entry
    return written


def expected_score(entry: Hostile, source: NotebookNode) -> float:
    """The autograded points ``entry`` must get, for the assignment whose solutions are
    ``source``."""
    total = points(source)
    _, item = _target(source)
    target = points(source, item)
    return entry.score(total, target, total - target)
