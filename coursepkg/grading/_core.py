"""The machinery every check shares: failures a student can act on, guarded calls into student
code, weight copying by name, tolerant comparisons, and recognising known mistakes.

A check (``check_<name>(impl, *, thorough=False, seed=None, points=None)``) either returns a
:class:`CheckResult` or raises :class:`CheckFailure`, an ``AssertionError`` whose message is a few
plain sentences. In a notebook IPython shows such a failure as ``✗ <check>: <message>`` lines
instead of a traceback (see :meth:`CheckFailure._render_traceback_`), so an nbgrader test cell is
just the call.

Student code never runs bare: :func:`call_student` turns ``NotImplementedError`` into a one-line
:class:`NotImplementedYet` and any other exception into a failure naming the file and line in the
student's code; :func:`forbidden_calls` records calls from student code into the reference
implementation (or into PyTorch's fused attention) and fails the check when there were any.
"""

from __future__ import annotations

import copy
import html
import inspect
import linecache
import os
import random
import sys
import sysconfig
import textwrap
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "DIAGNOSE_TOLERANCE",
    "NAMING_CONTRACT",
    "TOLERANCES",
    "CHECKER_FAILED",
    "BugVariant",
    "CheckFailure",
    "CheckerError",
    "CheckResult",
    "NotImplementedYet",
    "Report",
    "assert_close",
    "call_student",
    "check_gradients",
    "clone_module",
    "configs",
    "copy_weights",
    "describe",
    "diagnose",
    "diagnosis_message",
    "expect_tensor",
    "forbidden_calls",
    "materialise_lazy",
    "max_abs_error",
    "parameter_table",
    "register_configs",
    "reject_reference_class",
    "run_check",
    "swap_in",
]

# ---------------------------------------------------------------------------------------------
# Tolerances (the one place they are chosen)
# ---------------------------------------------------------------------------------------------

#: Default ``(rtol, atol)`` per dtype for comparing a student's numbers with the reference.
#: Measured on the attention-family items (SDPA, MHA, LayerNorm, FFN, encoder layer) at the
#: check configurations: the float32 reference against the same computation in float64 differs
#: by at most ~1e-6 absolute (outputs of size ~1), and two correct float32 implementations that
#: order the operations differently (einsum vs matmul, per-head loop vs batched, scaling Q
#: before the product vs the scores after) differ by at most ~2e-6. The float32 defaults leave
#: a margin of ~10-50x over that spread while staying far below the smallest effect of any
#: catalogued mistake (>= 1e-3). In float64 the same spread is ~1e-15.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
    torch.float32: (1e-4, 5e-5),
    torch.float64: (1e-7, 1e-9),
}

#: Looser ``(rtol, atol)`` for deciding that a student's output matches a known buggy variant:
#: the student and the bug may order operations differently, and a near match is what counts.
DIAGNOSE_TOLERANCE: tuple[float, float] = (1e-3, 1e-4)


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
            class) that makes exactly this mistake.
    """

    id: str
    item: str
    description: str
    advice: str
    impl: Callable[..., Any] | type


def diagnosis_message(bug: BugVariant) -> str:
    """The sentence a failure adds when the student's output matches ``bug``."""
    description = bug.description.rstrip(".")
    return f"This looks like a known mistake: {description}. {bug.advice}"


class Report:
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


def run_check(
    name: str,
    points: float | None,
    body: Callable[..., None],
    *args: Any,
    **kwargs: Any,
) -> CheckResult:
    """Run a check's ``body(report, *args, **kwargs)`` with the conventions every check shares.

    The global RNG state is saved and restored (the check seeds what it builds), a failure is
    labelled with the check's name, and an unexpected error inside the check itself becomes a
    :class:`CheckerError`, whose message says the checker failed (never that the student did)
    and asks the student to tell the instructor. Student code is called through
    :func:`call_student`, so its own errors never get here.

    Returns:
        A passed :class:`CheckResult` listing what was verified.
    """
    report = Report(name)
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            body(report, *args, **kwargs)
    except CheckFailure as failure:
        if failure.check is None:
            failure.check = name
        raise
    except Exception as exc:  # noqa: BLE001 - an error of the checker, never the student's
        raise CheckerError(name, exc) from None
    return CheckResult(name=name, passed=True, points=points, messages=report.verified)


# ---------------------------------------------------------------------------------------------
# Calling student code
# ---------------------------------------------------------------------------------------------

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../coursepkg
_STUBS_DIR = os.path.join(_PKG_DIR, "stubs")
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_LIB_DIRS = tuple(
    os.path.abspath(p)
    for p in {
        sysconfig.get_paths().get(key)
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if sysconfig.get_paths().get(key)
    }
)


def _is_student_file(filename: str) -> bool:
    """Whether a traceback frame's file is the student's (not torch, coursepkg or a library)."""
    if filename.startswith("<frozen"):
        return False
    path = os.path.abspath(filename)
    if path.startswith(_STUBS_DIR):
        return True
    if path.startswith((_PKG_DIR, _TORCH_DIR)):
        return False
    return not path.startswith(_LIB_DIRS)


def _student_frame(tb: Any) -> tuple[traceback.FrameSummary | None, str]:
    """The innermost traceback frame in the student's code (else the innermost of all), and
    the qualified name of its function."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    if not entries:
        return None, ""
    chosen = next(
        (e for e in reversed(entries) if _is_student_file(e.tb_frame.f_code.co_filename)),
        entries[-1],
    )
    code = chosen.tb_frame.f_code
    summary = traceback.FrameSummary(code.co_filename, chosen.tb_lineno, code.co_name)
    return summary, getattr(code, "co_qualname", code.co_name)


def _where(frame: traceback.FrameSummary | None) -> tuple[str, str]:
    """``("file:line (in fn)", "source line")`` of a frame."""
    if frame is None:
        return "", ""
    line = linecache.getline(frame.filename, frame.lineno or 0).strip()
    where = f"{frame.filename}:{frame.lineno}"
    if frame.name and frame.name != "<module>":
        where += f" (in {frame.name})"
    return where, line


def call_student(fn: Callable[..., Any], *args: Any, item: str, **kwargs: Any) -> Any:
    """Call student code and turn its exceptions into messages a student can act on.

    Args:
        fn: the student's function, class (to construct it) or module (to call it).
        *args, **kwargs: passed on to ``fn``.
        item: what the student implements, named in messages (e.g. ``"MultiHeadAttention"``).

    Returns:
        Whatever ``fn`` returns.

    Raises:
        NotImplementedYet: ``fn`` raised a bare ``NotImplementedError`` (an untouched stub); when
            the stub that raised is another one (say the ex02 class inside the ex04 layer),
            the message names it.
        CheckFailure: any other exception, naming its type, message and the file:line in the
            student's code where it happened.
    """
    try:
        return fn(*args, **kwargs)
    except CheckFailure:
        raise
    except Exception as exc:  # noqa: BLE001 - reported to the student
        frame, qualname = _student_frame(exc.__traceback__)
        if isinstance(exc, NotImplementedError) and not str(exc):
            owner = qualname.split(".")[0]
            detail = ""
            if owner and owner != item.split(".")[0] and owner != "<module>":
                detail = f"{qualname} still raises NotImplementedError"
            raise NotImplementedYet(item, detail) from None
        where, line = _where(frame)
        lines = [f"{item} raised {type(exc).__name__}" + (f" at {where}" if where else "") + ":"]
        if line:
            lines.append(f"    {line}")
        lines.append(f"{type(exc).__name__}: {exc}")
        lines.append("Fix the error in your code, then run the check again.")
        raise CheckFailure("\n".join(lines)) from None


def expect_tensor(value: Any, what: str) -> Tensor:
    """Fail unless ``value`` is a tensor; return it."""
    if not isinstance(value, Tensor):
        kind = "a tuple" if isinstance(value, tuple) else type(value).__name__
        raise CheckFailure(f"{what} should be a torch.Tensor, but your code returned {kind}.")
    return value


# ---------------------------------------------------------------------------------------------
# Honesty: no calls into the reference or into PyTorch's fused attention
# ---------------------------------------------------------------------------------------------

_REFERENCE_MODULES = (
    "attention",
    "layers",
    "positional",
    "masks",
    "schedule",
    "params",
    "decoding",
)

_SDPA_ADVICE = "write the matmul, scaling, masking and softmax yourself"
_REFERENCE_ADVICE = (
    "the exercise is to write it yourself; the course's reference implementation is there to "
    "compare with, not to call"
)


def _reference_targets() -> tuple[dict[CodeType, tuple[str, str]], dict[int, tuple[str, str]]]:
    """Python code objects and C functions a student's code must not call, with labels.

    Returns:
        ``(codes, builtins)``: ``codes`` maps a function's code object to ``(label, advice)``;
        ``builtins`` maps ``id(builtin)`` to ``(label, advice)``.
    """
    import importlib

    codes: dict[CodeType, tuple[str, str]] = {}
    builtins: dict[int, tuple[str, str]] = {
        id(F.scaled_dot_product_attention): (
            "torch.nn.functional.scaled_dot_product_attention",
            _SDPA_ADVICE,
        ),
    }
    codes[F.multi_head_attention_forward.__code__] = (
        "torch.nn.functional.multi_head_attention_forward",
        _SDPA_ADVICE,
    )
    for cls in _torch_forbidden_classes():
        codes[cls.forward.__code__] = (f"torch.nn.{cls.__name__}", _REFERENCE_ADVICE)
    for short in _REFERENCE_MODULES:
        module = importlib.import_module(f"coursepkg.{short}")
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            label = f"coursepkg.{short}.{name}"
            if inspect.isfunction(obj):
                # Unwrap decorators such as @torch.no_grad(): every decorated function shares
                # the decorator's wrapper code, which would flag any decorated call (the
                # student's own included) under one reference function's name.
                codes[inspect.unwrap(obj).__code__] = (label, _REFERENCE_ADVICE)
            elif inspect.isclass(obj) and issubclass(obj, nn.Module) and "forward" in vars(obj):
                codes[obj.forward.__code__] = (
                    f"{label} (the reference class's forward)",
                    _REFERENCE_ADVICE,
                )
    return codes, builtins


def _torch_forbidden_classes() -> tuple[type, ...]:
    return (
        nn.MultiheadAttention,
        nn.Transformer,
        nn.TransformerEncoder,
        nn.TransformerDecoder,
        nn.TransformerEncoderLayer,
        nn.TransformerDecoderLayer,
    )


def _reference_classes() -> tuple[type, ...]:
    """The nn.Module classes of coursepkg's reference (and torch's ready-made attention)."""
    import importlib

    classes: list[type] = list(_torch_forbidden_classes())
    for short in (*_REFERENCE_MODULES, "model", "rnn"):
        module = importlib.import_module(f"coursepkg.{short}")
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, nn.Module)
                and obj.__module__ == module.__name__
            ):
                classes.append(obj)
    return tuple(classes)


def _module_name(frame: FrameType) -> str:
    return frame.f_globals.get("__name__", "") or ""


def _is_reference_module(name: str) -> bool:
    """coursepkg's own code (reference and grading), but not the stubs students fill."""
    if name == "coursepkg":
        return True
    return name.startswith("coursepkg.") and not name.startswith("coursepkg.stubs")


def _callable_key(fn: Any) -> tuple[str, Any] | None:
    """How the profiler recognises a callable: ('code', code object) or ('c', id)."""
    fn = getattr(fn, "__func__", fn)
    if inspect.isclass(fn) and "forward" in vars(fn):
        return ("code", fn.forward.__code__)
    code = getattr(fn, "__code__", None)
    if isinstance(code, CodeType):
        return ("code", code)
    if callable(fn):
        return ("c", id(fn))
    return None


@contextmanager
def forbidden_calls(
    item: str,
    *,
    extra: Iterable[Callable[..., Any] | tuple[Callable[..., Any], str]] = (),
    allow: Iterable[Callable[..., Any]] = (),
    advice: str | None = None,
) -> Iterator[None]:
    """Fail if code run inside the block calls the reference or PyTorch's ready-made attention.

    While the block runs, a profile hook (``sys.setprofile``) watches every call. A call to a
    forbidden function counts only when it comes from the student's code: calls made by
    ``coursepkg`` itself (the checks computing the reference, or one reference function using
    another) and calls nested inside another forbidden call are ignored. Watching calls rather
    than patching names also catches ``from torch.nn.functional import
    scaled_dot_product_attention as f``.

    Forbidden by default: ``torch.nn.functional.scaled_dot_product_attention`` and
    ``multi_head_attention_forward``, the ``forward`` of ``nn.MultiheadAttention`` and of the
    ``nn.Transformer*`` classes, and every function and ``forward`` of ``coursepkg``'s
    attention, layers, positional, masks, schedule, params and decoding modules.

    Args:
        item: what the student implements, named in the message.
        extra: more forbidden callables (functions, builtins or ``nn.Module`` classes, whose
            ``forward`` is watched), optionally as ``(callable, label)`` pairs.
        allow: callables exempted for this item (e.g. the model's methods a decoding
            exercise must call).
        advice: replaces the default advice in the message.

    Raises:
        CheckFailure: on leaving the block, if student code called anything forbidden.
    """
    codes, builtins = _reference_targets()
    for entry in extra:
        fn, label = entry if isinstance(entry, tuple) else (entry, None)
        key = _callable_key(fn)
        if key is None:
            continue
        name = label or getattr(fn, "__qualname__", repr(fn))
        module = getattr(fn, "__module__", None)
        if label is None and module:
            name = f"{module}.{name}"
        if key[0] == "code":
            codes[key[1]] = (name, _REFERENCE_ADVICE)
        else:
            builtins[key[1]] = (name, _REFERENCE_ADVICE)
    for fn in allow:
        key = _callable_key(fn)
        if key is not None:
            (codes if key[0] == "code" else builtins).pop(key[1], None)
    calls: list[tuple[str, str]] = []

    def called_from_student(frame: FrameType | None) -> bool:
        # Walk out of torch's machinery (Module.__call__, hooks) to the real caller.
        while frame is not None and _module_name(frame).startswith("torch"):
            if frame.f_code in codes:  # nested inside another forbidden call
                return False
            frame = frame.f_back
        if frame is None or frame.f_code in codes:
            return False
        return not _is_reference_module(_module_name(frame))

    def record(label: tuple[str, str]) -> None:
        if label not in calls:
            calls.append(label)

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            label = codes.get(frame.f_code)
            if label is not None and called_from_student(frame.f_back):
                record(label)
        elif event == "c_call":
            label = builtins.get(id(arg))
            if label is not None and called_from_student(frame):
                record(label)
        if previous is not None:
            previous(frame, event, arg)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)
        if calls:
            names = ", ".join(label for label, _ in calls)
            tip = advice or calls[0][1]
            raise CheckFailure(f"your {item} calls {names}; {tip}.")


def reject_reference_class(
    cls: Any,
    item: str,
    instance: nn.Module | None = None,
    extra: Iterable[type] = (),
) -> None:
    """Fail if the student's class is, subclasses or contains a reference class.

    Args:
        cls: the student's class.
        item: what the student implements (named in the message).
        instance: a constructed instance, to inspect its submodules.
        extra: more forbidden classes for this item (e.g. ``nn.LayerNorm`` for the
            LayerNorm exercise).

    Raises:
        CheckFailure: naming the reference class and where it was found.
    """
    if not inspect.isclass(cls):
        raise CheckFailure(
            f"{item} should be a class (class {item}(nn.Module): ...), got {type(cls).__name__}."
        )
    forbidden = (*_reference_classes(), *extra)

    def label(ref: type) -> str:
        module = ref.__module__
        if module.startswith("coursepkg"):
            return f"coursepkg's reference {ref.__name__} ({module}.{ref.__name__})"
        return f"{module.replace('torch.nn.modules', 'torch.nn').rsplit('.', 1)[0]}.{ref.__name__}"

    for ref in forbidden:
        if cls is ref or issubclass(cls, ref):
            raise CheckFailure(
                f"your {item} is or subclasses {label(ref)}; write the class yourself, "
                "starting from nn.Module."
            )
    if instance is not None:
        for name, sub in instance.named_modules():
            for ref in forbidden:
                if isinstance(sub, ref) and name:
                    raise CheckFailure(
                        f"your {item} contains {label(ref)} as `{name}`; build it from your "
                        "own classes (paste them from the earlier assignments) instead."
                    )


# ---------------------------------------------------------------------------------------------
# Weights and parameter counts
# ---------------------------------------------------------------------------------------------

#: The naming contract of DESIGN.md, quoted when names do not match.
NAMING_CONTRACT = (
    "attention: q_proj k_proj v_proj out_proj (nn.Linear); layers: self_attn cross_attn ffn "
    "norm1 norm2 norm3; feed-forward: linear1 linear2 (nn.Linear); LayerNorm: weight bias"
)


def _shape(t: Tensor | torch.Size | Sequence[int]) -> str:
    dims = tuple(t.shape) if isinstance(t, Tensor) else tuple(t)
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def copy_weights(reference: nn.Module, student: nn.Module, item: str) -> None:
    """Copy the reference's parameters into the student's module, matching them by name.

    Args:
        reference: the reference module (its parameters are read).
        student: the student's module (its parameters are overwritten, cast to their dtype).
        item: what the student implements (named in the message).

    Raises:
        CheckFailure: when a name is missing, extra or of the wrong shape; the message lists
            the parameter names and shapes the contract expects.
    """
    ref = dict(reference.named_parameters())
    stu = dict(student.named_parameters())
    missing = [n for n in ref if n not in stu]
    extra = [n for n in stu if n not in ref]
    wrong = [n for n in ref if n in stu and stu[n].shape != ref[n].shape]
    if missing or extra or wrong:
        lines = [
            f"{item}: the check copies the reference weights into your module by parameter "
            "name, and your names or shapes do not match the contract."
        ]
        if missing:
            lines.append("Missing: " + ", ".join(f"{n} {_shape(ref[n])}" for n in missing) + ".")
        if extra:
            lines.append(
                "Not in the contract: " + ", ".join(f"{n} {_shape(stu[n])}" for n in extra) + "."
            )
        for n in wrong:
            text = f"{n} has shape {_shape(stu[n])}, expected {_shape(ref[n])}"
            if stu[n].dim() == 2 and tuple(stu[n].shape) == tuple(ref[n].shape)[::-1]:
                text += " (nn.Linear(in, out) stores its weight as (out, in))"
            lines.append(text + ".")
        lines.append(
            "Expected parameters: " + ", ".join(f"{n} {_shape(p)}" for n, p in ref.items()) + "."
        )
        lines.append(f"Naming contract: {NAMING_CONTRACT}.")
        raise CheckFailure("\n".join(lines))
    with torch.no_grad():
        for name, param in ref.items():
            stu[name].copy_(param.to(stu[name].dtype))


def clone_module(module: nn.Module) -> nn.Module:
    """A deep copy of a (student's) module that also works after a forward pass with autograd
    on: tensors a module keeps on ``self`` (attention weights stored to plot them, caches) are
    copied detached, since ``copy.deepcopy`` refuses tensors that are not graph leaves."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for value in vars(sub).values():
            stored = value if isinstance(value, (list, tuple)) else [value]
            for t in stored:
                if isinstance(t, Tensor) and not isinstance(t, nn.Parameter) and not t.is_leaf:
                    memo[id(t)] = t.detach().clone()
    return copy.deepcopy(module, memo)


def materialise_lazy(module: nn.Module, run: Callable[[nn.Module], Any], item: str) -> None:
    """Give the lazy parameters of a student's module (``nn.LazyLinear`` ...) their shapes by
    one forward pass, so that they can be counted and copied like any other.

    Args:
        module: the student's module.
        run: ``run(module)`` calls it once on inputs of the check's configuration.
        item: what the student implements (named in the message).

    Raises:
        CheckFailure: when the parameters are still uninitialised after that call.
    """
    lazy = nn.parameter.is_lazy
    if not any(lazy(p) for p in module.parameters()):
        return
    with torch.no_grad():
        run(module)
    still = [n for n, p in module.named_parameters() if lazy(p)]
    if still:
        raise CheckFailure(
            f"your {item} has lazy parameters ({', '.join(still)}) that one forward pass does "
            "not initialise; give their sizes in the constructor (nn.Linear(in, out))."
        )


class _Adapted(nn.Module):
    """A reference piece put where the student's piece was: it accepts the calls the student's
    layer makes to its own piece (the student's parameter names and order) and passes them on
    positionally to the reference piece."""

    def __init__(self, reference: nn.Module, signature: inspect.Signature | None) -> None:
        super().__init__()
        self.inner = reference
        self.signature = signature

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.signature is None or not kwargs:
            return self.inner(*args, **kwargs)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return self.inner(*bound.arguments.values())


def swap_in(layer: nn.Module, name: str, reference_piece: nn.Module) -> None:
    """Replace ``layer.<name>`` (a student's piece) by a copy of ``reference_piece`` that the
    student's forward can call the way it calls its own piece (keyword names included)."""
    own = getattr(layer, name, None)
    try:
        signature = inspect.signature(own.forward) if own is not None else None
    except (TypeError, ValueError):
        signature = None
    setattr(layer, name, _Adapted(copy.deepcopy(reference_piece), signature))


def _symbolic(shape: Sequence[int], dims: dict[str, int] | None) -> tuple[str, ...]:
    """Factors of a shape as letters when they match a named dimension (e.g. ('D', 'F')); a
    small multiple of the model width (a fused projection's 3·D) becomes ('3', 'D')."""
    names: dict[int, str] = {}
    for letter, size in (dims or {}).items():
        names.setdefault(size, letter)
    factors: list[str] = []
    for s in shape:
        if s in names:
            factors.append(names[s])
            continue
        d = (dims or {}).get("D")
        k = next((k for k in (2, 3, 4) if d and s == k * d), None)
        factors.extend((str(k), "D") if k else (str(s),))
    return tuple(sorted(factors))


def _polynomial(terms: Counter[tuple[str, ...]]) -> str:
    """Format {('D','F'): 2, ('D',): 1} as '2D·F + D' (numbers among the factors are folded
    into the coefficient: {('3','D','D'): 1, ('D','D'): 1} reads '4D²')."""
    folded: Counter[tuple[str, ...]] = Counter()
    for factors, coef in terms.items():
        value = coef
        for f in factors:
            if f.isdigit():
                value *= int(f)
        folded[tuple(f for f in factors if not f.isdigit())] += value
    parts = []
    for letters_of, value in sorted(folded.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        if value == 0:
            continue
        letters = "·".join(
            f + ("²" if k == 2 else "" if k == 1 else f"^{k}")
            for f, k in sorted(Counter(letters_of).items())
        )
        if not letters:
            parts.append(str(value))
        else:
            parts.append(("" if value == 1 else str(value)) + letters)
    return " + ".join(parts) if parts else "0"


def _grouped(poly: str) -> str:
    """Bracket a sum, so that a minus sign in front of it applies to every term."""
    return f"({poly})" if " + " in poly else poly


def _numel(p: Tensor) -> int:
    """Number of entries; 0 for a lazy parameter not yet initialised (``nn.LazyLinear``)."""
    return 0 if nn.parameter.is_lazy(p) else p.numel()


def _renaming_advice(
    student: dict[str, dict[str, Tensor]], reference: dict[str, dict[str, Tensor]]
) -> str:
    """The sentence for a module with the reference's number of parameters under other
    names: which names to use, and whether a fused projection has to be split."""
    wanted = ", ".join(reference)
    text = (
        "Same number of parameters under other names: the check copies the weights by name, "
        f"so name the submodules {wanted} (the naming contract: {NAMING_CONTRACT})."
    )
    sizes = sorted(_numel(p) for g in reference.values() for p in g.values())
    fused = []
    for group in student.values():
        for name, p in group.items():
            n = _numel(p)
            if (
                p.dim() >= 1
                and n not in sizes
                and any(n == k * m for m in sizes for k in (2, 3, 4))
            ):
                fused.append(name)
    if fused:
        text += (
            f" Split a fused projection ({', '.join(fused)}) into separate nn.Linear layers, "
            "e.g. one d_model x 3*d_model matrix into q_proj, k_proj and v_proj."
        )
    return text


def parameter_table(
    student: nn.Module, reference: nn.Module, dims: dict[str, int] | None = None
) -> tuple[bool, str]:
    """Per-submodule parameter counts of the student's module next to the reference's.

    Args:
        student: the student's module.
        reference: the reference module of the same configuration.
        dims: named sizes (e.g. ``{"D": 12, "F": 40, "H": 3}``) to explain a gap in symbols,
            "out_proj has no bias: −D", rather than in numbers.

    Returns:
        ``(ok, text)``: ``ok`` when every submodule's count matches; ``text`` is the table,
        followed by one line per difference explaining it.
    """

    def group(module: nn.Module) -> dict[str, dict[str, Tensor]]:
        groups: dict[str, dict[str, Tensor]] = {}
        for name, p in module.named_parameters():
            top = name.split(".", 1)[0]
            groups.setdefault(top, {})[name] = p
        return groups

    gs, gr = group(student), group(reference)
    tops = list(gr) + [t for t in gs if t not in gr]
    count = {
        k: {t: sum(_numel(p) for p in g.get(t, {}).values()) for t in tops}
        for k, g in (("s", gs), ("r", gr))
    }
    width = max([len(t) for t in tops] + [9])
    rows = [f"{'submodule':<{width}}  {'yours':>9}  {'reference':>9}"]
    for t in tops:
        flag = "" if count["s"][t] == count["r"][t] else "   <-"
        rows.append(f"{t:<{width}}  {count['s'][t]:>9}  {count['r'][t]:>9}{flag}")
    total_s, total_r = sum(count["s"].values()), sum(count["r"].values())
    rows.append(f"{'total':<{width}}  {total_s:>9}  {total_r:>9}")
    ok = all(count["s"][t] == count["r"][t] for t in tops)
    notes: list[str] = []
    if not ok and total_s == total_r:
        notes.append(_renaming_advice(gs, gr))
    ps, pr = dict(student.named_parameters()), dict(reference.named_parameters())
    for t in tops:
        if count["s"][t] == count["r"][t]:
            continue
        if t not in gs:
            terms = Counter()
            for p in gr[t].values():
                terms[_symbolic(p.shape, dims)] += 1
            notes.append(f"{t} missing: −{_grouped(_polynomial(terms))}")
            continue
        if t not in gr:
            terms = Counter()
            for p in gs[t].values():
                terms[_symbolic(p.shape, dims)] += 1
            notes.append(f"{t} is not in the reference: +{_polynomial(terms)}")
            continue
        for name, p in gr[t].items():
            if name not in ps:
                poly = _grouped(_polynomial(Counter([_symbolic(p.shape, dims)])))
                if name.endswith(".bias"):
                    notes.append(f"{name.rsplit('.', 1)[0]} has no bias: −{poly}")
                else:
                    notes.append(f"{name} missing: −{poly}")
            elif ps[name].shape != p.shape:
                notes.append(
                    f"{name} has shape {_shape(ps[name])} instead of {_shape(p)}: "
                    f"{ps[name].numel() - p.numel():+d}"
                )
        for name, p in gs[t].items():
            if name not in pr:
                poly = _polynomial(Counter([_symbolic(p.shape, dims)]))
                notes.append(f"{name} is not in the reference: +{poly}")
    text = "\n".join(rows + notes)
    return ok, text


# ---------------------------------------------------------------------------------------------
# Comparing numbers
# ---------------------------------------------------------------------------------------------


def assert_close(
    actual: Any,
    expected: Tensor,
    what: str,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Fail with a useful message unless ``actual`` equals ``expected`` within tolerance.

    Args:
        actual: the student's value.
        expected: the reference value.
        what: the quantity, as the student knows it ("the output of your MultiHeadAttention").
        rtol, atol: tolerances; default :data:`TOLERANCES` for ``expected``'s dtype.

    Raises:
        CheckFailure: naming the shapes/dtypes when they differ, otherwise the largest absolute
            error, where it occurs and the two values there.
    """
    actual = expect_tensor(actual, what)
    if actual.shape != expected.shape:
        raise CheckFailure(f"{what} has shape {_shape(actual)}, expected {_shape(expected)}.")
    if actual.dtype != expected.dtype:
        raise CheckFailure(
            f"{what} has dtype {actual.dtype}, expected {expected.dtype} (the dtype of the "
            "inputs). Create new tensors with dtype=/device= taken from the inputs."
        )
    if actual.device != expected.device:
        raise CheckFailure(f"{what} is on {actual.device}, expected {expected.device}.")
    if not expected.is_floating_point():
        bad = (actual != expected).nonzero()
        if len(bad):
            idx = tuple(bad[0].tolist())
            raise CheckFailure(
                f"{what} differs from the reference at {len(bad)} of {expected.numel()} "
                f"entries, first at index {idx} (yours {actual[idx].item()}, reference "
                f"{expected[idx].item()})."
            )
        return
    default_rtol, default_atol = TOLERANCES.get(expected.dtype, TOLERANCES[torch.float32])
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if bool((nan_a & ~nan_e).any()):
        idx = tuple(torch.nonzero(nan_a & ~nan_e)[0].tolist())
        count = int((nan_a & ~nan_e).sum())
        raise CheckFailure(
            f"{what} contains NaN ({count} of {a.numel()} entries, first at index {idx}) "
            f"where the reference is {e[idx].item():.6g}."
        )
    err = (a - e).abs().nan_to_num(nan=0.0, posinf=float("inf"))
    err = torch.where(nan_a & nan_e, torch.zeros_like(err), err)
    bad = err > atol + rtol * e.abs().nan_to_num(nan=0.0)
    if bool(bad.any()):
        flat = int(err.reshape(-1).argmax())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
        raise CheckFailure(
            f"{what} differs from the reference: max abs error {err[idx].item():.3g} at index "
            f"{idx} (yours {a[idx].item():.6g}, reference {e[idx].item():.6g}); "
            f"{int(bad.sum())} of {a.numel()} entries are outside the tolerance "
            f"(rtol={rtol:g}, atol={atol:g})."
        )


def max_abs_error(actual: Tensor, expected: Tensor) -> float:
    """Largest absolute difference (NaN where both are NaN counts as equal)."""
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    err = (a - e).abs()
    err = torch.where(torch.isnan(a) & torch.isnan(e), torch.zeros_like(err), err)
    return float(err.max()) if err.numel() else 0.0


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        out: list[Tensor] = []
        for v in value:
            out.extend(_tensors(v))
        return out
    return []


def _outputs_match(a: Any, b: Any, rtol: float, atol: float) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    if not ta or len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb, strict=True):
        if x.shape != y.shape:
            return False
        x64 = x.detach().to("cpu", torch.float64)
        y64 = y.detach().to("cpu", torch.float64)
        if not torch.allclose(x64, y64, rtol=rtol, atol=atol, equal_nan=True):
            return False
    return True


def diagnose(
    student_output_fn: Callable[..., Any],
    bugs: Sequence[BugVariant],
    inputs: Sequence[Any],
    *,
    run: Callable[[Any, Sequence[Any]], Any] | None = None,
    reference_output: Any = None,
) -> BugVariant | None:
    """Find the known mistake whose output matches the student's on the same inputs.

    Args:
        student_output_fn: called as ``student_output_fn(*inputs)``; returns the student's
            output (a tensor or a tuple of tensors). Errors count as "no match".
        bugs: candidate :class:`BugVariant` s.
        inputs: the inputs, chosen so that the candidates differ from each other.
        run: ``run(bug.impl, inputs)`` computes a bug's output (default ``bug.impl(*inputs)``);
            checks of modules pass a ``run`` that builds the buggy module with the
            reference's weights.
        reference_output: when given, a bug that matches the reference on these inputs is
            skipped (it cannot be told apart here).

    Returns:
        The first matching bug, or None.
    """
    rtol, atol = DIAGNOSE_TOLERANCE
    try:
        with torch.no_grad():
            student = student_output_fn(*inputs)
    except Exception:  # noqa: BLE001 - an erroring student output matches nothing
        return None
    runner = run or (lambda impl, args: impl(*args))
    for bug in bugs:
        try:
            with torch.no_grad():
                candidate = runner(bug.impl, inputs)
        except Exception:  # noqa: BLE001 - a variant that cannot run these inputs is skipped
            continue
        if reference_output is not None and _outputs_match(candidate, reference_output, rtol, atol):
            continue
        if _outputs_match(student, candidate, rtol, atol):
            return bug
    return None


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------


def check_gradients(
    output: Tensor,
    named: Iterable[tuple[str, Tensor]],
    item: str,
    *,
    seed: int = 0,
) -> None:
    """Backpropagate a random projection of ``output`` and fail unless every tensor gets a
    finite, not-all-zero gradient.

    Args:
        output: the student's output (part of an autograd graph).
        named: ``(name, tensor)`` pairs that must receive gradients (parameters or inputs).
        item: what the student implements.
        seed: seed of the random projection.

    Raises:
        CheckFailure: naming the first tensor without a usable gradient.
    """
    named = list(named)
    for _, t in named:
        t.grad = None
    if not output.requires_grad:
        raise CheckFailure(
            f"the output of your {item} does not require grad, so nothing can be trained: "
            "do not wrap the computation in torch.no_grad(), and do not use .detach(), "
            ".item() or .numpy() on the way."
        )
    gen = torch.Generator().manual_seed(seed)
    probe = torch.randn(output.shape, generator=gen, dtype=torch.float64)
    (output * probe.to(output.dtype)).sum().backward()
    for name, t in named:
        if t.grad is None:
            raise CheckFailure(
                f"no gradient reaches `{name}` in your {item}: it does not take part in the "
                "output (or is used through .data, .detach() or torch.no_grad())."
            )
        if not bool(torch.isfinite(t.grad).all()):
            raise CheckFailure(f"the gradient of `{name}` in your {item} contains NaN or inf.")
        if not bool(t.grad.any()):
            raise CheckFailure(
                f"the gradient of `{name}` in your {item} is zero everywhere: it does not "
                "influence the output."
            )


# ---------------------------------------------------------------------------------------------
# Shape configurations
# ---------------------------------------------------------------------------------------------

_CONFIGS: dict[
    str,
    tuple[
        list[dict[str, Any]], list[dict[str, Any]], Callable[[random.Random], dict[str, Any]] | None
    ],
] = {}

#: How many randomised configurations thorough mode adds.
N_RANDOM_CONFIGS = 3


def register_configs(
    item: str,
    visible: Sequence[dict[str, Any]],
    extra: Sequence[dict[str, Any]] = (),
    sample: Callable[[random.Random], dict[str, Any]] | None = None,
) -> None:
    """Declare the shape configurations of an item (each check module does this once).

    Args:
        item: the exercise item, e.g. ``"multi_head_attention"``.
        visible: the fixed small set every (visible) check run uses; at least 3.
        extra: fixed configurations added in thorough mode.
        sample: ``sample(rng)`` draws one randomised configuration for thorough mode.
    """
    _CONFIGS[item] = (list(visible), list(extra), sample)


def configs(item: str, thorough: bool = False, seed: int | None = None) -> list[dict[str, Any]]:
    """The shape configurations a check tries for ``item``.

    Args:
        item: a registered item.
        thorough: add the extra configurations and :data:`N_RANDOM_CONFIGS` randomised ones
            (hidden tests); visible mode uses only the fixed small set.
        seed: seed of the randomised configurations (thorough mode; None means 0).

    Returns:
        A list of dicts of sizes; thorough mode never repeats a visible configuration.
    """
    if item not in _CONFIGS:
        raise KeyError(f"no configurations registered for {item!r}; known: {sorted(_CONFIGS)}")
    visible, extra, sample = _CONFIGS[item]
    out = [dict(c) for c in visible]
    if not thorough:
        return out
    out += [dict(c) for c in extra if c not in out]
    if sample is not None:
        rng = random.Random(0 if seed is None else seed)
        added = 0
        for _ in range(50 * N_RANDOM_CONFIGS):
            c = sample(rng)
            if c not in out:
                out.append(c)
                added += 1
                if added == N_RANDOM_CONFIGS:
                    break
    return out


def describe(config: dict[str, Any]) -> str:
    """A configuration as ``B=2, L=5, ...`` for messages."""
    return ", ".join(f"{k}={v}" for k, v in config.items())
