"""Checks of ex02_multihead: the ``MultiHeadAttention`` class, with the catalogue of mistakes it
recognises. :class:`HeadsVariant` (a multi-head block with switchable mistakes) is also the
attention piece of the encoder and decoder catalogues.

Dimension legend: B batch, H heads, L queries, S keys, D d_model, Dk/Dv per-head sizes.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from ...attention import MultiHeadAttention as _ReferenceMHA
from ..framework import (
    BugVariant,
    CheckReport,
    HeadsVariant,
    ModuleSpec,
    call_student,
    check_module,
    configs,
    forbidden_calls,
    generator,
    module_runner,
    public_check,
    randn,
    register_configs,
    run_attention_cases,
)

__all__ = ["MHA_BUGS", "HeadsVariant", "check_multi_head_attention"]

MHA = "MultiHeadAttention"


# ---------------------------------------------------------------------------------------------
# Catalogue: multi-head attention
# ---------------------------------------------------------------------------------------------


def _mha_bug(name: str, **switches: Any) -> type:
    return type(f"MultiHeadAttention_{name}", (HeadsVariant,), switches)


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
    with forbidden_calls(MHA):
        run_attention_cases(
            report,
            lambda q, k, v, m: call_student(mine, q, k, v, m, item=MHA),
            lambda q, k, v, m: ref(q, k, v, m),
            cfg,
            dtype,
            gen,
            item=MHA,
            bugs=MHA_BUGS,
            run=module_runner(ref, args),
        )


def _mha_gradient_inputs(gen: torch.Generator, cfg: dict[str, int]) -> tuple[Any, ...]:
    x = randn(gen, cfg["B"], cfg["L"], cfg["D"])  # (B, L, D)
    m = randn(gen, cfg["B"], cfg["S"], cfg["D"])  # (B, S, D)
    return (x, m, m, None)


_MHA_SPEC = ModuleSpec(
    item=MHA,
    bugs=MHA_BUGS,
    reference=lambda cfg: _ReferenceMHA(cfg["D"], cfg["H"]).eval(),
    args=lambda cfg: (cfg["D"], cfg["H"]),
    dims=lambda cfg: {"D": cfg["D"], "H": cfg["H"]},
    dry=lambda cfg: (torch.zeros(1, 2, cfg["D"]),) * 3 + (None,),  # (1, 2, D) each
    gradient_inputs=_mha_gradient_inputs,
    cases=_mha_cases,
)


@public_check(
    assignment="ex02_multihead", implements="MultiHeadAttention", bugs=MHA_BUGS, kind="class"
)
def check_multi_head_attention(
    report: CheckReport, cls: Any, thorough: bool, seed: int | None
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
    check_module(report, cls, _MHA_SPEC, cfgs, gen)
    report.ok(f"parameter count and names match the reference on {len(cfgs)} shapes")
    report.ok("outputs match the reference (float32 and float64; no mask, padding, causal)")
    report.ok(
        "it reads its key and value; hidden keys change nothing; a fully masked query gives "
        "a zero attention output (no NaN, no average of the values)"
    )
    report.ok("gradients reach every parameter")
