"""The public checks, declared in one place: :func:`public_check` turns a check's body into the
function a notebook calls and records it, so the check table and :func:`catalogue` of known
mistakes are read from the same list.

A body has the signature ``body(report, impl, thorough, seed)``, says in its docstring what it
verifies, and either returns (every property held) or fails through ``report``. The public
check built from it has the signature every check shares::

    check_<name>(impl, *, thorough=False, seed=None, points=None) -> CheckResult

When the student's code calls a built-in the exercise asks them to write (a
:class:`ForbiddenCall`), the public check names it from its catalogue: the mistake whose
``calls`` list that built-in (:func:`~.calling.name_forbidden_call`).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .calling import mark_catalogued, name_forbidden_call
from .layout import LAYOUT_MISTAKES
from .results import BugVariant, CheckReport, CheckResult, ForbiddenCall, run_check

__all__ = ["CheckEntry", "catalogue", "mistakes_of", "public_check", "registered_checks"]

Body = Callable[[CheckReport, Any, bool, "int | None"], None]

_COMMON_DOC = """
    Args:
        impl: the student's {kind}.
        thorough: also try extra and randomised shapes (hidden tests).
        seed: picks the randomised shapes and the inputs.
        points: points to report on success.

    Returns:
        A passed :class:`CheckResult` listing what was verified.

    Raises:
        CheckFailure: what is wrong and, for a known mistake, what to change.
"""


@dataclass(frozen=True)
class CheckEntry:
    """One public check as the registry knows it.

    Attributes:
        name: the check's name (``check_layer_norm``).
        check: the public function.
        implements: what the student implements (``LayerNorm``).
        assignment: the assignment it grades (``ex04_encoder``).
        bugs: the known mistakes it recognises.
    """

    name: str
    check: Callable[..., CheckResult]
    implements: str
    assignment: str
    bugs: tuple[BugVariant, ...]


_REGISTRY: dict[str, CheckEntry] = {}


def _signature() -> inspect.Signature:
    keyword = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature(
        [
            inspect.Parameter("impl", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Any"),
            inspect.Parameter("thorough", keyword, default=False, annotation="bool"),
            inspect.Parameter("seed", keyword, default=None, annotation="int | None"),
            inspect.Parameter("points", keyword, default=None, annotation="float | None"),
        ],
        return_annotation="CheckResult",
    )


def public_check(
    *, assignment: str, implements: str, bugs: Sequence[BugVariant] = (), kind: str = "function"
) -> Callable[[Body], Callable[..., CheckResult]]:
    """Decorator: make ``body`` the public check of the same name and register it.

    Args:
        assignment: the assignment the check grades (``ex01_attention``).
        implements: what the student implements, as the table names it.
        bugs: the known mistakes the check recognises (listed by :func:`catalogue`).
        kind: ``"function"`` or ``"class"``, for the docstring of ``impl``.

    Returns:
        The decorator; it raises ``ValueError`` when a check of that name already exists.
    """

    def register(body: Body) -> Callable[..., CheckResult]:
        name = body.__name__
        if name in _REGISTRY:
            raise ValueError(f"a check named {name} is already registered")

        def check(
            impl: Any,
            *,
            thorough: bool = False,
            seed: int | None = None,
            points: float | None = None,
        ) -> CheckResult:
            try:
                return run_check(name, points, body, impl, thorough, seed)
            except ForbiddenCall as failure:  # a built-in the exercise asks them to write
                name_forbidden_call(failure, bugs)
                raise

        check.__name__ = check.__qualname__ = name
        check.__module__ = body.__module__
        check.__doc__ = (body.__doc__ or "").rstrip() + "\n" + _COMMON_DOC.format(kind=kind)
        check.__signature__ = _signature()  # type: ignore[attr-defined]
        _REGISTRY[name] = CheckEntry(name, check, implements, assignment, tuple(bugs))
        mark_catalogued(bug.impl for bug in bugs)
        return check

    return register


def _load_every_check() -> None:
    """Have the grading package import every check module (its ``load_every_check``): it
    imports each when first used, and this module cannot import it (the package imports this
    one). The package is always imported before its subpackages, so it is looked up, not
    imported."""
    sys.modules[__name__.rsplit(".", 2)[0]].load_every_check()


def registered_checks() -> list[CheckEntry]:
    """Every public check, in the order the assignments define them."""
    _load_every_check()
    return sorted(_REGISTRY.values(), key=lambda entry: entry.assignment)


def catalogue() -> list[BugVariant]:
    """Every known mistake the checks recognise, check by check, then the parameter-layout
    differences any module check names (:data:`~.layout.LAYOUT_MISTAKES`)."""
    return [bug for entry in registered_checks() for bug in entry.bugs] + list(LAYOUT_MISTAKES)


def mistakes_of(check: str) -> tuple[BugVariant, ...]:
    """The known mistakes of the check named ``check``: how a later assignment's check names
    the mistake of a piece that an earlier assignment grades, without importing that
    assignment's module (the package imports every check first when that one is not yet).

    Raises:
        KeyError: no check of that name is registered.
    """
    if check not in _REGISTRY:
        _load_every_check()
    return _REGISTRY[check].bugs
