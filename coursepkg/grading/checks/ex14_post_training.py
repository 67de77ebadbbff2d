"""Checks of assignment ex14_post_training: the SFT loss, the LoRA layer, the DPO loss, the
per-token pieces GRPO is assembled from (token entropy, masked mean, the clipped
policy-gradient loss per token), GRPO's group advantages and its loss, each against
:mod:`coursepkg.posttrain` (through :mod:`..framework.post_training`).

Each loss is compared in value and in gradient (float32 and float64) on inputs where the
catalogued mistakes differ from the answer: prompts and padding of different lengths in every
row, ratios far enough from 1 to be clipped, a group whose rewards are all equal, logits so far
apart that some probabilities are 0 in floating point, masks that keep a different number of
entries in each row and column. The LoRA layer is run with the reference's weights copied in
by name, and its behaviour before training and the gradients of its base layer are looked at.
The catalogue is :mod:`.ex14_post_training_mistakes` (written by concept in
:mod:`.ex14_mistakes`).

Dimension legend: B batch, L length, V vocabulary, P prompts, G answers per prompt, T targets.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ...posttrain import dpo as _dpo
from ...posttrain import grpo as _grpo
from ...posttrain import lora as _lora
from ...posttrain import per_token as _per_token
from ...posttrain import policy_gradient as _pg
from ...posttrain import sft as _sft
from ..framework import (
    BugVariant,
    CheckFailure,
    CheckReport,
    call_student,
    compare_value_and_grads,
    configs,
    describe,
    diagnose,
    expect_close,
    expect_tensor,
    forbidden_calls,
    generator,
    public_check,
    randn,
    register_configs,
)
from ..framework.post_training import (
    LoRAReference,
    advantages_reference,
    dpo_reference,
    entropy_reference,
    grpo_reference,
    masked_mean_reference,
    pg_reference,
    sft_reference,
)
from .ex14_mistakes.dpo import DPO_BUGS, DPO_ITEM
from .ex14_mistakes.grpo import (
    ADVANTAGES_BUGS,
    ADVANTAGES_ITEM,
    ENTROPY_BUGS,
    ENTROPY_ITEM,
    GRPO_BUGS,
    GRPO_ITEM,
    MASKED_MEAN_BUGS,
    MASKED_MEAN_ITEM,
    PG_BUGS,
    PG_ITEM,
)
from .ex14_mistakes.lora import LORA_BUGS, LORA_ITEM
from .ex14_mistakes.sft import SFT_BUGS, SFT_ITEM
from .ex14_post_training_mistakes import BUGS

__all__ = [
    "check_dpo_loss",
    "check_group_advantages",
    "check_grpo_loss",
    "check_grpo_clip_loss",
    "check_lora_linear",
    "check_masked_mean",
    "check_sft_loss",
    "check_token_entropy",
]

Config = dict[str, Any]
DTYPES = (torch.float32, torch.float64)

_FORBID = {
    "extra": [
        (_sft.sft_loss, "coursepkg.posttrain.sft.sft_loss"),
        (_sft.token_losses, "coursepkg.posttrain.sft.token_losses"),
        (_lora.LoRALinear, "coursepkg.posttrain.lora.LoRALinear"),
        (_dpo.dpo_loss, "coursepkg.posttrain.dpo.dpo_loss"),
        (_grpo.group_advantages, "coursepkg.posttrain.grpo.group_advantages"),
        (_grpo.grpo_loss, "coursepkg.posttrain.grpo.grpo_loss"),
        (_per_token.token_entropy, "coursepkg.posttrain.per_token.token_entropy"),
        (_per_token.masked_mean, "coursepkg.posttrain.per_token.masked_mean"),
        (_per_token.masked_normalize, "coursepkg.posttrain.per_token.masked_normalize"),
        (_pg.grpo_clip_loss, "coursepkg.posttrain.policy_gradient.grpo_clip_loss"),
        (_pg.grpo_token_loss, "coursepkg.posttrain.policy_gradient.grpo_token_loss"),
    ],
    "advice": "write it yourself from torch operations, not with the course's posttrain module",
}


def _rand(rng: random.Random, **ranges: tuple[int, int]) -> Config:
    return {k: rng.randint(*v) for k, v in ranges.items()}


register_configs(
    SFT_ITEM,
    visible=[{"B": 3, "L": 7, "V": 11}, {"B": 2, "L": 9, "V": 5}, {"B": 4, "L": 8, "V": 13}],
    extra=[{"B": 1, "L": 3, "V": 4}],
    sample=lambda rng: _rand(rng, B=(1, 4), L=(5, 12), V=(3, 20)),
)
register_configs(
    LORA_ITEM,
    visible=[
        {"in": 6, "out": 5, "r": 2, "alpha": 4.0},
        {"in": 8, "out": 8, "r": 1, "alpha": 1.0},
        {"in": 4, "out": 7, "r": 3, "alpha": 12.0},
    ],
    extra=[{"in": 16, "out": 3, "r": 8, "alpha": 16.0}],
    sample=lambda rng: {
        **_rand(rng, **{"in": (1, 12), "out": (1, 12), "r": (1, 6)}),
        "alpha": float(rng.choice([1, 2, 8, 16, 32])),
    },
)
register_configs(
    DPO_ITEM,
    visible=[{"B": 4, "beta": 0.1}, {"B": 1, "beta": 0.5}, {"B": 6, "beta": 2.0}],
    extra=[{"B": 3, "beta": 0.01}],
    sample=lambda rng: {"B": rng.randint(1, 8), "beta": rng.choice([0.05, 0.1, 0.3, 1.0])},
)
register_configs(
    ENTROPY_ITEM,
    visible=[{"B": 2, "L": 3, "V": 7}, {"B": 3, "L": 4, "V": 11}, {"B": 1, "L": 5, "V": 50}],
    extra=[{"B": 2, "L": 2, "V": 2}],
    sample=lambda rng: _rand(rng, B=(1, 4), L=(1, 6), V=(2, 64)),
)
register_configs(
    MASKED_MEAN_ITEM,
    visible=[{"B": 3, "T": 5, "dim": None}, {"B": 4, "T": 6, "dim": 1}, {"B": 5, "T": 3, "dim": 0}],
    extra=[{"B": 2, "T": 7, "dim": -1}],
    sample=lambda rng: {**_rand(rng, B=(2, 6), T=(2, 9)), "dim": rng.choice([None, 0, 1, -1])},
)
register_configs(
    PG_ITEM,
    visible=[
        {"B": 4, "T": 6, "clip": 0.2},
        {"B": 3, "T": 5, "clip": 0.1},
        {"B": 6, "T": 4, "clip": 0.3},
    ],
    extra=[{"B": 2, "T": 8, "clip": 0.2}],
    sample=lambda rng: {**_rand(rng, B=(2, 6), T=(3, 9)), "clip": rng.choice([0.1, 0.2, 0.3])},
)
register_configs(
    ADVANTAGES_ITEM,
    visible=[{"P": 3, "G": 4}, {"P": 2, "G": 2}, {"P": 4, "G": 6}],
    extra=[{"P": 1, "G": 3}],
    sample=lambda rng: _rand(rng, P=(1, 5), G=(2, 8)),
)
register_configs(
    GRPO_ITEM,
    visible=[
        {"B": 4, "T": 6, "clip": 0.2, "kl": 0.1},
        {"B": 3, "T": 5, "clip": 0.1, "kl": 0.5},
        {"B": 6, "T": 4, "clip": 0.3, "kl": 0.04},
    ],
    extra=[{"B": 2, "T": 8, "clip": 0.2, "kl": 0.0}],
    sample=lambda rng: {
        **_rand(rng, B=(2, 6), T=(3, 9)),
        "clip": rng.choice([0.1, 0.2, 0.3]),
        "kl": rng.choice([0.01, 0.1, 0.5]),
    },
)


# ---------------------------------------------------------------------------------------------
# Shared: a loss's value and gradients, from the student and from a variant
# ---------------------------------------------------------------------------------------------


def _guard(item: str) -> Callable:
    return lambda: forbidden_calls(item, **_FORBID)


def _call(impl: Any, item: str, *args: Any) -> Any:
    with forbidden_calls(item, **_FORBID):
        return call_student(impl, *args, item=item)


def _check_loss(report, impl, item, reference, bugs, inputs, wrt, where) -> None:
    """Value and gradients against ``reference``, under the item's honesty rules."""
    compare_value_and_grads(
        report, impl, item, reference, bugs, inputs, wrt, where, guard=_guard(item)
    )


def _constants_take_no_gradient(report, student, item, inputs, constants, where) -> None:
    """No gradient reaches the inputs at ``constants`` (position -> (name, mistake id)) when the
    student's result is backpropagated: they are sampled numbers, constants of the loss."""
    args = [x.detach().clone() for x in inputs]
    for i in (0, *constants):
        args[i].requires_grad_(True)
    with torch.enable_grad(), forbidden_calls(item, **_FORBID):
        call_student(student, *args, item=item).sum().backward()
    for i, (name, bug_id) in constants.items():
        if args[i].grad is not None and bool(args[i].grad.any()):
            report.fail(
                f"a gradient reaches {name} through your {item} {where}.",
                next(bug for bug in BUGS if bug.id == bug_id),
            )


# ---------------------------------------------------------------------------------------------
# SFT
# ---------------------------------------------------------------------------------------------


def _sft_inputs(config: Config, seed: int, dtype: torch.dtype) -> tuple[Tensor, ...]:
    """Logits and tokens; row r has r padding positions at its end and a prompt of 1 + r
    tokens (at least one response target per row, of different lengths)."""
    b, n, v = config["B"], config["L"], config["V"]
    gen = generator(seed)
    logits = 2.0 * randn(gen, b, n, v, dtype=dtype)  # (B, L, V)
    tokens = torch.randint(0, v, (b, n), generator=gen)  # (B, L)
    token_mask = torch.ones(b, n, dtype=torch.bool)  # (B, L)
    loss_mask = torch.zeros(b, n, dtype=torch.bool)  # (B, L)
    for row in range(b):
        real = max(n - row, 3)
        prompt = min(1 + row % 3, real - 1)
        token_mask[row, real:] = False
        loss_mask[row, prompt:real] = True
    return logits, tokens, loss_mask, token_mask


@public_check(assignment="ex14_post_training", implements="sft_loss", bugs=SFT_BUGS)
def check_sft_loss(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``sft_loss(logits, tokens, loss_mask, token_mask)``: value and gradient against
    the per-token mean over the response targets, with prompts and padding in every batch."""
    for index, config in enumerate(configs(SFT_ITEM, thorough, seed)):
        for dtype in DTYPES:
            inputs = _sft_inputs(config, 100 * index + (seed or 0), dtype)
            where = f"({describe(config)}, {dtype})"
            _check_loss(report, impl, SFT_ITEM, sft_reference, SFT_BUGS, inputs, [0], where)
    report.ok("only the response's targets count: not the prompt, not padding")
    report.ok("the mean is over every response token of the batch; value and gradient match")


# ---------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------


def _copy_adapters(dst: nn.Module, a: Tensor, b: Tensor) -> None:
    with torch.no_grad():
        dst.lora_A.copy_(a)
        dst.lora_B.copy_(b)


def _lora_parts(layer: Any, config: Config) -> None:
    shapes = {"lora_A": (config["r"], config["in"]), "lora_B": (config["out"], config["r"])}
    for name, shape in shapes.items():
        value = getattr(layer, name, None)
        if not isinstance(value, nn.Parameter) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise CheckFailure(
                f"your LoRALinear should have an nn.Parameter `{name}` of shape {shape} "
                f"({describe(config)}), got {got}."
            )


def _run_lora(cls: Any, args: Sequence[Any]) -> Tensor:
    base, config, a, b, x = args
    layer = cls(copy.deepcopy(base), config["r"], config["alpha"])
    _copy_adapters(layer, a, b)
    return layer(x)


@public_check(
    assignment="ex14_post_training", implements="LoRALinear", bugs=LORA_BUGS, kind="class"
)
def check_lora_linear(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``LoRALinear(base, r, alpha)``: unchanged output at step 0, the scaled low-rank
    change with the reference's adapters copied in, gradients for the adapters only."""
    for index, config in enumerate(configs(LORA_ITEM, thorough, seed)):
        where = f"({describe(config)})"
        gen = generator(seed, 200 + index)
        torch.manual_seed(1000 * index + (seed or 0))
        base = nn.Linear(config["in"], config["out"]).double()
        x = randn(gen, 3, 2, config["in"], dtype=torch.float64)  # (2, 3, in): leading dims
        layer = _call(impl, LORA_ITEM, copy.deepcopy(base), config["r"], config["alpha"])
        _lora_parts(layer, config)
        before = expect_tensor(_call(layer, LORA_ITEM, x), "your LoRALinear's output").detach()
        _check_lora_starts_learning(report, layer, x, where)
        a = randn(gen, config["r"], config["in"], dtype=torch.float64)  # (r, in)
        b = randn(gen, config["out"], config["r"], dtype=torch.float64)  # (out, r)
        expected = _run_lora(LoRAReference, (base, config, a, b, x))
        _copy_adapters(layer, a, b)
        out = expect_tensor(_call(layer, LORA_ITEM, x), "your LoRALinear's output", expected.shape)
        expect_close(
            report,
            out,
            expected,
            f"your LoRALinear's output with given lora_A and lora_B {where}",
            diagnosis=lambda args=(base, config, a, b, x), expected=expected: diagnose(
                lambda *xs: _run_lora(impl, xs),
                LORA_BUGS,
                list(args),
                run=_run_lora,
                reference_output=expected,
            ),
        )
        _check_lora_training(report, impl, layer, base, x, before, where)
    report.ok("before training the layer computes exactly what its base does (B = 0)")
    report.ok("the change is (alpha / r) x A^T B^T; only lora_A and lora_B take gradients")


def _lora_bug(bug_id: str) -> BugVariant:
    return next(bug for bug in LORA_BUGS if bug.id == bug_id)


def _check_lora_starts_learning(report, layer, x, where) -> None:
    """As built, a gradient reaches an adapter: with B = 0, lora_B's gradient is a product with
    lora_A (and lora_A's with lora_B), so two zero adapters never move."""
    layer.zero_grad(set_to_none=True)
    _call(layer, LORA_ITEM, x).sum().backward()
    grads = [getattr(layer, name).grad for name in ("lora_A", "lora_B")]
    layer.zero_grad(set_to_none=True)
    if not any(g is not None and bool(g.any()) for g in grads):
        report.fail(
            f"as built, no gradient reaches lora_A or lora_B of your LoRALinear {where}: "
            "training would never change the layer.",
            _lora_bug("lora.both_zero"),
        )


def _check_lora_training(report, impl, layer, base, x, before, where) -> None:
    """Step 0 changes nothing; the base takes no gradient; both adapters do."""
    if not torch.allclose(before, base(x), rtol=1e-12, atol=1e-12):
        report.fail(
            f"before training your LoRALinear's output differs from its base layer's {where}: "
            "the adapted model must start exactly where the pre-trained one is.",
            _lora_bug("lora.b_not_zero"),
        )
    layer.zero_grad(set_to_none=True)
    _call(layer, LORA_ITEM, x).sum().backward()
    inner = [m for m in layer.modules() if isinstance(m, nn.Linear)]
    leaked = [p for m in inner for p in m.parameters() if p.grad is not None and p.grad.any()]
    if leaked or any(p.requires_grad for m in inner for p in m.parameters()):
        report.fail(
            f"the base layer's parameters of your LoRALinear take gradients {where}: only "
            "lora_A and lora_B may train.",
            _lora_bug("lora.base_not_frozen"),
        )
    for name in ("lora_A", "lora_B"):
        grad = getattr(layer, name).grad
        if grad is None or not grad.any():
            report.fail(f"no gradient reaches {name} of your LoRALinear {where}.")


# ---------------------------------------------------------------------------------------------
# DPO
# ---------------------------------------------------------------------------------------------


@public_check(assignment="ex14_post_training", implements="dpo_loss", bugs=DPO_BUGS)
def check_dpo_loss(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected,
    beta)``: value and gradients against the reference; no gradient into the reference."""
    for index, config in enumerate(configs(DPO_ITEM, thorough, seed)):
        for dtype in DTYPES:
            gen = generator(seed, 300 + index)
            logps = [-20.0 * torch.rand(config["B"], generator=gen, dtype=dtype) for _ in "1234"]
            where = f"({describe(config)}, {dtype})"
            beta = config["beta"]

            def loss(pc, pr, rc, rr, fn=None, beta=beta):
                return (fn or impl)(pc, pr, rc, rr, beta)

            def reference(pc, pr, rc, rr, beta=beta):
                return dpo_reference(pc, pr, rc, rr, beta)

            bound = [lambda *xs, fn=bug.impl: loss(*xs, fn=fn) for bug in DPO_BUGS]
            bugs = [
                BugVariant(b.id, b.item, b.description, b.advice, f)
                for b, f in zip(DPO_BUGS, bound, strict=True)
            ]
            _check_loss(report, loss, DPO_ITEM, reference, bugs, logps, [0, 1], where)
            _check_no_reference_gradient(report, impl, logps, beta, where)
    report.ok("-log sigmoid(beta * margin), the margin chosen minus rejected, mean over pairs")
    report.ok("the reference's log-probabilities take no gradient")


def _check_no_reference_gradient(report, impl, logps, beta, where) -> None:
    pc, pr, rc, rr = (x.detach().clone().requires_grad_(True) for x in logps)
    with forbidden_calls(DPO_ITEM, **_FORBID):
        call_student(impl, pc, pr, rc, rr, beta, item=DPO_ITEM).backward()
    if any(x.grad is not None and bool(x.grad.any()) for x in (rc, rr)):
        report.fail(
            f"a gradient reaches the reference's log-probabilities through your dpo_loss {where}.",
            next(bug for bug in DPO_BUGS if bug.id == "dpo.reference_gradient"),
        )


# ---------------------------------------------------------------------------------------------
# The per-token pieces
# ---------------------------------------------------------------------------------------------


def _logits(config: Config, seed: int | None, salt: int, dtype: torch.dtype) -> Tensor:
    """Logits (B, L, V) at several scales; at position 0 one token is so far ahead (120 in
    float32, 800 in float64) that every other probability is exactly 0 in that dtype."""
    gen = generator(seed, salt)
    scales = torch.tensor([0.5, 2.0, 6.0], dtype=dtype)
    logits = randn(gen, config["B"], config["L"], config["V"], dtype=dtype)  # (B, L, V)
    logits = logits * scales[torch.arange(config["L"]) % 3][None, :, None]
    logits[:, 0, 0] += 120.0 if dtype == torch.float32 else 800.0
    return logits


@public_check(assignment="ex14_post_training", implements="token_entropy", bugs=ENTROPY_BUGS)
def check_token_entropy(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``token_entropy(logits)``: value and gradient against -sum p log p in nats, with
    distributions from near-uniform to one whose other probabilities underflow to 0."""
    for index, config in enumerate(configs(ENTROPY_ITEM, thorough, seed)):
        for dtype in DTYPES:
            inputs = [_logits(config, seed, 600 + index, dtype)]
            where = f"({describe(config)}, {dtype})"
            _check_loss(
                report, impl, ENTROPY_ITEM, entropy_reference, ENTROPY_BUGS, inputs, [0], where
            )
    report.ok("H = -sum_v p_v log p_v over the last dimension, in nats, one per position")
    report.ok("finite where a probability is 0 in floating point (log p from log-softmax)")


def _masked(config: Config, seed: int | None, salt: int, dtype: torch.dtype) -> list:
    """Values and a mask (B, T) that keeps a different number of entries in each row and
    column (never none); the masked entries are large, so counting them shows."""
    b, t = config["B"], config["T"]
    gen = generator(seed, salt)
    x = randn(gen, b, t, dtype=dtype)  # (B, T)
    mask = torch.rand(b, t, generator=gen) < 0.6  # (B, T)
    mask[torch.arange(b), torch.arange(b) % t] = True  # every row keeps one
    mask[torch.arange(t) % b, torch.arange(t)] = True  # every column keeps one
    mask[0, :] = True
    return [torch.where(mask, x, x + 50.0), mask]


@public_check(assignment="ex14_post_training", implements="masked_mean", bugs=MASKED_MEAN_BUGS)
def check_masked_mean(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``masked_mean(x, mask, dim)``: value and gradient against sum(x * mask) /
    sum(mask), over all entries (dim None) and along a dimension."""
    for index, config in enumerate(configs(MASKED_MEAN_ITEM, thorough, seed)):
        dim = config["dim"]
        for dtype in DTYPES:
            inputs = _masked(config, seed, 700 + index, dtype)
            where = f"({describe(config)}, {dtype})"

            def bind(fn: Callable, dim: int | None = dim) -> Callable:
                return lambda x, mask: fn(x, mask, dim)

            bugs = [
                BugVariant(b.id, b.item, b.description, b.advice, bind(b.impl))
                for b in MASKED_MEAN_BUGS
            ]
            _check_loss(
                report,
                bind(impl),
                MASKED_MEAN_ITEM,
                bind(masked_mean_reference),
                bugs,
                inputs,
                [0],
                where,
            )
    report.ok("only the kept entries count, in the sum and in the count")
    report.ok("along a dimension, each slice is divided by its own count of kept entries")


@public_check(assignment="ex14_post_training", implements="grpo_clip_loss", bugs=PG_BUGS)
def check_grpo_clip_loss(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``grpo_clip_loss(log_probs, old_log_probs, advantages, clip_eps)``: the loss per
    token, value and gradient, with ratios clipped on both sides; none into old_log_probs."""
    for index, config in enumerate(configs(PG_ITEM, thorough, seed)):
        clip = config["clip"]
        for dtype in DTYPES:
            lp, old, _, adv, _ = _grpo_inputs(config, seed, 800 + index, dtype)
            where = f"({describe(config)}, {dtype})"

            def bind(fn: Callable, clip: float = clip) -> Callable:
                return lambda *xs: fn(*xs, clip)

            bugs = [
                BugVariant(b.id, b.item, b.description, b.advice, bind(b.impl)) for b in PG_BUGS
            ]
            student = bind(impl)
            inputs = [lp, old, adv]
            _check_loss(report, student, PG_ITEM, bind(pg_reference), bugs, inputs, [0], where)
            constants = {1: ("old_log_probs", "pg.old_gradient")}
            _constants_take_no_gradient(report, student, PG_ITEM, inputs, constants, where)
    report.ok("-min(ratio A, clip(ratio, 1 - eps, 1 + eps) A) per token, ratio = pi / pi_old")
    report.ok("old_log_probs takes no gradient: only the policy's log-probabilities do")


# ---------------------------------------------------------------------------------------------
# GRPO
# ---------------------------------------------------------------------------------------------


def _rewards(config: Config, seed: int | None, salt: int) -> Tensor:
    """Rewards in {0, 0.5, 1}; the last group's are all equal (when there is more than one)."""
    gen = generator(seed, salt)
    rewards = torch.randint(0, 3, (config["P"], config["G"]), generator=gen) / 2.0  # (P, G)
    rewards[0, 0], rewards[0, 1] = 0.0, 1.0  # the first group is never equal
    if config["P"] > 1:
        rewards[-1] = 0.5
    return rewards.double()


@public_check(assignment="ex14_post_training", implements="group_advantages", bugs=ADVANTAGES_BUGS)
def check_group_advantages(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check ``group_advantages(rewards, eps)``: each group's rewards centred and scaled by its
    own std plus eps; an equal group gives zeros."""
    for index, config in enumerate(configs(ADVANTAGES_ITEM, thorough, seed)):
        rewards = _rewards(config, seed, 400 + index)
        where = f"({describe(config)})"
        expected = advantages_reference(rewards)
        mine = expect_tensor(
            _call(impl, ADVANTAGES_ITEM, rewards.clone(), 1e-4),
            "your advantages",
            expected.shape,
        )
        expect_close(
            report,
            mine,
            expected,
            f"your advantages of rewards {rewards.tolist()} {where}",
            diagnosis=lambda r=rewards, e=expected: diagnose(
                lambda x: impl(x, 1e-4), ADVANTAGES_BUGS, [r], reference_output=e
            ),
        )
    report.ok("each prompt's group is its own baseline: its mean and std, not the batch's")
    report.ok("a group whose rewards are all equal gets 0, never NaN")


def _grpo_inputs(config: Config, seed: int | None, salt: int, dtype: torch.dtype) -> list:
    b, t = config["B"], config["T"]
    gen = generator(seed, salt)
    lp = -3.0 * torch.rand(b, t, generator=gen, dtype=torch.float64)  # (B, T)
    old = lp + 0.5 * randn(gen, b, t, dtype=torch.float64)  # ratios well outside the clip
    ref = lp + 0.5 * randn(gen, b, t, dtype=torch.float64)
    adv = randn(gen, b, dtype=torch.float64)  # (B,)
    mask = torch.ones(b, t, dtype=torch.bool)  # (B, T)
    for row in range(b):
        mask[row, max(1, t - row) :] = False  # answers of different lengths
    return [x.to(dtype) for x in (lp, old, ref, adv)] + [mask]


@public_check(assignment="ex14_post_training", implements="grpo_loss", bugs=GRPO_BUGS)
def check_grpo_loss(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check ``grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps,
    kl_coef)``: value and gradient against the reference, with ratios clipped on both sides."""
    for index, config in enumerate(configs(GRPO_ITEM, thorough, seed)):
        clip, kl = config["clip"], config["kl"]
        for dtype in DTYPES:
            inputs = _grpo_inputs(config, seed, 500 + index, dtype)
            where = f"({describe(config)}, {dtype})"

            def bind(fn: Callable, clip: float = clip, kl: float = kl) -> Callable:
                return lambda lp, old, ref, adv, mask: fn(lp, old, ref, adv, mask, clip, kl)

            bugs = [
                BugVariant(b.id, b.item, b.description, b.advice, bind(b.impl)) for b in GRPO_BUGS
            ]
            student = bind(impl)
            _check_loss(report, student, GRPO_ITEM, bind(grpo_reference), bugs, inputs, [0], where)
            constants = {
                1: ("old_logprobs", "grpo.old_gradient"),
                2: ("ref_logprobs", "grpo.reference_gradient"),
            }
            _constants_take_no_gradient(report, student, GRPO_ITEM, inputs, constants, where)
    report.ok("min(ratio A, clip(ratio) A) per token, minus kl_coef times Schulman's k3")
    report.ok("old_logprobs and ref_logprobs take no gradient: only the policy's do")
    report.ok("each answer's tokens averaged first, then the answers; value and gradient match")
