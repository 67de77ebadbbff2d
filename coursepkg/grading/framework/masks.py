"""The mask properties, written once for any callable under test: no mask, padding invariance
(what a padding mask hides changes nothing), causal invariance (later positions change nothing
earlier) and a fully masked row (no NaN, the reference's output).

A check describes its callable as a :class:`MaskedBlock` (how to call the student's code, how
to compare it with the reference, how to name a known mistake) and its inputs as
:class:`MaskCases` (one :class:`Invariance` per hidden part, one :class:`FullyMasked` call);
:func:`run_mask_properties` runs them in order. :func:`hide_padding` and :func:`change_later`
build the changed inputs of the two invariances for a (B, L, D) sequence;
:func:`run_attention_cases` builds everything for an attention block called as
``f(query, key, value, mask)``.

Dimension legend: B batch, L queries, S keys, D d_model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ...masks import causal_mask
from .calling import expect_tensor
from .compare import TOLERANCES, diagnose, expect_close, max_abs_error, near, outputs_match_safely
from .inputs import describe, dtype_name, randn, random_keep
from .results import BugVariant, CheckFailure, CheckReport

#: The convention every message about masks quotes.
MASK_RULE = (
    "The course's convention is True = may attend, False = must not attend (the opposite of "
    "nn.MultiheadAttention's masks)."
)

Inputs = tuple[Any, ...]


def _whole(output: Any) -> Any:
    return output


@dataclass(frozen=True)
class MaskedBlock:
    """The callable under test, as the mask properties see it.

    Attributes:
        report: the running check's report.
        output: the student's output on some inputs (the tensor the invariances compare).
        compare: ``compare(inputs, case)`` fails unless the student's output on ``inputs``
            is the reference's (``case`` names the inputs in the message); returns the
            student's output.
        mistake: the known mistake the student's output matches on some inputs, if any
            (None: the check names none here).
        parts: the named outputs a fully masked row must keep finite (default: ``output``);
            may be a generator, so that each part is guarded only when it is reached.
    """

    report: CheckReport
    output: Callable[[Inputs], Any]
    compare: Callable[[Inputs, str], Any]
    mistake: Callable[[Inputs], BugVariant | None] | None = None
    parts: Callable[[Inputs], Iterable[tuple[str, Any]]] | None = None

    def named_parts(self, inputs: Inputs) -> Iterable[tuple[str, Any]]:
        """The outputs to check for non-finite numbers."""
        if self.parts is not None:
            return self.parts(inputs)
        return [("output", self.output(inputs))]


@dataclass(frozen=True)
class Invariance:
    """One invariance: a call under a mask, the same call with what the mask hides changed,
    and the part of the output that must not move.

    Attributes:
        inputs: the call under the mask.
        changed: the same call with the hidden positions (or the later ones) replaced.
        what: the quantity compared, for the message.
        case: when given, ``inputs`` are also compared with the reference under this name.
        compare_after: compare with the reference after the invariance (default: before).
        keep: picks the outputs that must stay (default: all of them).
        hint: advice added when no known mistake matches.
        message: when given, the invariance fails when the largest change exceeds the
            float32 tolerance ``atol + rtol``, with ``message(largest change)`` as its text.
    """

    inputs: Inputs
    changed: Inputs
    what: str
    case: str | None = None
    compare_after: bool = False
    keep: Callable[[Any], Any] = _whole
    hint: str = ""
    message: Callable[[float], str] | None = None


@dataclass(frozen=True)
class FullyMasked:
    """A call in which some query may attend nothing.

    Attributes:
        inputs: the call.
        case: the name of the comparison with the reference.
        message: ``message(part name)``, the text when a part has a value ``bad`` flags
            (None: no separate check, the comparison alone decides).
        bad: the values that must not appear (default: NaN).
        name_mistake: whether that failure names the matching known mistake.
    """

    inputs: Inputs
    case: str
    message: Callable[[str], str] | None = None
    bad: Callable[[Tensor], Tensor] = torch.isnan
    name_mistake: bool = True


@dataclass(frozen=True)
class MaskCases:
    """The inputs of the mask properties, in the order they run.

    Attributes:
        no_mask: a call without a mask, compared with the reference as "no mask".
        invariances: padding and causal invariances, in the check's order.
        fully_masked: the fully masked row.
    """

    no_mask: Inputs | None = None
    invariances: Sequence[Invariance] = field(default_factory=tuple)
    fully_masked: FullyMasked | None = None


def run_mask_properties(block: MaskedBlock, cases: MaskCases) -> None:
    """Run the mask properties of ``cases`` on ``block``; the first that fails raises.

    Args:
        block: the callable under test and its reference.
        cases: the inputs of each property (a property without inputs is skipped).

    Raises:
        CheckFailure: through ``block.report``, naming the property, the numbers and a
            matching known mistake.
    """
    if cases.no_mask is not None:
        block.compare(cases.no_mask, "no mask")
    for invariance in cases.invariances:
        check_invariance(block, invariance)
    if cases.fully_masked is not None:
        check_fully_masked(block, cases.fully_masked)


def check_invariance(block: MaskedBlock, case: Invariance) -> None:
    """Fail unless changing what the mask hides leaves the kept outputs as they were.

    Args:
        block: the callable under test.
        case: the call, its changed twin and the outputs that must stay.
    """
    if case.case is not None and not case.compare_after:
        before = block.compare(case.inputs, case.case)
    else:
        before = block.output(case.inputs)
    after = block.output(case.changed)

    def diagnosis() -> BugVariant | None:
        return block.mistake(case.inputs) if block.mistake is not None else None

    if case.message is None:
        expect_close(
            block.report,
            case.keep(after),
            case.keep(before),
            case.what,
            diagnosis=diagnosis,
            hint=case.hint,
        )
    else:
        rtol, atol = TOLERANCES[torch.float32]
        err = max_abs_error(case.keep(after), case.keep(before))
        if err > atol + rtol:
            block.report.fail(case.message(err), diagnosis())
    if case.case is not None and case.compare_after:
        block.compare(case.inputs, case.case)


def check_fully_masked(block: MaskedBlock, case: FullyMasked) -> None:
    """Fail when a part of the output has a value ``case.bad`` flags, then unless the output
    is the reference's.

    Args:
        block: the callable under test.
        case: the call in which some query may attend nothing.
    """
    if case.message is not None:
        for name, value in block.named_parts(case.inputs):
            if isinstance(value, Tensor) and bool(case.bad(value).any()):
                named = case.name_mistake and block.mistake is not None
                block.report.fail(case.message(name), block.mistake(case.inputs) if named else None)
    block.compare(case.inputs, case.case)


# ---------------------------------------------------------------------------------------------
# Inputs: what a padding mask hides, what a causal mask hides
# ---------------------------------------------------------------------------------------------


def hide_padding(gen: torch.Generator, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A random padding mask over the positions of ``x`` and ``x`` with the positions it hides
    replaced by other, larger numbers.

    Shape:
        x: (B, S, D); returns the mask (B, 1, 1, S), the kept positions (B, S) and the changed
        ``x`` (B, S, D).
    """
    (b, n, d), dtype = x.shape, x.dtype
    keep = random_keep(gen, b, n)  # (B, S)
    mask = keep[:, None, None, :]  # (B, 1, 1, S)
    changed = torch.where(keep[..., None], x, randn(gen, b, n, d, dtype=dtype) * 3)  # (B, S, D)
    return mask, keep, changed


def change_later(gen: torch.Generator, x: Tensor) -> tuple[Tensor, int, Tensor]:
    """A causal mask over the positions of ``x``, ``cut = L // 2``, and ``x`` with the positions
    from ``cut`` on replaced (the outputs before ``cut`` must not move).

    Shape:
        x: (B, L, D); returns the mask (L, L), ``cut`` and the changed ``x`` (B, L, D).
    """
    (b, n, d), dtype = x.shape, x.dtype
    mask = causal_mask(n)  # (L, L)
    cut = n // 2
    later = x.clone()
    later[:, cut:] = randn(gen, b, n - cut, d, dtype=dtype)  # (B, L - cut, D)
    return mask, cut, later


# ---------------------------------------------------------------------------------------------
# An attention block: f(query, key, value, mask) -> (B, L, D)
# ---------------------------------------------------------------------------------------------


def run_attention_cases(
    report: CheckReport,
    student: Callable[[Tensor, Tensor, Tensor, Tensor | None], Any],
    reference: Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor],
    cfg: dict[str, int],
    dtype: torch.dtype,
    gen: torch.Generator,
    *,
    item: str,
    bugs: Sequence[BugVariant],
    run: Callable[[Any, Sequence[Any]], Any],
) -> None:
    """The four mask properties of an attention block called as
    ``f(query, key, value, mask) -> (B, L, D)``: cross-attention without a mask and with a
    padding mask (hidden keys must change nothing), causal self-attention (later positions
    must change nothing earlier), and a fully masked query (no NaN). Each comparison with the
    reference names a matching known mistake from ``bugs`` (run through ``run``).

    Args:
        report: the running check's report.
        student, reference: the two blocks, already sharing weights and dtype.
        cfg: sizes B, L, S, D.
        dtype: dtype of the inputs.
        gen: generator of the inputs.
        item: what the student implements.
        bugs: candidate known mistakes.
        run: builds and runs a candidate (see :func:`module_runner`).
    """
    b, n_q, n_k, d = cfg["B"], cfg["L"], cfg["S"], cfg["D"]
    where = f"{describe(cfg)}, {dtype_name(dtype)}"
    query = randn(gen, b, n_q, d, dtype=dtype)  # (B, L, D)
    memory = randn(gen, b, n_k, d, dtype=dtype)  # (B, S, D)
    block = _attention_block(report, student, reference, item, bugs, run, where)
    cases = MaskCases(
        no_mask=(query, memory, memory, None),
        invariances=[
            *([_padding_case(gen, query, memory, item, where)] if n_k >= 2 else []),
            *([_causal_case(gen, query, item, where)] if n_q >= 2 else []),
        ],
        fully_masked=_fully_masked_case(query, memory, item, where),
    )
    expected = reference(query, memory, memory, None)
    if not outputs_match_safely(student, (query, memory, memory, None), expected):
        _probe_key_value(report, student, query, memory, item, where, bugs)
    run_mask_properties(block, cases)


def _attention_block(
    report: CheckReport,
    student: Callable[..., Any],
    reference: Callable[..., Tensor],
    item: str,
    bugs: Sequence[BugVariant],
    run: Callable[[Any, Sequence[Any]], Any],
    where: str,
) -> MaskedBlock:
    """The attention block as the mask properties see it: each comparison with the reference
    checks the output's shape and names a matching mistake from ``bugs``."""

    def mistake(inputs: Inputs) -> BugVariant | None:
        return diagnose(student, bugs, inputs, run=run, reference_output=reference(*inputs))

    def compare(inputs: Inputs, case: str) -> Tensor:
        expected = reference(*inputs)
        actual = expect_tensor(
            student(*inputs), f"the output of your {item} ({case})", tuple(expected.shape)
        )
        expect_close(
            report,
            actual,
            expected,
            f"the output of your {item} ({where}, {case})",
            diagnosis=lambda: diagnose(student, bugs, inputs, run=run, reference_output=expected),
        )
        return actual

    return MaskedBlock(report, lambda inputs: student(*inputs), compare, mistake)


def _padding_case(
    gen: torch.Generator, query: Tensor, memory: Tensor, item: str, where: str
) -> Invariance:
    """Keys and values a padding mask hides change nothing."""
    mask, _, changed = hide_padding(gen, memory)
    return Invariance(
        (query, memory, memory, mask),
        (query, changed, changed, mask),
        f"the output of your {item} after changing the keys and values a padding mask "
        f"hides ({where})",
        case="padding mask (B, 1, 1, S)",
        hint="Positions where the mask is False must not influence the output. " + MASK_RULE,
    )


def _causal_case(gen: torch.Generator, query: Tensor, item: str, where: str) -> Invariance:
    """Under a causal mask, later positions change nothing earlier."""
    mask, cut, later = change_later(gen, query)
    return Invariance(
        (query, query, query, mask),
        (later, later, later, mask),
        f"the first {cut} positions of your {item}'s output after changing the later "
        f"positions under a causal mask ({where})",
        case="self-attention, causal mask (L, L)",
        keep=lambda out: out[:, :cut],
        hint="Under a causal mask a position must not see later positions. " + MASK_RULE,
    )


def _fully_masked_case(query: Tensor, memory: Tensor, item: str, where: str) -> FullyMasked:
    """A query that may attend no key gets the reference's output: zeros, never NaN."""
    b, n_q, n_k = query.size(0), query.size(1), memory.size(1)
    mask = torch.ones(b, 1, n_q, n_k, dtype=torch.bool)  # (B, 1, L, S)
    mask[0, 0, 0] = False  # the first query of the first sequence sees nothing
    return FullyMasked(
        (query, memory, memory, mask),
        "a fully masked query (B, 1, L, S)",
        lambda _: (
            f"the output of your {item} contains NaN when a query may attend no key "
            f"({where}). A fully masked row must give zero attention weights (so a zero "
            "attention output), never NaN."
        ),
    )


def _probe_key_value(
    report: CheckReport,
    student: Callable[..., Any],
    query: Tensor,
    memory: Tensor,
    item: str,
    where: str,
    bugs: Sequence[BugVariant],
) -> None:
    """Fail naming the self-attention-only habit when the output does not move at all as the
    keys and values change (with the query held fixed).

    Args:
        report: the running check's report.
        student: the student's block, called as ``student(query, key, value, mask)``.
        query: (B, L, D) queries.
        memory: (B, S, D) keys and values; the probe replaces them by other numbers.
        item: what the student implements.
        where: the configuration, for the message.
        bugs: the candidate mistakes; the one whose id ends in ``ignores_key_value`` is named.
    """
    other = torch.randn(
        memory.shape, generator=torch.Generator().manual_seed(7), dtype=memory.dtype
    )
    try:
        first = student(query, memory, memory, None)
        second = student(query, other * 2 + 1, other * 2 + 1, None)
    except CheckFailure:
        return
    if isinstance(first, Tensor) and isinstance(second, Tensor) and first.shape == second.shape:
        if near(first, second):
            bug = next((b for b in bugs if b.id.endswith(".ignores_key_value")), None)
            report.fail(
                f"the output of your {item} stays the same when its key and value inputs "
                f"change ({where}).",
                bug,
            )
