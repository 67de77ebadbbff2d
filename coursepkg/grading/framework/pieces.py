"""The pieces a layer check is made of, shared by the encoder and decoder layers: calling a
student's module under watch (:func:`guarded`), and the layer's submodules as
:func:`~.locate.locate` sees them (an attention block, the feed-forward network, a LayerNorm).

A piece names its mistake with the catalogue of the earlier check that grades it, looked up in
the registry by that check's name (:func:`~.registry.mistakes_of`), so a layer's check needs
no import of another assignment's module.

Dimension legend: B batch, L length, D d_model, H heads, F d_ff.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from .calling import call_student, forbidden_calls
from .locate import Piece
from .norms import analyse_norm, combined
from .registry import mistakes_of
from .results import BugVariant
from .weights import diagnose_structure

__all__ = [
    "attention_piece",
    "feed_forward_piece",
    "guarded",
    "layer_norm_piece",
    "norm_probe",
    "piece_count_mistake",
]

PieceInputs = Callable[[Sequence[Any]], tuple[Any, ...]]


def guarded(module: nn.Module, item: str, **forbid: Any) -> Callable[..., Any]:
    """Call the student's module with :func:`call_student`, each call watched by
    :func:`forbidden_calls` (so the check's own work between calls, such as swapping
    reference pieces into the student's module, is never mistaken for the student's)."""

    def call(*inputs: Any) -> Any:
        with forbidden_calls(item, **forbid):
            return call_student(module, *inputs, item=item)

    return call


def attention_piece(name: str, d: int, h: int, inputs: PieceInputs) -> Piece:
    """A multi-head attention block of a layer, for :func:`locate` (ex02's catalogue)."""
    check = "check_multi_head_attention"
    return Piece(name, "MultiHeadAttention", check, mistakes_of(check), (d, h), inputs)


def feed_forward_piece(d: int, d_ff: int) -> Piece:
    """The layer's ``ffn``, called on the layer's first input (ex04's catalogue)."""
    check = "check_feed_forward"
    return Piece(
        "ffn", "PositionwiseFeedForward", check, mistakes_of(check), (d, d_ff), lambda i: (i[0],)
    )


def layer_norm_piece(name: str, d: int, inputs: PieceInputs) -> Piece:
    """A LayerNorm of a layer (ex04's catalogue); its mistake is first read from the module
    itself (:func:`analyse_norm`)."""
    check = "check_layer_norm"
    bugs = mistakes_of(check)
    return Piece(
        name,
        "LayerNorm",
        check,
        bugs,
        (d,),
        inputs,
        analyse=lambda m: combined(analyse_norm(m, d, bugs)),
    )


def norm_probe(x: Tensor) -> Tensor:
    """A LayerNorm input on which every LayerNorm mistake shows: the layer input with one
    nearly constant position (where eps matters) and an offset."""
    probe = x.detach().clone() * 2 + 1
    probe[:, 0] = probe[:, 0] * 1e-3 + 0.01
    return probe


def piece_count_mistake(
    student: nn.Module, reference: nn.Module, pieces: Sequence[Piece]
) -> BugVariant | None:
    """The known mistake of the first of a layer's pieces whose parameters differ from the
    reference piece's (an attention block without biases, a feed-forward of fixed width), from
    that piece's catalogue (:func:`diagnose_structure` on the piece)."""
    for piece in pieces:
        own, ref_piece = getattr(student, piece.name, None), getattr(reference, piece.name)
        if not isinstance(own, nn.Module):
            continue
        bug = diagnose_structure(own, ref_piece, piece.bugs, piece.args)
        if bug is not None:
            return bug
    return None
