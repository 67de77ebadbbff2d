"""Checks of ex04 (LayerNorm, the position-wise feed-forward network and the post-LN encoder
layer); the catalogue of mistakes they recognise is in :mod:`.ex04_encoder_mistakes`.

The encoder-layer check localises a wrong result with
:func:`coursepkg.grading.framework.locate`, so the message says which piece differs ("your
norm2 differs from the reference LayerNorm; ... the rest of your layer is right"), or that every
piece is right and the wiring of the forward pass is not.

Dimension legend: B batch, L length, D d_model, H heads, F d_ff.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...config import BlockConfig
from ...layers import EncoderLayer as _ReferenceEncoderLayer
from ...layers import LayerNorm as _ReferenceLayerNorm
from ...layers import PositionwiseFeedForward as _ReferenceFFN
from ..framework import (
    BugVariant,
    CheckReport,
    FullyMasked,
    Invariance,
    MaskCases,
    MaskedBlock,
    ModuleSpec,
    Piece,
    analyse_norm,
    attention_piece,
    change_later,
    check_module,
    clone_module,
    combined,
    configs,
    copy_weights,
    describe,
    diagnose,
    dtype_name,
    each_dtype,
    expect_close,
    expect_tensor,
    feed_forward_piece,
    generator,
    guarded,
    hide_padding,
    layer_norm_piece,
    locate,
    module_runner,
    norm_probe,
    piece_count_mistake,
    piece_mistake,
    public_check,
    randn,
    register_configs,
    run_mask_properties,
)
from .ex04_encoder_mistakes import (
    ENC_BUGS,
    ENC_ITEM,
    FFN_BUGS,
    FFN_ITEM,
    LN_BUGS,
    LN_ITEM,
)

__all__ = ["check_encoder_layer", "check_feed_forward", "check_layer_norm"]


# ---------------------------------------------------------------------------------------------
# check_layer_norm
# ---------------------------------------------------------------------------------------------

register_configs(
    "layer_norm",
    visible=[
        {"B": 2, "L": 5, "D": 8},
        {"B": 1, "L": 1, "D": 3},
        {"B": 3, "L": 4, "D": 16, "eps": 0.1},
    ],
    extra=[{"B": 1, "L": 7, "D": 2}, {"B": 4, "L": 2, "D": 32, "eps": 1e-3}],
    sample=lambda rng: {
        "B": rng.randint(1, 4),
        "L": rng.randint(1, 8),
        "D": rng.randint(2, 24),
        **({"eps": rng.choice([1e-3, 1e-2, 0.1])} if rng.random() < 0.5 else {}),
    },
)


def _norm_input(gen: torch.Generator, b: int, n: int, d: int, dtype: torch.dtype) -> Tensor:
    """Rows with different means and spreads; the first row of each sequence is nearly
    constant (spread 1e-3, where eps decides the result) and kept near 0, since a large
    offset would cost float32 most of that row's precision."""
    x = randn(gen, b, n, d) * (0.5 + 3 * torch.rand(b, n, 1, generator=gen))  # (B, L, D)
    x = x + 4 * randn(gen, b, n, 1)  # (B, L, D)
    x[:, 0] = x[:, 0] * 1e-3 + 0.01
    return x.to(dtype)


_LN_FORBID = {
    "extra": [
        (F.layer_norm, "torch.nn.functional.layer_norm"),
        (torch.layer_norm, "torch.layer_norm"),
    ],
    "advice": "compute the mean, the variance and the normalisation yourself",
}


def _diagnose_norm(
    mine: nn.Module, ref: nn.Module, x: Tensor, expected: Tensor, args: tuple
) -> BugVariant | None:
    """The student's LayerNorm mistakes, named each by :func:`analyse_norm`, else the
    catalogue entry whose output matches."""
    return combined(analyse_norm(mine, args[0], LN_BUGS)) or diagnose(
        guarded(mine, LN_ITEM, **_LN_FORBID),
        LN_BUGS,
        (x,),
        run=module_runner(ref, args),
        reference_output=expected,
    )


def _ln_initial_values(
    report: CheckReport,
    student: nn.Module,
    reference: nn.Module,
    cfg: dict[str, Any],
    gen: torch.Generator,
) -> None:
    """Names and shapes, then the initial values (ones, zeros); then random gains and shifts
    in the reference, so that the comparison sees them."""
    d = cfg["D"]
    copy_weights(reference, clone_module(student), LN_ITEM)  # names and shapes
    params = dict(student.named_parameters())
    for name, value in (("weight", 1.0), ("bias", 0.0)):
        if not torch.equal(params[name].detach(), torch.full((d,), value)):
            report.fail(
                f"a new LayerNorm should start as a plain normalisation: `{name}` should "
                f"be initialised to {'ones' if value else 'zeros'} "
                f"(torch.{'ones' if value else 'zeros'}(d_model))."
            )
    with torch.no_grad():
        reference.weight.copy_(1 + 0.5 * randn(gen, d))
        reference.bias.copy_(randn(gen, d))


def _ln_cases(
    report: CheckReport,
    mine: nn.Module,
    ref: nn.Module,
    cfg: dict[str, Any],
    dtype: torch.dtype,
    gen: torch.Generator,
) -> None:
    """The student's LayerNorm against the reference on rows of different means and spreads."""
    b, n, d = cfg["B"], cfg["L"], cfg["D"]
    x = _norm_input(gen, b, n, d, dtype)
    where = f"{describe(cfg)}, {dtype_name(dtype)}"
    actual = expect_tensor(
        guarded(mine, LN_ITEM, **_LN_FORBID)(x), f"your output ({where})", (b, n, d)
    )
    expected = ref(x)
    expect_close(
        report,
        actual,
        expected,
        f"the output of your LayerNorm ({where})",
        diagnosis=partial(_diagnose_norm, mine, ref, x, expected, (d, cfg.get("eps", 1e-5))),
        hint="Expected (x - mean) / sqrt(var + eps) * weight + bias over the last axis, "
        "with the biased variance.",
    )


_LN_SPEC = ModuleSpec(
    item=LN_ITEM,
    bugs=LN_BUGS,
    reference=lambda cfg: _ReferenceLayerNorm(cfg["D"], cfg.get("eps", 1e-5)),
    args=lambda cfg: (cfg["D"],),
    bug_args=lambda cfg: (cfg["D"], cfg.get("eps", 1e-5)),
    kwargs=lambda cfg: {"eps": cfg["eps"]} if "eps" in cfg else None,
    dims=lambda cfg: {"D": cfg["D"]},
    dry=lambda cfg: None,
    gradient_inputs=lambda gen, cfg: (
        _norm_input(gen, cfg["B"], cfg["L"], cfg["D"], torch.float32),
    ),
    stages=(each_dtype(_ln_cases),),
    before_copy=_ln_initial_values,
    forbid=_LN_FORBID,
    extra=(nn.LayerNorm,),
)


@public_check(assignment="ex04_encoder", implements="LayerNorm", bugs=LN_BUGS, kind="class")
def check_layer_norm(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the class ``LayerNorm(d_model, eps=1e-5)`` with parameters ``weight`` and ``bias``.

    Checks the parameters and their initial values (ones, zeros), copies random gains and
    shifts into both modules and compares with :class:`coursepkg.layers.LayerNorm` on inputs
    whose rows have different means and spreads (one nearly constant, where eps matters), in
    float32 and float64 and with a non-default eps; checks gradients, and rejects
    ``nn.LayerNorm`` and ``F.layer_norm``.
    """
    gen = generator(seed, salt=3)
    cfgs = configs("layer_norm", thorough, seed)
    check_module(report, impl, _LN_SPEC, cfgs, gen)
    report.ok(f"weight and bias (ones, zeros) match the reference on {len(cfgs)} shapes")
    report.ok("outputs match with random gains and shifts (float32, float64, other eps)")
    report.ok("gradients reach weight and bias")


# ---------------------------------------------------------------------------------------------
# check_feed_forward
# ---------------------------------------------------------------------------------------------

register_configs(
    "feed_forward",
    visible=[
        {"B": 2, "L": 5, "D": 8, "F": 16},
        {"B": 1, "L": 1, "D": 4, "F": 3},
        {"B": 3, "L": 4, "D": 6, "F": 10},
    ],
    extra=[{"B": 1, "L": 9, "D": 2, "F": 32}],
    sample=lambda rng: {
        "B": rng.randint(1, 4),
        "L": rng.randint(1, 8),
        "D": rng.randint(1, 16),
        "F": rng.randint(1, 32),
    },
)


def _ffn_cases(
    report: CheckReport,
    student: nn.Module,
    ref: nn.Module,
    cfg: dict[str, int],
    dtype: torch.dtype,
    gen: torch.Generator,
) -> None:
    """Numbers against the reference, and each position transformed on its own."""
    b, n, d, d_ff = cfg["B"], cfg["L"], cfg["D"], cfg["F"]
    mine = guarded(student, FFN_ITEM)
    x = randn(gen, b, n, d, dtype=dtype)  # (B, L, D)
    where = f"{describe(cfg)}, {dtype_name(dtype)}"
    expected = ref(x)
    actual = expect_tensor(mine(x), f"your output ({where})", (b, n, d))
    expect_close(
        report,
        actual,
        expected,
        f"the output of your feed-forward network ({where})",
        diagnosis=partial(
            diagnose,
            mine,
            FFN_BUGS,
            (x,),
            run=module_runner(ref, (d, d_ff)),
            reference_output=expected,
        ),
        hint="Expected linear2(relu(linear1(x))).",
    )
    order = torch.randperm(n, generator=gen)
    expect_close(
        report,
        mine(x[:, order]),
        actual[:, order],
        f"the output of your feed-forward network for reordered positions ({where})",
        hint="Each position must be transformed on its own; do not mix positions.",
    )


_FFN_SPEC = ModuleSpec(
    item=FFN_ITEM,
    bugs=FFN_BUGS,
    reference=lambda cfg: _ReferenceFFN(cfg["D"], cfg["F"]).eval(),
    args=lambda cfg: (cfg["D"], cfg["F"]),
    dims=lambda cfg: {"D": cfg["D"], "F": cfg["F"]},
    dry=lambda cfg: (torch.zeros(1, 2, cfg["D"]),),  # (1, 2, D)
    gradient_inputs=lambda gen, cfg: (randn(gen, cfg["B"], cfg["L"], cfg["D"]),),
    stages=(each_dtype(_ffn_cases),),
)


@public_check(
    assignment="ex04_encoder", implements="PositionwiseFeedForward", bugs=FFN_BUGS, kind="class"
)
def check_feed_forward(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the class ``PositionwiseFeedForward(d_model, d_ff)`` (``linear1``, ReLU,
    ``linear2``).

    Compares the parameter count with :class:`coursepkg.layers.PositionwiseFeedForward`,
    copies its weights in and compares outputs (float32 and float64), checks that each
    position is transformed on its own (reordering the positions reorders the output) and
    that every parameter gets a gradient.
    """
    gen = generator(seed, salt=4)
    cfgs = configs("feed_forward", thorough, seed)
    check_module(report, impl, _FFN_SPEC, cfgs, gen)
    report.ok(f"parameter count and names match the reference on {len(cfgs)} shapes")
    report.ok("outputs match (float32 and float64); each position is transformed on its own")
    report.ok("gradients reach every parameter")


# ---------------------------------------------------------------------------------------------
# Localising a wrong layer
# ---------------------------------------------------------------------------------------------


def _explain_layer(
    student: nn.Module, reference: nn.Module, inputs: tuple[Any, ...], cfg: dict[str, int]
) -> tuple[str, BugVariant | None]:
    """Which piece of a wrong encoder layer is wrong (:func:`locate`) and the known mistake:
    the wrong piece's own, or, when every piece is right, the wiring's."""
    d, h, d_ff = cfg["D"], cfg["H"], cfg["F"]
    pieces = encoder_pieces(d, h, d_ff)
    sentence, wrong = locate(student, reference, inputs, pieces, layer=ENC_ITEM)
    if wrong:
        found = piece_mistake(student, reference, pieces, inputs, wrong)
        return sentence, found[1] if found is not None else None
    bug = diagnose(
        lambda *a: student(*a),
        ENC_BUGS,
        inputs,
        run=module_runner(reference, (d, h, d_ff)),
        reference_output=reference(*inputs),
    )
    return sentence, bug


# ---------------------------------------------------------------------------------------------
# check_encoder_layer
# ---------------------------------------------------------------------------------------------


def _sample_encoder(rng: random.Random) -> dict[str, int]:
    heads = rng.randint(1, 4)
    return {
        "B": rng.randint(1, 3),
        "L": rng.randint(1, 8),
        "D": heads * rng.randint(1, 4),
        "H": heads,
        "F": rng.randint(1, 24),
    }


register_configs(
    "encoder_layer",
    visible=[
        {"B": 2, "L": 5, "D": 8, "H": 2, "F": 16},
        {"B": 1, "L": 1, "D": 6, "H": 3, "F": 4},
        {"B": 3, "L": 4, "D": 12, "H": 4, "F": 8},
    ],
    extra=[{"B": 2, "L": 9, "D": 4, "H": 1, "F": 20}],
    sample=_sample_encoder,
)


def encoder_pieces(d: int, h: int, d_ff: int) -> list[Piece]:
    """The encoder layer's submodules for :func:`locate`, called on the layer's ``(x, mask)``."""

    def norm_input(i: Sequence[Any]) -> tuple[Tensor]:
        return (norm_probe(i[0]),)

    return [
        attention_piece("self_attn", d, h, lambda i: (i[0], i[0], i[0], i[1])),
        feed_forward_piece(d, d_ff),
        layer_norm_piece("norm1", d, norm_input),
        layer_norm_piece("norm2", d, norm_input),
    ]


@public_check(assignment="ex04_encoder", implements="EncoderLayer", bugs=ENC_BUGS, kind="class")
def check_encoder_layer(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the class ``EncoderLayer(d_model, n_heads, d_ff)`` (post-LN; ``self_attn``,
    ``ffn``, ``norm1``, ``norm2``).

    The student's layer is built from the student's own pieces (from earlier cells); the check
    rejects reference classes inside it. It compares the parameter count with
    :class:`coursepkg.layers.EncoderLayer`, copies the reference's weights in by name, compares
    outputs without a mask, with a padding mask and with a causal mask (float32, float64),
    checks that hidden positions change nothing, and that every parameter gets a gradient.
    When the output differs it reports which piece is wrong (or that the wiring is) and names
    a known mistake.
    """
    gen = generator(seed, salt=5)
    cfgs = configs("encoder_layer", thorough, seed)
    check_module(report, impl, _ENCODER_SPEC, cfgs, gen)
    report.ok(f"parameter count and names match the reference on {len(cfgs)} shapes")
    report.ok("outputs match (float32 and float64; no mask, padding mask, causal mask)")
    report.ok(
        "hidden positions change nothing; a sequence whose every position is masked gets the "
        "reference's output (zero attention: no NaN, no average of the values)"
    )
    report.ok("gradients reach every parameter")


def _encoder_cases(
    report: CheckReport,
    student: nn.Module,
    reference: nn.Module,
    cfg: dict[str, int],
    dtype: torch.dtype,
    gen: torch.Generator,
) -> None:
    """No mask, padding mask and causal mask: numbers against the reference (localising a
    mismatch) and invariance to the positions a mask hides."""
    b, n, d = cfg["B"], cfg["L"], cfg["D"]
    mine = guarded(student, ENC_ITEM)
    where = f"{describe(cfg)}, {dtype_name(dtype)}"
    x = randn(gen, b, n, d, dtype=dtype)  # (B, L, D)

    def compare(inputs: tuple[Any, ...], case: str) -> Tensor:
        expected = reference(*inputs)
        actual = expect_tensor(mine(*inputs), f"the output of your {ENC_ITEM} ({case})", (b, n, d))
        expect_close(
            report,
            actual,
            expected,
            f"the output of your {ENC_ITEM} ({where}, {case})",
            explain=lambda: _explain_layer(student, reference, inputs, cfg),
        )
        return actual

    if n < 2:  # a single position: nothing a mask could hide from it
        cases = MaskCases(no_mask=(x, None))
    else:
        cases = MaskCases(
            no_mask=(x, None),
            invariances=[_encoder_padding_case(gen, x, where), _encoder_causal_case(gen, x, where)],
            fully_masked=FullyMasked(
                _encoder_masked_sequence(x), "a sequence whose every position is masked"
            ),
        )
    run_mask_properties(MaskedBlock(report, lambda inputs: mine(*inputs), compare), cases)


def _encoder_padding_case(gen: torch.Generator, x: Tensor, where: str) -> Invariance:
    """Padded positions change nothing at the real ones."""
    mask, keep, changed = hide_padding(gen, x)
    return Invariance(
        (x, mask),
        (changed, mask),
        f"the outputs of your {ENC_ITEM} at real positions after changing the padded positions "
        f"({where})",
        case="padding mask (B, 1, 1, L)",
        keep=lambda out: out[keep],
        hint="Padded positions (mask False) must not influence the others. True = may attend.",
    )


def _encoder_causal_case(gen: torch.Generator, x: Tensor, where: str) -> Invariance:
    """Under a causal mask, later positions change nothing earlier."""
    mask, cut, later = change_later(gen, x)
    return Invariance(
        (x, mask),
        (later, mask),
        f"the first {cut} positions of your {ENC_ITEM}'s output after changing later positions "
        f"under a causal mask ({where})",
        case="causal mask (L, L)",
        keep=lambda out: out[:, :cut],
        hint="Pass the mask on to self-attention; True = may attend.",
    )


def _encoder_masked_sequence(x: Tensor) -> tuple[Tensor, Tensor]:
    """The layer's inputs with the first sequence's every position masked: the reference's
    output (finite, never NaN) is expected."""
    b, n = x.size(0), x.size(1)
    mask = torch.ones(b, 1, 1, n, dtype=torch.bool)  # (B, 1, 1, L)
    mask[0] = False  # a sequence with no position to attend
    return x, mask


_ENCODER_SPEC = ModuleSpec(
    item=ENC_ITEM,
    bugs=ENC_BUGS,
    reference=lambda cfg: _ReferenceEncoderLayer(
        BlockConfig.of(cfg["D"], cfg["H"], cfg["F"])
    ).eval(),
    args=lambda cfg: (cfg["D"], cfg["H"], cfg["F"]),
    dims=lambda cfg: {"D": cfg["D"], "H": cfg["H"], "F": cfg["F"]},
    dry=lambda cfg: (torch.zeros(1, 2, cfg["D"]), None),  # (1, 2, D)
    gradient_inputs=lambda gen, cfg: (randn(gen, cfg["B"], cfg["L"], cfg["D"]), None),
    stages=(each_dtype(_encoder_cases),),
    count_mistake=lambda student, reference, cfg: piece_count_mistake(
        student, reference, encoder_pieces(cfg["D"], cfg["H"], cfg["F"])
    ),
)
