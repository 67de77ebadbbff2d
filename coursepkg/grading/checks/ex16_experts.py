"""Checks of ex16_experts: a mixture of experts' router (``route_top_k``) and load-balancing
loss (``load_balancing_loss``), and the part of a token that multi-head latent attention
caches (``compress_latent``); the catalogue of mistakes they recognise is in
:mod:`.ex16_experts_mistakes`.

Dimension legend: T tokens, E experts, k experts per token, B batch, L length, D d_model,
R the latent's width, Dr the rotated key part's width.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor

from ...moe import Routing, expert_load, route_sigmoid
from ...moe import load_balancing_loss as _reference_loss
from ...moe import route_top_k as _reference_route
from ...positional import apply_rope
from ..framework import (
    CheckFailure,
    CheckReport,
    call_student,
    check_gradients,
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
    register_configs,
)
from .ex16_experts_mistakes import (
    AUX_LOSS_BUGS,
    AUX_LOSS_ITEM,
    LATENT_BUGS,
    LATENT_ITEM,
    ROUTER_BUGS,
    ROUTER_ITEM,
)

__all__ = ["check_compress_latent", "check_load_balancing_loss", "check_route_top_k"]

Config = dict[str, Any]

#: The course's own router and loss, which the exercise asks students to write.
_REFERENCE_MOE = (_reference_route, route_sigmoid, _reference_loss, expert_load)


def _forbidden(item: str):
    """The honesty rule for ``item``: no call into the reference (the MoE functions too)."""
    return forbidden_calls(item, extra=_REFERENCE_MOE)


def _pair(value: Any, what: str) -> tuple[Any, Any]:
    """The two parts of a returned ``(a, b)``, or a failure saying what came back."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        sized = f" of {len(value)}" if isinstance(value, tuple | list) else ""
        raise CheckFailure(
            f"{what} should be a pair of tensors, but your code returned a "
            f"{type(value).__name__}{sized}."
        )
    return value[0], value[1]


# ---------------------------------------------------------------------------------------------
# check_route_top_k
# ---------------------------------------------------------------------------------------------

register_configs(
    ROUTER_ITEM,
    visible=[
        {"T": 6, "E": 4, "k": 2, "renormalize": True},
        {"T": 5, "E": 8, "k": 3, "renormalize": False},
        {"T": 1, "E": 3, "k": 1, "renormalize": False},
    ],
    extra=[
        {"T": 9, "E": 5, "k": 5, "renormalize": True},
        {"T": 4, "E": 16, "k": 1, "renormalize": True},
    ],
    sample=lambda rng: _sample_router(rng),
)


def _sample_router(rng: random.Random) -> Config:
    experts = rng.randint(2, 16)
    return {
        "T": rng.randint(1, 12),
        "E": experts,
        "k": rng.randint(1, experts),
        "renormalize": rng.choice([True, False]),
    }


def _by_expert(out: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """``(weights, experts)`` with each token's k entries in the order of the experts' ids, so
    that any order of the k choices compares equal."""
    weights, experts = out
    order = experts.long().argsort(dim=-1)  # (T, k)
    return weights.gather(-1, order), experts.long().gather(-1, order)


@public_check(assignment="ex16_experts", implements="route_top_k", bugs=ROUTER_BUGS)
def check_route_top_k(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``route_top_k(logits, k, renormalize=True) -> (weights, experts)``, (T, k) each.

    Compares the experts chosen (in any order) and their weights with
    :func:`coursepkg.moe.route_top_k`, with and without renormalisation, for one expert of
    several and all of them, and that the renormalised weights sum to 1.
    """
    if not callable(impl):
        report.fail(f"expected your function {ROUTER_ITEM}, got {type(impl).__name__}.")

    def route(logits: Tensor, k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
        with _forbidden(ROUTER_ITEM):
            out = call_student(impl, logits, k, renormalize, item=ROUTER_ITEM)
        return _pair(out, "your output")

    def ordered(*inputs: Any) -> tuple[Tensor, Tensor]:
        return _by_expert(route(*inputs))

    gen = generator(seed, salt=13)
    cfgs = configs(ROUTER_ITEM, thorough, seed)
    for cfg in cfgs:
        where, shape = describe(cfg), (cfg["T"], cfg["k"])
        inputs = (2.0 * randn(gen, cfg["T"], cfg["E"]), cfg["k"], cfg["renormalize"])
        weights, experts = route(*inputs)
        expect_tensor(weights, f"your weights ({where})", shape)
        expect_tensor(experts, f"your experts ({where})", shape)
        if experts.is_floating_point():
            report.fail(
                f"your experts ({where}) are {experts.dtype}; they should be integer "
                "indices (topk's .indices)."
            )
        reference = _reference_route(*inputs)
        expected = _by_expert((reference.weights, reference.experts))
        weights, experts = _by_expert((weights, experts))
        diagnosis = partial(
            diagnose,
            ordered,
            ROUTER_BUGS,
            inputs,
            reference_output=expected,
            run=lambda bug, args: _by_expert(bug(*args)),
        )
        if not torch.equal(experts, expected[1]):
            report.fail(
                f"your experts ({where}) are not each token's k most probable ones: "
                f"expected {expected[1].tolist()}, got {experts.tolist()}.",
                diagnosis(),
            )
        expect_close(
            report,
            weights,
            expected[0],
            f"your weight tensor ({where})",
            diagnosis=diagnosis,
            hint="Expected the softmax over all E experts' "
            "probabilities of the chosen k, divided by their sum when renormalize.",
        )
    report.ok(f"the same experts and weights as the reference on {len(cfgs)} shapes")
    report.ok("with and without renormalisation")


# ---------------------------------------------------------------------------------------------
# check_load_balancing_loss
# ---------------------------------------------------------------------------------------------

register_configs(
    AUX_LOSS_ITEM,
    visible=[{"T": 8, "E": 4, "k": 2}, {"T": 5, "E": 6, "k": 1}, {"T": 3, "E": 3, "k": 3}],
    extra=[{"T": 1, "E": 8, "k": 2}, {"T": 20, "E": 16, "k": 4}],
    sample=lambda rng: _sample_loss(rng),
)


def _sample_loss(rng: random.Random) -> Config:
    experts = rng.randint(2, 16)
    return {"T": rng.randint(1, 24), "E": experts, "k": rng.randint(1, experts)}


def _router_output(gen: torch.Generator, cfg: Config, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """A router's probabilities, (T, E), and each token's k most probable experts, (T, k)."""
    probs = torch.softmax(1.5 * randn(gen, cfg["T"], cfg["E"], dtype=dtype), dim=-1)
    return probs, probs.topk(cfg["k"], dim=-1).indices


@public_check(assignment="ex16_experts", implements="load_balancing_loss", bugs=AUX_LOSS_BUGS)
def check_load_balancing_loss(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check ``load_balancing_loss(probs, experts, n_experts) -> a scalar``.

    Compares with :func:`coursepkg.moe.load_balancing_loss` on routers of one, several and
    every expert per token, in float32 and float64; checks that an even load gives k and that
    the gradient reaches the probabilities.
    """
    if not callable(impl):
        report.fail(f"expected your function {AUX_LOSS_ITEM}, got {type(impl).__name__}.")

    def loss(probs: Tensor, experts: Tensor, n_experts: int) -> Tensor:
        with _forbidden(AUX_LOSS_ITEM):
            return call_student(impl, probs, experts, n_experts, item=AUX_LOSS_ITEM)

    gen = generator(seed, salt=14)
    cfgs = configs(AUX_LOSS_ITEM, thorough, seed)
    for index, cfg in enumerate(cfgs):
        for dtype in (torch.float32, torch.float64) if index == 0 else (torch.float32,):
            probs, experts = _router_output(gen, cfg, dtype)
            inputs, where = (probs, experts, cfg["E"]), f"{describe(cfg)}, {dtype_name(dtype)}"
            routing = Routing(probs, experts, probs.gather(1, experts))
            expected = _reference_loss([routing], cfg["E"])
            expect_close(
                report,
                expect_tensor(loss(*inputs), f"your loss ({where})", ()),
                expected,
                f"your loss ({where})",
                diagnosis=partial(diagnose, loss, AUX_LOSS_BUGS, inputs, reference_output=expected),
                hint="Expected E * sum_i f_i * P_i (f_i: the fraction of tokens sent to expert "
                "i, counting each of a token's k choices; P_i: its mean probability).",
            )
    _even_load_and_gradient(report, loss)
    report.ok(f"matches the reference on {len(cfgs)} routers, float32 and float64")


def _even_load_and_gradient(report: CheckReport, loss: Callable[..., Any]) -> None:
    """An even router (every probability 1/E, every expert chosen as often) gives k, and the
    loss's gradient reaches the probabilities."""
    e, k = 4, 2
    experts = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]])  # (T, k): each expert twice
    probs = torch.full((4, e), 1.0 / e, requires_grad=True)  # (T, E)
    value = expect_tensor(loss(probs, experts, e), "your loss (an even router)", ())
    expect_close(
        report,
        value.detach(),
        torch.tensor(float(k)),
        "your loss for an even "
        "router (every probability 1/E, every expert chosen equally: expected k)",
        diagnosis=partial(
            diagnose,
            loss,
            AUX_LOSS_BUGS,
            (probs.detach(), experts, e),
            reference_output=torch.tensor(float(k)),
        ),
    )
    check_gradients(value, [("probs", probs)], AUX_LOSS_ITEM)
    report.ok("an even load gives k, and the gradient reaches the probabilities")


# ---------------------------------------------------------------------------------------------
# check_compress_latent
# ---------------------------------------------------------------------------------------------

register_configs(
    LATENT_ITEM,
    visible=[
        {"B": 2, "L": 5, "D": 12, "R": 6, "Dr": 4, "start": 0, "theta": 10000.0},
        {"B": 1, "L": 4, "D": 8, "R": 2, "Dr": 6, "start": 3, "theta": 100.0},
    ],
    extra=[
        {"B": 1, "L": 1, "D": 4, "R": 4, "Dr": 2, "start": 7, "theta": 10000.0},
        {"B": 3, "L": 9, "D": 16, "R": 8, "Dr": 8, "start": 0, "theta": 500000.0},
    ],
    sample=lambda rng: _sample_latent(rng),
)


def _sample_latent(rng: random.Random) -> Config:
    d = rng.randint(2, 24)
    return {
        "B": rng.randint(1, 3),
        "L": rng.randint(1, 10),
        "D": d,
        "R": rng.randint(1, d),
        "Dr": 2 * rng.randint(1, 4),
        "start": rng.choice([0, rng.randint(1, 9)]),
        "theta": rng.choice([10000.0, 100.0]),
    }


def _reference_compress(
    x: Tensor, w_down: Tensor, kv_rank: int, positions: Tensor, theta: float
) -> tuple[Tensor, Tensor]:
    """The latent and the rotated key part (as ``MultiHeadLatentAttention.compress`` without
    the latent's norm)."""
    latent, k_rope = (x @ w_down.T).split([kv_rank, w_down.size(0) - kv_rank], dim=-1)
    k_rope = apply_rope(k_rope[:, None], positions, theta, "halves")[:, 0]  # (B, L, Dr)
    return latent, k_rope  # (B, L, R), (B, L, Dr)


@public_check(assignment="ex16_experts", implements="compress_latent", bugs=LATENT_BUGS)
def check_compress_latent(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``compress_latent(x, w_down, kv_rank, positions, theta) -> (latent, k_rope)``.

    Compares both parts with the reference (the projection split latent first, the key part
    alone rotated in the rotate-half pairing) for positions from 0 and later (as with a
    cache), several widths and bases.
    """
    if not callable(impl):
        report.fail(f"expected your function {LATENT_ITEM}, got {type(impl).__name__}.")

    def compress(*inputs: Any) -> tuple[Tensor, Tensor]:
        with _forbidden(LATENT_ITEM):
            return _pair(call_student(impl, *inputs, item=LATENT_ITEM), "your output")

    gen = generator(seed, salt=15)
    cfgs = configs(LATENT_ITEM, thorough, seed)
    for cfg in cfgs:
        b, n, r, dr, where = cfg["B"], cfg["L"], cfg["R"], cfg["Dr"], describe(cfg)
        w_down = randn(gen, r + dr, cfg["D"]) / math.sqrt(cfg["D"])  # (R + Dr, D)
        positions = torch.arange(n) + cfg["start"]  # (L,)
        inputs = (randn(gen, b, n, cfg["D"]), w_down, r, positions, cfg["theta"])
        latent, k_rope = compress(*inputs)
        expected = _reference_compress(*inputs)
        diagnosis = partial(diagnose, compress, LATENT_BUGS, inputs, reference_output=expected)
        for part, want, name, width in (
            (latent, expected[0], "latent", r),
            (k_rope, expected[1], "k_rope", dr),
        ):
            got = expect_tensor(part, f"your {name} ({where})", (b, n, width))
            expect_close(
                report,
                got,
                want,
                f"your {name} ({where})",
                diagnosis=diagnosis,
                hint="Expected latent, k_rope = (x @ w_down.T).split([kv_rank, Dr]) "
                "with k_rope alone rotated.",
            )
    report.ok(f"the latent and the rotated key part match the reference on {len(cfgs)} shapes")
    report.ok("only the key part carries the position")
