"""Checks of ex04 (LayerNorm, the position-wise feed-forward network and the post-LN encoder
layer), with the catalogue of mistakes they recognise.

The encoder-layer check localises a wrong result with
:func:`coursepkg.grading.framework.locate`, so the message says which piece differs ("your
norm2 differs from the reference LayerNorm; ... the rest of your layer is right"), or that every
piece is right and the wiring of the forward pass is not.

Dimension legend: B batch, L length, D d_model, H heads, F d_ff.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...layers import EncoderLayer as _ReferenceEncoderLayer
from ...layers import LayerNorm as _ReferenceLayerNorm
from ...layers import PositionwiseFeedForward as _ReferenceFFN
from ...masks import causal_mask
from ..framework import (
    BugVariant,
    CheckFailure,
    CheckReport,
    ModuleSpec,
    Piece,
    assert_close,
    call_student,
    check_module,
    clone_module,
    configs,
    copy_weights,
    describe,
    diagnose,
    dtype_name,
    expect_close,
    expect_tensor,
    forbidden_calls,
    generator,
    locate,
    module_runner,
    piece_mistake,
    public_check,
    randn,
    random_keep,
    register_configs,
)
from .ex02_multihead import MHA_BUGS, HeadsVariant

__all__ = ["BUGS", "check_encoder_layer", "check_feed_forward", "check_layer_norm"]

LN = "LayerNorm"
FFN = "PositionwiseFeedForward"
ENC = "EncoderLayer"


def guarded(module: nn.Module, item: str, **forbid: Any) -> Callable[..., Any]:
    """Call the student's module with :func:`call_student`, each call watched by
    :func:`forbidden_calls` (so the check's own work between calls, such as swapping
    reference pieces into the student's module, is never mistaken for the student's)."""

    def call(*inputs: Any) -> Any:
        with forbidden_calls(item, **forbid):
            return call_student(module, *inputs, item=item)

    return call


# ---------------------------------------------------------------------------------------------
# Catalogue: LayerNorm and feed-forward
# ---------------------------------------------------------------------------------------------


class _NormVariant(nn.Module):
    """LayerNorm with switches (class attributes) for the catalogued mistakes; the defaults
    are the correct computation."""

    unbiased = False
    eps_outside_sqrt = False
    eps_ignored = False
    default_eps = 1e-5
    axis = -1
    affine = True
    divide_by_variance = False

    def __init__(self, d_model: int, eps: float | None = None) -> None:
        super().__init__()
        self.eps = self.default_eps if eps is None else eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=self.axis, keepdim=True)  # (..., D)
        var = x.var(dim=self.axis, unbiased=self.unbiased, keepdim=True)  # (..., 1)
        if self.divide_by_variance:
            y = centred / (var + self.eps)
        elif self.eps_ignored:
            y = centred / var.sqrt()
        elif self.eps_outside_sqrt:
            y = centred / (var.sqrt() + self.eps)
        else:
            y = centred / (var + self.eps).sqrt()
        return y * self.weight + self.bias if self.affine else y


class _FeedForwardVariant(nn.Module):
    """The feed-forward network with a switch for where (and which) activation is applied."""

    activation = "relu"  # "none", "gelu", or "output" (ReLU after linear2 instead of between)

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.linear1(x)  # (B, L, F)
        if self.activation == "relu":
            hidden = F.relu(hidden)
        elif self.activation == "gelu":
            hidden = F.gelu(hidden)
        out = self.linear2(hidden)  # (B, L, D)
        return F.relu(out) if self.activation == "output" else out


def _variant(base: type, name: str, **switches: Any) -> type:
    return type(f"{base.__name__.strip('_')}_{name}", (base,), switches)


LN_BUGS: list[BugVariant] = [
    BugVariant(
        "ln.unbiased_variance",
        LN,
        "the variance is the unbiased one (divided by D - 1)",
        "LayerNorm divides by D: use x.var(-1, unbiased=False, keepdim=True) or "
        "((x - mean) ** 2).mean(-1, keepdim=True).",
        _variant(_NormVariant, "unbiased_variance", unbiased=True),
    ),
    BugVariant(
        "ln.eps_outside_sqrt",
        LN,
        "eps is added to the standard deviation instead of to the variance inside the square root",
        "Divide by torch.sqrt(var + self.eps), not by torch.sqrt(var) + self.eps.",
        _variant(_NormVariant, "eps_outside_sqrt", eps_outside_sqrt=True),
    ),
    BugVariant(
        "ln.wrong_axis",
        LN,
        "the mean and variance are taken over the positions (dim=-2) instead of over the features",
        "Normalise each position over its D features: reduce over dim=-1 with keepdim=True.",
        _variant(_NormVariant, "wrong_axis", axis=-2),
    ),
    BugVariant(
        "ln.no_affine",
        LN,
        "the learned gain (weight) and shift (bias) are never applied",
        "Return normalised * self.weight + self.bias.",
        _variant(_NormVariant, "no_affine", affine=False),
    ),
    BugVariant(
        "ln.divides_by_variance",
        LN,
        "the centred input is divided by the variance instead of the standard deviation",
        "Divide by the square root: torch.sqrt(var + self.eps).",
        _variant(_NormVariant, "divides_by_variance", divide_by_variance=True),
    ),
]

LN_BUGS += [
    BugVariant(
        "ln.eps_ignored",
        LN,
        "eps is never used: the centred input is divided by sqrt(var) alone, so a constant "
        "row divides 0 by 0",
        "Divide by torch.sqrt(var + self.eps), with the eps given to the constructor.",
        _variant(_NormVariant, "eps_ignored", eps_ignored=True),
    ),
    BugVariant(
        "ln.default_eps",
        LN,
        "the default eps is not the exercise's 1e-5 (BERT-style code uses 1e-12, others 1e-6)",
        "Keep the stub's signature: def __init__(self, d_model, eps=1e-5).",
        _variant(_NormVariant, "default_eps", default_eps=1e-12),
    ),
]

_LN_BY_ID = {bug.id: bug for bug in LN_BUGS}


def _norm_denominators(module: nn.Module, d: int) -> tuple[float, float] | None:
    """What the student's LayerNorm (gain 1, shift 0) divides two centred rows by: one of
    biased variance 1 and one of 1e-4 (where eps matters). None when that cannot be read."""
    z = torch.linspace(-1.0, 1.0, d, dtype=torch.float64) ** 3  # (D,)
    z = (z - z.mean()) / z.var(unbiased=False).sqrt()  # mean 0, biased variance 1
    x = torch.stack([z + 0.3, 0.01 * z + 0.3])[None]  # (1, 2, D)
    try:
        probe = clone_module(module).double()
        with torch.no_grad():
            params = dict(probe.named_parameters())
            params["weight"].fill_(1.0)
            params["bias"].fill_(0.0)
            y = probe(x)  # (1, 2, D)
    except Exception:  # noqa: BLE001 - a module that cannot be probed is judged by numbers
        return None
    if not isinstance(y, Tensor) or y.shape != x.shape or not bool(torch.isfinite(y).all()):
        return None
    c = x - x.mean(-1, keepdim=True)  # (1, 2, D)
    dens = (c * c).sum(-1) / (c * y).sum(-1)  # (1, 2)
    return float(dens[0, 0]), float(dens[0, 1])


def analyse_norm(module: nn.Module, d: int) -> list[BugVariant]:
    """Name each LayerNorm mistake of the student's module by rerunning its class with a
    controlled eps: the variance (biased or not), where eps goes (inside the square root,
    added to the standard deviation, or nowhere) and the default eps. Several at once are all
    named.

    Args:
        module: a student's LayerNorm (its class is built again as ``cls(d, eps=0.5)`` and
            ``cls(d)``; the module itself is not changed).
        d: d_model.

    Returns:
        The catalogued mistakes found, in a fixed order; an empty list when none of these
        explains the output (other mistakes, such as the wrong axis, are then matched against
        the catalogue).
    """
    if d < 2:
        return []
    cls = type(module)
    try:
        big = cls(d, eps=0.5)
        plain = cls(d)
    except Exception:  # noqa: BLE001 - not constructible the stub's way: nothing to say
        return []
    measured = _norm_denominators(big, d)
    if measured is None:
        return []
    found = None
    for unbiased in (False, True):
        for mode in ("inside", "outside", "none"):
            expected = [
                _denominator(var * (d / (d - 1) if unbiased else 1.0), 0.5, mode)
                for var in (1.0, 1e-4)
            ]
            if all(abs(m - e) <= 1e-3 * e for m, e in zip(measured, expected, strict=True)):
                found = (unbiased, mode)
    if found is None:
        return []
    unbiased, mode = found
    bugs = []
    if unbiased:
        bugs.append(_LN_BY_ID["ln.unbiased_variance"])
    if mode == "outside":
        bugs.append(_LN_BY_ID["ln.eps_outside_sqrt"])
    if mode == "none":
        bugs.append(_LN_BY_ID["ln.eps_ignored"])
    else:
        default = _norm_denominators(plain, d)
        if default is not None:
            var = 1e-4 * (d / (d - 1) if unbiased else 1.0)
            eps = default[1] ** 2 - var if mode == "inside" else default[1] - var**0.5
            if abs(eps - 1e-5) > 2e-6:
                bugs.append(_LN_BY_ID["ln.default_eps"])
    return bugs


def _denominator(var: float, eps: float, mode: str) -> float:
    if mode == "inside":
        return (var + eps) ** 0.5
    if mode == "outside":
        return var**0.5 + eps
    return var**0.5


def combined(bugs: Sequence[BugVariant]) -> BugVariant | None:
    """One known mistake, or several at once as a single entry naming each (its id is the
    first one's)."""
    if len(bugs) <= 1:
        return bugs[0] if bugs else None
    first = bugs[0]
    return BugVariant(
        first.id,
        first.item,
        "several at once: " + "; and ".join(b.description.rstrip(".") for b in bugs),
        " ".join(b.advice for b in bugs),
        first.impl,
    )


FFN_BUGS: list[BugVariant] = [
    BugVariant(
        "ffn.no_activation",
        FFN,
        "there is no activation between linear1 and linear2, so the network is linear",
        "Apply ReLU to the output of linear1: self.linear2(torch.relu(self.linear1(x))).",
        _variant(_FeedForwardVariant, "no_activation", activation="none"),
    ),
    BugVariant(
        "ffn.activation_after_output",
        FFN,
        "the ReLU is applied to the output of linear2 instead of between the two layers",
        "Apply ReLU between the layers (to linear1's output) and return linear2's output as "
        "it is: it must be able to go negative.",
        _variant(_FeedForwardVariant, "activation_after_output", activation="output"),
    ),
    BugVariant(
        "ffn.gelu_instead_of_relu",
        FFN,
        "the activation is GELU, where the paper's network uses ReLU",
        "Use torch.relu (max(0, x)) between the layers.",
        _variant(_FeedForwardVariant, "gelu_instead_of_relu", activation="gelu"),
    ),
]


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
    return combined(analyse_norm(mine, args[0])) or diagnose(
        guarded(mine, LN, **_LN_FORBID),
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
    copy_weights(reference, clone_module(student), LN)  # names and shapes
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
    actual = expect_tensor(guarded(mine, LN, **_LN_FORBID)(x), f"your output ({where})", (b, n, d))
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
    item=LN,
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
    cases=_ln_cases,
    before_copy=_ln_initial_values,
    forbid=_LN_FORBID,
    extra=(nn.LayerNorm,),
)


@public_check(assignment="ex04_encoder", implements="LayerNorm", bugs=LN_BUGS, kind="class")
def check_layer_norm(report: CheckReport, cls: Any, thorough: bool, seed: int | None) -> None:
    """Check the class ``LayerNorm(d_model, eps=1e-5)`` with parameters ``weight`` and ``bias``.

    Checks the parameters and their initial values (ones, zeros), copies random gains and
    shifts into both modules and compares with :class:`coursepkg.layers.LayerNorm` on inputs
    whose rows have different means and spreads (one nearly constant, where eps matters), in
    float32 and float64 and with a non-default eps; checks gradients, and rejects
    ``nn.LayerNorm`` and ``F.layer_norm``.
    """
    gen = generator(seed, salt=3)
    cfgs = configs("layer_norm", thorough, seed)
    check_module(report, cls, _LN_SPEC, cfgs, gen)
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
    mine = guarded(student, FFN)
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
    item=FFN,
    bugs=FFN_BUGS,
    reference=lambda cfg: _ReferenceFFN(cfg["D"], cfg["F"]).eval(),
    args=lambda cfg: (cfg["D"], cfg["F"]),
    dims=lambda cfg: {"D": cfg["D"], "F": cfg["F"]},
    dry=lambda cfg: (torch.zeros(1, 2, cfg["D"]),),  # (1, 2, D)
    gradient_inputs=lambda gen, cfg: (randn(gen, cfg["B"], cfg["L"], cfg["D"]),),
    cases=_ffn_cases,
)


@public_check(
    assignment="ex04_encoder", implements="PositionwiseFeedForward", bugs=FFN_BUGS, kind="class"
)
def check_feed_forward(report: CheckReport, cls: Any, thorough: bool, seed: int | None) -> None:
    """Check the class ``PositionwiseFeedForward(d_model, d_ff)`` (``linear1``, ReLU,
    ``linear2``).

    Compares the parameter count with :class:`coursepkg.layers.PositionwiseFeedForward`,
    copies its weights in and compares outputs (float32 and float64), checks that each
    position is transformed on its own (reordering the positions reorders the output) and
    that every parameter gets a gradient.
    """
    gen = generator(seed, salt=4)
    cfgs = configs("feed_forward", thorough, seed)
    check_module(report, cls, _FFN_SPEC, cfgs, gen)
    report.ok(f"parameter count and names match the reference on {len(cfgs)} shapes")
    report.ok("outputs match (float32 and float64); each position is transformed on its own")
    report.ok("gradients reach every parameter")


# ---------------------------------------------------------------------------------------------
# Catalogue: encoder layer (wiring mistakes, with correct pieces)
# ---------------------------------------------------------------------------------------------


class _EncoderVariant(nn.Module):
    """An encoder layer with a switch for its wiring; the default is the paper's post-LN."""

    wiring = "post_ln"  # "pre_ln", "no_residual_attention", "no_residual_ffn", "ffn_reads_input"

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.self_attn = HeadsVariant(d_model, n_heads)
        self.ffn = _FeedForwardVariant(d_model, d_ff)
        self.norm1 = _NormVariant(d_model)
        self.norm2 = _NormVariant(d_model)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.wiring == "pre_ln":
            h = self.norm1(x)
            x = x + self.self_attn(h, h, h, mask)  # (B, L, D)
            return x + self.ffn(self.norm2(x))  # (B, L, D)
        attended = self.self_attn(x, x, x, mask)  # (B, L, D)
        if self.wiring == "no_residual_attention":
            y = self.norm1(attended)
        else:
            y = self.norm1(x + attended)  # (B, L, D)
        if self.wiring == "no_residual_ffn":
            return self.norm2(self.ffn(y))
        if self.wiring == "ffn_reads_input":
            return self.norm2(y + self.ffn(x))
        return self.norm2(y + self.ffn(y))  # (B, L, D)


ENCODER_BUGS: list[BugVariant] = [
    BugVariant(
        "enc.pre_ln",
        ENC,
        "the layer is pre-LN (x + sublayer(norm(x))) instead of the paper's post-LN",
        "Normalise after adding the residual: x = norm1(x + self_attn(x, x, x, mask)), then "
        "x = norm2(x + ffn(x)).",
        _variant(_EncoderVariant, "pre_ln", wiring="pre_ln"),
    ),
    BugVariant(
        "enc.no_residual_attention",
        ENC,
        "the residual connection around self-attention is missing",
        "Add the input back before the norm: norm1(x + self_attn(x, x, x, mask)).",
        _variant(_EncoderVariant, "no_residual_attention", wiring="no_residual_attention"),
    ),
    BugVariant(
        "enc.no_residual_ffn",
        ENC,
        "the residual connection around the feed-forward network is missing",
        "Add the sub-layer's input back before the norm: norm2(x + ffn(x)).",
        _variant(_EncoderVariant, "no_residual_ffn", wiring="no_residual_ffn"),
    ),
    BugVariant(
        "enc.ffn_reads_layer_input",
        ENC,
        "the feed-forward network is applied to the layer's input instead of to the output "
        "of the attention sub-layer",
        "Feed the result of norm1 to the FFN: y = norm1(x + attn); out = norm2(y + ffn(y)).",
        _variant(_EncoderVariant, "ffn_reads_input", wiring="ffn_reads_input"),
    ),
]


# ---------------------------------------------------------------------------------------------
# Localising a wrong layer (shared with the decoder layer)
# ---------------------------------------------------------------------------------------------


def _explain_layer(
    student: nn.Module, reference: nn.Module, inputs: tuple[Any, ...], cfg: dict[str, int]
) -> tuple[str, BugVariant | None]:
    """Which piece of a wrong encoder layer is wrong (:func:`locate`) and the known mistake:
    the wrong piece's own, or, when every piece is right, the wiring's."""
    d, h, d_ff = cfg["D"], cfg["H"], cfg["F"]
    pieces = encoder_pieces(d, h, d_ff)
    sentence, wrong = locate(student, reference, inputs, pieces, layer=ENC)
    if wrong:
        found = piece_mistake(student, reference, pieces, inputs, wrong)
        return sentence, found[1] if found is not None else None
    bug = diagnose(
        lambda *a: student(*a),
        ENCODER_BUGS,
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

    def norm(name: str) -> Piece:
        return Piece(
            name,
            "LayerNorm",
            "check_layer_norm",
            LN_BUGS,
            (d,),
            lambda i: (_norm_probe(i[0]),),
            analyse=lambda m: combined(analyse_norm(m, d)),
        )

    return [
        Piece(
            "self_attn",
            "MultiHeadAttention",
            "check_multi_head_attention",
            MHA_BUGS,
            (d, h),
            lambda i: (i[0], i[0], i[0], i[1]),
        ),
        Piece(
            "ffn",
            "PositionwiseFeedForward",
            "check_feed_forward",
            FFN_BUGS,
            (d, d_ff),
            lambda i: (i[0],),
        ),
        norm("norm1"),
        norm("norm2"),
    ]


def _norm_probe(x: Tensor) -> Tensor:
    """A LayerNorm input on which every LayerNorm mistake shows: the layer input with one
    nearly constant position (where eps matters) and an offset."""
    probe = x.detach().clone() * 2 + 1
    probe[:, 0] = probe[:, 0] * 1e-3 + 0.01
    return probe


@public_check(assignment="ex04_encoder", implements="EncoderLayer", bugs=ENCODER_BUGS, kind="class")
def check_encoder_layer(report: CheckReport, cls: Any, thorough: bool, seed: int | None) -> None:
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
    check_module(report, cls, _ENCODER_SPEC, cfgs, gen)
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
    mine = guarded(student, ENC)
    where = f"{describe(cfg)}, {dtype_name(dtype)}"
    x = randn(gen, b, n, d, dtype=dtype)  # (B, L, D)

    def compare(inputs: tuple[Any, ...], case: str) -> Tensor:
        expected = reference(*inputs)
        actual = expect_tensor(mine(*inputs), f"the output of your {ENC} ({case})", (b, n, d))
        try:
            assert_close(actual, expected, f"the output of your {ENC} ({where}, {case})")
        except CheckFailure as failure:
            sentence, bug = _explain_layer(student, reference, inputs, cfg)
            report.fail(f"{failure.message}\n{sentence}", bug)
        return actual

    compare((x, None), "no mask")
    if n < 2:
        return
    keep = random_keep(gen, b, n)  # (B, L)
    mask = keep[:, None, None, :]  # (B, 1, 1, L)
    out = compare((x, mask), "padding mask (B, 1, 1, L)")
    changed = torch.where(keep[..., None], x, randn(gen, b, n, d, dtype=dtype) * 3)
    expect_close(
        report,
        mine(changed, mask)[keep],
        out[keep],
        f"the outputs of your {ENC} at real positions after changing the padded positions "
        f"({where})",
        hint="Padded positions (mask False) must not influence the others. True = may attend.",
    )
    mask = causal_mask(n)  # (L, L)
    out = compare((x, mask), "causal mask (L, L)")
    cut = n // 2
    later = x.clone()
    later[:, cut:] = randn(gen, b, n - cut, d, dtype=dtype)
    expect_close(
        report,
        mine(later, mask)[:, :cut],
        out[:, :cut],
        f"the first {cut} positions of your {ENC}'s output after changing later positions "
        f"under a causal mask ({where})",
        hint="Pass the mask on to self-attention; True = may attend.",
    )
    mask = torch.ones(b, 1, 1, n, dtype=torch.bool)  # (B, 1, 1, L)
    mask[0] = False  # a sequence with no position to attend: finite output, never NaN
    compare((x, mask), "a sequence whose every position is masked")


_ENCODER_SPEC = ModuleSpec(
    item=ENC,
    bugs=ENCODER_BUGS,
    reference=lambda cfg: _ReferenceEncoderLayer(cfg["D"], cfg["H"], cfg["F"]).eval(),
    args=lambda cfg: (cfg["D"], cfg["H"], cfg["F"]),
    dims=lambda cfg: {"D": cfg["D"], "H": cfg["H"], "F": cfg["F"]},
    dry=lambda cfg: (torch.zeros(1, 2, cfg["D"]), None),  # (1, 2, D)
    gradient_inputs=lambda gen, cfg: (randn(gen, cfg["B"], cfg["L"], cfg["D"]), None),
    cases=_encoder_cases,
)

BUGS: list[BugVariant] = [*LN_BUGS, *FFN_BUGS, *ENCODER_BUGS]
