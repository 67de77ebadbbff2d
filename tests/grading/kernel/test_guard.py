"""The guard's snapshot (:mod:`coursepkg.grading.kernel.guard`) finds what the fingerprint it
replaced found: the same names watched, and the same verdict on each kind of change a notebook
could make to the checks, the tolerances, torch, ``sys`` or ``builtins``.

The fingerprint listed every watched namespace again before each check cell; the snapshot holds
the objects and looks each name up. The fingerprint is kept here, whole, as the oracle.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import coursepkg.grading as grading
import coursepkg.grading.checks.ex01_attention as ex01
import coursepkg.grading.framework.compare as compare
from coursepkg.grading.kernel import guard


def _fingerprint() -> dict[tuple[str, ...], Any]:
    """The guard's fingerprint before the snapshot (commit 4544d6a's sandbox._fingerprint)."""
    prints: dict[tuple[str, ...], Any] = {}
    names = [n for n in sys.modules if n == "coursepkg" or n.startswith("coursepkg.")]
    for name in [*names, *guard._WATCHED_MODULES]:
        module = sys.modules.get(name)
        if module is None:
            continue
        prints[("module", name)] = id(module)
        own = name.startswith("coursepkg")
        for attr, value in list(vars(module).items()):
            if callable(value) or isinstance(value, type(sys)):
                prints[(name, attr)] = guard._identity(value)
            elif own and attr.isupper():
                prints[(name, attr)] = repr(value)
            if own and isinstance(value, type) and value.__module__ == name:
                for key, member in list(vars(value).items()):
                    if callable(member) or isinstance(member, (staticmethod, classmethod)):
                        prints[(name, attr, key)] = guard._identity(member)
    for attr, member in list(vars(sys.modules["torch"].Tensor).items()):
        if callable(member):
            prints[("torch.Tensor", attr)] = guard._identity(member)
    for attr in guard._WATCHED_SYS:
        prints[("sys", attr)] = guard._identity(getattr(sys, attr, None))
    for attr in guard._WATCHED_BUILTINS:
        prints[("builtins", attr)] = guard._identity(getattr(builtins, attr, None))
    return prints


def _oracle_changed(before: dict) -> list[str]:
    after = _fingerprint()
    changed = [key for key, value in before.items() if after.get(key) != value]
    return [".".join(("module." + k[1],) if k[0] == "module" else k) for k in changed]


@contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


@contextmanager
def _deleted(owner: Any, name: str) -> Iterator[None]:
    old = getattr(owner, name)
    delattr(owner, name)
    try:
        yield
    finally:
        setattr(owner, name, old)


@contextmanager
def _appended(items: list, value: Any) -> Iterator[None]:
    items.append(value)
    try:
        yield
    finally:
        items.pop()


def _bug_field(bug: Any, field: str, value: Any) -> Callable[[], Any]:
    @contextmanager
    def change() -> Iterator[None]:
        old = getattr(bug, field)
        object.__setattr__(bug, field, value)  # a frozen dataclass too
        try:
            yield
        finally:
            object.__setattr__(bug, field, old)

    return change


def _a_function_of(module: Any) -> Any:
    return next(v for v in vars(module).values() if type(v).__name__ == "function")


def _a_class_with_a_method() -> tuple[Any, type, str]:
    """A module of the checks' framework, a class it defines and a method of that class."""
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("coursepkg.grading.framework."):
            continue
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == name:
                for key, member in vars(value).items():
                    if type(member).__name__ == "function":
                        return module, value, key
    raise AssertionError("the framework defines no class with a method")


def _changes() -> dict[str, Callable[[], Any]]:
    """Each kind of change to what the checks rely on, as a context manager that undoes it."""
    helper = _a_function_of(compare)
    home, cls, method = _a_class_with_a_method()
    with_defaults = next(
        f for f in vars(compare).values() if type(f).__name__ == "function" and f.__defaults__
    )
    with_kwdefaults = next(
        f
        for m in (compare, ex01, grading)
        for f in vars(m).values()
        if type(f).__name__ == "function" and f.__kwdefaults__
    )
    bug = ex01.SDPA_BUGS[0]
    return {
        "a check replaced": lambda: _replaced(ex01, "check_scaled_dot_product_attention", len),
        "a helper replaced": lambda: _replaced(compare, helper.__name__, lambda *a, **k: None),
        "a helper's code replaced": lambda: _replaced(helper, "__code__", (lambda: None).__code__),
        "a helper's defaults": lambda: _replaced(with_defaults, "__defaults__", (None,)),
        "keyword defaults": lambda: _replaced(with_kwdefaults, "__kwdefaults__", {}),
        "a method replaced": lambda: _replaced(cls, method, lambda self: None),
        "a class replaced": lambda: _replaced(home, cls.__name__, type("Fake", (), {})),
        "a helper deleted": lambda: _deleted(compare, helper.__name__),
        "a catalogue grown": lambda: _appended(ex01.SDPA_BUGS, bug),
        "a catalogue entry edited": _bug_field(bug, "advice", "anything goes"),
        "a constant rebound": lambda: _replaced(ex01, "SDPA_BUGS", []),
        "torch.allclose": lambda: _replaced(torch, "allclose", lambda *a, **k: True),
        "torch.testing.assert_close": lambda: _replaced(
            torch.testing, "assert_close", lambda *a, **k: None
        ),
        "a Tensor method": lambda: _replaced(torch.Tensor, "__repr__", lambda self: "x"),
        "sys.settrace": lambda: _replaced(sys, "settrace", lambda *a: None),
        "builtins.len": lambda: _replaced(builtins, "len", lambda x: 0),
        "a module swapped in sys.modules": lambda: _replaced_module("coursepkg.grading.framework"),
    }


@contextmanager
def _replaced_module(name: str) -> Iterator[None]:
    old = sys.modules[name]
    sys.modules[name] = type(old)(name)
    try:
        yield
    finally:
        sys.modules[name] = old


@pytest.fixture(scope="module")
def watched() -> None:
    grading.load_every_check()  # what the fork server has imported before any kernel
    for name in grading.__all__:  # and the names it has looked up (coursepkg.grading's lazy)
        getattr(grading, name)


def test_the_snapshot_watches_what_the_fingerprint_did(watched):
    oracle = [".".join(("module." + k[1],) if k[0] == "module" else k) for k in _fingerprint()]
    snapshot = guard._Snapshot()
    assert sorted(snapshot.watched()) == sorted(oracle)
    assert len(oracle) > 5000  # every check module and its catalogue
    assert snapshot.changed() == []
    # New modules imported later are not in either (they were not there to guard).


CHANGES = [
    "a check replaced",
    "a helper replaced",
    "a helper's code replaced",
    "a helper's defaults",
    "keyword defaults",
    "a method replaced",
    "a class replaced",
    "a helper deleted",
    "a catalogue grown",
    "a catalogue entry edited",
    "a constant rebound",
    "torch.allclose",
    "torch.testing.assert_close",
    "a Tensor method",
    "sys.settrace",
    "builtins.len",
    "a module swapped in sys.modules",
]


def test_every_change_is_tried(watched):
    assert sorted(CHANGES) == sorted(_changes())


@pytest.mark.parametrize("change", CHANGES)
def test_each_change_is_found_as_the_fingerprint_found_it(watched, change):
    before, snapshot = _fingerprint(), guard._Snapshot()
    with _changes()[change]():
        expected = _oracle_changed(before)
        found = snapshot.changed()
    assert expected, f"the oracle misses {change!r}: the case tests nothing"
    assert sorted(found) == sorted(expected)
    assert snapshot.changed() == [] == _oracle_changed(before)  # undone: nothing to report


class _Shell:
    """What the guard uses of an IPython shell: its events and the notebook's namespace."""

    def __init__(self) -> None:
        self.hooks: list[Callable[..., None]] = []
        self.events = self
        self.user_ns: dict[str, Any] = {}

    def register(self, event: str, hook: Callable[..., None]) -> None:
        assert event == "pre_run_cell"
        self.hooks.append(hook)


@pytest.fixture
def snapshots_made(monkeypatch) -> list[int]:
    """Counts the snapshots taken; the server's preloaded one is this test's own."""
    monkeypatch.setattr(guard, "_PRELOADED", {})
    made: list[int] = []
    real = guard._Snapshot.__init__

    def counted(self) -> None:
        made.append(1)
        real(self)

    monkeypatch.setattr(guard._Snapshot, "__init__", counted)
    return made


def test_a_kernel_starts_with_the_snapshot_its_server_took(watched, snapshots_made):
    guard.preload_snapshot()  # in the fork server, before it forks
    assert len(snapshots_made) == 1
    shell = _Shell()
    hook = guard.install_guard(shell)  # in the kernel, before the first cell
    assert len(snapshots_made) == 1 and guard._PRELOADED == {}
    name = "check_scaled_dot_product_attention"
    shell.user_ns[name] = None
    with _changes()["a helper replaced"]():  # the notebook's change, after the server's snapshot
        hook(SimpleNamespace(raw_cell=f"{name}(f)"))
    with pytest.raises(grading.CheckFailure, match="grading code was changed"):
        shell.user_ns[name](None)


@contextmanager
def _module_imported() -> Iterator[None]:
    name = "coursepkg._imported_after_the_server"
    sys.modules[name] = type(sys)(name)
    try:
        yield
    finally:
        del sys.modules[name]


@contextmanager
def _name_added() -> Iterator[None]:
    ex01._added_after_the_server = len
    try:
        yield
    finally:
        del ex01._added_after_the_server


@pytest.mark.parametrize("change", [_module_imported, _name_added])
def test_a_kernel_that_imported_or_added_more_takes_its_own_snapshot(
    watched, snapshots_made, change
):
    guard.preload_snapshot()
    name = "check_scaled_dot_product_attention"
    with change():
        shell = _Shell()
        hook = guard.install_guard(shell)
        assert len(snapshots_made) == 2  # what the kernel added is watched too
        assert guard._PRELOADED == {}
        shell.user_ns[name] = None
        hook(SimpleNamespace(raw_cell=f"{name}(f)"))
    # nothing changed since the kernel's own snapshot: the name is the real check again
    assert shell.user_ns[name].__wrapped__ is getattr(grading, name)
