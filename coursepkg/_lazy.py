"""Names of a package imported from their modules on first use (PEP 562).

A package lists ``name -> module`` in a dict and sets ``__getattr__ = lazy_attributes(...)``:
``from package import name`` then imports only that name's module, the first time. The course
uses it where importing everything up front would cost processes that need little of it: a
notebook's first cell imports its own assignment's checks only (``coursepkg.grading``), and a
Dask worker of ``coursepkg grade`` never imports the client's reports and torch
(``coursepkg.grading.classroom``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any], submodules: bool = False
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: each name of ``homes`` imported from its module.

    Args:
        package: the package's ``__name__`` (the modules in ``homes`` are relative to it).
        homes: name -> the module that defines it (``".attention"``).
        namespace: the package's ``globals()``, where a name is kept once imported.
        submodules: also give a submodule for its name (``package.sub`` without importing it
            first).

    Returns:
        The function to assign to the package's ``__getattr__``; it raises ``AttributeError``
        for any other name.
    """

    def __getattr__(name: str) -> Any:
        from importlib import import_module

        home = homes.get(name)
        if home is not None:
            value = getattr(import_module(home, package), name)
        elif submodules and not name.startswith("_") and _has_submodule(package, name):
            value = import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    return __getattr__


def _has_submodule(package: str, name: str) -> bool:
    from importlib.util import find_spec

    return find_spec(f"{package}.{name}") is not None
