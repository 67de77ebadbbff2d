"""The mask properties of an attention block, written once: no mask, padding invariance (hidden
keys change nothing), causal invariance (later positions change nothing earlier) and a fully
masked row (zeros, never NaN). Each comparison with the reference names a matching known
mistake.

Dimension legend: B batch, L queries, S keys, D d_model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ...masks import causal_mask
from .calling import expect_tensor
from .compare import diagnose, expect_close, near, outputs_match_safely
from .inputs import describe, dtype_name, randn, random_keep
from .results import BugVariant, CheckFailure, CheckReport

#: The convention every message about masks quotes.
MASK_RULE = (
    "The course's convention is True = may attend, False = must not attend (the opposite of "
    "nn.MultiheadAttention's masks)."
)


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
    """The masking and number checks of an attention block called as
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

    def compare(inputs: tuple[Any, ...], case: str) -> Tensor:
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

    expected = reference(query, memory, memory, None)
    if not outputs_match_safely(student, (query, memory, memory, None), expected):
        _probe_key_value(report, student, query, memory, item, where, bugs)
    compare((query, memory, memory, None), "no mask")

    if n_k >= 2:
        keep = random_keep(gen, b, n_k)  # (B, S)
        mask = keep[:, None, None, :]  # (B, 1, 1, S)
        out = compare((query, memory, memory, mask), "padding mask (B, 1, 1, S)")
        changed = torch.where(keep[..., None], memory, randn(gen, b, n_k, d, dtype=dtype) * 3)
        expect_close(
            report,
            student(query, changed, changed, mask),
            out,
            f"the output of your {item} after changing the keys and values a padding mask "
            f"hides ({where})",
            diagnosis=lambda: diagnose(
                student,
                bugs,
                (query, memory, memory, mask),
                run=run,
                reference_output=reference(query, memory, memory, mask),
            ),
            hint="Positions where the mask is False must not influence the output. " + MASK_RULE,
        )

    if n_q >= 2:
        mask = causal_mask(n_q)  # (L, L)
        out = compare((query, query, query, mask), "self-attention, causal mask (L, L)")
        cut = n_q // 2
        later = query.clone()
        later[:, cut:] = randn(gen, b, n_q - cut, d, dtype=dtype)
        expect_close(
            report,
            student(later, later, later, mask)[:, :cut],
            out[:, :cut],
            f"the first {cut} positions of your {item}'s output after changing the later "
            f"positions under a causal mask ({where})",
            diagnosis=lambda: diagnose(
                student,
                bugs,
                (query, query, query, mask),
                run=run,
                reference_output=reference(query, query, query, mask),
            ),
            hint="Under a causal mask a position must not see later positions. " + MASK_RULE,
        )

    mask = torch.ones(b, 1, n_q, n_k, dtype=torch.bool)  # (B, 1, L, S)
    mask[0, 0, 0] = False  # the first query of the first sequence sees nothing
    out = student(query, memory, memory, mask)
    if isinstance(out, Tensor) and bool(torch.isnan(out).any()):
        report.fail(
            f"the output of your {item} contains NaN when a query may attend no key ({where}). "
            "A fully masked row must give zero attention weights (so a zero attention output), "
            "never NaN.",
            diagnose(
                student,
                bugs,
                (query, memory, memory, mask),
                run=run,
                reference_output=reference(query, memory, memory, mask),
            ),
        )
    compare((query, memory, memory, mask), "a fully masked query (B, 1, L, S)")


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
