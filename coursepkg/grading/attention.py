"""Checks of ex01 (scaled dot-product attention, the additive score) and ex02 (multi-head
attention), with the catalogue of mistakes they recognise.

Besides the three public checks, this module holds helpers the other attention-bearing checks
(encoder and decoder layers) share: seeded inputs and masks, a comparison that names a known
mistake, building a student's module safely, and running a buggy variant with the reference's
weights.

Dimension legend: B batch, H heads, L queries, S keys, D d_model, Dk/Dv per-head sizes,
A additive-attention width.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import AdditiveAttention
from ..attention import MultiHeadAttention as _ReferenceMHA
from ..attention import scaled_dot_product_attention as _reference_sdpa
from ..masks import causal_mask
from ._core import (
    BugVariant,
    CheckFailure,
    CheckResult,
    Report,
    assert_close,
    call_student,
    check_gradients,
    configs,
    copy_weights,
    describe,
    diagnose,
    forbidden_calls,
    materialise_lazy,
    parameter_table,
    register_configs,
    reject_reference_class,
    run_check,
)

__all__ = [
    "BUGS",
    "check_additive_score",
    "check_multi_head_attention",
    "check_scaled_dot_product_attention",
]

SDPA = "scaled_dot_product_attention"
ADDITIVE = "additive_score"
MHA = "MultiHeadAttention"

_MASK_RULE = (
    "The course's convention is True = may attend, False = must not attend (the opposite of "
    "nn.MultiheadAttention's masks)."
)


# ---------------------------------------------------------------------------------------------
# Shared helpers (also used by the encoder and decoder checks)
# ---------------------------------------------------------------------------------------------


def generator(seed: int | None, salt: int = 0) -> torch.Generator:
    """A CPU generator for a check's inputs: the same seed gives the same inputs."""
    return torch.Generator().manual_seed(10_007 * (0 if seed is None else seed) + salt)


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard normal values drawn in float64 and cast, so float32 and float64 runs of one
    configuration see the same numbers."""
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def random_keep(gen: torch.Generator, batch: int, length: int) -> Tensor:
    """A token mask (B, S), True = real: every row keeps at least one position and, when
    ``length >= 2``, hides at least one, so an inverted mask never hides a whole row."""
    keep = torch.rand(batch, length, generator=gen) < 0.6  # (B, S)
    if length >= 2:
        for b in range(batch):
            hide = int(torch.randint(length, (1,), generator=gen))
            keep[b, hide] = False
            show = (hide + 1 + int(torch.randint(length - 1, (1,), generator=gen))) % length
            keep[b, show] = True
    else:
        keep[:] = True
    return keep


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` as ``float32``, for messages."""
    return str(dtype).replace("torch.", "")


def expect_close(
    report: Report,
    actual: Any,
    expected: Tensor,
    what: str,
    *,
    diagnosis: Callable[[], BugVariant | None] | None = None,
    hint: str = "",
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Fail (through ``report``) unless ``actual`` is close to ``expected``.

    Args:
        report: the running check's report.
        actual: the student's value.
        expected: the reference value.
        what: the quantity, with its configuration.
        diagnosis: called only on a mismatch; returns the known mistake it matches, if any.
        hint: advice added when no known mistake matches.
        rtol, atol: tolerances (default: the framework's per-dtype ones).
    """
    try:
        assert_close(actual, expected, what, rtol=rtol, atol=atol)
    except CheckFailure as failure:
        bug = diagnosis() if diagnosis is not None else None
        message = failure.message
        if bug is None and hint:
            message += "\n" + hint
        report.fail(message, bug)


def build_module(
    cls: Any,
    args: Sequence[Any],
    item: str,
    *,
    seed: int,
    extra: Sequence[type] = (),
    kwargs: dict[str, Any] | None = None,
    probe: Sequence[Any] | None = None,
) -> nn.Module:
    """Construct the student's module safely, reject reference classes, switch to eval mode.

    Args:
        cls: the student's class.
        args: constructor arguments.
        item: what the student implements.
        seed: seeds the student's initialisation (the check overwrites it anyway).
        extra: more forbidden classes for this item (see :func:`reject_reference_class`).
        kwargs: keyword arguments of the constructor.
        probe: inputs of one forward pass that initialises lazy parameters
            (``nn.LazyLinear``), run only when the module has some.
    """
    reject_reference_class(cls, item, extra=extra)
    torch.manual_seed(seed)
    module = call_student(cls, *args, item=item, **(kwargs or {}))
    if not isinstance(module, nn.Module):
        raise CheckFailure(f"{item}(...) should build an nn.Module, got {type(module).__name__}.")
    reject_reference_class(cls, item, instance=module, extra=extra)
    if probe is not None:
        materialise_lazy(module, lambda m: call_student(m, *probe, item=item), item)
    return module.eval()


def structure(module: nn.Module) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes."""
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


def diagnose_structure(
    student: nn.Module, reference: nn.Module, bugs: Sequence[BugVariant], args: Sequence[Any]
) -> BugVariant | None:
    """The known mistake whose parameters (names and shapes) are exactly the student's, when
    those differ from the reference's (e.g. a missing output projection)."""
    mine = structure(student)
    if mine == structure(reference):
        return None
    for bug in bugs:
        try:
            variant = bug.impl(*args)
        except Exception:  # noqa: BLE001 - a variant that cannot be built here is skipped
            continue
        if isinstance(variant, nn.Module) and structure(variant) == mine:
            return bug
    return None


def module_runner(
    reference: nn.Module, args: Sequence[Any], call: Callable[..., Any] | None = None
) -> Callable[[Any, Sequence[Any]], Any]:
    """A ``run`` for :func:`diagnose`: build a buggy variant with ``args``, give it the
    reference's weights (and dtype), and call it on the inputs.

    Args:
        reference: the reference module whose weights the variant receives.
        args: the constructor arguments.
        call: ``call(module, *inputs)`` (default ``module(*inputs)``).
    """
    dtype = next(reference.parameters()).dtype

    def run(impl: Any, inputs: Sequence[Any]) -> Any:
        variant = impl(*args)
        copy_weights(reference, variant, "variant")
        variant = variant.to(dtype).eval()
        return call(variant, *inputs) if call is not None else variant(*inputs)

    return run


def param_gap(report: Report, student: nn.Module, reference: nn.Module, item: str, **kw: Any):
    """Fail with the per-submodule parameter table when the counts differ.

    Keyword Args:
        dims: named sizes for :func:`parameter_table`.
        bugs: catalogue to match structurally; ``args``: the constructor arguments.
    """
    ok, table = parameter_table(student, reference, kw.get("dims"))
    if ok:
        return
    bug = diagnose_structure(student, reference, kw.get("bugs", ()), kw.get("args", ()))
    report.fail(
        f"your {item} has a different number of parameters from the reference "
        f"({describe(kw.get('dims') or {})}):\n{table}",
        bug,
    )


def require_shape(report: Report, value: Any, shape: tuple[int, ...], what: str) -> Tensor:
    """Fail unless ``value`` is a tensor of ``shape``."""
    if not isinstance(value, Tensor):
        kind = "a tuple" if isinstance(value, tuple) else type(value).__name__
        report.fail(f"{what} should be a torch.Tensor, but your code returned {kind}.")
    if tuple(value.shape) != tuple(shape):
        report.fail(
            f"{what} has shape {tuple(value.shape)}, expected {tuple(shape)}. Check which "
            "axes you transpose, reshape and reduce."
        )
    return value


# ---------------------------------------------------------------------------------------------
# Catalogue: scaled dot-product attention
# ---------------------------------------------------------------------------------------------


def _attention_variant(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    scale: str = "sqrt_dk",
    softmax_dim: int = -1,
    mask_mode: str = "fill",
    empty_rows: str = "zero",
    return_scores: bool = False,
) -> tuple[Tensor, Tensor]:
    """Attention with switches for the catalogued mistakes; the defaults are the correct
    computation. ``scale``: "sqrt_dk", "none", "dk" or "sqrt_dv"; ``mask_mode``: "fill"
    (-inf before softmax), "after" (zero the weights after softmax, no renormalising) or
    "inverted" (hide the True positions); ``empty_rows``: "zero", "nan" (leave softmax's NaN)
    or "uniform" (a large finite fill, so a fully hidden row averages every value)."""
    d_k, d_v = query.size(-1), value.size(-1)
    divisor = {"sqrt_dk": math.sqrt(d_k), "none": 1.0, "dk": float(d_k), "sqrt_dv": math.sqrt(d_v)}
    scores = query @ key.transpose(-2, -1) / divisor[scale]  # (..., L, S)
    allowed = None if mask is None else (~mask if mask_mode == "inverted" else mask)
    if allowed is not None and mask_mode != "after":
        fill = float("-inf") if empty_rows != "uniform" else -1e9
        scores = scores.masked_fill(~allowed, fill)
    weights = torch.softmax(scores, dim=softmax_dim)  # (..., L, S)
    if allowed is not None and (mask_mode == "after" or empty_rows == "zero"):
        weights = weights.masked_fill(~allowed, 0.0)
    return weights @ value, scores if return_scores else weights  # (..., L, Dv), (..., L, S)


def _sdpa_bug(name: str, **switches: Any) -> Callable[..., tuple[Tensor, Tensor]]:
    def impl(query, key, value, mask=None):  # noqa: ANN001, ANN202 - the stub's signature
        return _attention_variant(query, key, value, mask, **switches)

    impl.__name__ = impl.__qualname__ = f"sdpa_{name}"
    return impl


SDPA_BUGS: list[BugVariant] = [
    BugVariant(
        "sdpa.no_scaling",
        SDPA,
        "the scores Q K^T are not divided by sqrt(d_k)",
        "Divide the scores by math.sqrt(d_k), where d_k = query.size(-1), before the softmax.",
        _sdpa_bug("no_scaling", scale="none"),
    ),
    BugVariant(
        "sdpa.scale_by_dk",
        SDPA,
        "the scores are divided by d_k instead of sqrt(d_k)",
        "Divide by math.sqrt(d_k), not by d_k.",
        _sdpa_bug("scale_by_dk", scale="dk"),
    ),
    BugVariant(
        "sdpa.scale_by_dv",
        SDPA,
        "the scores are scaled with the value size Dv instead of the key size Dk",
        "Use d_k = query.size(-1) (the size of the dot products), not value.size(-1).",
        _sdpa_bug("scale_by_dv", scale="sqrt_dv"),
    ),
    BugVariant(
        "sdpa.softmax_query_axis",
        SDPA,
        "the softmax runs over the queries (dim=-2) instead of over the keys",
        "Use torch.softmax(scores, dim=-1): each query's weights over the keys must sum to 1.",
        _sdpa_bug("softmax_query_axis", softmax_dim=-2),
    ),
    BugVariant(
        "sdpa.mask_after_softmax",
        SDPA,
        "the mask zeroes the weights after the softmax, so the remaining weights no longer "
        "sum to 1",
        "Mask the scores before the softmax: scores.masked_fill(~mask, float('-inf')).",
        _sdpa_bug("mask_after_softmax", mask_mode="after"),
    ),
    BugVariant(
        "sdpa.inverted_mask",
        SDPA,
        "the mask is read the wrong way round (True treated as blocked)",
        "True means may attend: hide the positions where the mask is False, "
        "scores.masked_fill(~mask, float('-inf')).",
        _sdpa_bug("inverted_mask", mask_mode="inverted"),
    ),
    BugVariant(
        "sdpa.masked_row_nan",
        SDPA,
        "a query whose keys are all masked gets NaN (softmax of a row of -inf)",
        "After the softmax, set the weights of masked positions to 0, e.g. "
        "weights.masked_fill(~mask, 0.0); a fully masked row then gives zeros.",
        _sdpa_bug("masked_row_nan", empty_rows="nan"),
    ),
    BugVariant(
        "sdpa.masked_row_uniform",
        SDPA,
        "a query whose keys are all masked averages all values (a finite fill such as -1e9 "
        "makes that row's softmax uniform)",
        "After the softmax, set the weights of masked positions to 0, e.g. "
        "weights.masked_fill(~mask, 0.0), so a fully masked row gives zeros.",
        _sdpa_bug("masked_row_uniform", empty_rows="uniform"),
    ),
    BugVariant(
        "sdpa.returns_scores",
        SDPA,
        "the second value returned is the scores before the softmax, not the weights",
        "Return (output, weights) where weights = softmax(scores) after masking.",
        _sdpa_bug("returns_scores", return_scores=True),
    ),
]


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
    SDPA,
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


def check_scaled_dot_product_attention(
    impl: Callable[..., Any],
    *,
    thorough: bool = False,
    seed: int | None = None,
    points: float | None = None,
) -> CheckResult:
    """Check ``scaled_dot_product_attention(query, key, value, mask=None) -> (output, weights)``.

    Compares with :func:`coursepkg.attention.scaled_dot_product_attention` over several shapes
    (3-D and 4-D inputs, L != S, Dk != Dv) in float32 and float64, without a mask, with a
    padding mask, with a causal mask and with a fully masked query; checks that hidden keys
    cannot influence the output, that gradients reach Q, K and V, and that the function does
    not call PyTorch's fused attention.

    Args:
        impl: the student's function.
        thorough: also try extra and randomised shapes (hidden tests).
        seed: picks the randomised shapes and the inputs.
        points: points to report on success.

    Returns:
        A passed :class:`CheckResult`.

    Raises:
        CheckFailure: what is wrong and, for a known mistake, what to change.
    """
    return run_check("check_scaled_dot_product_attention", points, _sdpa_body, impl, thorough, seed)


def _sdpa_body(report: Report, fn: Any, thorough: bool, seed: int | None) -> None:
    if not callable(fn):
        report.fail(f"expected your function {SDPA}, got {type(fn).__name__}.")

    def student(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> Any:
        result = call_student(fn, query, key, value, mask, item=SDPA)
        if not isinstance(result, tuple) or len(result) != 2:
            kind = type(result).__name__ + (
                f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""
            )
            raise CheckFailure(
                f"{SDPA} should return a tuple (output, weights), but it returned {kind}."
            )
        return result

    gen = generator(seed)
    cfgs = configs(SDPA, thorough, seed)
    with forbidden_calls(SDPA):
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
        output = expect_tensor_out(report, student(q, k, v)[0])
        check_gradients(output, [("query", q), ("key", k), ("value", v)], SDPA)
    report.ok("gradients reach query, key and value")


def expect_tensor_out(report: Report, value: Any) -> Tensor:
    """Fail unless the student's output is a tensor; return it."""
    if not isinstance(value, Tensor):
        report.fail(f"the output should be a torch.Tensor, got {type(value).__name__}.")
    return value


def _sdpa_config(
    report: Report,
    student: Callable[..., Any],
    cfg: dict[str, int],
    dtype: torch.dtype,
    gen: torch.Generator,
) -> None:
    b, n_q, n_k, d_k, d_v = cfg["B"], cfg["L"], cfg["S"], cfg["Dk"], cfg["Dv"]
    lead = (b, cfg["H"]) if "H" in cfg else (b,)
    q = randn(gen, *lead, n_q, d_k, dtype=dtype)  # (..., L, Dk)
    k = randn(gen, *lead, n_k, d_k, dtype=dtype)  # (..., S, Dk)
    v = randn(gen, *lead, n_k, d_v, dtype=dtype)  # (..., S, Dv)
    where = f"{describe(cfg)}, {dtype_name(dtype)}"
    # Pad so a (B, S) mask broadcasts against (..., L, S).
    pad_axes = (1,) * (len(lead) - 1) + (1,)

    def compare(mask: Tensor | None, case: str, inputs: tuple[Tensor, ...]) -> None:
        expected = _reference_sdpa(*inputs, mask)
        out, weights = student(*inputs, mask)
        require_shape(report, out, (*lead, n_q, d_v), f"the output ({where}, {case})")
        require_shape(report, weights, (*lead, n_q, n_k), f"the weights ({where}, {case})")

        def diagnosis() -> BugVariant | None:
            return diagnose(student, SDPA_BUGS, (*inputs, mask), reference_output=expected)

        expect_close(
            report, out, expected[0], f"your output ({where}, {case})", diagnosis=diagnosis
        )
        expect_close(
            report, weights, expected[1], f"your weights ({where}, {case})", diagnosis=diagnosis
        )

    compare(None, "no mask", (q, k, v))

    if n_k >= 2:
        keep = random_keep(gen, b, n_k)  # (B, S)
        mask = keep.view(b, *pad_axes, n_k)  # (B, [1,] 1, S)
        out = student(q, k, v, mask)[0]
        hidden = ~mask.transpose(-1, -2)  # (B, [1,] S, 1)
        k2 = torch.where(hidden, randn(gen, *k.shape, dtype=dtype) * 3, k)
        v2 = torch.where(hidden, randn(gen, *v.shape, dtype=dtype) * 3, v)
        expect_close(
            report,
            student(q, k2, v2, mask)[0],
            out,
            f"your output after changing the keys and values that a padding mask hides ({where})",
            diagnosis=lambda: diagnose(
                student, SDPA_BUGS, (q, k, v, mask), reference_output=_reference_sdpa(q, k, v, mask)
            ),
            hint="Positions where the mask is False must not influence the output. " + _MASK_RULE,
        )
        compare(mask, "padding mask", (q, k, v))

    if 2 <= n_q <= n_k:
        mask = causal_mask(n_q, n_k)  # (L, S), bottom-right aligned
        cut = n_q // 2  # queries 0 .. cut-1 see keys 0 .. cut-1 + S - L only
        visible_keys = cut + n_k - n_q
        out = student(q, k, v, mask)[0]
        k2, v2 = k.clone(), v.clone()
        k2[..., visible_keys:, :] = randn(gen, *k2[..., visible_keys:, :].shape, dtype=dtype)
        v2[..., visible_keys:, :] = randn(gen, *v2[..., visible_keys:, :].shape, dtype=dtype)
        expect_close(
            report,
            student(q, k2, v2, mask)[0][..., :cut, :],
            out[..., :cut, :],
            f"the first {cut} rows of your output after changing later keys and values under "
            f"a causal mask ({where})",
            diagnosis=lambda: diagnose(
                student, SDPA_BUGS, (q, k, v, mask), reference_output=_reference_sdpa(q, k, v, mask)
            ),
            hint="A query must not see keys the causal mask hides. " + _MASK_RULE,
        )
        compare(mask, "causal mask", (q, k, v))

    mask = torch.ones(*lead, n_q, n_k, dtype=torch.bool)  # (..., L, S)
    mask[(0,) * len(lead) + (0,)] = False  # the first query of the first row sees nothing
    if n_k >= 2:
        mask &= random_keep(gen, b, n_k).view(b, *pad_axes, n_k)
        mask[(0,) * len(lead) + (0,)] = False
    out, weights = student(q, k, v, mask)
    for name, t in (("output", out), ("weights", weights)):
        t = expect_tensor_out(report, t)
        if bool(torch.isnan(t).any()):
            bug = diagnose(
                student, SDPA_BUGS, (q, k, v, mask), reference_output=_reference_sdpa(q, k, v, mask)
            )
            report.fail(
                f"your {name} contains NaN when a query may attend no key ({where}). A fully "
                "masked row must give zero weights and a zero output.",
                bug,
            )
    compare(mask, "a fully masked query", (q, k, v))


# ---------------------------------------------------------------------------------------------
# Additive score
# ---------------------------------------------------------------------------------------------


def _additive_variant(query, keys, W_q, W_k, v, *, mode):  # noqa: ANN001, ANN202, N803
    q = query @ W_q.T  # (B, A)
    k = keys @ W_k.T  # (B, S, A)
    if mode == "no_tanh":
        return (q.unsqueeze(1) + k) @ v  # (B, S)
    if mode == "tanh_separately":
        return (torch.tanh(q).unsqueeze(1) + torch.tanh(k)) @ v  # (B, S)
    scores = torch.tanh(q.unsqueeze(1) + k) @ v  # (B, S)
    return torch.softmax(scores, dim=-1)  # mode == "softmax"


def _additive_bug(mode: str) -> Callable[..., Tensor]:
    def impl(query, keys, W_q, W_k, v):  # noqa: ANN001, ANN202, N803 - the stub's signature
        return _additive_variant(query, keys, W_q, W_k, v, mode=mode)

    impl.__name__ = impl.__qualname__ = f"additive_{mode}"
    return impl


ADDITIVE_BUGS: list[BugVariant] = [
    BugVariant(
        "additive.no_tanh",
        ADDITIVE,
        "the tanh between the projections and v is missing (the score is then linear)",
        "Compute v^T tanh(W_q s + W_k h): apply torch.tanh to the sum before the product with v.",
        _additive_bug("no_tanh"),
    ),
    BugVariant(
        "additive.tanh_separately",
        ADDITIVE,
        "tanh is applied to W_q s and to W_k h separately instead of to their sum",
        "Add the two projections first, then apply one tanh: tanh(W_q s + W_k h).",
        _additive_bug("tanh_separately"),
    ),
    BugVariant(
        "additive.softmax_applied",
        ADDITIVE,
        "the function returns softmax weights instead of the raw scores",
        "Return the scores; the softmax (and the mask) belong to the caller.",
        _additive_bug("softmax"),
    ),
]

register_configs(
    ADDITIVE,
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


def check_additive_score(
    impl: Callable[..., Any],
    *,
    thorough: bool = False,
    seed: int | None = None,
    points: float | None = None,
) -> CheckResult:
    """Check ``additive_score(query, keys, W_q, W_k, v) -> scores (B, S)`` (optional item).

    The expected scores come from :class:`coursepkg.attention.AdditiveAttention` given the same
    weights (its key bias set to zero, since the standalone score has none).

    Args:
        impl: the student's function.
        thorough: also try extra and randomised shapes.
        seed: picks the randomised shapes and the inputs.
        points: points to report on success.

    Returns:
        A passed :class:`CheckResult`.

    Raises:
        CheckFailure: what is wrong and, for a known mistake, what to change.
    """
    return run_check("check_additive_score", points, _additive_body, impl, thorough, seed)


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


def _additive_body(report: Report, fn: Any, thorough: bool, seed: int | None) -> None:
    if not callable(fn):
        report.fail(f"expected your function {ADDITIVE}, got {type(fn).__name__}.")

    def student(*inputs: Tensor) -> Any:
        return call_student(fn, *inputs, item=ADDITIVE)

    gen = generator(seed, salt=1)
    cfgs = configs(ADDITIVE, thorough, seed)
    with forbidden_calls(ADDITIVE):
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
                scores = require_shape(report, student(*inputs), (b, n_k), f"your scores ({where})")
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
        scores = expect_tensor_out(report, student(*inputs))
        check_gradients(scores, list(zip(names, inputs, strict=True)), ADDITIVE)
    report.ok("gradients reach all five inputs")


# ---------------------------------------------------------------------------------------------
# Catalogue: multi-head attention
# ---------------------------------------------------------------------------------------------


class _HeadsVariant(nn.Module):
    """Multi-head attention with switches for the catalogued mistakes (class attributes); the
    defaults are the correct computation. The encoder and decoder catalogues use the correct
    one as their attention block."""

    split = "transpose"  # or "reshape": (B, n, D) viewed as (B, H, n, Dk) directly
    merge = "transpose"  # or "reshape": (B, H, L, Dk) viewed as (B, L, D) directly
    scale = "sqrt_dk"  # or "sqrt_d_model"
    inverted = False
    has_out_proj = True
    self_only = False  # keys and values projected from the query (self-attention only)
    empty_rows = "zero"  # or "uniform": a finite fill, so a fully masked query averages values

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        if self.has_out_proj:
            self.out_proj = nn.Linear(d_model, d_model)

    def _heads(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        if self.split == "reshape":
            return x.reshape(b, self.n_heads, n, d // self.n_heads)  # (B, H, n, Dk)
        return x.reshape(b, n, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B, H, n, Dk)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        b, n_q, d = query.shape
        if self.self_only:
            key = value = query
        q = self._heads(self.q_proj(query))  # (B, H, L, Dk)
        k = self._heads(self.k_proj(key))  # (B, H, S, Dk)
        v = self._heads(self.v_proj(value))  # (B, H, S, Dk)
        if self.scale == "sqrt_d_model":
            # The kernel divides by sqrt(Dk); this makes the net divisor sqrt(D).
            q = q * math.sqrt(q.size(-1) / d)
        out, _ = _attention_variant(
            q,
            k,
            v,
            mask,
            mask_mode="inverted" if self.inverted else "fill",
            empty_rows=self.empty_rows,
        )  # (B, H, L, Dk)
        if self.merge == "reshape":
            out = out.reshape(b, n_q, d)  # (B, L, D)
        else:
            out = out.transpose(1, 2).reshape(b, n_q, d)  # (B, L, D)
        return self.out_proj(out) if self.has_out_proj else out


def _mha_bug(name: str, **switches: Any) -> type:
    return type(f"MultiHeadAttention_{name}", (_HeadsVariant,), switches)


MHA_BUGS: list[BugVariant] = [
    BugVariant(
        "mha.split_without_transpose",
        MHA,
        "the heads are split with a plain reshape (B, L, D) -> (B, H, L, Dk), which mixes "
        "positions and features",
        "Reshape to (B, L, H, Dk) first, then transpose(1, 2) to get (B, H, L, Dk).",
        _mha_bug("split_without_transpose", split="reshape"),
    ),
    BugVariant(
        "mha.merge_wrong_order",
        MHA,
        "the heads are merged in the wrong order: (B, H, L, Dk) is reshaped to (B, L, D) "
        "without moving the head axis back first",
        "Transpose (B, H, L, Dk) to (B, L, H, Dk), then reshape to (B, L, H*Dk) "
        "(call .contiguous() or use .reshape).",
        _mha_bug("merge_wrong_order", merge="reshape"),
    ),
    BugVariant(
        "mha.no_output_projection",
        MHA,
        "the output projection W^O (out_proj) is missing",
        "Add self.out_proj = nn.Linear(d_model, d_model) and apply it to the concatenated heads.",
        _mha_bug("no_output_projection", has_out_proj=False),
    ),
    BugVariant(
        "mha.scale_by_d_model",
        MHA,
        "the scores are divided by sqrt(d_model) instead of sqrt(d_k) of one head",
        "Each head's dot products have Dk = d_model // n_heads terms: divide by math.sqrt(Dk).",
        _mha_bug("scale_by_d_model", scale="sqrt_d_model"),
    ),
    BugVariant(
        "mha.inverted_mask",
        MHA,
        "the mask is read the wrong way round (True treated as blocked)",
        "True means may attend: fill the scores with -inf where the mask is False (~mask).",
        _mha_bug("inverted_mask", inverted=True),
    ),
    BugVariant(
        "mha.ignores_key_value",
        MHA,
        "your MultiHeadAttention ignores its key and value inputs: keys and values are "
        "projected from the query, so it can only attend to itself (the GPT-style "
        "self-attention habit), and cross-attention to the encoder's memory cannot work",
        "Project the arguments you are given: q = q_proj(query), k = k_proj(key), "
        "v = v_proj(value); with a fused projection, apply it to each input separately.",
        _mha_bug("ignores_key_value", self_only=True),
    ),
    BugVariant(
        "mha.masked_row_uniform",
        MHA,
        "a query whose keys are all masked averages all values instead of giving zero "
        "attention: a finite fill such as -1e9 or -1e4 (or torch.finfo().min) makes that "
        "row's softmax uniform",
        "After the softmax, set the weights of masked positions to 0 (weights.masked_fill("
        "~mask, 0.0)), or fill with float('-inf') and turn the NaN rows into zeros; a fully "
        "masked query must give a zero attention output.",
        _mha_bug("masked_row_uniform", empty_rows="uniform"),
    ),
]


# ---------------------------------------------------------------------------------------------
# check_multi_head_attention
# ---------------------------------------------------------------------------------------------


def _sample_mha(rng: random.Random) -> dict[str, int]:
    heads = rng.randint(1, 4)
    return {
        "B": rng.randint(1, 3),
        "L": rng.randint(1, 8),
        "S": rng.randint(1, 8),
        "D": heads * rng.randint(1, 4),
        "H": heads,
    }


register_configs(
    "multi_head_attention",
    visible=[
        {"B": 2, "L": 5, "S": 7, "D": 12, "H": 3},
        {"B": 1, "L": 1, "S": 4, "D": 8, "H": 2},
        {"B": 3, "L": 6, "S": 6, "D": 8, "H": 4},
    ],
    extra=[
        {"B": 2, "L": 3, "S": 9, "D": 16, "H": 8},
        {"B": 1, "L": 7, "S": 2, "D": 6, "H": 1},
    ],
    sample=_sample_mha,
)


def check_multi_head_attention(
    impl: type,
    *,
    thorough: bool = False,
    seed: int | None = None,
    points: float | None = None,
) -> CheckResult:
    """Check the class ``MultiHeadAttention(d_model, n_heads)``.

    Builds it for several shapes (batch of 1, L != S, one head ...), compares its parameter
    count with :class:`coursepkg.attention.MultiHeadAttention`, copies the reference's weights
    into it by name and compares outputs in float32 and float64 (no mask, padding mask,
    causal mask, a fully masked query); checks that hidden keys change nothing, that every
    parameter gets a gradient, and that it calls neither PyTorch's attention nor the
    reference.

    Args:
        impl: the student's class.
        thorough: also try extra and randomised shapes.
        seed: picks the randomised shapes and the inputs.
        points: points to report on success.

    Returns:
        A passed :class:`CheckResult`.

    Raises:
        CheckFailure: what is wrong and, for a known mistake, what to change.
    """
    return run_check("check_multi_head_attention", points, _mha_body, impl, thorough, seed)


def _mha_body(report: Report, cls: Any, thorough: bool, seed: int | None) -> None:
    gen = generator(seed, salt=2)
    cfgs = configs("multi_head_attention", thorough, seed)
    for index, cfg in enumerate(cfgs):
        d_model, n_heads = cfg["D"], cfg["H"]
        torch.manual_seed(index)
        reference = _ReferenceMHA(d_model, n_heads).eval()
        with forbidden_calls(MHA):
            dry = torch.zeros(1, 2, d_model)  # (1, 2, D)
            student = build_module(
                cls, (d_model, n_heads), MHA, seed=index, probe=(dry, dry, dry, None)
            )
        param_gap(
            report,
            student,
            reference,
            MHA,
            dims={"D": d_model, "H": n_heads},
            bugs=MHA_BUGS,
            args=(d_model, n_heads),
        )
        copy_weights(reference, student, MHA)
        for dtype in (torch.float32, torch.float64) if index == 0 else (torch.float32,):
            ref = copy.deepcopy(reference).to(dtype)
            mine = student.to(dtype)
            with forbidden_calls(MHA):
                run_attention_cases(
                    report,
                    lambda q, k, v, m, mine=mine: call_student(mine, q, k, v, m, item=MHA),
                    lambda q, k, v, m, ref=ref: ref(q, k, v, m),
                    cfg,
                    dtype,
                    gen,
                    item=MHA,
                    bugs=MHA_BUGS,
                    run=module_runner(ref, (d_model, n_heads)),
                )
        if index == 0:
            mine = student.float()
            x = randn(gen, cfg["B"], cfg["L"], d_model)
            m = randn(gen, cfg["B"], cfg["S"], d_model)
            with forbidden_calls(MHA):
                out = expect_tensor_out(report, call_student(mine, x, m, m, None, item=MHA))
            check_gradients(out, list(mine.named_parameters()), MHA)
    report.ok(f"parameter count and names match the reference on {len(cfgs)} shapes")
    report.ok("outputs match the reference (float32 and float64; no mask, padding, causal)")
    report.ok(
        "it reads its key and value; hidden keys change nothing; a fully masked query gives "
        "a zero attention output (no NaN, no average of the values)"
    )
    report.ok("gradients reach every parameter")


def run_attention_cases(
    report: Report,
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
        actual = require_shape(
            report, student(*inputs), tuple(expected.shape), f"the output of your {item} ({case})"
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
    if not _outputs_match_safely(student, (query, memory, memory, None), expected):
        _probe_key_value(report, student, query, memory, item, where)
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
            hint="Positions where the mask is False must not influence the output. " + _MASK_RULE,
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
            hint="Under a causal mask a position must not see later positions. " + _MASK_RULE,
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


def _outputs_match_safely(
    student: Callable[..., Any], inputs: Sequence[Any], expected: Tensor
) -> bool:
    """Whether the student's block gives ``expected`` on ``inputs`` (an error: no)."""
    try:
        out = student(*inputs)
    except CheckFailure:
        return False
    return isinstance(out, Tensor) and out.shape == expected.shape and _near(out, expected)


def _near(a: Tensor, b: Tensor) -> bool:
    return bool(
        torch.allclose(
            a.detach().to("cpu", torch.float64),
            b.detach().to("cpu", torch.float64),
            rtol=1e-3,
            atol=1e-4,
            equal_nan=True,
        )
    )


def _probe_key_value(
    report: Report,
    student: Callable[..., Any],
    query: Tensor,
    memory: Tensor,
    item: str,
    where: str,
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
        if _near(first, second):
            bug = next(b for b in MHA_BUGS if b.id == "mha.ignores_key_value")
            report.fail(
                f"the output of your {item} stays the same when its key and value inputs "
                f"change ({where}).",
                bug,
            )


BUGS: list[BugVariant] = [*SDPA_BUGS, *ADDITIVE_BUGS, *MHA_BUGS]
