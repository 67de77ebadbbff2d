"""Checks of assignment ex07_parameters: the Transformer's parameter count in closed form.

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

from ...config import TransformerConfig
from ...model import Transformer
from ...params import (
    attention_parameters,
    count_parameters,
    feed_forward_parameters,
    layer_norm_parameters,
)
from ..framework import (
    BugVariant,
    CheckFailure,
    CheckReport,
    call_student,
    configs,
    diagnose,
    forbidden_calls,
    public_check,
    register_configs,
)

__all__ = ["BUGS", "check_parameter_count"]

ITEM = "transformer_parameter_count"

_POSITIONAL = ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers")
_DEFAULTS: dict[str, Any] = {
    "n_decoder_layers": None,
    "d_k": None,
    "d_v": None,
    "src_vocab_size": None,
    "share_embeddings": True,
    "tie_embeddings": True,
    "bias": True,
    "final_norm": False,
}


def _config(kw: dict[str, Any]) -> TransformerConfig:
    """The reference configuration of the stub's arguments (sinusoidal positions: no
    parameters)."""
    return TransformerConfig(
        vocab_size=kw["vocab_size"],
        d_model=kw["d_model"],
        n_heads=kw["n_heads"],
        d_ff=kw["d_ff"],
        n_layers=kw["n_layers"],
        n_decoder_layers=kw.get("n_decoder_layers"),
        d_k=kw.get("d_k"),
        d_v=kw.get("d_v"),
        src_vocab_size=kw.get("src_vocab_size"),
        share_embeddings=kw.get("share_embeddings", True),
        tie_embeddings=kw.get("tie_embeddings", True),
        bias=kw.get("bias", True),
        final_norm=kw.get("final_norm", False),
        positional="sinusoidal",
    )


def _parts(kw: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """Named parts of the reference count that a mistake typically adds or drops.

    Returns:
        name -> (number of parameters, how it is made up, in symbols).
    """
    c = _config(kw)
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
# Known mistakes (the reference count moved by the mistake's amount: no second solution here)
# ---------------------------------------------------------------------------------------------


def _kwargs(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {**_DEFAULTS, **dict(zip(_POSITIONAL, args, strict=False)), **kwargs}


def _mistake(delta: Callable[[TransformerConfig], int]) -> Callable[..., int]:
    """A buggy count: the reference count plus ``delta(config)``."""

    def count(*args: Any, **kwargs: Any) -> int:
        c = _config(_kwargs(args, kwargs))
        return count_parameters(c) + delta(c)

    return count


def _biases(c: TransformerConfig) -> int:
    if not c.bias:
        return 0
    d, h, dk, dv, f = c.d_model, c.n_heads, c.head_dim_k, c.head_dim_v, c.d_ff
    blocks = c.n_layers + 2 * c.decoder_layers
    return blocks * (2 * h * dk + h * dv + d) + (c.n_layers + c.decoder_layers) * (f + d)


def _n_norms(c: TransformerConfig) -> int:
    return 2 * c.n_layers + 3 * c.decoder_layers + (2 if c.use_final_norm else 0)


def _value_size_uses_dk(c: TransformerConfig) -> int:
    blocks = c.n_layers + 2 * c.decoder_layers
    h, d = c.n_heads, c.d_model
    per_width = 2 * d + (1 if c.bias else 0)  # W^V column + W^O row (+ a W^V bias entry)
    return blocks * h * (c.head_dim_k - c.head_dim_v) * per_width


_no_biases = _mistake(lambda c: -_biases(c))
_no_layer_norms = _mistake(lambda c: -_n_norms(c) * layer_norm_parameters(c))
_norm_gain_only = _mistake(lambda c: -_n_norms(c) * c.d_model if c.bias else 0)
_tied_counted_twice = _mistake(lambda c: c.vocab_size * c.d_model if c.tie_embeddings else 0)
_shared_counted_twice = _mistake(lambda c: c.vocab_size * c.d_model if c.share_embeddings else 0)
_two_norms_per_decoder_layer = _mistake(lambda c: -c.decoder_layers * layer_norm_parameters(c))
_no_cross_attention = _mistake(lambda c: -c.decoder_layers * attention_parameters(c))
_value_uses_dk = _mistake(_value_size_uses_dk)
_decoder_layers_ignored = _mistake(
    lambda c: (
        (c.n_layers - c.decoder_layers)
        * (2 * attention_parameters(c) + feed_forward_parameters(c) + 3 * layer_norm_parameters(c))
    )
)
_final_norm_ignored = _mistake(lambda c: -2 * layer_norm_parameters(c) if c.use_final_norm else 0)
_output_bias = _mistake(lambda c: c.vocab_size)
_untied_counted_once = _mistake(
    lambda c: (
        -c.vocab_size * c.d_model if not c.share_embeddings and not c.separate_vocabularies else 0
    )
)

_FORMULA = (
    "per attention block 2·D·H·Dk + 2·H·Dv·D (+ 2·H·Dk + H·Dv + D biases); per feed-forward "
    "network 2·D·F (+ F + D); per LayerNorm 2·D (D without biases)"
)

BUGS: list[BugVariant] = [
    BugVariant(
        id="parameter_count.no_biases",
        item=ITEM,
        description="the linear layers' biases are missing",
        advice="With bias=True every linear layer has a bias of its output size: "
        "2·H·Dk + H·Dv + D per attention block and F + D per feed-forward network.",
        impl=_no_biases,
    ),
    BugVariant(
        id="parameter_count.no_layer_norms",
        item=ITEM,
        description="the LayerNorms are missing",
        advice="Each LayerNorm has a gain and a shift of D each (2·D, or D with bias=False): "
        "2 per encoder layer, 3 per decoder layer, plus one per stack with final_norm.",
        impl=_no_layer_norms,
    ),
    BugVariant(
        id="parameter_count.norm_gain_only",
        item=ITEM,
        description="each LayerNorm is counted with its gain only (D instead of 2·D)",
        advice="A LayerNorm has a gain and a shift (bias), D each; only with bias=False does it "
        "keep the gain alone.",
        impl=_norm_gain_only,
    ),
    BugVariant(
        id="parameter_count.tied_counted_twice",
        item=ITEM,
        description="the output projection is counted although it is tied to the target embedding",
        advice="With tie_embeddings=True the output projection reuses the target embedding "
        "matrix: count that V·D matrix once.",
        impl=_tied_counted_twice,
    ),
    BugVariant(
        id="parameter_count.shared_counted_twice",
        item=ITEM,
        description="the source and target embeddings are counted separately although they "
        "are shared",
        advice="With share_embeddings=True the source and the target use one V·D matrix: "
        "count it once.",
        impl=_shared_counted_twice,
    ),
    BugVariant(
        id="parameter_count.two_norms_per_decoder_layer",
        item=ITEM,
        description="each decoder layer is counted with two LayerNorms instead of three",
        advice="A decoder layer has three sub-layers (self-attention, cross-attention, "
        "feed-forward), each followed by its own LayerNorm.",
        impl=_two_norms_per_decoder_layer,
    ),
    BugVariant(
        id="parameter_count.no_cross_attention",
        item=ITEM,
        description="the decoder's cross-attention blocks are missing",
        advice="Each decoder layer has two attention blocks: masked self-attention and "
        "cross-attention over the encoder output.",
        impl=_no_cross_attention,
    ),
    BugVariant(
        id="parameter_count.value_size_uses_dk",
        item=ITEM,
        description="W^V and W^O are sized with Dk instead of Dv",
        advice="W^V is D x H·Dv and W^O is H·Dv x D; only W^Q and W^K use Dk.",
        impl=_value_uses_dk,
    ),
    BugVariant(
        id="parameter_count.decoder_layers_ignored",
        item=ITEM,
        description="the decoder is counted with n_layers layers, ignoring n_decoder_layers",
        advice="Use n_decoder_layers for the decoder when it is given (None means n_layers).",
        impl=_decoder_layers_ignored,
    ),
    BugVariant(
        id="parameter_count.final_norm_ignored",
        item=ITEM,
        description="the final LayerNorms (final_norm=True) are not counted",
        advice="With final_norm=True each stack ends with one more LayerNorm: add 2 of them.",
        impl=_final_norm_ignored,
    ),
    BugVariant(
        id="parameter_count.output_bias",
        item=ITEM,
        description="the output projection is counted with a bias (V more parameters), "
        "which the model does not have",
        advice="The output projection D -> V has no bias (nn.Linear(d_model, vocab_size, "
        "bias=False)), whether or not it is tied: drop the + V.",
        impl=_output_bias,
    ),
    BugVariant(
        id="parameter_count.untied_embeddings_counted_once",
        item=ITEM,
        description="with share_embeddings=False the source and target embeddings are two "
        "matrices even when the vocabularies have the same size, but only one is counted",
        advice="Count V_src·D for the source embedding and V·D for the target one unless "
        "share_embeddings=True.",
        impl=_untied_counted_once,
    ),
]

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
    ITEM,
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
    args = [kw[name] for name in _POSITIONAL]
    extra = {k: v for k, v in kw.items() if k not in _POSITIONAL}
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
    parts = [f"{k}={kw[k]}" for k in _POSITIONAL] + [
        f"{k}={v}" for k, v in kw.items() if k not in _POSITIONAL
    ]
    return f"transformer_parameter_count({', '.join(parts)})"


@public_check(
    assignment="ex07_parameters",
    implements="transformer_parameter_count",
    bugs=BUGS,
    kind="function",
)
def check_parameter_count(
    report: CheckReport, impl: Callable, thorough: bool, seed: int | None
) -> None:
    """Check the student's ``transformer_parameter_count(...)`` against the reference."""
    cases = configs(ITEM, thorough, seed)
    expected = [count_parameters(_config(kw)) for kw in cases]
    got = []
    # Counting is arithmetic: building the model (ours or torch's) and counting its
    # parameters is not the exercise.
    with forbidden_calls(
        ITEM,
        extra=[
            (Transformer.__init__, "coursepkg.Transformer (building the model)"),
            (nn.Transformer.__init__, "torch.nn.Transformer (building a model)"),
        ],
        advice="count with arithmetic from the formulas, without building a model",
    ):
        for kw in cases:
            value = call_student(_call, impl, kw, item=ITEM)
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
            BUGS,
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
