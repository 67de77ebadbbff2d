"""Checks of assignment ex05_decoder: the causal mask and the decoder layer.

``check_causal_mask`` compares the student's mask with :func:`coursepkg.masks.causal_mask`
entry by entry. ``check_decoder_layer`` builds the student's layer (from the student's own
attention, LayerNorm and feed-forward classes), copies the reference weights into it by name,
and compares outputs; when they differ it tests each piece on its own to say which one is
wrong, or, when every piece is right, names the wiring mistake in ``forward``. Masking is
checked by invariance: later target positions, padded memory positions and fully masked rows.

Dimension legend: B batch, L target length, S source (memory) length, D d_model, H heads,
F d_ff.

The catalogue of known mistakes these checks name is in :mod:`.ex05_decoder_mistakes`.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ...config import BlockConfig
from ...layers import DecoderLayer as _ReferenceDecoderLayer
from ...masks import causal_mask as _reference_causal_mask
from ..framework import (
    BugVariant,
    BuiltModule,
    CheckFailure,
    CheckReport,
    ForbiddenCall,
    FullyMasked,
    Invariance,
    MaskCases,
    MaskedBlock,
    ModuleSpec,
    NotImplementedYet,
    Piece,
    Stage,
    attention_piece,
    call_student,
    check_module,
    clone_module,
    configs,
    describe,
    diagnose,
    expect_close,
    expect_tensor,
    feed_forward_piece,
    forbidden_calls,
    gradients_reach,
    layer_norm_piece,
    locate,
    piece_count_mistake,
    piece_mistake,
    public_check,
    register_configs,
    run_mask_properties,
)
from .ex05_decoder_mistakes import (
    CAUSAL_MASK_BUGS,
    CAUSAL_MASK_ITEM,
    DECODER_LAYER_BUGS,
    DECODER_LAYER_ITEM,
    SUBLAYERS,
)

__all__ = ["check_causal_mask", "check_decoder_layer"]


# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------


def _sample_mask(rng: random.Random) -> dict[str, int]:
    return {"L": rng.randint(2, 48)}


def _sample_layer(rng: random.Random) -> dict[str, int]:
    h = rng.choice([1, 2, 3, 4])
    d = h * rng.choice([2, 3, 4, 5])
    return {
        "B": rng.randint(1, 4),
        "L": rng.randint(1, 9),
        "S": rng.randint(1, 9),
        "D": d,
        "H": h,
        "F": rng.choice([f for f in (8, 14, 20, 32) if f != d]),
    }


register_configs(
    CAUSAL_MASK_ITEM,
    visible=[{"L": 1}, {"L": 4}, {"L": 7}],
    extra=[{"L": 2}, {"L": 33}],
    sample=_sample_mask,
)
# Batch of 1, odd lengths, L != S both ways, one head and several; D != F so that the
# parameter table can name D and F apart.
register_configs(
    "decoder_layer",
    visible=[
        {"B": 1, "L": 1, "S": 3, "D": 8, "H": 2, "F": 16},
        {"B": 2, "L": 5, "S": 7, "D": 12, "H": 3, "F": 20},
        {"B": 3, "L": 6, "S": 4, "D": 16, "H": 4, "F": 24},
    ],
    extra=[
        {"B": 2, "L": 9, "S": 9, "D": 6, "H": 1, "F": 10},
        {"B": 1, "L": 3, "S": 11, "D": 24, "H": 6, "F": 40},
    ],
    sample=_sample_layer,
)

# ---------------------------------------------------------------------------------------------
# check_causal_mask
# ---------------------------------------------------------------------------------------------


def _grid(mask: Tensor) -> str:
    """A small mask as rows of 1/0 (or its values when not boolean), for messages."""
    rows = []
    for row in mask.tolist():
        rows.append("    " + " ".join(f"{int(v)}" if v in (0, 1) else f"{v:g}" for v in row))
    return "\n".join(rows)


def _readable_grids(impl: Callable, length: int, out: Tensor) -> str:
    """The student's mask next to the expected one, at a length where the pattern shows
    (``length`` when it is 4..8, else 5)."""
    show = length if 4 <= length <= 8 else 5
    if show != length:
        try:
            with forbidden_calls(CAUSAL_MASK_ITEM):
                out = call_student(impl, show, item=CAUSAL_MASK_ITEM)
        except CheckFailure:
            return ""
        if not isinstance(out, Tensor) or out.dim() < 2:
            return ""
    grid = out.detach().cpu()
    while grid.dim() > 2 and grid.size(0) == 1:
        grid = grid[0]  # a leading batch axis of 1 is shown without it
    if grid.dim() != 2 or max(grid.shape) > 8:
        return ""
    label = "1 = True" if grid.dtype == torch.bool else "its values"
    return (
        f"\nYours at L = {show} ({label}):\n{_grid(grid)}\n"
        f"Expected at L = {show} (1 = True = may attend):\n"
        f"{_grid(_reference_causal_mask(show).int())}"
    )


def _diagnose_mask(impl: Callable, length: int, boolean: bool) -> BugVariant | None:
    """Match the student's masks of ``length`` and of 5 (where every catalogued mask differs
    from the others: at L = 1 a hidden diagonal and an inverted mask are both [[False]])."""
    lengths = (length, 5)

    def masks(fn: Callable, _: Any = None) -> tuple[Tensor, ...]:
        return tuple(fn(n) for n in lengths)

    if not boolean:
        # A float mask can equal the reference numerically; match on values alone.
        float_bugs = [b for b in CAUSAL_MASK_BUGS if b.impl(2).dtype != torch.bool]
        return diagnose(lambda: masks(impl), float_bugs, [], run=masks)
    expected = masks(_reference_causal_mask)
    return diagnose(lambda: masks(impl), CAUSAL_MASK_BUGS, [], run=masks, reference_output=expected)


@public_check(
    assignment="ex05_decoder", implements="causal_mask", bugs=CAUSAL_MASK_BUGS, kind="function"
)
def check_causal_mask(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``causal_mask(length)`` against the reference."""
    for config in configs(CAUSAL_MASK_ITEM, thorough, seed):
        length = config["L"]
        with forbidden_calls(CAUSAL_MASK_ITEM):
            out = call_student(impl, length, item=CAUSAL_MASK_ITEM)
        what = f"causal_mask({length})"
        out = expect_tensor(out, what)
        expected = _reference_causal_mask(length)  # (L, L)
        if tuple(out.shape) != tuple(expected.shape):
            extra = ""
            if out.dim() > 2 and all(n == 1 for n in out.shape[:-2]):
                extra = (
                    " Drop the leading axes of size 1 (a batch axis, as in subsequent_mask): "
                    "attention broadcasts an (L, L) mask itself."
                )
            report.fail(
                f"{what} has shape {tuple(out.shape)}, expected {tuple(expected.shape)}: one "
                f"row per query position and one column per key position.{extra}"
                + _readable_grids(impl, length, out)
            )
        if out.dtype != torch.bool or not torch.equal(out, expected):
            bug = _diagnose_mask(impl, length, boolean=out.dtype == torch.bool)
            if out.dtype != torch.bool:
                message = (
                    f"{what} has dtype {out.dtype}; the course's masks are torch.bool, "
                    "True = may attend."
                )
            else:
                wrong = (out != expected).nonzero()
                i, j = (int(v) for v in wrong[0])
                verb = "may" if bool(out[i, j]) else "may not"
                message = (
                    f"{what} is wrong at {len(wrong)} of {expected.numel()} entries; first at "
                    f"row {i}, column {j}: yours says query {i} {verb} attend key {j}. Query i "
                    "may attend key j exactly when j <= i (True = may attend)."
                )
            message += _readable_grids(impl, length, out)
            report.fail(message, bug)
    lengths = ", ".join(str(c["L"]) for c in configs(CAUSAL_MASK_ITEM, thorough, seed))
    report.ok(f"lower-triangular boolean mask for L = {lengths}")


# ---------------------------------------------------------------------------------------------
# check_decoder_layer
# ---------------------------------------------------------------------------------------------


def _pieces(d: int, h: int, f: int) -> list[Piece]:
    """The decoder layer's submodules for :func:`locate`, called on the layer's
    ``(x, memory, self_mask, cross_mask)``."""
    return [
        attention_piece("self_attn", d, h, lambda i: (i[0], i[0], i[0], i[2])),
        attention_piece("cross_attn", d, h, lambda i: (i[0], i[1], i[1], i[3])),
        feed_forward_piece(d, f),
        *(layer_norm_piece(name, d, lambda i: (i[0],)) for name in ("norm1", "norm2", "norm3")),
    ]


# Tolerances are framework.TOLERANCES. Measured for this layer over the visible and thorough
# configurations (seeds 0-4): the float32 reference against itself in float64 differs by at
# most 9e-7, and the two independent test layers (einsum heads; per-head loop with a -1e9
# fill) differ from the reference by at most 1.5e-6 once the weights are copied. The float32
# default (rtol 1e-4, atol 5e-5) leaves a ~30x margin; the smallest catalogued mistake
# (cross_mask ignored) moves the output by more than 1e-2.


def _reference_layer(config: dict[str, int]) -> nn.Module:
    """The reference layer of a configuration (under the configuration's seed, which
    :func:`check_module` sets), with LayerNorm gains and shifts moved away from 1 and 0 (so
    that a swapped or missing norm shows in the numbers)."""
    layer = _ReferenceDecoderLayer(BlockConfig.of(config["D"], config["H"], config["F"])).eval()
    with torch.no_grad():
        for name in ("norm1", "norm2", "norm3"):
            norm = getattr(layer, name)
            norm.weight.copy_(1.0 + 0.5 * torch.randn_like(norm.weight))
            norm.bias.copy_(0.5 * torch.randn_like(norm.bias))
    return layer


def _layer_inputs(
    config: dict[str, int], seed: int, *, same_length: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Decoder input, memory, and masks: causal self-attention with target padding at the
    end of some rows, and source padding at the end of some rows (never a whole row).

    Returns:
        x (B, L, D), memory (B, S, D), self_mask (B, 1, L, L), cross_mask (B, 1, 1, S).
    """
    b, n_q, d = config["B"], config["L"], config["D"]
    n_k = n_q if same_length else config["S"]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n_q, d, generator=gen)  # (B, L, D)
    memory = torch.randn(b, n_k, d, generator=gen)  # (B, S, D)
    tgt_real = torch.ones(b, n_q, dtype=torch.bool)  # (B, L)
    src_real = torch.ones(b, n_k, dtype=torch.bool)  # (B, S)
    for row in range(1, b):
        tgt_real[row, max(1, n_q - row) :] = False
        src_real[row, max(1, n_k - row) :] = False
    self_mask = _reference_causal_mask(n_q)[None, None] & tgt_real[:, None, None, :]
    # self_mask: (B, 1, L, L)
    cross_mask = src_real[:, None, None, :]  # (B, 1, 1, S)
    return x, memory, self_mask, cross_mask


def _piece_bug(
    student: nn.Module, reference: nn.Module, config: dict[str, int], seed: int
) -> tuple[str, BugVariant] | None:
    """The first of the student's pieces whose known mistake can be named, called on its own
    with the reference's piece as the yardstick: inputs where memory and target have one
    length (so self-attention-only code runs) and one memory row hidden entirely (so a finite
    mask fill shows)."""
    probe_config = {**config, "B": max(2, config["B"]), "L": max(4, config["L"])}
    x, memory, self_mask, cross_mask = _layer_inputs(probe_config, seed + 7, same_length=True)
    cross_mask = cross_mask.clone()
    cross_mask[0] = False  # (B, 1, 1, S): batch row 0 may attend no memory position
    pieces = _pieces(config["D"], config["H"], config["F"])
    return piece_mistake(student, reference, pieces, (x, memory, self_mask, cross_mask))


def _bound_run(reference: nn.Module) -> Callable[[Callable, Any], Any]:
    """``run`` for :func:`diagnose`: a wiring variant applied to the reference's pieces."""
    return lambda impl, args: impl(reference, *args)


def _diagnose_layer(
    student: nn.Module, reference: nn.Module, config: dict[str, int], inputs: tuple, seed: int
) -> BugVariant | None:
    """Match the student's layer against the wiring variants: first on the check's inputs,
    then on inputs with L == S, where variants that mix up memory and x can run."""
    with torch.no_grad():
        expected = reference(*inputs)
    bug = diagnose(
        lambda *a: student(*a),
        DECODER_LAYER_BUGS,
        inputs,
        run=_bound_run(reference),
        reference_output=expected,
    )
    if bug is not None:
        return bug
    probe_config = {**config, "B": max(2, config["B"]), "L": max(3, config["L"])}
    probe = _layer_inputs(probe_config, seed, same_length=True)
    with torch.no_grad():
        expected = reference(*probe)
    return diagnose(
        lambda *a: student(*a),
        DECODER_LAYER_BUGS,
        probe,
        run=_bound_run(reference),
        reference_output=expected,
    )


@public_check(
    assignment="ex05_decoder", implements="DecoderLayer", bugs=DECODER_LAYER_BUGS, kind="class"
)
def check_decoder_layer(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``DecoderLayer(d_model, n_heads, d_ff)`` against the reference.

    For each configuration: the class is the student's own (no reference classes, no
    ``nn.MultiheadAttention``, no fused attention calls); parameter counts match the
    reference's per submodule; after copying the reference weights in by name, outputs match
    in float32 and float64; later target positions, padded memory positions and a fully
    masked memory row do not leak into the output; gradients reach every parameter.
    """
    check_module(report, impl, _DECODER_SPEC, configs("decoder_layer", thorough, seed), seed=seed)


def _check_layer_numbers(report: CheckReport, case: BuiltModule) -> None:
    """Compare the output of the student's layer (holding the reference's weights) with the
    reference's; when they differ, name the wrong piece or the wiring mistake."""
    config, seed, student, reference = case.cfg, case.seed, case.student, case.reference
    where = f"({describe(config)})"
    inputs = _layer_inputs(config, seed)
    with torch.no_grad():
        expected = reference(*inputs)  # (B, L, D)
    try:
        with forbidden_calls(DECODER_LAYER_ITEM):
            out = call_student(student, *inputs, item=DECODER_LAYER_ITEM)
    except (NotImplementedYet, ForbiddenCall):
        raise
    except CheckFailure as failure:
        where_bug = _piece_bug(student, reference, config, seed)
        if where_bug is not None:
            name, bug = where_bug
            report.fail(f"{failure.message}\nThe cause is in your {name}.", bug)
        report.fail(failure.message, _diagnose_layer(student, reference, config, inputs, seed))
    expect_close(
        report,
        out,
        expected,
        f"the output of your DecoderLayer {where}",
        explain=lambda: _explain_layer(student, reference, config, inputs, seed),
    )


def _explain_layer(
    student: nn.Module, reference: nn.Module, config: dict[str, int], inputs: tuple, seed: int
) -> tuple[str, BugVariant | None]:
    """Which piece of a wrong decoder layer is wrong (:func:`locate`) and the known mistake:
    the wrong piece's own, or, when every piece is right, the wiring's."""
    probe_config = {
        **config,
        "B": max(2, config["B"]),
        "L": max(4, config["L"]),
        "S": max(3, config["S"]),
    }
    probe = _layer_inputs(probe_config, seed + 5)
    pieces = _pieces(config["D"], config["H"], config["F"])
    explanation, wrong = locate(
        student, reference, inputs, pieces, layer=DECODER_LAYER_ITEM, probe=probe
    )
    if wrong:
        where_bug = _piece_bug(student, reference, config, seed)
        return explanation, where_bug[1] if where_bug is not None else None
    bug = _diagnose_layer(student, reference, config, inputs, seed)
    if bug is None:
        explanation += f" The paper's order: {SUBLAYERS}."
    return explanation, bug


def _check_layer_gradients_and_float64(report: CheckReport, case: BuiltModule) -> None:
    """Every parameter gets a gradient, and float64 inputs give the reference's float64
    output. At least 3 target positions: with a single one, softmax weights are all 1 and the
    query projection rightly gets no gradient."""
    config, seed, student, reference = case.cfg, case.seed, case.student, case.reference
    where = f"({describe(config)})"
    grad_config = {**config, "L": max(3, config["L"]), "S": max(2, config["S"])}
    x, memory, self_mask, cross_mask = _layer_inputs(grad_config, seed + 3)
    gradients_reach(student, (x, memory, self_mask, cross_mask), DECODER_LAYER_ITEM, seed=seed)

    x, memory, self_mask, cross_mask = _layer_inputs(config, seed)
    student64 = clone_module(student).double()
    reference64 = copy.deepcopy(reference).double()
    inputs64 = (x.double(), memory.double(), self_mask, cross_mask)
    with torch.no_grad():
        out64 = call_student(student64, *inputs64, item=DECODER_LAYER_ITEM)
        # No diagnosis: the float32 numbers of every configuration passed before this stage,
        # so a mismatch here is the dtype's, never a catalogued mistake.
        expect_close(
            report, out64, reference64(*inputs64), f"your DecoderLayer's float64 output {where}"
        )


def _check_layer_masking(report: CheckReport, case: BuiltModule) -> None:
    """Invariances: future target positions, padded memory, and a fully masked memory row."""
    config, seed, student, reference = case.cfg, case.seed, case.student, case.reference
    x, memory, _, _ = _layer_inputs(config, seed + 1)
    n_q, n_mem = config["L"], memory.size(1)
    where = f"({describe(config)})"
    gen = torch.Generator().manual_seed(seed + 2)
    causal = _reference_causal_mask(n_q)  # (L, L)
    invariances = []
    if n_q > 1:
        invariances.append(_future_case(gen, x, memory, causal, where))
    if n_mem > 1:
        invariances.append(_hidden_memory_case(gen, x, memory, causal, where))
    none = torch.ones(x.size(0), 1, 1, n_mem, dtype=torch.bool)  # (B, 1, 1, S)
    none[0] = False  # batch row 0 may attend no memory position: zeros, not NaN
    fully_masked = FullyMasked(
        (x, memory, causal, none),
        "your DecoderLayer's output when cross_mask hides a whole row",
        lambda _: (
            f"when cross_mask hides every memory position of a row, your DecoderLayer "
            f"returns NaN or inf {where}. A fully masked row must give zero attention "
            "weights (and so a zero attention output), never NaN: e.g. replace NaN weights "
            "with 0 after the softmax."
        ),
        bad=lambda t: ~torch.isfinite(t),
        name_mistake=False,
    )
    with torch.no_grad():
        run_mask_properties(
            _layer_block(report, student, reference, config, seed),
            MaskCases(invariances=invariances, fully_masked=fully_masked),
        )


def _layer_block(
    report: CheckReport, student: nn.Module, reference: nn.Module, config: dict[str, int], seed: int
) -> MaskedBlock:
    """The student's layer as the mask properties see it: a wiring mistake named on an
    invariance, the wrong piece's mistake on the fully masked comparison."""
    where = f"({describe(config)})"

    def output(inputs: tuple[Any, ...]) -> Any:
        return call_student(student, *inputs, item=DECODER_LAYER_ITEM)

    def explain() -> tuple[str, BugVariant | None]:
        where_bug = _piece_bug(student, reference, config, seed)
        return (
            "A memory row that cross_mask hides entirely must give zero cross-attention weights "
            "(so a zero attention output), neither NaN nor uniform weights.",
            where_bug[1] if where_bug is not None else None,
        )

    def compare(inputs: tuple[Any, ...], case: str) -> Any:
        out = output(inputs)
        expect_close(report, out, reference(*inputs), f"{case} {where}", explain=explain)
        return out

    return MaskedBlock(
        report,
        output=output,
        compare=compare,
        mistake=lambda inputs: _diagnose_layer(student, reference, config, inputs, seed),
        parts=lambda inputs: [
            ("output", expect_tensor(output(inputs), "the output of your DecoderLayer"))
        ],
    )


def _future_case(
    gen: torch.Generator, x: Tensor, memory: Tensor, causal: Tensor, where: str
) -> Invariance:
    """Under ``self_mask = causal``, later decoder inputs change nothing earlier."""
    (b, n_q, d), cut = x.shape, x.size(1) // 2
    changed = x.clone()
    changed[:, cut + 1 :] = 3.0 * torch.randn(b, n_q - cut - 1, d, generator=gen)
    return Invariance(
        (x, memory, causal, None),
        (changed, memory, causal, None),
        "your DecoderLayer's output at earlier positions",
        keep=lambda out: out[:, : cut + 1],
        message=lambda err: (
            f"with self_mask = causal_mask({n_q}), changing the decoder input after "
            f"position {cut} changed your output at positions 0..{cut} (by up to "
            f"{err:.3g}) {where}: your layer lets a position see the future. Pass "
            "self_mask to self-attention (True = may attend)."
        ),
    )


def _hidden_memory_case(
    gen: torch.Generator, x: Tensor, memory: Tensor, causal: Tensor, where: str
) -> Invariance:
    """The second half of every memory row, hidden by ``cross_mask`` and scrambled, changes
    nothing."""
    b, n_mem = memory.size(0), memory.size(1)
    real = torch.ones(b, n_mem, dtype=torch.bool)  # (B, S)
    real[:, (n_mem + 1) // 2 :] = False
    hidden = real[:, None, None, :]  # (B, 1, 1, S)
    scrambled = torch.where(
        real[..., None], memory, 5.0 * torch.randn(memory.shape, generator=gen)
    )  # (B, S, D)
    return Invariance(
        (x, memory, causal, hidden),
        (x, scrambled, causal, hidden),
        "your DecoderLayer's output",
        message=lambda err: (
            f"changing memory positions that cross_mask hides changed your output (by up "
            f"to {err:.3g}) {where}: pass cross_mask to cross-attention (True = may "
            "attend)."
        ),
    )


_DECODER_SPEC = ModuleSpec(
    item=DECODER_LAYER_ITEM,
    bugs=(),  # its mistakes are wrong forwards: none changes a parameter
    reference=_reference_layer,
    args=lambda cfg: (cfg["D"], cfg["H"], cfg["F"]),
    dims=lambda cfg: {"D": cfg["D"], "F": cfg["F"]},
    dry=lambda cfg: (torch.zeros(1, 2, cfg["D"]), torch.zeros(1, 3, cfg["D"]), None, None),
    gradient_inputs=None,  # the last stage checks gradients, on every configuration
    case_seed=lambda index, seed: 1000 * index + (0 if seed is None else seed),
    count_mistake=lambda student, reference, cfg: piece_count_mistake(
        student, reference, _pieces(cfg["D"], cfg["H"], cfg["F"])
    ),
    # Numbers first over every configuration (the wiring mistakes show there, and their
    # diagnosis is most precise), then masking, gradients and float64.
    stages=(
        Stage(
            _check_layer_numbers,
            ok=(
                "parameter counts match the reference per submodule",
                "outputs match the reference with its weights copied in",
            ),
            while_building=True,
        ),
        Stage(
            _check_layer_masking,
            ok=(
                "no leak from future positions or padded memory; a fully masked memory row gets "
                "zero cross-attention (no NaN, no average of the values)",
            ),
        ),
        Stage(
            _check_layer_gradients_and_float64,
            ok=("gradients reach every parameter; float64 inputs give float64 outputs",),
        ),
    ),
)
