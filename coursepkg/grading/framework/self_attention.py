"""Self-attention blocks called as ``f(x, mask, cache)`` (today's decoder: grouped-query
attention, a pre-norm block): the mask properties on one sequence
(:func:`run_self_attention_cases`) and decoding with a key/value cache held in a dict
(:func:`decode_with_cache`, :func:`cache_equals_whole`), and the :class:`~.modules.Stage`
of a module check that runs both on every configuration (:func:`cache_stage`).

Dimension legend: B batch, L length, D d_model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ...masks import causal_mask
from .calling import expect_tensor
from .compare import diagnose, expect_close
from .inputs import describe, dtype_name, generator, randn
from .masks import (
    MASK_RULE,
    FullyMasked,
    Invariance,
    MaskCases,
    MaskedBlock,
    change_later,
    hide_padding,
    run_mask_properties,
)
from .modules import BuiltModule, Stage
from .pieces import guarded
from .results import BugVariant, CheckReport
from .weights import copy_weights, module_runner

__all__ = [
    "cache_equals_whole",
    "cache_stage",
    "decode_with_cache",
    "norm_gains_stage",
    "run_self_attention_cases",
]

Block = Callable[..., Any]


def run_self_attention_cases(
    report: CheckReport,
    student: Block,
    reference: Block,
    cfg: dict[str, Any],
    dtype: torch.dtype,
    gen: torch.Generator,
    *,
    item: str,
    bugs: Sequence[BugVariant],
    run: Callable[[Any, Sequence[Any]], Any],
    hint: str = "",
    tolerance: dict[str, float] | None = None,
) -> None:
    """The mask properties of a self-attention block ``f(x, mask)``: no mask, causal
    invariance (later positions change nothing earlier), padding invariance (hidden
    positions change nothing at the kept ones) and a sequence that may attend nothing, each
    compared with the reference and named from ``bugs`` (built and run by ``run``).

    Args:
        report: the running check's report.
        student, reference: the two blocks, sharing weights and dtype (the student's guarded).
        cfg: sizes B, L, D.
        dtype: dtype of the inputs.
        gen: generator of the inputs.
        item: what the student implements.
        bugs: candidate known mistakes.
        run: builds and runs a candidate (see :func:`~.weights.module_runner`).
        hint: advice added when no known mistake matches.
        tolerance: ``rtol``/``atol`` of the comparisons with the reference (default: the
            framework's).
    """
    b, n, d = cfg["B"], cfg["L"], cfg["D"]
    where = f"{describe(cfg)}, {dtype_name(dtype)}"
    x = randn(gen, b, n, d, dtype=dtype)  # (B, L, D)

    def mistake(inputs: tuple[Any, ...]) -> BugVariant | None:
        return diagnose(student, bugs, inputs, run=run, reference_output=reference(*inputs))

    def compare(inputs: tuple[Any, ...], case: str) -> Tensor:
        actual = expect_tensor(student(*inputs), f"your output ({case}; {where})", (b, n, d))
        expect_close(
            report,
            actual,
            reference(*inputs),
            f"the output of your {item} ({case}; {where})",
            diagnosis=lambda: mistake(inputs),
            hint=hint,
            **(tolerance or {}),
        )
        return actual

    cases = _mask_cases(gen, x, item, where)
    run_mask_properties(MaskedBlock(report, lambda i: student(*i), compare, mistake), cases)


def _mask_cases(gen: torch.Generator, x: Tensor, item: str, where: str) -> MaskCases:
    """The inputs of :func:`run_self_attention_cases` for the sequence ``x`` (B, L, D)."""
    n = x.size(1)
    causal, cut, later = change_later(gen, x)
    padding, keep, hidden = hide_padding(gen, x)
    nothing = keep.clone()
    nothing[0] = False  # the first sequence may attend nothing
    invariances = [
        Invariance(
            (x, causal),
            (later, causal),
            f"your outputs before position {cut} when the later positions change ({where})",
            case="causal mask",
            keep=lambda out: out[:, :cut],
            hint="A causal mask hides the later keys. " + MASK_RULE,
        )
    ]
    if n >= 2:
        invariances.append(
            Invariance(
                (x, padding),
                (hidden, padding),
                f"your outputs at the kept positions when the hidden ones change ({where})",
                case="padding mask",
                keep=lambda out: out[keep],
                hint=MASK_RULE,
            )
        )
    fully_masked = FullyMasked(
        (x, nothing[:, None, None, :]),  # (B, 1, 1, L)
        "a sequence whose keys are all masked",
        message=lambda part: (
            f"your {item} gives NaN where a query may attend no key (a "
            "softmax over only -inf); its attention output must be zeros there."
        ),
    )
    return MaskCases(no_mask=(x, None), invariances=invariances, fully_masked=fully_masked)


def decode_with_cache(block: Block, x: Tensor, prefill: int) -> Tensor:
    """The outputs of ``x`` computed with a dict KV cache: the first ``prefill`` positions in
    one call under a causal mask, then one position per call.

    Shape:
        x (B, L, D) -> (B, L, D).
    """
    cache: dict[str, Tensor] = {}
    outs = [block(x[:, :prefill], causal_mask(prefill), cache)]  # (B, prefill, D)
    outs += [block(x[:, t : t + 1], None, cache) for t in range(prefill, x.size(1))]
    return torch.cat(outs, dim=1)  # (B, L, D)


def cache_equals_whole(
    report: CheckReport,
    student: Block,
    x: Tensor,
    *,
    item: str,
    bugs: Sequence[BugVariant],
    run: Callable[[Any, Sequence[Any]], Any],
    reference: Block,
    where: str,
) -> None:
    """Fail unless decoding ``x`` with the cache (:func:`decode_with_cache`, half the
    positions at once, then one at a time) gives the student's outputs of the whole sequence
    under a causal mask; a mismatch is named from ``bugs``, each decoded the same way by
    ``run`` (a :func:`~.weights.module_runner` whose call is :func:`decode_with_cache`).

    Shape:
        x (B, L, D).
    """
    n = x.size(1)
    prefill = max(1, n // 2)
    full = expect_tensor(student(x, causal_mask(n), None), f"your output ({where})")
    where = f"{where}; the first {prefill} positions at once, then one at a time"
    decoded = expect_tensor(
        decode_with_cache(student, x, prefill), f"your outputs with the cache ({where})", x.shape
    )
    expect_close(
        report,
        decoded,
        full.detach(),
        f"your outputs decoded with the cache ({where}; the reference here is your own output "
        "for the whole sequence at once)",
        diagnosis=lambda: diagnose(
            lambda x: decode_with_cache(student, x, prefill),
            bugs,
            (x,),
            run=lambda impl, inputs: run(impl, (*inputs, prefill)),
            reference_output=reference(x, causal_mask(n)),
        ),
        hint=f"With a cache, your {item} appends the new keys and values to the cached ones, "
        "and the new positions start after the cached ones.",
    )


def cache_stage(
    item: str,
    bugs: Sequence[BugVariant],
    bug_args: Callable[[dict[str, Any]], tuple[Any, ...]],
) -> Stage:
    """A :class:`~.modules.Stage` on every configuration (sizes B, L, D, H, Hkv) of a block
    with a dict KV cache: decoding with the cache gives the outputs of the whole sequence
    (:func:`cache_equals_whole`, a catalogued variant built with ``bug_args(cfg)``), and the
    cache holds the keys of the Hkv key/value heads, (B, Hkv, L, D / H), in ``cache["k"]``."""

    def run(report: CheckReport, built: BuiltModule) -> None:
        cfg = built.cfg
        b, n, d = cfg["B"], cfg["L"], cfg["D"]
        x = randn(generator(built.seed, salt=14), b, n, d)  # (B, L, D)
        mine = guarded(built.student.float(), item)
        cache_equals_whole(
            report,
            mine,
            x,
            item=item,
            bugs=bugs,
            run=module_runner(built.reference, bug_args(cfg), call=decode_with_cache),
            reference=built.reference,
            where=describe(cfg),
        )
        cache: dict[str, Tensor] = {}
        mine(x, causal_mask(n), cache)
        stored, expected = cache.get("k"), (b, cfg["Hkv"], n, d // cfg["H"])
        if not isinstance(stored, Tensor) or tuple(stored.shape) != expected:
            shape = tuple(stored.shape) if isinstance(stored, Tensor) else type(stored).__name__
            report.fail(
                f"after a call on {n} positions your cache['k'] should hold the rotated keys "
                f"of the {cfg['Hkv']} key/value heads, shape (B, Hkv, L, Dh) = {expected}; it "
                f"holds {shape} ({describe(cfg)}). Store the keys before repeating them for "
                "the query heads: that is what makes the cache H / Hkv times smaller."
            )

    return Stage(
        run,
        ok=(
            "decoding with the cache (a prompt, then one token at a time) gives the outputs "
            "of the whole sequence",
            "the cache stores the keys of the Hkv key/value heads, not of the H query heads",
        ),
    )


def norm_gains_stage(
    item: str,
    bugs: Sequence[BugVariant],
    bug_args: Callable[[dict[str, Any]], tuple[Any, ...]],
    norms: tuple[str, ...] = ("norm1", "norm2"),
) -> Stage:
    """A :class:`~.modules.Stage` on every configuration of a block with the norms ``norms``:
    random gains (a new norm's are ones, which hide a norm used in the wrong place) copied
    into both blocks, then the outputs under a causal mask compared with the reference's, a
    mismatch named from ``bugs`` (a catalogued variant built with ``bug_args(cfg)``). It
    changes the built modules' weights, so it comes after every other stage."""

    def run(report: CheckReport, built: BuiltModule) -> None:
        cfg = built.cfg
        gen = generator(built.seed, salt=17)
        reference, student = built.reference.float(), built.student.float()
        with torch.no_grad():
            for name in norms:
                getattr(reference, name).weight.copy_(1 + 0.5 * randn(gen, cfg["D"]))
        copy_weights(reference, student, item)
        x = randn(gen, cfg["B"], cfg["L"], cfg["D"])  # (B, L, D)
        mask = causal_mask(cfg["L"])
        expected = reference(x, mask)
        mine = guarded(student, item)
        expect_close(
            report,
            expect_tensor(mine(x, mask), f"your output ({describe(cfg)})", x.shape),
            expected,
            f"the output of your {item} with random gains in {' and '.join(norms)} (causal "
            f"mask; {describe(cfg)})",
            diagnosis=lambda: diagnose(
                mine,
                bugs,
                (x, mask),
                run=module_runner(reference, bug_args(cfg)),
                reference_output=expected,
            ),
            hint=f"Each of {', '.join(norms)} normalises the input of its own sub-layer.",
        )

    return Stage(run, ok=(f"the norms' own gains are used where they belong ({', '.join(norms)})",))
