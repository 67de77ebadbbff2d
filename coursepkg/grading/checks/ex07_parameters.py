"""Checks of assignment ex07_parameters: the Transformer's parameter count in closed form; the
catalogue of mistakes it recognises is in :mod:`.ex07_parameters_mistakes`.

``check_parameter_count`` compares the student's ``transformer_parameter_count(...)`` with
:func:`coursepkg.params.count_parameters` over configurations that switch every option on and
off (d_k != d_v, separate vocabularies, untied output projection, no biases, final norms, more
decoder than encoder layers). When a count is wrong it names the mistake from the pattern of
gaps over all configurations, or else explains the first gap by the parts of the model it
equals ("lower by exactly the LayerNorms: 2·D per norm, ...").

Dimension legend: V vocabulary, D d_model, H heads, Dk/Dv per-head sizes, F d_ff,
N encoder layers.
"""

from __future__ import annotations

import itertools
import numbers
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ...model import Transformer
from ...params import (
    attention_parameters,
    count_parameters,
    feed_forward_parameters,
    layer_norm_parameters,
)
from ..framework import (
    CheckFailure,
    CheckReport,
    call_student,
    configs,
    diagnose,
    forbidden_calls,
    public_check,
    register_configs,
)
from .ex07_parameters_mistakes import (
    PARAMETER_COUNT_BUGS,
    PARAMETER_COUNT_ITEM,
    POSITIONAL,
    reference_config,
)

__all__ = ["check_parameter_count"]


def _parts(kw: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """Named parts of the reference count that a mistake typically adds or drops.

    Returns:
        name -> (number of parameters, how it is made up, in symbols).
    """
    c = reference_config(kw)
    d, v, h = c.d_model, c.vocab_size, c.n_heads
    dk, dv, f = c.head_dim_k, c.head_dim_v, c.d_ff
    n_enc, n_dec = c.n_layers, c.decoder_layers
    n_attn = n_enc + 2 * n_dec
    n_norms = 2 * n_enc + 3 * n_dec + (2 if c.use_final_norm else 0)
    parts: dict[str, tuple[int, str]] = {}
    if c.bias:
        parts["the linear layers' biases"] = (
            n_attn * (2 * h * dk + h * dv + d) + (n_enc + n_dec) * (f + d),
            f"2·H·Dk + H·Dv + D per attention block ({n_attn} blocks) and F + D per "
            f"feed-forward network ({n_enc + n_dec})",
        )
        parts["the LayerNorms' shifts"] = (n_norms * d, f"D per LayerNorm ({n_norms} norms)")
    parts["the LayerNorms"] = (
        n_norms * layer_norm_parameters(c),
        f"{'2·D' if c.bias else 'D'} per LayerNorm: 2 per encoder layer, 3 per decoder "
        f"layer{', 2 final norms' if c.use_final_norm else ''} ({n_norms} norms)",
    )
    parts["a V·D embedding matrix"] = (v * d, "V·D")
    if c.separate_vocabularies:
        parts["the source embedding"] = (c.source_vocab_size * d, "V_src·D")
    parts["the decoder's cross-attention blocks"] = (
        n_dec * attention_parameters(c),
        f"one attention block per decoder layer ({n_dec})",
    )
    parts["one LayerNorm per decoder layer"] = (
        n_dec * layer_norm_parameters(c),
        f"the third norm of each decoder layer ({n_dec})",
    )
    parts["the feed-forward networks"] = (
        (n_enc + n_dec) * feed_forward_parameters(c),
        "2·D·F (+ F + D biases) per layer",
    )
    parts["the two final LayerNorms"] = (
        2 * layer_norm_parameters(c),
        "one per stack" + ("" if c.use_final_norm else ", which final_norm=False leaves out"),
    )
    parts["an output-projection bias"] = (v, "V; the output projection has no bias")
    if not c.share_embeddings:
        parts["the target embedding (not shared with the source)"] = (
            v * d,
            "V·D, a matrix of its own when share_embeddings=False",
        )
    return parts


def _explain_gap(kw: dict[str, Any], gap: int) -> str:
    """Explain ``gap`` = yours - reference by one to three named parts, if it equals them
    (the fewest parts first)."""
    parts = _parts(kw)
    items = [(name, n, how) for name, (n, how) in parts.items() if n > 0]
    for size in (1, 2, 3):
        # A part may be used more than once (a matrix counted twice, two parts missed).
        for combo in itertools.combinations_with_replacement(items, size):
            for signs in itertools.product((1, -1), repeat=size):
                if sum(s * n for s, (_, n, _) in zip(signs, combo, strict=True)) != gap:
                    continue
                terms = Counter(
                    (s, name, n, how) for s, (name, n, how) in zip(signs, combo, strict=True)
                )
                if any((-s, name, n, how) in terms for s, name, n, how in terms):
                    continue  # a part both added and removed explains nothing
                phrases = [
                    f"{'counts' if s > 0 else 'misses'} {'' if k == 1 else f'{k} × '}{name} "
                    f"({n:,} = {how})"
                    for (s, name, n, how), k in terms.items()
                ]
                return "Your count " + " and ".join(phrases) + "."
    return (
        "The gap is not one of the usual parts; compare your count part by part with: "
        + ", ".join(f"{name} = {n:,}" for name, n, _ in items)
        + "."
    )


# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------

_BASE = {"vocab_size": 37000, "d_model": 512, "n_heads": 8, "d_ff": 2048, "n_layers": 6}


def _sample(rng: random.Random) -> dict[str, Any]:
    h = rng.choice([1, 2, 4, 8])
    kw: dict[str, Any] = {
        "vocab_size": rng.randint(20, 5000),
        "d_model": h * rng.choice([4, 8, 16]),
        "n_heads": h,
        "d_ff": rng.choice([32, 64, 200, 1024]),
        "n_layers": rng.randint(1, 6),
    }
    if rng.random() < 0.5:
        kw["n_decoder_layers"] = rng.randint(1, 6)
    if rng.random() < 0.5:
        kw["d_k"], kw["d_v"] = rng.randint(2, 40), rng.randint(2, 40)
    if rng.random() < 0.4:
        kw["src_vocab_size"] = kw["vocab_size"] + rng.randint(1, 500)
        kw["share_embeddings"] = False
    elif rng.random() < 0.3:
        kw["share_embeddings"] = False
    for flag, p in (("tie_embeddings", 0.3), ("bias", 0.3)):
        if rng.random() < p:
            kw[flag] = False
    if rng.random() < 0.4:
        kw["final_norm"] = True
    return kw


# Every option is switched away from its default in at least one visible configuration.
register_configs(
    PARAMETER_COUNT_ITEM,
    visible=[
        dict(_BASE),
        {
            "vocab_size": 50,
            "d_model": 12,
            "n_heads": 3,
            "d_ff": 20,
            "n_layers": 2,
            "d_k": 5,
            "d_v": 7,
            "tie_embeddings": False,
            "share_embeddings": False,
        },
        {
            "vocab_size": 30,
            "d_model": 16,
            "n_heads": 2,
            "d_ff": 24,
            "n_layers": 1,
            "n_decoder_layers": 3,
            "src_vocab_size": 40,
            "share_embeddings": False,
            "final_norm": True,
        },
        {
            "vocab_size": 64,
            "d_model": 8,
            "n_heads": 2,
            "d_ff": 16,
            "n_layers": 3,
            "bias": False,
            "final_norm": True,
            "d_k": 3,
            "d_v": 6,
        },
    ],
    extra=[
        {**_BASE, "d_model": 1024, "n_heads": 16, "d_ff": 4096},
        {
            "vocab_size": 100,
            "d_model": 6,
            "n_heads": 1,
            "d_ff": 7,
            "n_layers": 4,
            "share_embeddings": False,
            "tie_embeddings": False,
        },
    ],
    sample=_sample,
)

# ---------------------------------------------------------------------------------------------
# check_parameter_count
# ---------------------------------------------------------------------------------------------


def _call(fn: Callable, kw: dict[str, Any]) -> Any:
    args = [kw[name] for name in POSITIONAL]
    extra = {k: v for k, v in kw.items() if k not in POSITIONAL}
    return fn(*args, **extra)


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_floating_point():
        return int(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise CheckFailure(
            f"{what} should be an int, but your code returned {type(value).__name__}."
        )
    if not isinstance(value, numbers.Integral):
        if float(value).is_integer():
            return int(value)
        raise CheckFailure(
            f"{what} returned {value!r}, which is not a whole number: a parameter count is an "
            "int (use // rather than / when dividing sizes)."
        )
    return int(value)


def _signature(kw: dict[str, Any]) -> str:
    parts = [f"{k}={kw[k]}" for k in POSITIONAL] + [
        f"{k}={v}" for k, v in kw.items() if k not in POSITIONAL
    ]
    return f"transformer_parameter_count({', '.join(parts)})"


@public_check(
    assignment="ex07_parameters",
    implements="transformer_parameter_count",
    bugs=PARAMETER_COUNT_BUGS,
    kind="function",
)
def check_parameter_count(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``transformer_parameter_count(...)`` against the reference."""
    cases = configs(PARAMETER_COUNT_ITEM, thorough, seed)
    expected = [count_parameters(reference_config(kw)) for kw in cases]
    got = []
    # Counting is arithmetic: building the model (ours or torch's) and counting its
    # parameters is not the exercise.
    with forbidden_calls(
        PARAMETER_COUNT_ITEM,
        extra=[
            (Transformer.__init__, "coursepkg.Transformer (building the model)"),
            (nn.Transformer.__init__, "torch.nn.Transformer (building a model)"),
        ],
        advice="count with arithmetic from the formulas, without building a model",
    ):
        for kw in cases:
            value = call_student(_call, impl, kw, item=PARAMETER_COUNT_ITEM)
            got.append(_as_int(value, _signature(kw)))
    wrong = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    if wrong:
        i = wrong[0]
        gap = got[i] - expected[i]
        reference_gaps = torch.zeros(len(cases), dtype=torch.float64)  # (n_configs,)

        # Gaps from the reference over every configuration: a mistake shows as a pattern.
        def gaps(fn: Callable) -> Tensor:
            values = [_as_int(_call(fn, kw), "count") for kw in cases]
            return torch.tensor(
                [v - e for v, e in zip(values, expected, strict=True)], dtype=torch.float64
            )  # (n_configs,)

        student_gaps = torch.tensor(
            [g - e for g, e in zip(got, expected, strict=True)], dtype=torch.float64
        )
        bug = diagnose(
            lambda: student_gaps,
            PARAMETER_COUNT_BUGS,
            [],
            run=lambda fn, _: gaps(fn),
            reference_output=reference_gaps,
        )
        report.fail(
            f"{_signature(cases[i])} returned {got[i]:,}, expected {expected[i]:,} "
            f"({'higher' if gap > 0 else 'lower'} by {abs(gap):,}); {len(wrong)} of "
            f"{len(cases)} configurations are wrong.\n{_explain_gap(cases[i], gap)}",
            bug,
        )
    report.ok(f"the paper's base model has {expected[0]:,} parameters")
    report.ok(
        f"matches the reference over {len(cases)} configurations (d_k != d_v, separate "
        "vocabularies, untied output, no biases, final norms, more decoder layers)"
    )
