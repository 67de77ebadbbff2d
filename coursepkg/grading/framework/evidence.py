"""What about a check's input made a student's code raise: the sizes an error message quotes,
read back as the dimensions of the arguments they belong to, and the properties of the input
the error is about (a non-contiguous view, a dtype, a bool mask, an empty cache).

:func:`~.calling.call_student` adds these lines to the message of any exception the student's
code raises, so "RuntimeError: The size of tensor a (5) must match the size of tensor b (4)"
comes with "5 is the size of x.shape[1]; 4 of mask.shape[-1]".
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["input_clues"]

_NUMBER = re.compile(r"(?<![\w.])(\d+)(?![\w.])")
#: (words of the error, the property, a test of one argument)
_PROPERTIES: tuple[tuple[tuple[str, ...], str, Callable[[Any], bool]], ...] = (
    (
        ("view size is not compatible", "contiguous"),
        "is not contiguous (a transposed view): .view() fails on it where .reshape() works",
        lambda a: isinstance(a, Tensor) and a.dim() > 1 and not a.is_contiguous(),
    ),
    (
        ("dtype", "scalar type", "double", "float", "half", "bfloat16"),
        "is {dtype}",
        lambda a: isinstance(a, Tensor) and a.is_floating_point() and a.dtype.itemsize != 4,
    ),
    (
        ("bool", "boolean", "subtract", "~", "bitwise"),
        "is a bool tensor (True = may attend)",
        lambda a: isinstance(a, Tensor) and a.dtype == torch.bool,
    ),
    (
        ("keyerror", "'k'", "'v'", "empty"),
        "is an empty dict (a new sequence starts with an empty cache)",
        lambda a: isinstance(a, dict) and not a,
    ),
)


def _named_arguments(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> list[tuple[str, Any]]:
    """The arguments with the names the student's signature gives them (``argument 1`` where
    the signature cannot be read or bound)."""
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
        return list(bound.arguments.items())
    except (TypeError, ValueError):
        named = [(f"argument {i + 1}", a) for i, a in enumerate(args)]
        return named + list(kwargs.items())


def _sizes(named: list[tuple[str, Any]], number: int) -> list[str]:
    """Where ``number`` is a dimension of a tensor argument (``x.shape[1]``)."""
    where = []
    for name, value in named:
        if isinstance(value, Tensor):
            where += [f"{name}.shape[{d}]" for d, n in enumerate(value.shape) if n == number]
    return where


def _shape_line(named: list[tuple[str, Any]]) -> str:
    parts = []
    for name, value in named:
        if isinstance(value, Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            parts.append(f"{name} {tuple(value.shape)} {dtype}")
        elif isinstance(value, (int, float, bool)) or value is None:
            parts.append(f"{name}={value!r}")
        elif isinstance(value, dict):
            parts.append(f"{name}={{...{len(value)} keys}}" if value else f"{name}={{}}")
    return ", ".join(parts)


def input_clues(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], error: str
) -> list[str]:
    """Lines that tie an error message to the input that triggered it.

    Args:
        fn: the student's function or module (its signature names the arguments).
        args, kwargs: what the check passed.
        error: the exception's text (``"RuntimeError: ..."``).

    Returns:
        The input's shapes and dtypes, which argument dimension each size the error quotes
        is, and the properties of the input the error's words point at; empty when there is
        nothing to say (no tensors, no sizes).
    """
    named = _named_arguments(fn, args, kwargs)
    line = _shape_line(named)
    if not line:
        return []
    lines = [f"Your code was called with: {line}."]
    seen: list[str] = []
    for match in _NUMBER.finditer(error):
        number = int(match.group(1))
        where = _sizes(named, number) if number > 1 else []
        if where and match.group(1) not in seen:
            seen.append(match.group(1))
            lines.append(f"In the error, {number} is the size of {' and '.join(where[:3])}.")
        if len(seen) == 3:
            break
    lowered = error.lower()
    for words, text, has in _PROPERTIES:
        if any(w in lowered for w in words):
            for name, value in named:
                if has(value):
                    dtype = str(getattr(value, "dtype", "")).removeprefix("torch.")
                    lines.append(f"The input {name} {text.format(dtype=dtype)}.")
    return lines
