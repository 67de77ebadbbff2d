"""Results and failures of a check: what a student sees, and how a check runs.

A check either returns a :class:`CheckResult` or raises :class:`CheckFailure`, an
``AssertionError`` whose message is a few plain sentences. :class:`CheckerError` marks a failure
of the checker itself, never of the student. :func:`run_check` gives every check the same
conventions (RNG state restored, failures labelled, checker errors caught); :func:`checking`
is the same for a body that returns its own result.
"""

from __future__ import annotations

import html
import os
import textwrap
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

# ---------------------------------------------------------------------------------------------
# Failures and results
# ---------------------------------------------------------------------------------------------


_WRAP = 88  # columns of a check's message as a notebook shows it


class CheckFailure(AssertionError):
    """A check failed. The message is written for the student: what is wrong and what to change.

    Args:
        message: plain sentences (may span several lines).
        check: name of the public check that failed (filled in by :func:`run_check`).
        diagnosis: the id of the catalogued mistake the student's output matched, if any.
    """

    def __init__(
        self, message: str, *, check: str | None = None, diagnosis: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.check = check
        self.diagnosis = diagnosis

    def __str__(self) -> str:
        return self.message

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback: ``✗ <check>: <message>`` lines.

        Long lines are wrapped between words at 88 columns here, because the places that show
        this text (a notebook cell, nbgrader's Validate dialog, the feedback page) either cut a
        long line off or break it in the middle of a word.
        """
        head = f"✗ {self.check}: " if self.check else "✗ "
        out: list[str] = []
        for i, line in enumerate(self.message.splitlines() or [""]):
            first = head + line if i == 0 else "  " + line
            indent = " " * (len(first) - len(first.lstrip()))
            wrapped = textwrap.wrap(
                first,
                width=_WRAP,
                subsequent_indent=indent + "  ",
                break_long_words=False,
                break_on_hyphens=False,
            )
            out.extend(wrapped or [first])
        return out


class NotImplementedYet(CheckFailure):
    """The student's code still raises ``NotImplementedError`` (an untouched stub)."""

    def __init__(self, item: str, detail: str = "", *, check: str | None = None) -> None:
        what = f"{item} is not implemented yet"
        if detail:
            what += f" ({detail})"
        super().__init__(
            f"{what}: replace `raise NotImplementedError` with your code.", check=check
        )
        self.item = item


#: The phrase every message of a failure of the checker itself starts with (``coursepkg grade``
#: looks for it to flag the student for review).
class ForbiddenCall(CheckFailure):
    """The student's code called what the exercise asks them to write (the reference, or
    PyTorch's fused version); no diagnosis of the numbers applies.

    Args:
        message: what was called and what to do instead.
        called: what was called, as :func:`~.calling.forbidden_calls` recognises a callable
            (a code object or a builtin's id), so that the check can name the catalogued
            mistake of using it (:func:`~.calling.name_forbidden_call`).
    """

    def __init__(self, message: str, *, called: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.called = called


CHECKER_FAILED = "the checker itself failed"


class CheckerError(CheckFailure):
    """The check crashed: an error in the checker, not a verdict on the student's code.

    Student code never raises this (its exceptions go through :func:`call_student`); the
    message says so, names the error and asks the student to tell the instructor.

    Args:
        check: the public check's name.
        exc: the exception the checker raised.
    """

    checker_error = True

    def __init__(self, check: str, exc: BaseException) -> None:
        frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" at {os.path.basename(frame[0].filename)}:{frame[0].lineno}" if frame else ""
        super().__init__(
            f"{CHECKER_FAILED} ({type(exc).__name__}{where}: {exc}). This is not a verdict on "
            "your code: please tell your instructor, with this message, so that the check can "
            "be fixed and your answer graded by hand.",
            check=check,
        )
        self.error = exc


@dataclass
class CheckResult:
    """What a passed (or, in a report, failed) check verified.

    Attributes:
        name: the check, e.g. ``"check_multi_head_attention"``.
        passed: whether every step passed.
        points: points awarded (None when the caller did not give any).
        messages: what was verified, one short phrase each.
        diagnosis: a catalogue bug id when a failure matched one.
    """

    name: str
    passed: bool
    points: float | None = None
    messages: list[str] = field(default_factory=list)
    diagnosis: str | None = None

    def __bool__(self) -> bool:
        return self.passed

    def _points_text(self) -> str:
        if self.points is None:
            return ""
        return f" [{self.points:g} point{'s' if self.points != 1 else ''}]"

    def __str__(self) -> str:
        mark = "✓" if self.passed else "✗"
        state = "passed" if self.passed else "failed"
        text = f"{mark} {self.name} {state}{self._points_text()}"
        if self.messages:
            text += ": " + "; ".join(self.messages)
        if self.diagnosis:
            text += f" (known mistake: {self.diagnosis})"
        return text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython's plain-text form (terminals, `coursepkg check`, nbgrader's text output).
        printer.text(str(self))

    def _ipython_display_(self) -> None:
        # Shown as display data rather than returned as the cell's value: nbgrader reads a test
        # cell's returned value as partial credit (a float), and warns on anything else.
        from IPython.display import display

        display({"text/plain": str(self), "text/html": self._repr_html_()}, raw=True)

    def _repr_html_(self) -> str:
        colour, border, mark = (
            ("#e8f5e9", "#2e7d32", "✓") if self.passed else ("#ffebee", "#c62828", "✗")
        )
        items = "".join(f"<li>{html.escape(m)}</li>" for m in self.messages)
        state = "passed" if self.passed else "failed"
        # The text colour is set with the background: a dark theme's light text on this pale
        # box is unreadable.
        return (
            f'<div style="background:{colour};color:#1a1a1a;border-left:4px solid {border};'
            "padding:6px 10px;margin:4px 0;font-family:sans-serif;font-size:90%;"
            'overflow-wrap:normal;word-break:normal;white-space:normal">'
            f"<b>{mark} {html.escape(self.name)}</b> {state}"
            f"{html.escape(self._points_text())}"
            + (f'<ul style="margin:4px 0 0 0">{items}</ul>' if items else "")
            + "</div>"
        )


@dataclass(frozen=True)
class BugVariant:
    """A known mistake, with a buggy implementation used to recognise it.

    Attributes:
        id: stable identifier, e.g. ``"sdpa.no_scaling"``.
        item: the exercise item it belongs to, e.g. ``"scaled_dot_product_attention"``.
        description: what the mistake is, as a clause ("the scores are not divided by ...").
        advice: what to change.
        impl: an implementation with the stub's signature (a function or an ``nn.Module``
            class) that makes exactly this mistake; None only where nothing can be rerun
            (ex09's training mistakes, whose check gathers its own evidence from the trained
            model and the training record).
        calls: for the mistake of calling a built-in the exercise asks the student to write
            (``F.scaled_dot_product_attention``, ``nn.MultiheadAttention``), the built-ins
            (functions, classes) whose call is the evidence; such a mistake is never matched
            by its outputs.
        shows: for a mistake that changes the parameters (biases left out, a width fixed),
            ``shows(module, args) -> bool``: whether the student's module, with its own
            weights, behaves as the mistake does and a correct module does not (its output is
            0 for a zero input, say); with the variant's parameter count, the evidence that
            names the mistake whatever the student's parameter names.
    """

    id: str
    item: str
    description: str
    advice: str
    impl: Callable[..., Any] | type | None = None
    calls: tuple[Any, ...] = ()
    shows: Callable[[Any, tuple[Any, ...]], bool] | None = None


def diagnosis_message(bug: BugVariant) -> str:
    """The sentence a failure adds when the student's output matches ``bug``."""
    description = bug.description.rstrip(".")
    return f"This looks like a known mistake: {description}. {bug.advice}"


class CheckReport:
    """Collects what a check verified; :func:`run_check` turns it into a :class:`CheckResult`.

    Args:
        name: the public check's name.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.verified: list[str] = []

    def ok(self, what: str) -> None:
        """Record one verified property (a short phrase)."""
        self.verified.append(what)

    def fail(self, message: str, bug: BugVariant | None = None) -> None:
        """Raise a :class:`CheckFailure`, adding the diagnosis of ``bug`` when given."""
        if bug is not None:
            message = f"{message}\n{diagnosis_message(bug)}"
        raise CheckFailure(message, check=self.name, diagnosis=bug.id if bug else None)


@contextmanager
def checking(name: str) -> Iterator[None]:
    """The conventions every check runs under, for a body that returns its own result.

    The global RNG state is saved and restored (the check seeds what it builds), gradients are
    enabled, a failure is labelled with the check's name, and an unexpected error inside the
    check itself becomes a :class:`CheckerError`, whose message says the checker failed (never
    that the student did) and asks the student to tell the instructor. Student code is called
    through :func:`call_student`, so its own errors never get here.

    Args:
        name: the public check's name.
    """
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            yield
    except CheckFailure as failure:
        if failure.check is None:
            failure.check = name
        raise
    except Exception as exc:  # noqa: BLE001 - an error of the checker, never the student's
        raise CheckerError(name, exc) from None


def run_check(
    name: str,
    points: float | None,
    body: Callable[..., None],
    *args: Any,
    **kwargs: Any,
) -> CheckResult:
    """Run a check's ``body(report, *args, **kwargs)`` under :func:`checking`.

    Returns:
        A passed :class:`CheckResult` listing what was verified.
    """
    report = CheckReport(name)
    with checking(name):
        body(report, *args, **kwargs)
    return CheckResult(name=name, passed=True, points=points, messages=report.verified)
