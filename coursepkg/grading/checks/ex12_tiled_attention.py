"""Checks of ex12_tiled_attention: exact attention in tiles (FlashAttention's online softmax)
with its backward pass by recomputation, written as a ``torch.autograd.Function``; the
catalogue of mistakes it recognises is in :mod:`.ex12_tiled_attention_mistakes`.

The expected numbers are ``torch.nn.functional.scaled_dot_product_attention``'s and its
autograd gradients, computed in float64 (a query that may attend no key gets zeros).

Dimension legend: B batch, H heads, L queries, S keys, Dk/Dv per-head sizes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...efficient_attention import tiled_attention
from ...masks import causal_mask
from ..framework import (
    BugVariant,
    CheckFailure,
    CheckReport,
    call_student,
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
)
from .ex12_tiled_attention_mistakes import TILED_BUGS, TILED_ITEM

__all__ = ["SCALED_QUERIES", "check_tiled_attention", "devices"]

Config = dict[str, Any]
Inputs = tuple[Any, ...]  # (query, key, value, mask, causal, block_q, block_k, grad_out)

#: The factor the queries are multiplied by in the overflow case: scores of a few hundred,
#: far past float32's exp limit (~88), which an online softmax that subtracts its running
#: maximum handles exactly.
SCALED_QUERIES = 100.0

#: ``(rtol, atol as a fraction of the largest expected entry)`` of the gradients in the overflow
#: case. With scores of a few hundred a float32 rounding of a score (~2e-5 of it) moves a weight
#: by ~2e-5 of itself, and the key gradient multiplies such differences by the scaled queries:
#: correct float32 solutions differ from the float64 reference by up to 1.9e-3 where the largest
#: entry is ~2 (measured on five correct implementations in three styles, seeds None, 0, 1, 2,
#: 121 and 122; at most 8% of this tolerance). The case is there for overflow: a backward that
#: exponentiates raw scores gives inf or NaN, far outside it.
SCALED_GRADIENTS = (1e-2, 1e-2)


def _sample(rng: random.Random) -> Config:
    causal = rng.random() < 0.5
    n_q = rng.randint(1, 12)
    cfg: Config = {"B": rng.randint(1, 2)}
    if rng.random() < 0.5:
        cfg["H"] = rng.randint(1, 3)
    cfg.update(
        L=n_q,
        S=rng.randint(n_q, 14) if causal else rng.randint(1, 14),
        Dk=rng.randint(1, 8),
        Dv=rng.randint(1, 8),
        bq=rng.randint(1, 6),
        bk=rng.randint(1, 6),
        causal=causal,
        mask=rng.choice(["none", "padding"]),
    )
    return cfg


register_configs(
    TILED_ITEM,
    visible=[
        {
            "B": 1,
            "H": 2,
            "L": 7,
            "S": 10,
            "Dk": 4,
            "Dv": 3,
            "bq": 3,
            "bk": 4,
            "causal": False,
            "mask": "none",
        },
        {
            "B": 2,
            "L": 6,
            "S": 9,
            "Dk": 8,
            "Dv": 5,
            "bq": 4,
            "bk": 2,
            "causal": False,
            "mask": "padding",
        },
        {
            "B": 1,
            "H": 2,
            "L": 5,
            "S": 9,
            "Dk": 4,
            "Dv": 4,
            "bq": 2,
            "bk": 4,
            "causal": True,
            "mask": "none",
        },
        {
            "B": 2,
            "L": 8,
            "S": 8,
            "Dk": 4,
            "Dv": 2,
            "bq": 3,
            "bk": 3,
            "causal": True,
            "mask": "padding",
        },
    ],
    extra=[
        {
            "B": 1,
            "L": 1,
            "S": 1,
            "Dk": 1,
            "Dv": 1,
            "bq": 4,
            "bk": 4,
            "causal": False,
            "mask": "none",
        },
        {
            "B": 1,
            "H": 3,
            "L": 4,
            "S": 13,
            "Dk": 6,
            "Dv": 3,
            "bq": 5,
            "bk": 5,
            "causal": True,
            "mask": "padding",
        },
    ],
    sample=_sample,
)

_FORBID = {
    "extra": [(tiled_attention, "coursepkg.efficient_attention.tiled_attention")],
    "advice": "write the tiles, the online softmax and the backward pass yourself",
}

_OUTPUT_HINT = (
    "Expected softmax(Q K^T / sqrt(Dk)) V over the keys each query may see (mask True, and "
    "with causal=True key j <= i + S - L), computed key block by key block."
)
_GRADIENT_HINT = (
    "Expected the gradients of that output: dV = P^T dO, dP = dO V^T, dS = P * (dP - D) with "
    "D = rowsum(dO * O), dQ = dS K / sqrt(Dk), dK = dS^T Q / sqrt(Dk), each tile's P "
    "recomputed as exp(scores - lse)."
)


_GRADIENT_COUNT = (
    "backward returns one entry per argument of forward after ctx: "
    "(grad_query, grad_key, grad_value, None, None, None, None)."
)
_RETURNS_A_TUPLE = (
    "your TiledAttention.apply returns a tuple: forward should return the output only, and keep "
    "the log-sum-exp for the backward pass with ctx.save_for_backward."
)


def devices() -> list[str]:
    """Where the check runs: the CPU, and a CUDA device when there is one."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


# ---------------------------------------------------------------------------------------------
# Running a Function (the student's or a catalogued one) and the reference
# ---------------------------------------------------------------------------------------------


def _run(function: Any, inputs: Inputs, call: Callable[..., Any] | None = None) -> tuple:
    """``function.apply`` on the inputs, then its gradients for ``grad_out``: (out, dq, dk, dv).
    ``call(fn, *args)`` calls the student's code (``call_student``); None calls it plainly."""
    q, k, v, mask, causal, block_q, block_k, grad_out = inputs
    call = call or (lambda fn, *args, **kw: fn(*args, **kw))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        out = call(function.apply, *leaves, mask, causal, block_q, block_k)
        if isinstance(out, tuple):
            raise CheckFailure(_RETURNS_A_TUPLE)
        out = expect_tensor(
            out, "the output of your TiledAttention.apply", (*q.shape[:-1], v.size(-1))
        )
        if not out.requires_grad:
            raise CheckFailure(
                "the output of your TiledAttention.apply has no gradient: return it from "
                "forward (a torch.autograd.Function) without detaching it."
            )
        try:
            grads = call(torch.autograd.grad, out, leaves, grad_out, allow_unused=True)
        except CheckFailure as failure:
            if "incorrect number of gradients" in failure.message:
                failure.message += f"\n{_GRADIENT_COUNT}"
                failure.args = (failure.message,)
            raise
    for name, grad, leaf in zip(("query", "key", "value"), grads, leaves, strict=True):
        if grad is None:
            raise CheckFailure(f"your backward returns None as the gradient of the {name}.")
        expect_tensor(grad, f"the gradient of the {name} from your backward", leaf.shape)
    return (out.detach(), *grads)


def _allowed(mask: Tensor | None, causal: bool, q: Tensor, k: Tensor) -> Tensor | None:
    """The whole mask (..., L, S) the student's Function is asked to apply, or None."""
    n_q, n_k = q.size(-2), k.size(-2)
    allowed = None if mask is None else mask.expand(*q.shape[:-2], n_q, n_k)
    if causal:
        tri = causal_mask(n_q, n_k, device=q.device)  # (L, S), bottom-right aligned
        allowed = tri.expand(*q.shape[:-2], n_q, n_k) if allowed is None else allowed & tri
    return allowed


def _reference(inputs: Inputs) -> tuple[Tensor, ...]:
    """SDPA's output and gradients (float64, on the CPU), as the inputs' dtype and device; a
    query that may attend no key gets zeros (its row attends everything, then is zeroed)."""
    q, k, v, mask, causal, _, _, grad_out = inputs
    leaves = [t.detach().to("cpu", torch.float64).requires_grad_() for t in (q, k, v)]
    allowed = _allowed(None if mask is None else mask.cpu(), causal, *leaves[:2])
    with torch.enable_grad():
        if allowed is None:
            out = F.scaled_dot_product_attention(*leaves)  # (..., L, Dv)
        else:
            seen = allowed.any(dim=-1, keepdim=True)  # (..., L, 1)
            out = F.scaled_dot_product_attention(*leaves, attn_mask=allowed | ~seen)
            out = torch.where(seen, out, 0.0)  # (..., L, Dv)
        grads = torch.autograd.grad(out, leaves, grad_out.to("cpu", torch.float64))
    return tuple(t.detach().to(q.device, q.dtype) for t in (out, *grads))


def _inputs(gen: torch.Generator, cfg: Config, dtype: torch.dtype, device: str) -> Inputs:
    lead = (cfg["B"], cfg["H"]) if "H" in cfg else (cfg["B"],)
    q = randn(gen, *lead, cfg["L"], cfg["Dk"], dtype=dtype)  # (..., L, Dk)
    k = randn(gen, *lead, cfg["S"], cfg["Dk"], dtype=dtype)  # (..., S, Dk)
    v = randn(gen, *lead, cfg["S"], cfg["Dv"], dtype=dtype)  # (..., S, Dv)
    grad_out = randn(gen, *lead, cfg["L"], cfg["Dv"], dtype=dtype)  # (..., L, Dv)
    mask = None
    if cfg["mask"] == "padding":
        pad_axes = (1,) * (len(lead) - 1)
        mask = random_keep(gen, cfg["B"], cfg["S"]).view(cfg["B"], *pad_axes, 1, cfg["S"])
    q, k, v, grad_out = (t.to(device) for t in (q, k, v, grad_out))
    mask = None if mask is None else mask.to(device)
    return (q, k, v, mask, cfg["causal"], cfg["bq"], cfg["bk"], grad_out)


# ---------------------------------------------------------------------------------------------
# The comparisons
# ---------------------------------------------------------------------------------------------


def _first(run: Callable[..., tuple]) -> Callable[..., Tensor]:
    return lambda *args: run(*args)[0]


def _compare(
    report: CheckReport,
    student: Callable[..., tuple],
    inputs: Inputs,
    where: str,
    gradients: tuple[float, float] | None = None,
    output_diagnosis: Callable[[], BugVariant | None] | None = None,
) -> None:
    """The output, then the three gradients, against SDPA's; a mismatch of the output is named
    from the catalogue's outputs, one of the gradients from its outputs and gradients."""
    expected = _reference(inputs)
    mine = student(*inputs)
    expect_close(
        report,
        mine[0],
        expected[0],
        f"your output ({where})",
        diagnosis=output_diagnosis
        or (
            lambda: diagnose(
                _first(student),
                TILED_BUGS,
                inputs,
                run=lambda f, a: _run(f, a)[0],
                reference_output=expected[0],
            )
        ),
        hint=_OUTPUT_HINT,
    )
    for name, grad, want in zip(("query", "key", "value"), mine[1:], expected[1:], strict=True):
        tolerance = {}
        if gradients is not None:
            largest = float(want.abs().max()) if want.numel() else 0.0
            tolerance = {"rtol": gradients[0], "atol": gradients[1] * max(largest, 1.0)}
        expect_close(
            report,
            grad,
            want,
            f"the gradient of the {name} from your backward ({where})",
            diagnosis=lambda: diagnose(
                student, TILED_BUGS, inputs, run=_run, reference_output=expected
            ),
            hint=_GRADIENT_HINT,
            **tolerance,
        )


def _fully_masked(gen: torch.Generator, cfg: Config, device: str) -> Inputs:
    """The first query of the first sequence may attend no key; the others a padding mask."""
    q, k, v, _, _, block_q, block_k, grad_out = _inputs(gen, cfg, torch.float32, device)
    lead = tuple(q.shape[:-2])
    mask = torch.ones(*lead, q.size(-2), k.size(-2), dtype=torch.bool)  # (..., L, S)
    mask &= random_keep(gen, cfg["B"], k.size(-2)).view(cfg["B"], *(1,) * len(lead), -1)
    mask[(0,) * len(lead) + (0,)] = False
    return (q, k, v, mask.to(device), False, block_q, block_k, grad_out)


def _overflow(
    report: CheckReport, student: Callable[..., tuple], inputs: Inputs, where: str
) -> None:
    """Queries scaled by :data:`SCALED_QUERIES` (float32): exp of an unshifted score
    overflows. A student whose output is not finite here, as the catalogued variant's is not,
    made that mistake."""
    q, *rest = inputs
    scaled = (q * SCALED_QUERIES, *rest)
    bug = next(b for b in TILED_BUGS if b.id == "tiled.max_not_subtracted")

    def overflow() -> BugVariant | None:
        try:
            out = student(*scaled)[0]
        except CheckFailure:
            return None
        theirs = _run(bug.impl, scaled)[0]
        finite = bool(torch.isfinite(out).all())
        return bug if not finite and not bool(torch.isfinite(theirs).all()) else None

    _compare(
        report,
        student,
        scaled,
        f"queries multiplied by {SCALED_QUERIES:g}: scores of a few hundred, {where}",
        gradients=SCALED_GRADIENTS,
        output_diagnosis=overflow,
    )


def _expect_function(report: CheckReport, impl: Any) -> None:
    if not (isinstance(impl, type) and issubclass(impl, torch.autograd.Function)):
        report.fail(
            f"{TILED_ITEM} should be a class derived from torch.autograd.Function (with "
            f"static methods forward(ctx, ...) and backward(ctx, grad_out)), got "
            f"{type(impl).__name__}."
        )


def _each_device(
    report: CheckReport, student: Callable[..., tuple], cfgs: Sequence[Config], seed: Any
) -> list[str]:
    ran = []
    for device in devices():
        gen = generator(seed, salt=21)
        for cfg in cfgs:
            for dtype in (torch.float32, torch.float64):
                inputs = _inputs(gen, cfg, dtype, device)
                _compare(report, student, inputs, f"{describe(cfg)}, {dtype_name(dtype)}, {device}")
        masked = _fully_masked(gen, cfgs[0], device)
        _compare(report, student, masked, f"a query that may attend no key, {device}")
        plain = _inputs(gen, cfgs[0], torch.float32, device)
        _overflow(report, student, plain, f"{describe(cfgs[0])}, float32, {device}")
        ran.append(device)
    return ran


@public_check(
    assignment="ex12_tiled_attention", implements="TiledAttention", bugs=TILED_BUGS, kind="class"
)
def check_tiled_attention(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``TiledAttention``, a ``torch.autograd.Function`` called as
    ``TiledAttention.apply(query, key, value, mask, causal, block_q, block_k)``.

    Compares its output and the gradients its backward returns for query, key and value with
    ``scaled_dot_product_attention``'s (float64 autograd) in float32 and float64: block sizes
    that do not divide the lengths, 3-D and 4-D inputs, a padding mask, a causal mask aligned
    bottom-right with fewer queries than keys, a query that may attend no key (zeros, not
    NaN) and queries scaled until exp of a raw score overflows float32. On a machine with
    CUDA the same cases run there too. Rejects calls to PyTorch's fused attention and to the
    course's own ``tiled_attention``.
    """
    _expect_function(report, impl)

    def student(*inputs: Any) -> tuple:
        return _run(
            impl, inputs, lambda fn, *args, **kw: call_student(fn, *args, item=TILED_ITEM, **kw)
        )

    cfgs = configs(TILED_ITEM, thorough, seed)
    with forbidden_calls(TILED_ITEM, **_FORBID):
        ran = _each_device(report, student, cfgs, seed)
    report.ok(f"output and gradients match SDPA's on {len(cfgs)} shapes (float32 and float64)")
    report.ok("block sizes that do not divide the lengths; padding and bottom-right causal masks")
    report.ok("a query that may attend no key gives zeros; scores of a few hundred do not overflow")
    report.ok(f"ran on {' and '.join(ran)}")
