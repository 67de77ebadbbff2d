"""Which piece of a student's layer is wrong: one locator for every layer check.

Given a student's layer and the reference layer sharing its weights, :func:`locate` gathers
evidence in three steps, stopping at the first that finds a wrong piece: each piece called on
its own against the reference's piece; each student piece put into a copy of the reference
layer; and, when every piece looks right both ways, the reference's pieces swapped one at a
time into the student's layer (a piece may behave differently inside the student's layer, e.g.
through keyword arguments). The wrong pieces are then all swapped for the reference's to judge
the rest of the layer. :func:`piece_mistake` names the known mistake of a wrong piece.

Dimension legend: B batch, L length, D d_model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .compare import TOLERANCES, diagnose
from .results import BugVariant
from .weights import clone_module, module_runner, swap_in

__all__ = ["Piece", "is_close", "locate", "piece_mistake"]


@dataclass(frozen=True)
class Piece:
    """One submodule of a layer, as the locator sees it.

    Attributes:
        name: the attribute of the layer (``norm2``).
        kind: the class a student knows it as (``LayerNorm``).
        check: the earlier assignment's check of that class (``check_layer_norm``).
        bugs: that class's catalogue of known mistakes.
        args: the constructor arguments of a catalogued variant (``(D,)``).
        inputs: the layer's inputs -> the inputs of this piece.
        analyse: recognises a mistake from the piece itself (LayerNorm's denominators), tried
            before comparing outputs with the catalogue.
    """

    name: str
    kind: str
    check: str
    bugs: Sequence[BugVariant]
    args: Sequence[int]
    inputs: Callable[[Sequence[Any]], tuple[Any, ...]]
    analyse: Callable[[nn.Module], BugVariant | None] | None = None


def is_close(actual: Any, expected: Tensor) -> bool:
    """Whether ``actual`` is a tensor of ``expected``'s shape, within the per-dtype
    tolerances; anything else (another type, an error while comparing) is not close."""
    if not isinstance(actual, Tensor) or actual.shape != expected.shape:
        return False
    rtol, atol = TOLERANCES.get(expected.dtype, TOLERANCES[torch.float32])
    try:
        return bool(
            torch.allclose(actual.detach().to(expected.dtype), expected, rtol=rtol, atol=atol)
        )
    except RuntimeError:
        return False


class _AttentionOnly(nn.Module):
    """A student's attention block inside a reference layer, which passes a key/value cache
    after the mask: only ``(query, key, value, mask)`` reach the student's block."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Any = None, *_: Any) -> Any:
        return self.inner(query, key, value, mask)


def _runs_close(run: Callable[[], Any], expected: Tensor) -> bool:
    """Whether ``run()`` gives ``expected``; an error counts as not."""
    try:
        with torch.no_grad():
            return is_close(run(), expected)
    except Exception:  # noqa: BLE001 - a piece that cannot run here is a wrong piece
        return False


def _wrong_alone(student: nn.Module, reference: nn.Module, probe: Sequence[Any], pieces) -> list:
    """The pieces that differ from the reference's when called on their own."""
    wrong = []
    for piece in pieces:
        own = getattr(student, piece.name, None)
        args = piece.inputs(probe)
        with torch.no_grad():
            expected = getattr(reference, piece.name)(*args)
        if own is None or not _runs_close(lambda own=own, args=args: own(*args), expected):
            wrong.append(piece.name)
    return wrong


def _wrong_in_reference(student: nn.Module, reference: nn.Module, inputs, expected, pieces) -> list:
    """The student's pieces that change the reference layer's output when put into it."""
    wrong = []
    for piece in pieces:
        hybrid = copy.deepcopy(reference)
        own = clone_module(getattr(student, piece.name))
        setattr(hybrid, piece.name, _AttentionOnly(own) if piece.name.endswith("attn") else own)
        if not _runs_close(lambda hybrid=hybrid: hybrid(*inputs), expected):
            wrong.append(piece.name)
    return wrong


def _first_repair(student: nn.Module, reference: nn.Module, inputs, expected, pieces) -> list:
    """The first piece whose reference swapped into the student's layer makes it right."""
    for piece in pieces:
        repaired = clone_module(student)
        swap_in(repaired, piece.name, getattr(reference, piece.name))
        if _runs_close(lambda repaired=repaired: repaired(*inputs), expected):
            return [piece.name]
    return []


def locate(
    student: nn.Module,
    reference: nn.Module,
    inputs: Sequence[Any],
    pieces: Sequence[Piece],
    *,
    layer: str,
    probe: Sequence[Any] | None = None,
) -> tuple[str, list[str]]:
    """Say which of the student's pieces are wrong, given the reference's weights in both.

    Args:
        student: the student's layer, holding the reference's weights.
        reference: the reference layer.
        inputs: the layer inputs on which the two differ.
        pieces: the layer's submodules, in the order the forward pass uses them.
        layer: the class, for the message (``DecoderLayer``).
        probe: layer inputs for calling each piece on its own (default ``inputs``).

    Returns:
        ``(sentence, wrong)``: what was found, and the names of the wrong pieces (empty when
        every piece is right and the forward pass combines them wrongly).
    """
    with torch.no_grad():
        expected = reference(*inputs)
    wrong = (
        _wrong_alone(student, reference, inputs if probe is None else probe, pieces)
        or _wrong_in_reference(student, reference, inputs, expected, pieces)
        or _first_repair(student, reference, inputs, expected, pieces)
    )
    if not wrong:
        names = ", ".join(p.name for p in pieces)
        return (
            f"Each of your pieces ({names}) gives the reference's result, on its own and inside "
            "the reference layer, so the mistake is in how forward combines them.",
            [],
        )
    repaired = clone_module(student)
    for name in wrong:
        swap_in(repaired, name, getattr(reference, name))
    swap_error = None
    try:
        with torch.no_grad():
            rest_right = is_close(repaired(*inputs), expected)
    except Exception as exc:  # noqa: BLE001 - said in the message, not blamed on the wiring
        rest_right, swap_error = False, f"{type(exc).__name__}: {exc}"
    return _sentence(wrong, pieces, layer, rest_right, swap_error), wrong


def _sentence(
    wrong: list[str], pieces: Sequence[Piece], layer: str, rest_right: bool, swap_error: str | None
) -> str:
    by_name = {p.name: p for p in pieces}
    kinds = list(dict.fromkeys(by_name[n].kind for n in wrong))
    checks = list(dict.fromkeys(by_name[n].check for n in wrong))
    names = ", ".join(wrong)
    first, others = wrong[0], wrong[1:]
    text = f"Your {first} differs from the reference {by_name[first].kind} given the same weights"
    if others:
        text += f" (and so does your {', '.join(others)})"
    if swap_error is not None:
        text += (
            f". The reference's {names} could not be swapped into your layer to judge the rest "
            f"({swap_error}), so fix {names} first and run the check again."
        )
    elif rest_right:
        text += (
            f"; with the reference's {names} swapped in, your {layer} matches, so the rest of "
            "your layer is right."
        )
    else:
        text += (
            f"; even with the reference's {names} swapped in, your {layer} differs, so check "
            "how your forward connects them too."
        )
    return text + f" Fix your {' and '.join(kinds)} first: {' and '.join(checks)} says more."


def piece_mistake(
    student: nn.Module,
    reference: nn.Module,
    pieces: Sequence[Piece],
    inputs: Sequence[Any],
    names: Sequence[str] | None = None,
) -> tuple[str, BugVariant] | None:
    """The first of the student's pieces (of ``names``, default all) that differs from the
    reference's piece on its own and whose known mistake can be named.

    Args:
        student, reference: the two layers, sharing weights.
        pieces: the layer's submodules.
        inputs: layer inputs; each piece is called on ``piece.inputs(inputs)``.
        names: which pieces to try, in order.

    Returns:
        ``(piece name, mistake)``, or None when no piece's mistake is known.
    """
    by_name = {p.name: p for p in pieces}
    for name in names if names is not None else list(by_name):
        piece, own, ref_piece = (
            by_name[name],
            getattr(student, name, None),
            getattr(reference, name),
        )
        if not isinstance(own, nn.Module):
            continue
        args = piece.inputs(inputs)
        with torch.no_grad():
            expected = ref_piece(*args)
            if _runs_close(lambda own=own, args=args: own(*args), expected):
                continue
            bug = piece.analyse(own) if piece.analyse is not None else None
            bug = bug or diagnose(
                lambda *a, own=own: own(*a),
                piece.bugs,
                args,
                run=module_runner(ref_piece, piece.args),
                reference_output=expected,
            )
        if bug is not None:
            return name, bug
    return None
