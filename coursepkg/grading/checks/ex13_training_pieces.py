"""Checks of ex13_training_pieces: AdamW, its parameter groups, the warm-up + cosine schedule,
clipping by global norm and a resumable training state; the catalogue of mistakes they name is
in :mod:`.ex13_training_pieces_mistakes` (written by concept in :mod:`.ex13_mistakes`).

The expected numbers are ``torch.optim.AdamW``'s (which :class:`coursepkg.optim.AdamW` equals)
and :mod:`coursepkg.optim`'s; a resumed run must equal an uninterrupted one bit for bit.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from ... import optim as reference
from ..framework import (
    BugVariant,
    CheckFailure,
    CheckReport,
    ForbiddenCall,
    NotImplementedYet,
    call_student,
    configs,
    describe,
    diagnose,
    dtype_name,
    expect_close,
    expect_number,
    forbidden_calls,
    generator,
    public_check,
    randn,
    register_configs,
)
from ..framework.resume import resume_run, run_uninterrupted
from .ex13_mistakes.clipping import CLIP_BUGS, CLIP_ITEM, TORCH_CLIP
from .ex13_mistakes.optimiser import (
    ADAMW_BUGS,
    ADAMW_ITEM,
    PARAM_GROUPS_BUGS,
    PARAM_GROUPS_ITEM,
    TORCH_ADAM_STEP,
    correct_param_groups,
)
from .ex13_mistakes.resume import RESUME_BUGS, RESUME_ITEM
from .ex13_mistakes.schedule import WARMUP_COSINE_BUGS, WARMUP_COSINE_ITEM

__all__ = [
    "check_adamw",
    "check_clip_grad_norm",
    "check_param_groups",
    "check_training_state",
    "check_warmup_cosine_lr",
]

Config = dict[str, Any]

#: Parameter shapes of the optimizer and clipping checks: matrices, a 3-D tensor, vectors and a
#: single number.
SHAPES = ((3, 4), (4,), (2, 3, 2), (1,), (5, 3))

_REFERENCE_STEP = reference.AdamW.step.__wrapped__
_FORBID = {
    "extra": [
        (TORCH_ADAM_STEP, "torch.optim.AdamW"),
        (_REFERENCE_STEP, "coursepkg.optim.AdamW"),
        (TORCH_CLIP, "torch.nn.utils.clip_grad_norm_"),
        (reference.clip_grad_norm_, "coursepkg.optim.clip_grad_norm_"),
        (reference.warmup_cosine_lr, "coursepkg.optim.warmup_cosine_lr"),
        (reference.param_groups, "coursepkg.optim.param_groups"),
    ],
    "advice": "write it yourself: the course's and PyTorch's versions are there to compare with",
}

register_configs(
    ADAMW_ITEM,
    visible=[
        {"T": 6, "lr": 1e-2, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "wd": 0.1, "g": 1.0},
        {"T": 5, "lr": 3e-2, "b1": 0.8, "b2": 0.95, "eps": 1e-3, "wd": 0.5, "g": 0.01},
        {"T": 8, "lr": 5e-3, "b1": 0.5, "b2": 0.9, "eps": 1e-6, "wd": 0.0, "g": 10.0},
    ],
    extra=[{"T": 12, "lr": 1e-1, "b1": 0.95, "b2": 0.99, "eps": 1e-8, "wd": 1.0, "g": 3.0}],
    sample=lambda rng: {
        "T": rng.randint(2, 10),
        "lr": rng.choice([1e-3, 1e-2, 5e-2]),
        "b1": rng.choice([0.0, 0.5, 0.9]),
        "b2": rng.choice([0.9, 0.99, 0.999]),
        "eps": rng.choice([1e-8, 1e-4]),
        "wd": rng.choice([0.01, 0.1, 0.3]),
        "g": rng.choice([0.1, 1.0, 5.0]),
    },
)
register_configs(
    PARAM_GROUPS_ITEM,
    visible=[{"wd": 0.1}, {"wd": 0.01}, {"wd": 0.5}],
    extra=[{"wd": 1.0}],
    sample=lambda rng: {"wd": rng.choice([0.02, 0.05, 0.2, 0.3])},
)
register_configs(
    WARMUP_COSINE_ITEM,
    visible=[
        {"max_lr": 1e-3, "warmup": 10, "total": 50, "min_lr": 1e-4},
        {"max_lr": 6e-4, "warmup": 1, "total": 8, "min_lr": 6e-5},
        {"max_lr": 3.0, "warmup": 4, "total": 5, "min_lr": 1.0},
    ],
    extra=[{"max_lr": 3e-4, "warmup": 0, "total": 20, "min_lr": 3e-5}],
    sample=lambda rng: {
        "max_lr": rng.choice([1e-4, 3e-4, 1e-3, 1.0]),
        "warmup": rng.randint(0, 20),
        "total": rng.randint(21, 80),
        "min_lr": rng.choice([0.0, 1e-5, 1e-4]),
    },
)
register_configs(
    CLIP_ITEM,
    visible=[
        {"g": 1.0, "max_norm": 0.5},
        {"g": 0.01, "max_norm": 1.0},
        {"g": 10.0, "max_norm": 3.0},
    ],
    extra=[{"g": 1.0, "max_norm": 4.0}],
    sample=lambda rng: {"g": rng.choice([0.1, 1.0, 5.0]), "max_norm": rng.choice([0.5, 1.0, 8.0])},
)


def _builtin_failure(item: str, bugs: list[BugVariant], what: str) -> CheckFailure:
    bug = next(b for b in bugs if b.calls)
    return CheckFailure(
        f"your {item} is {what}; write it yourself (known mistake: {bug.id})", diagnosis=bug.id
    )


# ---------------------------------------------------------------------------------------------
# check_adamw
# ---------------------------------------------------------------------------------------------


def _adamw_gradients(cfg: Config, seed: int | None, dtype: torch.dtype) -> tuple[list, list]:
    """The starting weights and each step's gradients (None: the parameter gets no gradient
    at that step: the fourth one skips the first step, so its update count lags)."""
    gen = generator(seed, salt=131)
    weights = [randn(gen, *s, dtype=dtype) for s in SHAPES]
    grads = [
        [
            None if (i == 3 and t == 0) else cfg["g"] * randn(gen, *s, dtype=dtype)
            for i, s in enumerate(SHAPES)
        ]
        for t in range(cfg["T"])
    ]
    return weights, grads


def _adamw_trajectory(optimizer_class: Any, inputs: tuple, call: Callable | None = None) -> Tensor:
    """Every parameter after every step, (T, P): the optimizer built on two groups (matrices
    decayed by ``wd``, vectors by 0; the constructor's weight_decay is 0.01), the learning rate
    of group g set to ``lr * (1 + t / 4) * (1 + g)`` before step t."""
    cfg, weights, grads = inputs
    call = call or (lambda fn, *args, **kw: fn(*args, **kw))
    params = [nn.Parameter(w.clone()) for w in weights]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg["wd"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = call(
        optimizer_class,
        groups,
        lr=cfg["lr"],
        betas=(cfg["b1"], cfg["b2"]),
        eps=cfg["eps"],
        weight_decay=0.01,
    )
    rows = []
    for t, step_grads in enumerate(grads):
        for g, group in enumerate(opt.param_groups):
            group["lr"] = cfg["lr"] * (1.0 + t / 4) * (1.0 + g)
        for p, grad in zip(params, step_grads, strict=True):
            p.grad = None if grad is None else grad.clone()
        call(opt.step)
        rows.append(torch.cat([p.detach().reshape(-1) for p in params]))  # (P,)
    return torch.stack(rows)  # (T, P)


#: Settings where every catalogued AdamW mistake moves the weights far (eps comparable to
#: sqrt(v), a strong decay, a learning rate that changes): where a failing setting cannot tell
#: a mistake from the reference, the mistake is looked for here too.
_ADAMW_PROBE = {"T": 5, "lr": 3e-2, "b1": 0.8, "b2": 0.95, "eps": 1e-3, "wd": 0.5, "g": 0.01}


def _adamw_mistake(student: Callable, inputs: tuple, expected: Tensor) -> BugVariant | None:
    """The catalogued mistake the student's trajectory matches on the failing settings; failing
    that, the one it matches on :data:`_ADAMW_PROBE` and, within the loose tolerance, on the
    failing settings too."""
    bug = diagnose(student, ADAMW_BUGS, inputs, run=_adamw_trajectory, reference_output=expected)
    if bug is not None:
        return bug
    probe = (_ADAMW_PROBE, *_adamw_gradients(_ADAMW_PROBE, None, torch.float64))
    bug = diagnose(
        student,
        ADAMW_BUGS,
        probe,
        run=_adamw_trajectory,
        reference_output=_adamw_trajectory(_torch_adamw, probe),
    )
    if bug is not None and diagnose(student, [bug], inputs, run=_adamw_trajectory) is bug:
        return bug
    return None


def _torch_adamw(params, **kw):
    return torch.optim.AdamW(params, foreach=False, **kw)


def _expect_optimizer(impl: Any) -> None:
    if impl in (torch.optim.AdamW, reference.AdamW) or getattr(impl, "step", None) in (
        torch.optim.Adam.step,
        reference.AdamW.step,
    ):
        raise _builtin_failure(ADAMW_ITEM, ADAMW_BUGS, "PyTorch's (or the course's) AdamW")
    if not (isinstance(impl, type) and issubclass(impl, torch.optim.Optimizer)):
        raise CheckFailure(
            f"AdamW should be a class derived from torch.optim.Optimizer, got "
            f"{type(impl).__name__}."
        )


@public_check(assignment="ex13_training_pieces", implements="AdamW", bugs=ADAMW_BUGS, kind="class")
def check_adamw(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``AdamW`` (a ``torch.optim.Optimizer``) against ``torch.optim.AdamW``
    step by step: parameters of several shapes in a decayed and an undecayed group, a learning
    rate set in each group before every step, a parameter that gets its first gradient one
    step late, float32 and float64."""
    _expect_optimizer(impl)

    def student(*inputs: Any) -> Tensor:
        return _adamw_trajectory(
            impl, inputs, lambda fn, *a, **kw: call_student(fn, *a, item=ADAMW_ITEM, **kw)
        )

    cfgs = configs(ADAMW_ITEM, thorough, seed)
    with forbidden_calls(ADAMW_ITEM, **_FORBID):
        for cfg in cfgs:
            for dtype in (torch.float32, torch.float64):
                inputs = (cfg, *_adamw_gradients(cfg, seed, dtype))
                expected = _adamw_trajectory(_torch_adamw, inputs)
                expect_close(
                    report,
                    student(*inputs),
                    expected,
                    f"the trajectory of your parameters (row t: after step t + 1 of {cfg['T']}; "
                    f"{describe(cfg)}, {dtype_name(dtype)})",
                    diagnosis=lambda inputs=inputs, expected=expected: _adamw_mistake(
                        student, inputs, expected
                    ),
                    hint="Expected torch.optim.AdamW's updates: decoupled decay w -= lr * wd * w, "
                    "then m and v, their bias corrections with t from 1, lr * m_hat / "
                    "(sqrt(v_hat) + eps), each group's own lr and weight_decay.",
                )
    report.ok(f"equals torch.optim.AdamW step by step on {len(cfgs)} settings (float32, float64)")
    report.ok("decoupled decay, bias correction, each group's lr and weight_decay read every step")


# ---------------------------------------------------------------------------------------------
# check_param_groups
# ---------------------------------------------------------------------------------------------


class _GroupsProbe(nn.Module):
    """Every kind of parameter: an embedding tied to the output layer, linear weights and
    biases, a LayerNorm, a gain named ``gain``, a 3-D convolution kernel and a frozen layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.gain = nn.Parameter(torch.ones(4))
        self.conv = nn.Conv1d(4, 4, 2, bias=False)
        self.head = nn.Linear(4, 7)
        self.head.weight = self.embed.weight  # tied: one parameter, two modules
        self.frozen = nn.Linear(4, 2)
        self.frozen.requires_grad_(False)


def _decay_table(groups: Any, model: nn.Module) -> Tensor:
    """The weight decay each trainable parameter gets, in ``model.parameters()`` order (NaN:
    in no group); fails on what an optimizer would refuse."""
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) for g in groups):
        raise CheckFailure(
            f"param_groups should return a list of dicts, got {type(groups).__name__}."
        )
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    found: dict[int, float] = {}
    for i, group in enumerate(groups):
        if "params" not in group or "weight_decay" not in group:
            raise CheckFailure(f"group {i} needs the keys 'params' and 'weight_decay'.")
        wd = expect_number(group["weight_decay"], f"group {i}'s weight_decay")
        for p in list(group["params"]):
            name = names.get(id(p), "a tensor that is not the model's")
            if id(p) in found:
                raise CheckFailure(f"{name} is in two groups; each parameter belongs to one.")
            found[id(p)] = wd  # a frozen parameter may be listed: it never gets a gradient
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.tensor([found.get(id(p), math.nan) for p in trainable], dtype=torch.float64)


@public_check(
    assignment="ex13_training_pieces",
    implements="param_groups",
    bugs=PARAM_GROUPS_BUGS,
    kind="function",
)
def check_param_groups(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``param_groups(model, weight_decay)``: on a model with an embedding
    tied to its output layer, biases, a LayerNorm, a gain named ``gain``, a 3-D kernel and a
    frozen layer, every matrix (two or more dimensions) is decayed, every bias and gain is not,
    each trainable parameter is in exactly one group (a frozen one may be left out)."""

    def table(fn: Callable, inputs: tuple, call: Callable | None = None) -> Tensor:
        (wd,) = inputs
        torch.manual_seed(0)
        model = _GroupsProbe()
        call = call or (lambda f, *a: f(*a))
        return _decay_table(call(fn, model, wd), model)

    def student(*inputs: Any) -> Tensor:
        return table(impl, inputs, lambda f, *a: call_student(f, *a, item=PARAM_GROUPS_ITEM))

    names = [n for n, p in _GroupsProbe().named_parameters() if p.requires_grad]
    with forbidden_calls(PARAM_GROUPS_ITEM, **_FORBID):
        for cfg in configs(PARAM_GROUPS_ITEM, thorough, seed):
            got, expected = student(cfg["wd"]), table(correct_param_groups, (cfg["wd"],))
            if torch.equal(got.nan_to_num(-1.0), expected):
                continue
            i = int((got.nan_to_num(-1.0) != expected).nonzero()[0])
            mine = "no group" if math.isnan(got[i]) else f"weight_decay {got[i].item():g}"
            bug = diagnose(
                student, PARAM_GROUPS_BUGS, (cfg["wd"],), run=table, reference_output=expected
            )
            report.fail(
                f"with weight_decay={cfg['wd']:g}, your groups give {names[i]} {mine}, expected "
                f"{expected[i].item():g} (matrices: weight_decay; biases and gains: 0.0).",
                bug,
            )
    report.ok("matrices and embeddings decayed; biases, LayerNorm and other gains not")
    report.ok("every trainable parameter in one group, a tied weight once")


# ---------------------------------------------------------------------------------------------
# check_warmup_cosine_lr
# ---------------------------------------------------------------------------------------------


def _curve(fn: Callable, cfg: Config, call: Callable | None = None) -> Tensor:
    """The schedule at every step from 0 to total + 5, in units of max_lr."""
    call = call or (lambda f, *a: f(*a))
    args = (cfg["max_lr"], cfg["warmup"], cfg["total"], cfg["min_lr"])
    values = [
        expect_number(call(fn, s, *args), f"warmup_cosine_lr({s}, ...)")
        for s in range(cfg["total"] + 6)
    ]
    return torch.tensor(values, dtype=torch.float64) / cfg["max_lr"]  # (total + 6,)


@public_check(
    assignment="ex13_training_pieces",
    implements="warmup_cosine_lr",
    bugs=WARMUP_COSINE_BUGS,
    kind="function",
)
def check_warmup_cosine_lr(
    report: CheckReport, impl: Any, thorough: bool, seed: int | None
) -> None:
    """Check the student's ``warmup_cosine_lr(step, max_lr, warmup_steps, total_steps,
    min_lr)`` against :func:`coursepkg.optim.warmup_cosine_lr` at every step from 0 to five
    past the end: the warm-up's first and last steps, the cosine, the floor held after it."""

    def student(cfg: Config) -> Tensor:
        return _curve(impl, cfg, lambda f, *a: call_student(f, *a, item=WARMUP_COSINE_ITEM))

    cfgs = configs(WARMUP_COSINE_ITEM, thorough, seed)
    with forbidden_calls(WARMUP_COSINE_ITEM, **_FORBID):
        for cfg in cfgs:
            got, expected = student(cfg), _curve(reference.warmup_cosine_lr, cfg)
            bad = ~torch.isclose(got, expected, rtol=1e-6, atol=1e-9)
            if not bool(bad.any()):
                continue
            s = int(bad.nonzero()[0])
            bug = diagnose(
                student,
                WARMUP_COSINE_BUGS,
                (cfg,),
                run=lambda f, a: _curve(f, *a),
                reference_output=expected,
            )
            report.fail(
                f"warmup_cosine_lr({s}, max_lr={cfg['max_lr']:g}, warmup_steps={cfg['warmup']}, "
                f"total_steps={cfg['total']}, min_lr={cfg['min_lr']:g}) returned "
                f"{got[s].item() * cfg['max_lr']:.6g}, expected "
                f"{expected[s].item() * cfg['max_lr']:.6g} ({int(bad.sum())} of {len(bad)} "
                f"steps from 0 to {len(bad) - 1} are wrong).",
                bug,
            )
    report.ok("warm-up from max_lr / warmup_steps at step 0 to max_lr, cosine to min_lr")
    report.ok(f"min_lr held after total_steps; {len(cfgs)} schedules")


# ---------------------------------------------------------------------------------------------
# check_clip_grad_norm
# ---------------------------------------------------------------------------------------------


_CLIP_BUG = {bug.id: bug for bug in CLIP_BUGS}
_ONE_PASS = "The parameters come as a one-pass iterator: make a list before walking them twice."
#: The task allows adding 1e-6 to the norm in max_norm / norm (as PyTorch does) or not: clipping
#: (norm >= max_norm), the two differ relatively by at most this / max_norm, added to the rtol.
_ALLOWED_EPS = 1e-6
_CLIP_OUTPUTS = ("the vector of your clipped gradients", "the norm you return")


def _clipped(
    fn: Callable, inputs: tuple, call: Callable | None = None, one_pass=True, no_grad=True
) -> tuple:
    """(every gradient after clipping, flattened; the norm returned) for one set of grads,
    the parameters given as a one-pass iterator with one parameter whose grad is None among
    them (or, not ``one_pass``, those with a gradient as a list; not ``no_grad``, the same
    iterator without the parameter whose grad is None)."""
    grads, max_norm = inputs
    call = call or (lambda f, *a: f(*a))
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    if no_grad:
        params.insert(2, nn.Parameter(torch.zeros(3, dtype=grads[0].dtype)))  # its grad is None
    given = iter(params) if one_pass else [p for p in params if p.grad is not None]
    norm = expect_number(call(fn, given, max_norm), "the norm clip_grad_norm_ returns")
    flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])  # (P,)
    return flat, torch.tensor(norm, dtype=torch.float64)


def _clip_explain(student: Callable, inputs: tuple, expected: tuple, tol: dict) -> tuple:
    """The known mistake; else the one-pass hint if the same gradients in a list pass."""
    bug = diagnose(student, CLIP_BUGS, inputs, run=_clipped, reference_output=expected)
    if bug is not None:
        return "", bug
    try:
        right = torch.allclose(student(*inputs, one_pass=False)[0], expected[0], **tol)
    except (CheckFailure, RuntimeError):  # the code fails on a list too: not that
        return "", None
    return (_ONE_PASS if right else ""), None


def _clip_or_crash(
    report: CheckReport, student: Callable, inputs: tuple, expected: tuple, tol: dict
) -> tuple:
    """The student's clipping; when their code raises, the failure, named
    ``clip.grad_none_crashes`` when the same call without the parameter whose grad is None
    runs and gives the reference's gradients (that parameter is what made it raise)."""
    try:
        return student(*inputs)
    except (NotImplementedYet, ForbiddenCall):
        raise
    except CheckFailure as failure:
        try:
            right = torch.allclose(student(*inputs, no_grad=False)[0], expected[0], **tol)
        except CheckFailure:  # it fails without that parameter too: not that
            right = False
        report.fail(failure.message, _CLIP_BUG["clip.grad_none_crashes"] if right else None)
        raise  # not reached: report.fail raises


@public_check(
    assignment="ex13_training_pieces", implements="clip_grad_norm_", bugs=CLIP_BUGS, kind="function"
)
def check_clip_grad_norm(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``clip_grad_norm_(parameters, max_norm)`` against
    :func:`coursepkg.optim.clip_grad_norm_` (equal to PyTorch's): the gradients after clipping
    and the norm returned, with gradients above and below ``max_norm``, a parameter without a
    gradient, float32 and float64; the parameters are passed as a one-pass iterator."""
    if impl in (torch.nn.utils.clip_grad_norm_, reference.clip_grad_norm_):
        raise _builtin_failure(CLIP_ITEM, CLIP_BUGS, "PyTorch's (or the course's) clip_grad_norm_")

    def student(*inputs: Any, **given: bool) -> tuple[Tensor, Tensor]:
        return _clipped(impl, inputs, partial(call_student, item=CLIP_ITEM), **given)

    gen = generator(seed, salt=133)
    with forbidden_calls(CLIP_ITEM, **_FORBID):
        for cfg in configs(CLIP_ITEM, thorough, seed):
            for dtype in (torch.float32, torch.float64):
                inputs = ([cfg["g"] * randn(gen, *s, dtype=dtype) for s in SHAPES], cfg["max_norm"])
                expected = _clipped(reference.clip_grad_norm_, inputs)
                rtol = (1e-5 if dtype == torch.float32 else 1e-9) + _ALLOWED_EPS / cfg["max_norm"]
                tol = {"rtol": rtol, "atol": 1e-7}
                got = _clip_or_crash(report, student, inputs, expected, tol)
                for k, what in enumerate(_CLIP_OUTPUTS):
                    expect_close(
                        report,
                        got[k],
                        expected[k],
                        f"{what} ({describe(cfg)}, {dtype_name(dtype)})",
                        explain=lambda i=inputs, e=expected, t=tol: _clip_explain(student, i, e, t),
                        **tol,
                    )
    report.ok("one global norm, every gradient scaled by min(1, max_norm / norm)")
    report.ok("returns the norm before clipping; parameters without a gradient skipped")


# ---------------------------------------------------------------------------------------------
# check_training_state
# ---------------------------------------------------------------------------------------------


def _sample_resume(rng: random.Random) -> Config:
    steps = rng.randint(4, 10)
    return {"steps": steps, "stop": rng.randint(1, steps - 1), "p": rng.choice([0.2, 0.5])}


register_configs(
    RESUME_ITEM,
    visible=[{"steps": 8, "stop": 3, "p": 0.3}],
    extra=[{"steps": 8, "stop": 1, "p": 0.3}, {"steps": 9, "stop": 7, "p": 0.5}],
    sample=_sample_resume,
)


@public_check(
    assignment="ex13_training_pieces", implements="TrainingState", bugs=RESUME_BUGS, kind="class"
)
def check_training_state(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``TrainingState`` (``capture`` and ``restore``): a small model with
    dropout, trained with AdamW, the warm-up + cosine schedule and clipping on batches drawn
    from a generator, is stopped, captured, written with ``torch.save`` and read back, then
    restored into a new model, optimizer and generator with torch's global RNG moved; the
    weights after the remaining steps must equal an uninterrupted run's bit for bit."""
    for name in ("capture", "restore"):
        if not callable(getattr(impl, name, None)):
            raise CheckFailure(f"TrainingState needs a static method {name}.")

    def calls(state_class: Any, student: bool) -> tuple[Callable, Callable]:
        def call(fn: Callable, *args: Any) -> Any:
            return call_student(fn, *args, item=RESUME_ITEM) if student else fn(*args)

        return (lambda *a: call(state_class.capture, *a), lambda *a: call(state_class.restore, *a))

    def run(state_class: Any, inputs: tuple, student: bool = False) -> Tensor:
        return resume_run(*calls(state_class, student), *inputs)

    cfgs = configs(RESUME_ITEM, thorough, seed)
    with forbidden_calls(RESUME_ITEM, **_FORBID):
        for cfg in cfgs:
            inputs = (cfg, 0 if seed is None else seed)
            expected = run_uninterrupted(*inputs)
            got = run(impl, inputs, student=True)
            if torch.equal(got, expected):
                continue
            bug = diagnose(
                lambda *a: run(impl, a, True),
                RESUME_BUGS,
                inputs,
                run=run,
                reference_output=expected,
            )
            err = float((got - expected).abs().max())
            report.fail(
                f"after resuming at step {cfg['stop']} of {cfg['steps']} (dropout p={cfg['p']}), "
                f"your run's weights differ from the uninterrupted run's by up to {err:.3g}; "
                "they must be equal bit for bit."
                + (
                    ""
                    if bug
                    else "\nSave and restore the weights, the optimizer's state, the "
                    "step, the batch generator's state and torch's global RNG state."
                ),
                bug,
            )
    report.ok(f"resumes bit for bit after {', '.join(str(c['stop']) for c in cfgs)} steps")
    report.ok("weights, optimizer state, step, data position and RNG state all restored")
