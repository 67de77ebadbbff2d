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


class _Block:
    """One attention block under test: the student's and the reference's, called as
    ``f(query, key, value, mask) -> (B, L, D)``, and how to name a mistake."""

    def __init__(self, report: CheckReport, student, reference, item: str, bugs, run, where: str):
        self.report, self.student, self.reference = report, student, reference
        self.item, self.bugs, self.run, self.where = item, bugs, run, where

    def mistake(self, inputs: tuple[Any, ...]) -> BugVariant | None:
        """The known mistake whose output the student's matches on ``inputs``, if any."""
        return diagnose(
            self.student,
            self.bugs,
            inputs,
            run=self.run,
            reference_output=self.reference(*inputs),
        )

    def compare(self, inputs: tuple[Any, ...], case: str) -> Tensor:
        """Fail unless the student's output on ``inputs`` is the reference's; return it."""
        expected = self.reference(*inputs)
        actual = expect_tensor(
            self.student(*inputs),
            f"the output of your {self.item} ({case})",
            tuple(expected.shape),
        )
        expect_close(
            self.report,
            actual,
            expected,
            f"the output of your {self.item} ({self.where}, {case})",
            diagnosis=lambda: diagnose(
                self.student, self.bugs, inputs, run=self.run, reference_output=expected
            ),
        )
        return actual


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
    block = _Block(
        report, student, reference, item, bugs, run, f"{describe(cfg)}, {dtype_name(dtype)}"
    )
    query = randn(gen, b, n_q, d, dtype=dtype)  # (B, L, D)
    memory = randn(gen, b, n_k, d, dtype=dtype)  # (B, S, D)
    expected = reference(query, memory, memory, None)
    if not outputs_match_safely(student, (query, memory, memory, None), expected):
        _probe_key_value(report, student, query, memory, item, block.where, bugs)
    block.compare((query, memory, memory, None), "no mask")
    if n_k >= 2:
        _padding_invariance(block, gen, query, memory)
    if n_q >= 2:
        _causal_invariance(block, gen, query)
    _fully_masked_row(block, query, memory)


def _padding_invariance(block: _Block, gen: torch.Generator, query: Tensor, memory: Tensor) -> None:
    """Keys and values a padding mask hides change nothing."""
    (b, n_k, d), dtype = memory.shape, memory.dtype
    keep = random_keep(gen, b, n_k)  # (B, S)
    mask = keep[:, None, None, :]  # (B, 1, 1, S)
    out = block.compare((query, memory, memory, mask), "padding mask (B, 1, 1, S)")
    changed = torch.where(keep[..., None], memory, randn(gen, b, n_k, d, dtype=dtype) * 3)
    expect_close(
        block.report,
        block.student(query, changed, changed, mask),
        out,
        f"the output of your {block.item} after changing the keys and values a padding mask "
        f"hides ({block.where})",
        diagnosis=lambda: block.mistake((query, memory, memory, mask)),
        hint="Positions where the mask is False must not influence the output. " + MASK_RULE,
    )


def _causal_invariance(block: _Block, gen: torch.Generator, query: Tensor) -> None:
    """Under a causal mask, later positions change nothing earlier."""
    (b, n_q, d), dtype = query.shape, query.dtype
    mask = causal_mask(n_q)  # (L, L)
    out = block.compare((query, query, query, mask), "self-attention, causal mask (L, L)")
    cut = n_q // 2
    later = query.clone()
    later[:, cut:] = randn(gen, b, n_q - cut, d, dtype=dtype)
    expect_close(
        block.report,
        block.student(later, later, later, mask)[:, :cut],
        out[:, :cut],
        f"the first {cut} positions of your {block.item}'s output after changing the later "
        f"positions under a causal mask ({block.where})",
        diagnosis=lambda: block.mistake((query, query, query, mask)),
        hint="Under a causal mask a position must not see later positions. " + MASK_RULE,
    )


def _fully_masked_row(block: _Block, query: Tensor, memory: Tensor) -> None:
    """A query that may attend no key gets the reference's output: zeros, never NaN."""
    b, n_q, n_k = query.size(0), query.size(1), memory.size(1)
    mask = torch.ones(b, 1, n_q, n_k, dtype=torch.bool)  # (B, 1, L, S)
    mask[0, 0, 0] = False  # the first query of the first sequence sees nothing
    out = block.student(query, memory, memory, mask)
    if isinstance(out, Tensor) and bool(torch.isnan(out).any()):
        block.report.fail(
            f"the output of your {block.item} contains NaN when a query may attend no key "
            f"({block.where}). A fully masked row must give zero attention weights (so a zero "
            "attention output), never NaN.",
            block.mistake((query, memory, memory, mask)),
        )
    block.compare((query, memory, memory, mask), "a fully masked query (B, 1, L, S)")


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
