"""Calling student code: guarded calls, the tensor guard, and the honesty rules.

:func:`call_student` turns ``NotImplementedError`` into a one-line :class:`NotImplementedYet`
and any other exception into a failure naming the file and line in the student's code;
:func:`forbidden_calls` records calls from student code into the reference implementation (or
into PyTorch's fused attention) and fails the check when there were any.
"""

from __future__ import annotations

import inspect
import linecache
import numbers
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .evidence import input_clues
from .results import CheckFailure, ForbiddenCall, NotImplementedYet

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
            student's code where it happened, then the input and which of its dimensions the
            sizes in the error are (:func:`~.evidence.input_clues`).
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
        lines += _clues(fn, args, kwargs, f"{type(exc).__name__}: {exc}")
        lines.append("Fix the error in your code, then run the check again.")
        raise CheckFailure("\n".join(lines)) from None


def _clues(fn: Any, args: Sequence[Any], kwargs: dict[str, Any], error: str) -> list[str]:
    """:func:`~.evidence.input_clues` for the student's callable (a module: its ``forward``);
    reading the input never turns the student's error into the checker's."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        return input_clues(target, args, kwargs, error)
    except Exception:  # noqa: BLE001 - the student's error stands without the clues
        return []


def expect_tensor(value: Any, what: str, shape: Sequence[int] | None = None) -> Tensor:
    """The one tensor guard: fail unless ``value`` is a tensor (of ``shape``, when given).

    Args:
        value: what the student's code returned.
        what: the quantity, named in the message (e.g. ``"the output of your LayerNorm"``).
        shape: the expected shape, if the check knows it.

    Returns:
        ``value``, now known to be a tensor of the right shape.

    Raises:
        CheckFailure: naming what came back instead, or the two shapes.
    """
    if not isinstance(value, Tensor):
        kind = "a tuple" if isinstance(value, tuple) else type(value).__name__
        raise CheckFailure(f"{what} should be a torch.Tensor, but your code returned {kind}.")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise CheckFailure(
            f"{what} has shape {tuple(value.shape)}, expected {tuple(shape)}. Check which "
            "axes you transpose, reshape and reduce."
        )
    return value


def expect_number(value: Any, what: str) -> float:
    """The one number guard: a Python number or a one-element tensor, as a float.

    Args:
        value: what the student's code returned.
        what: the quantity, named in the message.

    Returns:
        ``value`` as a float.

    Raises:
        CheckFailure: naming what came back instead (a bool, a larger tensor, another type).
    """
    if isinstance(value, Tensor) and value.numel() == 1:
        return float(value.detach().reshape(()).item())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    kind = (
        f"a tensor of shape {tuple(value.shape)}"
        if isinstance(value, Tensor)
        else (type(value).__name__)
    )
    raise CheckFailure(f"{what} should be one number, but your code returned {kind}.")


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


def is_reference_module(name: str) -> bool:
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


def _watched_targets(
    extra: Iterable[Callable[..., Any] | tuple[Callable[..., Any], str]],
    allow: Iterable[Callable[..., Any]],
) -> tuple[dict[CodeType, tuple[str, str]], dict[int, tuple[str, str]]]:
    """The reference targets of :func:`_reference_targets`, plus ``extra``, minus ``allow``."""
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
    return codes, builtins


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
    codes, builtins = _watched_targets(extra, allow)
    calls: list[tuple[str, str]] = []
    keys: list[Any] = []

    def called_from_student(frame: FrameType | None) -> bool:
        # Walk out of torch's machinery (Module.__call__, hooks) to the real caller.
        while frame is not None and _module_name(frame).startswith("torch"):
            if frame.f_code in codes:  # nested inside another forbidden call
                return False
            frame = frame.f_back
        if frame is None or frame.f_code in codes:
            return False
        return not is_reference_module(_module_name(frame))

    def record(label: tuple[str, str], key: Any) -> None:
        if label not in calls:
            calls.append(label)
            keys.append(key)

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            label = codes.get(frame.f_code)
            if label is not None and called_from_student(frame.f_back) and not _on_mistake(frame):
                record(label, ("code", frame.f_code))
        elif event == "c_call":
            label = builtins.get(id(arg))
            if label is not None and called_from_student(frame):
                record(label, ("c", id(arg)))
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
            raise ForbiddenCall(f"your {item} calls {names}; {tip}.", called=tuple(keys))


def name_forbidden_call(failure: ForbiddenCall, bugs: Iterable[Any]) -> None:
    """Give ``failure`` the id of the catalogued mistake (among ``bugs``) whose ``calls`` hold
    what the student called, and end its message with ``(known mistake: <id>)``, the words
    reports and the misconception dashboard count.

    Args:
        failure: raised by :func:`forbidden_calls` or :func:`reject_reference_class`.
        bugs: the check's catalogue (:class:`~.results.BugVariant` s).
    """
    if failure.diagnosis is not None:
        return
    for bug in bugs:
        calls = getattr(bug, "calls", ())
        seen = {_callable_key(fn) for fn in calls} | {
            ("class", cls) for cls in calls if inspect.isclass(cls)
        }
        if any(key in seen for key in failure.called):
            failure.diagnosis = bug.id
            failure.message = f"{failure.message} (known mistake: {bug.id})"
            failure.args = (failure.message,)
            return


_CATALOGUED: set[type] = set()


def mark_catalogued(impls: Iterable[Any]) -> None:
    """Record the classes among a catalogue's ``impl`` s (the registry calls this for every
    check it registers)."""
    _CATALOGUED.update(impl for impl in impls if inspect.isclass(impl))


def is_catalogued(cls: Any) -> bool:
    """Whether ``cls`` is one of the catalogues' own mistake classes, which the tests hand a
    check as if a student had written them (alone, or as a piece of a student's layer).

    A known mistake is the reference with one step overridden, so it subclasses the reference
    on purpose: :func:`reject_reference_class` lets exactly those class objects through, and
    :func:`forbidden_calls` does not count the reference methods they inherit. The test is
    identity, not a name or an attribute: a class a student writes is a new class object and
    is never exempt.
    """
    return inspect.isclass(cls) and cls in _CATALOGUED


def _on_mistake(frame: FrameType) -> bool:
    # A forbidden (reference) method running on a catalogued mistake's instance.
    return is_catalogued(type(frame.f_locals.get("self")))


def reject_reference_class(
    cls: Any,
    item: str,
    instance: nn.Module | None = None,
    extra: Iterable[type] = (),
) -> None:
    """Fail if the student's class is, subclasses or contains a reference class; the
    catalogues' own mistakes (:func:`is_catalogued`), built on the reference on purpose, are
    let through with everything inside them.

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
    if is_catalogued(cls):
        return
    forbidden = (*_reference_classes(), *extra)

    def label(ref: type) -> str:
        module = ref.__module__
        if module.startswith("coursepkg"):
            return f"coursepkg's reference {ref.__name__} ({module}.{ref.__name__})"
        return f"{module.replace('torch.nn.modules', 'torch.nn').rsplit('.', 1)[0]}.{ref.__name__}"

    for ref in forbidden:
        if cls is ref or issubclass(cls, ref):
            raise ForbiddenCall(
                f"your {item} is or subclasses {label(ref)}; write the class yourself, "
                "starting from nn.Module.",
                called=(("class", ref),),
            )
    if instance is not None:
        skipped = [n for n, sub in instance.named_modules() if is_catalogued(type(sub))]
        for name, sub in instance.named_modules():
            if any(name == s or name.startswith(s + ".") for s in skipped):
                continue  # inside an exempt module
            for ref in forbidden:
                if isinstance(sub, ref) and name:
                    raise ForbiddenCall(
                        f"your {item} contains {label(ref)} as `{name}`; build it from your "
                        "own classes (paste them from the earlier assignments) instead.",
                        called=(("class", ref),),
                    )
