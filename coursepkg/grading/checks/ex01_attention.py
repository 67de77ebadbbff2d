"""Checks of ex01_attention: scaled dot-product attention and the additive (Bahdanau) score;
the catalogue of mistakes they recognise is in :mod:`.ex01_attention_mistakes`.

Dimension legend: B batch, H heads, L queries, S keys, Dk/Dv per-head sizes, A additive-attention
width.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from ...attention import AdditiveAttention
from ...attention import scaled_dot_product_attention as _reference_sdpa
from ...masks import causal_mask
from ..framework import (
    MASK_RULE,
    BugVariant,
    CheckFailure,
    CheckReport,
    FullyMasked,
    Invariance,
    MaskCases,
    MaskedBlock,
    call_student,
    check_gradients,
    configs,
    describe,
    diagnose,
    dtype_name,
    expect_close,
    expect_tensor,
    forbidden_calls,
    generator,
    public_check,
    randn,
    random_keep,
    register_configs,
    run_mask_properties,
)
from .ex01_attention_mistakes import ADDITIVE_BUGS, ADDITIVE_ITEM, SDPA_BUGS, SDPA_ITEM

__all__ = ["check_additive_score", "check_scaled_dot_product_attention"]


# ---------------------------------------------------------------------------------------------
# check_scaled_dot_product_attention
# ---------------------------------------------------------------------------------------------


def _sample_sdpa(rng: random.Random) -> dict[str, int]:
    config = {"B": rng.randint(1, 3)}
    if rng.random() < 0.5:
        config["H"] = rng.randint(1, 3)
    config.update(
        L=rng.randint(1, 9), S=rng.randint(1, 9), Dk=rng.randint(1, 9), Dv=rng.randint(1, 9)
    )
    return config


register_configs(
    SDPA_ITEM,
    visible=[
        {"B": 2, "L": 5, "S": 7, "Dk": 4, "Dv": 3},
        {"B": 1, "L": 3, "S": 3, "Dk": 8, "Dv": 8},
        {"B": 2, "H": 3, "L": 4, "S": 6, "Dk": 5, "Dv": 2},
    ],
    extra=[
        {"B": 1, "L": 1, "S": 1, "Dk": 1, "Dv": 1},
        {"B": 3, "H": 2, "L": 7, "S": 2, "Dk": 3, "Dv": 6},
    ],
    sample=_sample_sdpa,
)


@public_check(
    assignment="ex01_attention",
    implements="scaled_dot_product_attention",
    bugs=SDPA_BUGS,
    kind="function",
)
def check_scaled_dot_product_attention(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check ``scaled_dot_product_attention(query, key, value, mask=None) -> (output, weights)``.

    Compares with :func:`coursepkg.attention.scaled_dot_product_attention` over several shapes
    (3-D and 4-D inputs, L != S, Dk != Dv) in float32 and float64, without a mask, with a
    padding mask, with a causal mask and with a fully masked query; checks that hidden keys
    cannot influence the output, that gradients reach Q, K and V, and that the function does
    not call PyTorch's fused attention.
    """
    if not callable(impl):
        report.fail(f"expected your function {SDPA_ITEM}, got {type(impl).__name__}.")

    def student(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> Any:
        result = call_student(impl, query, key, value, mask, item=SDPA_ITEM)
        if not isinstance(result, tuple) or len(result) != 2:
            kind = type(result).__name__ + (
                f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""
            )
            raise CheckFailure(
                f"{SDPA_ITEM} should return a tuple (output, weights), but it returned {kind}."
            )
        return result

    gen = generator(seed)
    cfgs = configs(SDPA_ITEM, thorough, seed)
    with forbidden_calls(SDPA_ITEM):
        for index, cfg in enumerate(cfgs):
            for dtype in (torch.float32, torch.float64) if index == 0 else (torch.float32,):
                _sdpa_config(report, student, cfg, dtype, gen)
        report.ok(f"matches the reference on {len(cfgs)} shapes (float32 and float64)")
        report.ok("hidden keys change nothing (padding and causal masks); True = may attend")
        report.ok("a fully masked query gives zeros, not NaN")
        cfg = cfgs[0]
        q = randn(gen, cfg["B"], cfg["L"], cfg["Dk"]).requires_grad_()
        k = randn(gen, cfg["B"], cfg["S"], cfg["Dk"]).requires_grad_()
        v = randn(gen, cfg["B"], cfg["S"], cfg["Dv"]).requires_grad_()
        output = expect_tensor(student(q, k, v)[0], "the output")
        check_gradients(output, [("query", q), ("key", k), ("value", v)], SDPA_ITEM)
    report.ok("gradients reach query, key and value")


def _sdpa_config(
    report: CheckReport,
    student: Callable[..., Any],
    cfg: dict[str, int],
    dtype: torch.dtype,
    gen: torch.Generator,
) -> None:
    """The mask properties of the student's function on one shape: no mask, padding and
    causal invariance (each followed by the comparison under that mask), a fully masked query."""
    b, n_q, n_k, d_k, d_v = cfg["B"], cfg["L"], cfg["S"], cfg["Dk"], cfg["Dv"]
    lead = (b, cfg["H"]) if "H" in cfg else (b,)
    q = randn(gen, *lead, n_q, d_k, dtype=dtype)  # (..., L, Dk)
    k = randn(gen, *lead, n_k, d_k, dtype=dtype)  # (..., S, Dk)
    v = randn(gen, *lead, n_k, d_v, dtype=dtype)  # (..., S, Dv)
    where = f"{describe(cfg)}, {dtype_name(dtype)}"
    invariances = []
    if n_k >= 2:
        invariances.append(_sdpa_padding_case((q, k, v), gen, where))
    if 2 <= n_q <= n_k:
        invariances.append(_sdpa_causal_case((q, k, v), gen, where))
    cases = MaskCases(
        no_mask=(q, k, v, None),
        invariances=invariances,
        fully_masked=_sdpa_masked_row_case((q, k, v), gen, where),
    )
    run_mask_properties(_sdpa_block(report, student, where, (*lead, n_q), d_v, n_k), cases)


def _sdpa_block(
    report: CheckReport,
    student: Callable[..., Any],
    where: str,
    rows: tuple[int, ...],
    d_v: int,
    n_k: int,
) -> MaskedBlock:
    """The student's function as the mask properties see it: its output for the invariances,
    output and weights compared with the reference's, its SDPA mistake named."""

    def compare(inputs: tuple[Any, ...], case: str) -> None:
        expected = _reference_sdpa(*inputs)
        out, weights = student(*inputs)
        expect_tensor(out, f"the output ({where}, {case})", (*rows, d_v))
        expect_tensor(weights, f"the weights ({where}, {case})", (*rows, n_k))

        def diagnosis() -> BugVariant | None:
            return diagnose(student, SDPA_BUGS, inputs, reference_output=expected)

        expect_close(
            report, out, expected[0], f"your output ({where}, {case})", diagnosis=diagnosis
        )
        expect_close(
            report, weights, expected[1], f"your weights ({where}, {case})", diagnosis=diagnosis
        )

    def parts(inputs: tuple[Any, ...]) -> Iterator[tuple[str, Tensor]]:
        out, weights = student(*inputs)
        for name, t in (("output", out), ("weights", weights)):
            yield name, expect_tensor(t, "the output")

    return MaskedBlock(
        report,
        output=lambda inputs: student(*inputs)[0],
        compare=compare,
        mistake=lambda inputs: _sdpa_mistake(student, inputs),
        parts=parts,
    )


def _sdpa_mistake(student: Callable[..., Any], inputs: tuple[Any, ...]) -> BugVariant | None:
    """The known mistake whose output the student's function matches on ``inputs``."""
    return diagnose(student, SDPA_BUGS, inputs, reference_output=_reference_sdpa(*inputs))


def _sdpa_padding_case(
    qkv: tuple[Tensor, Tensor, Tensor], gen: torch.Generator, where: str
) -> Invariance:
    """Keys and values a padding mask hides change nothing."""
    q, k, v = qkv
    b, n_k, dtype = q.size(0), k.size(-2), q.dtype
    pad_axes = (1,) * (q.dim() - 3) + (1,)  # so a (B, S) mask broadcasts against (..., L, S)
    keep = random_keep(gen, b, n_k)  # (B, S)
    mask = keep.view(b, *pad_axes, n_k)  # (B, [1,] 1, S)
    hidden = ~mask.transpose(-1, -2)  # (B, [1,] S, 1)
    k2 = torch.where(hidden, randn(gen, *k.shape, dtype=dtype) * 3, k)
    v2 = torch.where(hidden, randn(gen, *v.shape, dtype=dtype) * 3, v)
    return Invariance(
        (q, k, v, mask),
        (q, k2, v2, mask),
        f"your output after changing the keys and values that a padding mask hides ({where})",
        case="padding mask",
        compare_after=True,
        hint="Positions where the mask is False must not influence the output. " + MASK_RULE,
    )


def _sdpa_causal_case(
    qkv: tuple[Tensor, Tensor, Tensor], gen: torch.Generator, where: str
) -> Invariance:
    """Under a causal mask, later keys and values change nothing earlier."""
    q, k, v = qkv
    n_q, n_k, dtype = q.size(-2), k.size(-2), q.dtype
    mask = causal_mask(n_q, n_k)  # (L, S), bottom-right aligned
    cut = n_q // 2  # queries 0 .. cut-1 see keys 0 .. cut-1 + S - L only
    visible_keys = cut + n_k - n_q
    k2, v2 = k.clone(), v.clone()
    k2[..., visible_keys:, :] = randn(gen, *k2[..., visible_keys:, :].shape, dtype=dtype)
    v2[..., visible_keys:, :] = randn(gen, *v2[..., visible_keys:, :].shape, dtype=dtype)
    return Invariance(
        (q, k, v, mask),
        (q, k2, v2, mask),
        f"the first {cut} rows of your output after changing later keys and values under "
        f"a causal mask ({where})",
        case="causal mask",
        compare_after=True,
        keep=lambda out: out[..., :cut, :],
        hint="A query must not see keys the causal mask hides. " + MASK_RULE,
    )


def _sdpa_masked_row_case(
    qkv: tuple[Tensor, Tensor, Tensor], gen: torch.Generator, where: str
) -> FullyMasked:
    """A query that may attend no key gives zero weights and output, never NaN (the mask is
    also a padding mask on the other rows)."""
    q, k, _ = qkv
    b, n_q, n_k = q.size(0), q.size(-2), k.size(-2)
    lead = tuple(q.shape[:-2])
    pad_axes = (1,) * (len(lead) - 1) + (1,)
    mask = torch.ones(*lead, n_q, n_k, dtype=torch.bool)  # (..., L, S)
    mask[(0,) * len(lead) + (0,)] = False  # the first query of the first row sees nothing
    if n_k >= 2:
        mask &= random_keep(gen, b, n_k).view(b, *pad_axes, n_k)
        mask[(0,) * len(lead) + (0,)] = False
    return FullyMasked(
        (*qkv, mask),
        "a fully masked query",
        lambda name: (
            f"your {name} contains NaN when a query may attend no key ({where}). A fully "
            "masked row must give zero weights and a zero output."
        ),
    )


# ---------------------------------------------------------------------------------------------
# Additive score
# ---------------------------------------------------------------------------------------------


register_configs(
    ADDITIVE_ITEM,
    visible=[
        {"B": 2, "S": 5, "Dq": 3, "Dk": 4, "A": 6},
        {"B": 1, "S": 1, "Dq": 2, "Dk": 2, "A": 2},
        {"B": 3, "S": 7, "Dq": 5, "Dk": 1, "A": 3},
    ],
    extra=[{"B": 4, "S": 2, "Dq": 8, "Dk": 6, "A": 1}],
    sample=lambda rng: {
        "B": rng.randint(1, 4),
        "S": rng.randint(1, 9),
        "Dq": rng.randint(1, 8),
        "Dk": rng.randint(1, 8),
        "A": rng.randint(1, 8),
    },
)


def _reference_additive(query, keys, W_q, W_k, v):  # noqa: ANN001, ANN202, N803
    """Scores of the reference module with these weights (its key bias zero): its own layers,
    composed as its forward composes them before the softmax, and differentiable in all five
    inputs (``functional_call`` runs each layer with the given tensors as its parameters)."""
    module = AdditiveAttention(W_q.size(1), W_k.size(1), W_q.size(0))
    run = torch.func.functional_call
    q = run(module.query_proj, {"weight": W_q}, (query,))  # (B, A)
    k = run(module.key_proj, {"weight": W_k, "bias": W_k.new_zeros(W_k.size(0))}, (keys,))
    hidden = torch.tanh(q.unsqueeze(1) + k)  # (B, S, A)
    return run(module.score, {"weight": v.unsqueeze(0)}, (hidden,)).squeeze(-1)  # (B, S)


@public_check(
    assignment="ex01_attention", implements="additive_score", bugs=ADDITIVE_BUGS, kind="function"
)
def check_additive_score(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``additive_score(query, keys, W_q, W_k, v) -> scores (B, S)`` (optional item).

    The expected scores come from :class:`coursepkg.attention.AdditiveAttention` given the same
    weights (its key bias set to zero, since the standalone score has none).
    """
    if not callable(impl):
        report.fail(f"expected your function {ADDITIVE_ITEM}, got {type(impl).__name__}.")

    def student(*inputs: Tensor) -> Any:
        return call_student(impl, *inputs, item=ADDITIVE_ITEM)

    gen = generator(seed, salt=1)
    cfgs = configs(ADDITIVE_ITEM, thorough, seed)
    with forbidden_calls(ADDITIVE_ITEM):
        for index, cfg in enumerate(cfgs):
            for dtype in (torch.float32, torch.float64) if index == 0 else (torch.float32,):
                b, n_k, a = cfg["B"], cfg["S"], cfg["A"]
                inputs = (
                    randn(gen, b, cfg["Dq"], dtype=dtype),
                    randn(gen, b, n_k, cfg["Dk"], dtype=dtype),
                    randn(gen, a, cfg["Dq"], dtype=dtype),
                    randn(gen, a, cfg["Dk"], dtype=dtype),
                    randn(gen, a, dtype=dtype),
                )
                where = f"{describe(cfg)}, {dtype_name(dtype)}"
                scores = expect_tensor(student(*inputs), f"your scores ({where})", (b, n_k))
                expected = _reference_additive(*inputs)
                expect_close(
                    report,
                    scores,
                    expected,
                    f"your scores ({where})",
                    diagnosis=lambda inputs=inputs, expected=expected: diagnose(
                        student, ADDITIVE_BUGS, inputs, reference_output=expected
                    ),
                )
        report.ok(f"matches the reference on {len(cfgs)} shapes (float32 and float64)")
        cfg = cfgs[0]
        names = ("query", "keys", "W_q", "W_k", "v")
        inputs = tuple(
            randn(gen, *shape).requires_grad_()
            for shape in (
                (cfg["B"], cfg["Dq"]),
                (cfg["B"], cfg["S"], cfg["Dk"]),
                (cfg["A"], cfg["Dq"]),
                (cfg["A"], cfg["Dk"]),
                (cfg["A"],),
            )
        )
        scores = expect_tensor(student(*inputs), "the output")
        check_gradients(scores, list(zip(names, inputs, strict=True)), ADDITIVE_ITEM)
    report.ok("gradients reach all five inputs")
