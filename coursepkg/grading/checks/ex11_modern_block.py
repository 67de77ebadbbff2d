"""Checks of ex11_modern_block: today's decoder block (``RMSNorm``, ``apply_rope``, ``SwiGLU``,
``GroupedQueryAttention`` and the pre-norm ``ModernDecoderBlock``); the catalogue of mistakes
they recognise is in :mod:`.ex11_modern_block_mistakes`.

Dimension legend: B batch, L length, D d_model, H query heads, Hkv key/value heads, Dh per-head
width, F hidden width of the feed-forward.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...layers import PositionwiseFeedForward as _ReferenceFFN
from ...layers import RMSNorm as _ReferenceRMSNorm
from ...masks import causal_mask
from ...positional import apply_rope as _reference_rope
from ..framework import (
    BugVariant,
    CheckReport,
    ModuleSpec,
    Stage,
    cache_stage,
    call_student,
    check_module,
    configs,
    describe,
    diagnose,
    dtype_name,
    each_dtype,
    expect_close,
    expect_tensor,
    forbidden_calls,
    generator,
    guarded,
    module_runner,
    norm_gains_stage,
    public_check,
    randn,
    register_configs,
    run_self_attention_cases,
)
from ..framework.modern_blocks import ReferenceBlock, ReferenceGQA
from .ex11_modern_block_mistakes import (
    GQA_BUGS,
    GQA_ITEM,
    MODERN_BLOCK_BUGS,
    MODERN_BLOCK_ITEM,
    RMS_NORM_BUGS,
    RMS_NORM_ITEM,
    ROPE_BUGS,
    ROPE_ITEM,
    SWIGLU_BUGS,
    SWIGLU_ITEM,
)

__all__ = [
    "check_apply_rope",
    "check_grouped_query_attention",
    "check_modern_block",
    "check_rms_norm",
    "check_swiglu",
]

Config = dict[str, Any]

#: ``(rtol, atol)`` of the float64 comparisons of everything that rotates (apply_rope, the
#: attention, the block). The reference's ``apply_rope`` computes its angles in float32 even
#: for float64 inputs, so an exact float64 rotation differs from it by up to 6e-7 at 20
#: positions and 2.9e-6 at 64 (measured; the checks use at most 24 positions). Every
#: catalogued mistake changes the outputs by more than 1e-2.
ROTARY_FLOAT64 = (1e-5, 1e-5)


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    """The float64 tolerance of :data:`ROTARY_FLOAT64`; the framework's defaults otherwise."""
    if dtype == torch.float64:
        return {"rtol": ROTARY_FLOAT64[0], "atol": ROTARY_FLOAT64[1]}
    return {}


# ---------------------------------------------------------------------------------------------
# check_rms_norm
# ---------------------------------------------------------------------------------------------

register_configs(
    RMS_NORM_ITEM,
    visible=[
        {"B": 2, "L": 5, "D": 8},
        {"B": 1, "L": 1, "D": 3},
        {"B": 3, "L": 4, "D": 16, "eps": 1e-6},
    ],
    extra=[{"B": 1, "L": 7, "D": 1}],
    sample=lambda rng: {"B": rng.randint(1, 3), "L": rng.randint(1, 8), "D": rng.randint(1, 24)},
)

_RMS_FORBID = {
    "extra": [
        (F.rms_norm, "torch.nn.functional.rms_norm"),
        (torch.rms_norm, "torch.rms_norm"),
    ],
    "advice": "compute the mean of the squares and the normalisation yourself",
}


def _rows(gen: torch.Generator, b: int, n: int, d: int, dtype: torch.dtype) -> Tensor:
    """Rows of different scales whose means are far from 0 (centring them changes them); the
    first row of each sequence is small (its mean square, ~1e-4, is near eps, where the place
    of eps decides the result)."""
    x = randn(gen, b, n, d) * (0.5 + 3 * torch.rand(b, n, 1, generator=gen))  # (B, L, D)
    x = x + 2 * randn(gen, b, n, 1)  # (B, L, D)
    x[:, 0] = x[:, 0] * 1e-3 + 0.01
    return x.to(dtype)


def _rms_gains(
    report: CheckReport, student: nn.Module, reference: nn.Module, cfg: Config, gen: Any
) -> None:
    """The gain starts at ones; then random gains in the reference, which the copy carries."""
    params = dict(student.named_parameters())
    if "weight" in params and not torch.equal(params["weight"].detach(), torch.ones(cfg["D"])):
        report.fail(
            "a new RMSNorm should start as a plain normalisation: `weight` should be "
            "initialised to ones (torch.ones(d_model))."
        )
    with torch.no_grad():
        reference.weight.copy_(1 + 0.5 * randn(gen, cfg["D"]))


def _positionwise_stage(
    item: str,
    bugs: list[BugVariant],
    args: Callable[[Config], tuple[Any, ...]],
    inputs: Callable[[torch.Generator, Config, torch.dtype], Tensor],
    hint: str,
    forbid: dict[str, Any] | None = None,
) -> Stage:
    """The numbers of a module of one input (B, L, D), per dtype (:func:`each_dtype`): its
    output on ``inputs(gen, cfg, dtype)`` against the reference's, a mismatch named from
    ``bugs`` (built with ``args(cfg)`` and the reference's weights)."""

    def cases(report: CheckReport, student: nn.Module, ref: nn.Module, cfg: Config, *rest: Any):
        dtype, gen = rest
        mine = guarded(student, item, **(forbid or {}))
        x = inputs(gen, cfg, dtype)  # (B, L, D)
        where = f"{describe(cfg)}, {dtype_name(dtype)}"
        expected = ref(x)
        run = module_runner(ref, args(cfg))
        expect_close(
            report,
            expect_tensor(mine(x), f"your output ({where})", x.shape),
            expected,
            f"the output of your {item} ({where})",
            diagnosis=partial(diagnose, mine, bugs, (x,), run=run, reference_output=expected),
            hint=hint,
        )

    return each_dtype(cases)


_RMS_SPEC = ModuleSpec(
    item=RMS_NORM_ITEM,
    bugs=RMS_NORM_BUGS,
    reference=lambda cfg: _ReferenceRMSNorm(cfg["D"], cfg.get("eps", 1e-5)),
    args=lambda cfg: (cfg["D"],),
    bug_args=lambda cfg: (cfg["D"], cfg.get("eps", 1e-5)),
    kwargs=lambda cfg: {"eps": cfg["eps"]} if "eps" in cfg else None,
    dims=lambda cfg: {"D": cfg["D"]},
    dry=lambda cfg: None,
    gradient_inputs=lambda gen, cfg: (_rows(gen, cfg["B"], cfg["L"], cfg["D"], torch.float32),),
    stages=(
        _positionwise_stage(
            RMS_NORM_ITEM,
            RMS_NORM_BUGS,
            lambda cfg: (cfg["D"], cfg.get("eps", 1e-5)),
            lambda gen, cfg, dtype: _rows(gen, cfg["B"], cfg["L"], cfg["D"], dtype),
            "Expected x / sqrt(mean(x**2) + eps) * weight over the last axis.",
            _RMS_FORBID,
        ),
    ),
    before_copy=_rms_gains,
    forbid=_RMS_FORBID,
    extra=(nn.RMSNorm,),
)


@public_check(
    assignment="ex11_modern_block", implements="RMSNorm", bugs=RMS_NORM_BUGS, kind="class"
)
def check_rms_norm(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the class ``RMSNorm(d_model, eps=1e-5)`` with the one parameter ``weight``.

    Checks the parameter and its initial value (ones), copies random gains into both modules
    and compares with :class:`coursepkg.layers.RMSNorm` on rows whose means are far from zero
    and on small rows (where eps matters), in float32 and float64 and with another eps;
    checks gradients, and rejects ``nn.RMSNorm`` and ``F.rms_norm``.
    """
    gen = generator(seed, salt=11)
    cfgs = configs(RMS_NORM_ITEM, thorough, seed)
    check_module(report, impl, _RMS_SPEC, cfgs, gen)
    report.ok(f"one gain `weight` (ones, no bias), as the reference's, on {len(cfgs)} shapes")
    report.ok("outputs match with random gains (float32, float64, another eps)")
    report.ok("gradients reach the gain")


# ---------------------------------------------------------------------------------------------
# check_apply_rope
# ---------------------------------------------------------------------------------------------


def _sample_rope(rng: random.Random) -> Config:
    return {
        "B": rng.randint(1, 2),
        "H": rng.randint(1, 3),
        "L": rng.randint(1, 12),
        "Dh": 2 * rng.randint(1, 8),
        "start": rng.choice([0, 0, rng.randint(1, 12)]),
        "theta": rng.choice([10000.0, 500000.0, 100.0]),
        "pairs": rng.choice(["halves", "interleaved"]),
    }


register_configs(
    ROPE_ITEM,
    visible=[
        {"B": 2, "H": 3, "L": 6, "Dh": 8, "start": 0, "theta": 10000.0, "pairs": "halves"},
        {"B": 1, "H": 2, "L": 5, "Dh": 8, "start": 3, "theta": 10000.0, "pairs": "interleaved"},
        {"B": 1, "H": 1, "L": 1, "Dh": 4, "start": 7, "theta": 500000.0, "pairs": "halves"},
    ],
    extra=[
        {"B": 1, "H": 4, "L": 12, "Dh": 2, "start": 0, "theta": 10000.0, "pairs": "interleaved"},
        {"B": 2, "H": 1, "L": 9, "Dh": 16, "start": 11, "theta": 100.0, "pairs": "halves"},
    ],
    sample=_sample_rope,
)


def _relative_positions(
    report: CheckReport, rope: Callable[..., Any], x: Tensor, cfg: Config, where: str
) -> None:
    """RoPE's point: the score of a rotated query and key depends on their offset only, so
    shifting every position by the same amount changes no score."""
    q, k = x, x.flip(-2)  # (B, H, L, Dh) each
    start = torch.arange(cfg["L"]) + cfg["start"]  # (L,)
    args = (cfg["theta"], cfg["pairs"])
    scores = rope(q, start, *args) @ rope(k, start, *args).transpose(-2, -1)  # (B, H, L, L)
    later = start + 5
    shifted = rope(q, later, *args) @ rope(k, later, *args).transpose(-2, -1)  # (B, H, L, L)
    expect_close(
        report,
        shifted,
        scores,
        f"the scores q·k of your rotated queries and keys with every position moved by 5 ({where})",
        hint="A rotation by pos·w_i of every pair makes q_m·k_n depend on m - n only.",
        **_tolerance(x.dtype),
    )


@public_check(assignment="ex11_modern_block", implements="apply_rope", bugs=ROPE_BUGS)
def check_apply_rope(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``apply_rope(x, positions, theta=10000.0, pairs="halves") -> (B, H, L, Dh)``.

    Compares with :func:`coursepkg.positional.apply_rope` for both pairings ("halves", the
    rotate-half layout, and "interleaved", adjacent columns), several bases theta, positions
    that start after 0 (as with a KV cache) and a single position, in float32 and float64;
    checks that the scores of rotated queries and keys depend on the offset only, and that it
    is computed rather than taken from the reference.
    """
    if not callable(impl):
        report.fail(f"expected your function {ROPE_ITEM}, got {type(impl).__name__}.")

    def rope(x: Tensor, positions: Tensor, theta: float, pairs: str) -> Any:
        with forbidden_calls(ROPE_ITEM):
            return call_student(impl, x, positions, theta, pairs, item=ROPE_ITEM)

    gen = generator(seed, salt=12)
    cfgs = configs(ROPE_ITEM, thorough, seed)
    for index, cfg in enumerate(cfgs):
        shape = (cfg["B"], cfg["H"], cfg["L"], cfg["Dh"])
        positions = torch.arange(cfg["L"]) + cfg["start"]  # (L,)
        for dtype in (torch.float32, torch.float64) if index == 0 else (torch.float32,):
            x = randn(gen, *shape, dtype=dtype)  # (B, H, L, Dh)
            where = f"{describe(cfg)}, {dtype_name(dtype)}"
            inputs = (x, positions, cfg["theta"], cfg["pairs"])
            expected = _reference_rope(*inputs)
            expect_close(
                report,
                expect_tensor(rope(*inputs), f"your output ({where})", shape),
                expected,
                f"your rotated x ({where})",
                diagnosis=partial(diagnose, rope, ROPE_BUGS, inputs, reference_output=expected),
                hint="Expected pair i of each head turned by the angle pos * theta^(-2i/Dh).",
                **_tolerance(dtype),
            )
        _relative_positions(report, rope, x, cfg, where)
    report.ok(f"matches the reference on {len(cfgs)} shapes, both pairings, several theta")
    report.ok("positions that start after 0 (as with a KV cache) are rotated by their value")
    report.ok("scores of rotated queries and keys depend on their offset only")


# ---------------------------------------------------------------------------------------------
# check_swiglu
# ---------------------------------------------------------------------------------------------

register_configs(
    SWIGLU_ITEM,
    visible=[
        {"B": 2, "L": 5, "D": 8, "F": 12},
        {"B": 1, "L": 1, "D": 4, "F": 3},
        {"B": 3, "L": 4, "D": 6, "F": 16},
    ],
    extra=[{"B": 1, "L": 9, "D": 2, "F": 32}],
    sample=lambda rng: {
        "B": rng.randint(1, 3),
        "L": rng.randint(1, 8),
        "D": rng.randint(1, 16),
        "F": rng.randint(1, 32),
    },
)


_SWIGLU_SPEC = ModuleSpec(
    item=SWIGLU_ITEM,
    bugs=SWIGLU_BUGS,
    reference=lambda cfg: _ReferenceFFN(cfg["D"], cfg["F"], activation="swiglu", bias=False),
    args=lambda cfg: (cfg["D"], cfg["F"]),
    dims=lambda cfg: {"D": cfg["D"], "F": cfg["F"]},
    dry=lambda cfg: (torch.zeros(1, 2, cfg["D"]),),  # (1, 2, D)
    gradient_inputs=lambda gen, cfg: (randn(gen, cfg["B"], cfg["L"], cfg["D"]),),
    stages=(
        _positionwise_stage(
            SWIGLU_ITEM,
            SWIGLU_BUGS,
            lambda cfg: (cfg["D"], cfg["F"]),
            lambda gen, cfg, dtype: randn(gen, cfg["B"], cfg["L"], cfg["D"], dtype=dtype),
            "Expected linear2(silu(linear1(x)) * linear3(x)), no biases.",
        ),
    ),
)


@public_check(assignment="ex11_modern_block", implements="SwiGLU", bugs=SWIGLU_BUGS, kind="class")
def check_swiglu(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the class ``SwiGLU(d_model, d_ff)`` (``linear1`` the gate, ``linear3`` the
    linear branch, ``linear2`` back to D, no biases).

    Compares the parameter count with :class:`coursepkg.layers.PositionwiseFeedForward`
    (``activation="swiglu"``, ``bias=False``), copies its weights in by name and compares
    outputs (float32 and float64); checks that every parameter gets a gradient.
    """
    gen = generator(seed, salt=13)
    cfgs = configs(SWIGLU_ITEM, thorough, seed)
    check_module(report, impl, _SWIGLU_SPEC, cfgs, gen)
    report.ok(f"parameter count and names match the reference on {len(cfgs)} shapes")
    report.ok("outputs match (float32 and float64): SiLU on the gate linear1, times linear3")
    report.ok("gradients reach every parameter")


def _args(cfg: Config) -> tuple[Any, ...]:
    """The constructor's positional arguments: (D, H, Hkv) and, for the block, F."""
    return (cfg["D"], cfg["H"], cfg["Hkv"], *((cfg["F"],) if "F" in cfg else ()))


def _rope_kwargs(cfg: Config) -> dict[str, Any]:
    return {"rope_theta": cfg["theta"], "rope_pairs": cfg["pairs"]}


def _gqa_args(cfg: Config) -> tuple[Any, ...]:
    """A catalogued attention's arguments: (D, H, Hkv, theta, pairs)."""
    return (*_args(cfg), cfg["theta"], cfg["pairs"])


def _block_args(cfg: Config) -> tuple[Any, ...]:
    """A catalogued block's arguments: (D, H, Hkv, F, eps, theta, pairs)."""
    return (*_args(cfg), 1e-5, cfg["theta"], cfg["pairs"])


# ---------------------------------------------------------------------------------------------
# check_grouped_query_attention
# ---------------------------------------------------------------------------------------------


def _sample_gqa(rng: random.Random) -> Config:
    kv = rng.randint(1, 3)
    heads = kv * rng.randint(1, 3)
    return {
        "B": rng.randint(1, 3),
        "L": rng.randint(2, 10),
        "D": heads * 2 * rng.randint(1, 4),
        "H": heads,
        "Hkv": kv,
        "theta": rng.choice([10000.0, 500000.0]),
        "pairs": rng.choice(["halves", "interleaved"]),
    }


_GQA_VISIBLE = [
    {"B": 2, "L": 6, "D": 16, "H": 4, "Hkv": 2, "theta": 10000.0, "pairs": "halves"},
    {"B": 1, "L": 5, "D": 12, "H": 3, "Hkv": 1, "theta": 10000.0, "pairs": "interleaved"},
    {"B": 3, "L": 4, "D": 8, "H": 2, "Hkv": 2, "theta": 500000.0, "pairs": "halves"},
]
register_configs(
    GQA_ITEM,
    visible=_GQA_VISIBLE,
    extra=[
        {"B": 1, "L": 9, "D": 24, "H": 6, "Hkv": 3, "theta": 10000.0, "pairs": "interleaved"},
        {"B": 2, "L": 1, "D": 8, "H": 4, "Hkv": 1, "theta": 10000.0, "pairs": "halves"},
    ],
    sample=_sample_gqa,
)


def _self_attention_spec(
    item: str,
    bugs: list[BugVariant],
    reference: Callable[[Config], nn.Module],
    bug_args: Callable[[Config], tuple[Any, ...]],
    hint: str,
    more_stages: tuple[Any, ...] = (),
    **kw: Any,
) -> ModuleSpec:
    """The spec of a self-attention block ``(D, H, Hkv[, F], rope_theta=, rope_pairs=)``
    called as ``f(x, mask, cache)``: the mask properties per dtype, then its cache, checked
    by a last stage; a catalogued variant is built with ``bug_args(cfg)``."""

    def cases(report: CheckReport, student: nn.Module, ref: nn.Module, cfg: Config, *rest: Any):
        dtype, gen = rest
        mine, run = guarded(student, item), module_runner(ref, bug_args(cfg))
        tolerance = _tolerance(dtype)
        run_self_attention_cases(
            report,
            mine,
            ref,
            cfg,
            *rest,
            item=item,
            bugs=bugs,
            run=run,
            hint=hint,
            tolerance=tolerance,
        )

    return ModuleSpec(
        item=item,
        bugs=bugs,
        reference=reference,
        args=_args,
        kwargs=_rope_kwargs,
        bug_args=bug_args,
        stages=(each_dtype(cases), cache_stage(item, bugs, bug_args), *more_stages),
        dry=lambda cfg: (torch.zeros(1, 2, cfg["D"]), None, None),  # (1, 2, D)
        gradient_inputs=lambda gen, cfg: (
            randn(gen, cfg["B"], cfg["L"], cfg["D"]),
            causal_mask(cfg["L"]),
            None,
        ),
        **kw,
    )


_GQA_SPEC = _self_attention_spec(
    GQA_ITEM,
    GQA_BUGS,
    lambda cfg: ReferenceGQA(*_gqa_args(cfg)).eval(),
    _gqa_args,
    "Expected out_proj(attention of the H rotated query heads over the Hkv rotated key heads, "
    "each shared by H / Hkv query heads), scores divided by sqrt(Dh).",
    dims=lambda cfg: {"D": cfg["D"], "H": cfg["H"], "Hkv": cfg["Hkv"]},
)


@public_check(
    assignment="ex11_modern_block", implements="GroupedQueryAttention", bugs=GQA_BUGS, kind="class"
)
def check_grouped_query_attention(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check ``GroupedQueryAttention(d_model, n_heads, n_kv_heads, rope_theta, rope_pairs)``.

    Builds it for grouped (Hkv < H), multi-query (Hkv = 1) and plain multi-head (Hkv = H)
    shapes with both RoPE pairings, compares its parameter count with the reference's
    :class:`coursepkg.attention.MultiHeadAttention` (``n_kv_heads``, RoPE, no biases: K and V
    have Hkv heads), copies the reference's weights in by name and compares outputs (float32
    and float64; no mask, causal, padding, a sequence that may attend nothing); checks that
    later and hidden positions change nothing, that decoding with the cache dict gives the
    outputs of the whole sequence and stores Hkv heads, and that every parameter gets a
    gradient.
    """
    gen = generator(seed, salt=15)
    cfgs = configs(GQA_ITEM, thorough, seed)
    check_module(report, impl, _GQA_SPEC, cfgs, gen)
    report.ok(f"parameter count and names match the reference on {len(cfgs)} shapes")
    report.ok("outputs match the reference (float32 and float64; no mask, causal, padding)")
    report.ok("later and hidden positions change nothing; no NaN where nothing may be attended")
    report.ok("gradients reach every parameter")


# ---------------------------------------------------------------------------------------------
# check_modern_block
# ---------------------------------------------------------------------------------------------


def _sample_block(rng: random.Random) -> Config:
    cfg = _sample_gqa(rng)
    cfg["F"] = rng.randint(1, 24)
    return cfg


register_configs(
    MODERN_BLOCK_ITEM,
    visible=[{**cfg, "F": f} for cfg, f in zip(_GQA_VISIBLE, (24, 10, 6), strict=True)],
    extra=[
        {"B": 1, "L": 9, "D": 12, "H": 6, "Hkv": 2, "F": 32, "theta": 10000.0, "pairs": "halves"}
    ],
    sample=_sample_block,
)


_BLOCK_SPEC = _self_attention_spec(
    MODERN_BLOCK_ITEM,
    MODERN_BLOCK_BUGS,
    lambda cfg: ReferenceBlock(*_block_args(cfg)).eval(),
    _block_args,
    "Expected x + self_attn(norm1(x), mask, cache), then that plus ffn(norm2(of it)). If a "
    "piece is wrong, its own check says which.",
    more_stages=(norm_gains_stage(MODERN_BLOCK_ITEM, MODERN_BLOCK_BUGS, _block_args),),
    dims=lambda cfg: {k: cfg[k] for k in ("D", "H", "Hkv", "F")},
)


@public_check(
    assignment="ex11_modern_block",
    implements="ModernDecoderBlock",
    bugs=MODERN_BLOCK_BUGS,
    kind="class",
)
def check_modern_block(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``ModernDecoderBlock(d_model, n_heads, n_kv_heads, d_ff, rope_theta, rope_pairs)``,
    the pre-norm block: ``x + self_attn(norm1(x))``, then ``+ ffn(norm2(x))``.

    Compares its parameters (``norm1``, ``self_attn``, ``norm2``, ``ffn``) with those of the
    reference's pre-norm :class:`coursepkg.layers.EncoderLayer` (RMSNorm, SwiGLU, ``n_kv_heads``,
    RoPE, no biases), copies the weights in by name and compares outputs (float32 and float64; no
    mask, causal, padding, a sequence that may attend nothing), checks that later and hidden
    positions change nothing, that decoding with the cache gives the outputs of the whole
    sequence, and that every parameter gets a gradient.
    """
    gen = generator(seed, salt=16)
    cfgs = configs(MODERN_BLOCK_ITEM, thorough, seed)
    check_module(report, impl, _BLOCK_SPEC, cfgs, gen)
    report.ok(f"parameter count and names match the reference on {len(cfgs)} shapes")
    report.ok("outputs match the reference (float32 and float64; no mask, causal, padding)")
    report.ok("later and hidden positions change nothing")
    report.ok("gradients reach every parameter")
