r"""The one module check: build the student's class, count its parameters against the
reference's, copy the reference's weights in, compare numbers in float32 and float64, and see
gradients reach every parameter.

:func:`check_module` runs that loop over a check's configurations from a :class:`ModuleSpec`
(multi-head attention, LayerNorm, feed-forward, encoder layer, decoder layer);
:func:`prepare_module` (build, count, copy) and :func:`gradients_reach` are its steps. A check
whose work goes in passes over every configuration (the decoder layer compares numbers on
all of them before it tests masking) lists them as :class:`Stage`\ s of its spec.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .calling import call_student, expect_tensor, forbidden_calls
from .compare import check_gradients
from .results import BugVariant, CheckReport
from .weights import build_module, copy_weights, param_gap

__all__ = [
    "BuiltModule",
    "ModuleSpec",
    "Stage",
    "check_module",
    "dtypes_for",
    "each_dtype",
    "gradients_reach",
    "prepare_module",
]

Config = dict[str, Any]


@dataclass(frozen=True)
class BuiltModule:
    """One configuration's modules, as a :class:`Stage` sees them.

    Attributes:
        cfg: the configuration.
        seed: its seed (:attr:`ModuleSpec.case_seed`): it seeded both modules' weights and
            seeds the stage's own inputs.
        student: the student's module, holding the reference's weights, in eval mode.
        reference: the reference module.
        index: the configuration's place in the check's list (0 is the first).
        gen: the check's shared generator (its draws follow the configurations' order).
    """

    cfg: Config
    seed: int
    student: nn.Module
    reference: nn.Module
    index: int = 0
    gen: torch.Generator | None = None


@dataclass(frozen=True)
class Stage:
    """One pass of a module check over every configuration.

    Attributes:
        run: ``(report, built)``: the work on one configuration (a :class:`BuiltModule`).
        ok: the lines :meth:`CheckReport.ok` records once every configuration has passed.
        while_building: run on each configuration right after it is built (and before the
            next one is), instead of after every configuration is built.
    """

    run: Callable[[CheckReport, BuiltModule], None]
    ok: tuple[str, ...] = ()
    while_building: bool = False


@dataclass(frozen=True)
class ModuleSpec:
    """What :func:`check_module` needs to know about one class a student writes.

    Attributes:
        item: the class, as messages name it (``MultiHeadAttention``).
        bugs: its catalogue, matched structurally when the parameter counts differ.
        reference: ``(cfg) -> module``: the reference of a configuration (in eval mode).
        args: ``(cfg) -> tuple``: the constructor's positional arguments.
        dims: ``(cfg) -> dict``: named sizes for the parameter table (``{"D": 8}``).
        dry: ``(cfg) -> tuple``: inputs of one forward pass that sizes lazy parameters.
        gradient_inputs: ``(gen, cfg) -> tuple``: inputs of the gradient check on the first
            configuration (after its ``while_building`` stages), or None where a stage checks
            gradients itself.
        before_copy: ``(report, student, reference, cfg, gen)``: run after the parameter count
            and before the weights are copied (LayerNorm checks its initial values there).
        forbid: keyword arguments of :func:`forbidden_calls` for every call of the student's
            module.
        extra: more forbidden classes (see :func:`reject_reference_class`).
        kwargs: ``(cfg) -> dict | None``: keyword arguments of the constructor.
        bug_args: ``(cfg) -> tuple``: constructor arguments of a catalogued variant (default
            ``args``).
        case_seed: ``(index, seed) -> int``: the seed of the ``index``-th configuration when
            the check runs with ``seed`` (default: the index).
        stages: the checks, in order (see :class:`Stage`; :func:`each_dtype` makes the usual
            first one, the numbers in each of :func:`dtypes_for`).
        count_mistake: ``(student, reference, cfg) -> BugVariant | None``: the known mistake
            a parameter count that differs shows, when ``bugs`` name none (a layer asks its
            pieces' catalogues: :func:`~.pieces.piece_count_mistake`).
    """

    item: str
    bugs: Sequence[BugVariant]
    reference: Callable[[Config], nn.Module]
    args: Callable[[Config], tuple[Any, ...]]
    dims: Callable[[Config], dict[str, int]]
    dry: Callable[[Config], tuple[Any, ...] | None]
    gradient_inputs: Callable[[torch.Generator, Config], tuple[Any, ...]] | None
    before_copy: Callable[..., None] | None = None
    forbid: dict[str, Any] = field(default_factory=dict)
    extra: Sequence[type] = ()
    kwargs: Callable[[Config], dict[str, Any] | None] = lambda cfg: None
    bug_args: Callable[[Config], tuple[Any, ...]] | None = None
    case_seed: Callable[[int, int | None], int] = lambda index, seed: index
    stages: Sequence[Stage] = ()
    count_mistake: Callable[[nn.Module, nn.Module, Config], BugVariant | None] | None = None


def dtypes_for(index: int) -> tuple[torch.dtype, ...]:
    """The dtypes of a configuration: float32 and float64 for the first, float32 after."""
    return (torch.float32, torch.float64) if index == 0 else (torch.float32,)


def each_dtype(cases: Callable[..., None]) -> Stage:
    """The stage that compares the numbers of each dtype of :func:`dtypes_for`, run on each
    configuration as it is built.

    Args:
        cases: ``(report, student, reference, cfg, dtype, gen)``: the comparisons of one dtype;
            ``student`` is the student's module moved to ``dtype``, ``reference`` a copy of the
            reference in ``dtype``, ``gen`` the check's shared generator.

    Returns:
        A :class:`Stage` with ``while_building=True``.
    """

    def run(report: CheckReport, built: BuiltModule) -> None:
        for dtype in dtypes_for(built.index):
            reference = copy.deepcopy(built.reference).to(dtype)
            cases(report, built.student.to(dtype), reference, built.cfg, dtype, built.gen)

    return Stage(run, while_building=True)


def prepare_module(
    report: CheckReport,
    cls: Any,
    reference: nn.Module,
    args: Sequence[Any],
    item: str,
    *,
    seed: int,
    dims: dict[str, int],
    bugs: Sequence[BugVariant] = (),
    probe: Sequence[Any] | None = None,
    forbid: dict[str, Any] | None = None,
    extra: Sequence[type] = (),
    kwargs: dict[str, Any] | None = None,
    before_copy: Callable[[nn.Module], None] | None = None,
    bug_args: Sequence[Any] | None = None,
    count_mistake: Callable[[nn.Module], BugVariant | None] | None = None,
) -> nn.Module:
    """Build the student's module, compare its parameters with the reference's per submodule,
    and copy the reference's weights into it by name.

    Args:
        report: the running check's report.
        cls: the student's class.
        reference: the reference module (its weights are copied).
        args: constructor arguments.
        item: what the student implements.
        seed: seeds the student's initialisation.
        dims: named sizes for the parameter table.
        bugs: catalogue matched structurally when the counts differ.
        probe: inputs of one forward pass that sizes lazy parameters.
        forbid: keyword arguments of :func:`forbidden_calls` while building.
        extra: more forbidden classes.
        kwargs: keyword arguments of the constructor.
        before_copy: called with the student's module before the weights are copied.
        bug_args: constructor arguments of a catalogued variant (default ``args``).
        count_mistake: ``(student) -> BugVariant | None``, asked when the counts differ and
            ``bugs`` name no mistake.

    Returns:
        The student's module in eval mode, holding the reference's weights.
    """
    with forbidden_calls(item, **(forbid or {})):
        student = build_module(cls, args, item, seed=seed, extra=extra, kwargs=kwargs, probe=probe)
    variant_args = args if bug_args is None else bug_args
    explain = None if count_mistake is None else (lambda: count_mistake(student))
    param_gap(
        report,
        student,
        reference,
        item,
        dims=dims,
        bugs=bugs,
        args=variant_args,
        explain=explain,
    )
    if before_copy is not None:
        before_copy(student)
    copy_weights(reference, student, item)
    return student


def gradients_reach(
    module: nn.Module,
    inputs: Sequence[Any],
    item: str,
    forbid: dict[str, Any] | None = None,
    *,
    seed: int = 0,
) -> None:
    """Call the student's module (in float32) on ``inputs`` and check that every parameter gets
    a gradient (``seed`` picks the random projection that is backpropagated)."""
    mine = module.float()
    with forbidden_calls(item, **(forbid or {})):
        out = call_student(mine, *inputs, item=item)
    output = expect_tensor(out, f"the output of your {item}")
    check_gradients(output, list(mine.named_parameters()), item, seed=seed)


def check_module(
    report: CheckReport,
    cls: Any,
    spec: ModuleSpec,
    cfgs: Sequence[Config],
    gen: torch.Generator | None = None,
    *,
    seed: int | None = None,
) -> None:
    """The module check over ``cfgs``: for each configuration build, count and copy
    (:func:`prepare_module`) and run the ``while_building`` stages, then on the first
    configuration check gradients; then each other stage of ``spec.stages`` over every
    configuration.

    Args:
        report: the running check's report.
        cls: the student's class.
        spec: what to build and compare.
        cfgs: the configurations (see :func:`configs`).
        gen: generator of the stages' shared inputs and of the gradient check.
        seed: the check's seed, passed to ``spec.case_seed``.
    """
    built = []
    during = [stage for stage in spec.stages if stage.while_building]
    for index, cfg in enumerate(cfgs):
        case = _build_case(report, cls, spec, cfg, index, spec.case_seed(index, seed), gen)
        for stage in during:
            stage.run(report, case)
        if index == 0 and spec.gradient_inputs is not None:
            gradients_reach(case.student, spec.gradient_inputs(gen, cfg), spec.item, spec.forbid)
        built.append(case)
    for stage in spec.stages:
        if not stage.while_building:
            for case in built:
                stage.run(report, case)
        for line in stage.ok:
            report.ok(line)


def _build_case(
    report: CheckReport,
    cls: Any,
    spec: ModuleSpec,
    cfg: Config,
    index: int,
    seed: int,
    gen: torch.Generator | None,
) -> BuiltModule:
    """The ``index``-th configuration of :func:`check_module`: the reference (seeded by
    ``seed``) and the student's module (:func:`prepare_module`)."""
    torch.manual_seed(seed)
    reference = spec.reference(cfg)
    hook = None
    if spec.before_copy is not None:

        def hook(student: nn.Module) -> None:
            spec.before_copy(report, student, reference, cfg, gen)

    student = prepare_module(
        report,
        cls,
        reference,
        spec.args(cfg),
        spec.item,
        seed=seed,
        dims=spec.dims(cfg),
        bugs=spec.bugs,
        probe=spec.dry(cfg),
        forbid=spec.forbid,
        extra=spec.extra,
        kwargs=spec.kwargs(cfg),
        before_copy=hook,
        bug_args=spec.bug_args(cfg) if spec.bug_args is not None else None,
        count_mistake=None
        if spec.count_mistake is None
        else (lambda student: spec.count_mistake(student, reference, cfg)),
    )
    return BuiltModule(cfg, seed, student, reference, index, gen)
