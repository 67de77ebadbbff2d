"""ex09_training_run's own-pieces check: the model and the notebook's code use the student's own
pieces, not the course's reference or PyTorch's ready-made layers (allowed, but they cost this
check's points; the accuracy points stay the student's)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from torch import nn

from ..framework import CheckFailure, CheckReport, CheckResult, NotImplementedYet, run_check

__all__ = ["check_own_pieces"]


# What the earlier assignments wrote by hand; using one of these instead costs the points.
_TORCH_STAND_INS = (
    nn.Transformer,
    nn.TransformerEncoder,
    nn.TransformerDecoder,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
    nn.MultiheadAttention,
    nn.LayerNorm,
)
_TORCH_FUNCTIONS = ("scaled_dot_product_attention", "multi_head_attention_forward", "layer_norm")
_ALLOWED_PACKAGES = ("coursepkg.data", "coursepkg.grading")


def _reference_name(obj: Any) -> str | None:
    """``module.name`` when ``obj`` is a piece of the course's reference implementation."""
    module = obj.__name__ if isinstance(obj, type(os)) else getattr(obj, "__module__", None)
    if not isinstance(module, str):
        return None
    if module == "coursepkg" or module.startswith("coursepkg."):
        if not module.startswith(_ALLOWED_PACKAGES):
            return module if isinstance(obj, type(os)) else f"{module}.{obj.__qualname__}"
    return None


def _code_names(obj: Any) -> set[str]:
    """Global names the functions of ``obj`` (a function or a class's methods) refer to."""
    functions = [obj] if callable(obj) and not isinstance(obj, type) else []
    if isinstance(obj, type):
        functions = [v for v in vars(obj).values() if callable(v)]
    names: set[str] = set()
    for fn in functions:
        code = getattr(fn, "__code__", None)
        stack = [code] if code is not None else []
        while stack:
            c = stack.pop()
            names.update(c.co_names)
            stack.extend(k for k in c.co_consts if hasattr(k, "co_names"))
    return names


def check_own_pieces(
    model: nn.Module, namespace: Mapping[str, Any], *, points: float | None = None
) -> CheckResult:
    """Pass when the model and the notebook's code use the student's own pieces only.

    A piece of ``coursepkg`` (other than its data and grading) or PyTorch's ready-made
    Transformer layers, attention or layer norm, whether in the model or bound to a name in
    the notebook, is a stand-in: allowed, but it costs this check's points.

    Args:
        model: the trained model.
        namespace: the notebook's globals (``globals()``).
        points: shown in the result.
    """
    return run_check("check_own_pieces", points, _own_pieces, model, namespace)


def _own_pieces(report: CheckReport, model: nn.Module, namespace: Mapping[str, Any]) -> None:
    if model is None:
        raise NotImplementedYet("model", "the training cell did not build and train it")
    stand_ins: set[str] = set()
    for module in model.modules():
        cls = type(module)
        ref = _reference_name(cls)
        if ref:
            stand_ins.add(ref)
        elif issubclass(cls, _TORCH_STAND_INS):
            stand_ins.add(f"torch.nn.{cls.__name__}")
    for key, value in namespace.items():
        if key.startswith("_"):
            continue
        ref = _reference_name(value)
        if ref:
            stand_ins.add(ref)
        elif callable(value) and getattr(value, "__module__", None) in ("__main__", None):
            used = _code_names(value) & set(_TORCH_FUNCTIONS)
            stand_ins.update(f"torch.nn.functional.{u} (in {key})" for u in sorted(used))
    if stand_ins:
        raise CheckFailure(
            "Reference stand-ins in use (they cost this test's points; the accuracy points "
            "stay yours): " + ", ".join(sorted(stand_ins)) + "."
        )
    report.ok("the model is built from your pieces")
