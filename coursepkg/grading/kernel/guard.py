"""The guard of the checks inside a grading kernel (:func:`install_guard`).

Before the first cell, the guard snapshots ``coursepkg`` and the parts of PyTorch, ``math``,
``sys`` and ``builtins`` the checks rely on: every function, class, method and module there,
and ``coursepkg``'s constants (tolerances, catalogues); a kernel forked from the fork server
takes the snapshot the server took after its imports (:func:`preload_snapshot`). Before every
cell that calls a check, the check names a notebook imported are put back to the real checks,
and the snapshot is compared: once anything in it was replaced (a monkeypatched check, helper,
tolerance or ``torch.allclose``), every later check fails with a message saying so.

What must not change about a watched object: the object itself and, for a function (or a
method, a callable object), its code and defaults; about a constant: its ``repr`` (so mutating a
list in place counts too). The
snapshot holds the objects it watches (:class:`_Snapshot`), so a comparison looks each name up
and checks that it is still the same object, instead of listing the whole namespace again: a
kernel compares before each of its check cells, and listing ~6,400 names each time was half of
a forked kernel's CPU time when grading ex01 (:mod:`.forkserver`'s children touch every object
afresh).
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["install_guard", "preload_snapshot"]

_WATCHED_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.testing", "math")
# IPython swaps sys.displayhook and friends around every cell; only these are watched in sys.
_WATCHED_SYS = ("setprofile", "settrace", "getprofile", "gettrace", "_getframe", "modules")
_WATCHED_BUILTINS = (
    "abs all any bool callable dict float getattr hasattr int isinstance issubclass len list "
    "max min range repr round setattr sorted str sum tuple type zip"
).split()
# Objects with no code or defaults of their own (builtins and descriptors take no attribute;
# a class's or a module's ``__code__`` would be an ordinary attribute that nothing runs): the
# same object is the same code.
_FIXED = (
    type,
    types.ModuleType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
)
# Constants whose repr cannot change while they stay the same object (tuples and frozensets
# of these too).
_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None))
_MISSING = object()
# The snapshot the fork server took before forking (:func:`preload_snapshot`).
_PRELOADED: dict[str, Any] = {}


def _identity(value: Any) -> tuple[int, ...]:
    """What must not change about a watched object: it, and a function's code and defaults."""
    return (
        id(value),
        id(getattr(value, "__code__", None)),
        id(getattr(value, "__defaults__", None)),
        id(getattr(value, "__kwdefaults__", None)),
    )


def _immutable(value: Any) -> bool:
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(v) for v in value)
    return type(value) in _IMMUTABLE


def _expected(value: Any) -> Any:
    """What :func:`_same` compares a watched object with later."""
    if type(value) is types.FunctionType:
        return (value.__code__, value.__defaults__, value.__kwdefaults__)
    if isinstance(value, _FIXED):
        return None
    return _identity(value)


def _same(now: Any, value: Any, expected: Any) -> bool:
    """Whether ``now`` is still the watched object ``value`` with its code and defaults."""
    if now is not value:
        return False
    if type(value) is types.FunctionType:
        code, defaults, kwdefaults = expected
        return (
            value.__code__ is code
            and value.__defaults__ is defaults
            and value.__kwdefaults__ is kwdefaults
        )
    return expected is None or _identity(now) == expected


def _module_dict(name: str) -> Callable[[], Mapping | None]:
    def find() -> Mapping | None:
        module = sys.modules.get(name)
        return None if module is None else vars(module)

    return find


def _class_dict(name: str, attr: str) -> Callable[[], Mapping | None]:
    def find() -> Mapping | None:
        module = sys.modules.get(name)
        cls = None if module is None else vars(module).get(attr)
        own = isinstance(cls, type) and cls.__module__ == name
        return vars(cls) if own else None

    return find


def _tensor_dict() -> Mapping | None:
    torch = sys.modules.get("torch")
    return None if torch is None else vars(torch.Tensor)


def _builtins_dict() -> Mapping:
    import builtins

    return vars(builtins)


class _Snapshot:
    """Every watched object, in groups that share a namespace: a group is ``(find, probes)``,
    ``find()`` giving the namespace now (None: it is gone), a probe ``(key, name, value,
    expected, constant)``: ``key`` the dotted name's parts, ``value`` what ``name`` held,
    ``expected`` its code and defaults (or, for a constant, its repr)."""

    def __init__(self) -> None:
        import torch

        self.modules = {
            name: module
            for name, module in list(sys.modules.items())
            if name == "coursepkg" or name.startswith("coursepkg.")
        }
        for name in _WATCHED_MODULES:
            if name in sys.modules:
                self.modules[name] = sys.modules[name]
        self.groups: list[tuple[Callable[[], Mapping | None], list[tuple]]] = []
        for name, module in self.modules.items():
            self._module(name, module)
        members = [(k, v) for k, v in list(vars(torch.Tensor).items()) if callable(v)]
        self._group(_tensor_dict, "torch.Tensor", members)
        # The groups above watch every name their namespace held; those below, fixed lists.
        self.listed = len(self.groups)
        here = vars(sys)
        self._group(lambda: vars(sys), "sys", [(a, here.get(a, _MISSING)) for a in _WATCHED_SYS])
        builtins = _builtins_dict()
        watched = [(a, builtins.get(a, _MISSING)) for a in _WATCHED_BUILTINS]
        self._group(_builtins_dict, "builtins", watched)
        self.sizes = self._sizes()

    def _sizes(self) -> list[int]:
        """How many names each namespace watched whole holds now (-1: it is gone)."""
        sizes = []
        for find, _ in self.groups[: self.listed]:
            namespace = find()
            sizes.append(-1 if namespace is None else len(namespace))
        return sizes

    def _group(self, find: Callable, label: str, items: list, constants: tuple = ()) -> None:
        probes = [((label, k), k, v, _expected(v), False) for k, v in items]
        probes += [((label, k), k, v, (repr(v), _immutable(v)), True) for k, v in constants]
        self.groups.append((find, probes))

    def _module(self, name: str, module: types.ModuleType) -> None:
        own = name.startswith("coursepkg")
        watched, constants, classes = [], [], []
        for attr, value in list(vars(module).items()):
            if callable(value) or isinstance(value, types.ModuleType):
                watched.append((attr, value))
            elif own and attr.isupper():
                constants.append((attr, value))  # mutating them in place counts too
            if own and isinstance(value, type) and value.__module__ == name:
                classes.append((attr, value))
        self._group(_module_dict(name), name, watched, constants)
        for attr, cls in classes:
            members = [
                (key, member)
                for key, member in list(vars(cls).items())
                if callable(member) or isinstance(member, (staticmethod, classmethod))
            ]
            self._group(_class_dict(name, attr), f"{name}.{attr}", members)

    def covers(self) -> bool:
        """Whether a snapshot taken now would watch what this one watches: the same modules
        (the same objects), and as many names in each namespace it watches whole (in ``sys``
        and ``builtins``, a fixed list of names). A snapshot taken earlier in this process then
        still fits; a change to a name both watch is for :meth:`changed` to find."""
        now = {
            name: module
            for name, module in list(sys.modules.items())
            if name == "coursepkg" or name.startswith("coursepkg.") or name in _WATCHED_MODULES
        }
        same = now.keys() == self.modules.keys() and all(
            module is self.modules[name] for name, module in now.items()
        )
        return same and self._sizes() == self.sizes

    def watched(self) -> list[str]:
        """Every dotted name the snapshot watches, as :meth:`changed` names them."""
        names = [f"module.{name}" for name in self.modules]
        return names + [".".join(key) for _, probes in self.groups for key, *_ in probes]

    def changed(self) -> list[str]:
        """The dotted names replaced, mutated or gone since the snapshot."""
        found = [
            f"module.{name}"
            for name, module in self.modules.items()
            if sys.modules.get(name) is not module
        ]
        for find, probes in self.groups:
            namespace = find()
            if namespace is None:
                found += [".".join(key) for key, *_ in probes]
                continue
            for key, name, value, expected, constant in probes:
                now = namespace.get(name, _MISSING)
                if constant:
                    text, immutable = expected
                    if not (now is value and immutable) and repr(now) != text:
                        found.append(".".join(key))
                elif not _same(now, value, expected):
                    found.append(".".join(key))
        return found


def preload_snapshot() -> None:
    """Take the guard's snapshot now, in the fork server after its imports: each kernel forked
    from it then starts with it instead of taking its own (~30-40 ms of a forked kernel's CPU).
    Nothing has run in the server but its imports; anything a kernel changed before its first
    cell would count as a change to the checks, as the kernel's own snapshot never saw it."""
    _PRELOADED["snapshot"] = _Snapshot()


def install_guard(
    shell: Any | None = None, streams: tuple = (), reason: str = ""
) -> Callable[..., None]:
    """Protect the checks from the notebook's code, before every cell of the kernel ``shell``.

    Takes the snapshot now (call it before any student code runs), or takes the one the fork
    server took (:func:`preload_snapshot`) if it watches the same modules, and registers an IPython
    ``pre_run_cell`` hook that (1) puts every ``check_*`` name the notebook bound back to the
    real check (which, when grading, also refuses an answer that is coursepkg's reference
    itself), and (2) compares the snapshot; once anything changed, every check fails with a
    :class:`~coursepkg.grading.CheckFailure` naming what was replaced.

    Args:
        shell: the IPython shell (default: the running one).
        streams: output streams whose per-cell count starts again before each cell (their
            ``reset()``).
        reason: why the notebook is not graded (the grader's): every check fails with it.

    Returns:
        The hook (registered already).
    """
    import coursepkg.grading as grading
    from coursepkg.grading import CheckFailure

    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    checks = {name: getattr(grading, name) for name in grading.__all__ if name.startswith("check_")}
    snapshot = _PRELOADED.pop("snapshot", None)
    if snapshot is None or not snapshot.covers():
        snapshot = _Snapshot()
    state: dict[str, str] = {"reason": reason}

    def refuse(name: str, reason: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise CheckFailure(reason, check=name)

        refused.__name__ = name
        return refused

    guarded = {name: _no_reference(name, check) for name, check in checks.items()}

    def before_cell(info: Any = None, *_: Any) -> None:
        for stream in streams:
            stream.reset()
        # Comparing the snapshot takes ~15 ms, so it is done before cells that call a check
        # (a change made earlier is still found then: the snapshot is the one from the start).
        source = getattr(info, "raw_cell", None)
        if not state["reason"] and (source is None or "check_" in source):
            changed = snapshot.changed()
            if changed:
                shown = ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")
                state["reason"] = (
                    f"the grading code was changed by this notebook ({shown} replaced), so no "
                    "check can be trusted and this test scores 0. Your answers must not modify "
                    "coursepkg, torch, math, sys or builtins."
                )
        namespace = shell.user_ns
        for name, check in guarded.items():
            if name in namespace:
                namespace[name] = refuse(name, state["reason"]) if state["reason"] else check

    shell.events.register("pre_run_cell", before_cell)
    return before_cell


def _no_reference(name: str, check: Callable[..., Any]) -> Callable[..., Any]:
    """The check, refusing an answer that is coursepkg's reference itself: the checks ignore
    calls the reference makes, so ``from coursepkg.attention import scaled_dot_product_attention``
    as the answer would pass."""
    from coursepkg.grading import CheckFailure
    from coursepkg.grading.framework import is_reference_module

    @functools.wraps(check)
    def checked(impl: Any = None, *args: Any, **kwargs: Any) -> Any:
        module = getattr(impl, "__module__", None) or ""
        if is_reference_module(module):
            what = f"{module}.{getattr(impl, '__qualname__', type(impl).__name__)}"
            raise CheckFailure(
                f"your answer is coursepkg's reference implementation ({what}), imported "
                "rather than written; it scores no points. Write it yourself.",
                check=name,
            )
        return check(impl, *args, **kwargs)

    return checked
