"""Checks of ex02_multihead: the ``MultiHeadAttention`` class; the catalogue of mistakes it
recognises is in :mod:`.ex02_multihead_mistakes`.

Dimension legend: B batch, H heads, L queries, S keys, D d_model, Dk/Dv per-head sizes.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from ...attention import MultiHeadAttention as _ReferenceMHA
from ..framework import (
    CheckReport,
    ModuleSpec,
    call_student,
    check_module,
    configs,
    each_dtype,
    forbidden_calls,
    generator,
    module_runner,
    public_check,
    randn,
    register_configs,
    run_attention_cases,
)
from .ex02_multihead_mistakes import MHA_BUGS, MHA_ITEM

__all__ = ["check_multi_head_attention"]


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


def _mha_cases(
    report: CheckReport,
    mine: nn.Module,
    ref: nn.Module,
    cfg: dict[str, int],
    dtype: torch.dtype,
    gen: torch.Generator,
) -> None:
    """The four mask properties of the student's block against the reference's, in ``dtype``."""
    args = (cfg["D"], cfg["H"])
    with forbidden_calls(MHA_ITEM):
        run_attention_cases(
            report,
            lambda q, k, v, m: call_student(mine, q, k, v, m, item=MHA_ITEM),
            lambda q, k, v, m: ref(q, k, v, m),
            cfg,
            dtype,
            gen,
            item=MHA_ITEM,
            bugs=MHA_BUGS,
            run=module_runner(ref, args),
        )


def _mha_gradient_inputs(gen: torch.Generator, cfg: dict[str, int]) -> tuple[Any, ...]:
    x = randn(gen, cfg["B"], cfg["L"], cfg["D"])  # (B, L, D)
    m = randn(gen, cfg["B"], cfg["S"], cfg["D"])  # (B, S, D)
    return (x, m, m, None)


_MHA_SPEC = ModuleSpec(
    item=MHA_ITEM,
    bugs=MHA_BUGS,
    reference=lambda cfg: _ReferenceMHA(cfg["D"], cfg["H"]).eval(),
    args=lambda cfg: (cfg["D"], cfg["H"]),
    dims=lambda cfg: {"D": cfg["D"], "H": cfg["H"]},
    dry=lambda cfg: (torch.zeros(1, 2, cfg["D"]),) * 3 + (None,),  # (1, 2, D) each
    gradient_inputs=_mha_gradient_inputs,
    stages=(each_dtype(_mha_cases),),
)


@public_check(
    assignment="ex02_multihead", implements="MultiHeadAttention", bugs=MHA_BUGS, kind="class"
)
def check_multi_head_attention(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check the class ``MultiHeadAttention(d_model, n_heads)``.

    Builds it for several shapes (batch of 1, L != S, one head ...), compares its parameter
    count with :class:`coursepkg.attention.MultiHeadAttention`, copies the reference's weights
    into it by name and compares outputs in float32 and float64 (no mask, padding mask,
    causal mask, a fully masked query); checks that hidden keys change nothing, that every
    parameter gets a gradient, and that it calls neither PyTorch's attention nor the
    reference.
    """
    gen = generator(seed, salt=2)
    cfgs = configs("multi_head_attention", thorough, seed)
    check_module(report, impl, _MHA_SPEC, cfgs, gen)
    report.ok(f"parameter count and names match the reference on {len(cfgs)} shapes")
    report.ok("outputs match the reference (float32 and float64; no mask, padding, causal)")
    report.ok(
        "it reads its key and value; hidden keys change nothing; a fully masked query gives "
        "a zero attention output (no NaN, no average of the values)"
    )
    report.ok("gradients reach every parameter")
