"""check_module: the order of its work (build, cases, gradients, stages), the seeds it gives each
configuration, and that a failing stage stops the check with its message."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from coursepkg.grading.framework import (
    CheckFailure,
    CheckReport,
    ModuleSpec,
    Stage,
    check_module,
    each_dtype,
)


class _Scale(nn.Module):
    """A student's module: the reference's parameters under the reference's names."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _reference(cfg: dict[str, int]) -> nn.Module:
    return _Scale(cfg["D"]).eval()


def _spec(log: list, **overrides) -> ModuleSpec:
    def stage(name: str):
        return lambda report, case: log.append((name, case.cfg["D"], case.seed))

    fields = {
        "item": "Scale",
        "bugs": (),
        "reference": _reference,
        "args": lambda cfg: (cfg["D"],),
        "dims": lambda cfg: {"D": cfg["D"]},
        "dry": lambda cfg: None,
        "gradient_inputs": None,
        "case_seed": lambda index, seed: 10 * index + (seed or 0),
        "stages": (
            Stage(stage("during"), ok=("first",), while_building=True),
            Stage(stage("after"), ok=("second",)),
        ),
    }
    return ModuleSpec(**{**fields, **overrides})


CFGS = [{"D": 2}, {"D": 3}]


def test_stages_run_in_order_with_each_configurations_seed() -> None:
    log: list = []
    report = CheckReport("check_scale")
    check_module(report, _Scale, _spec(log), CFGS, seed=5)
    assert log == [
        ("during", 2, 5),
        ("during", 3, 15),
        ("after", 2, 5),
        ("after", 3, 15),
    ]
    assert report.verified == ["first", "second"]


def test_the_stage_sees_the_students_module_with_the_references_weights() -> None:
    seen: list = []

    def compare(report: CheckReport, case) -> None:
        x = torch.randn(4, case.cfg["D"])
        seen.append(torch.equal(case.student(x), case.reference(x)))
        seen.append(case.student is not case.reference)

    spec = _spec([], stages=(Stage(compare),))
    check_module(CheckReport("check_scale"), _Scale, spec, CFGS)
    assert seen == [True, True, True, True]


def test_a_failing_stage_stops_the_check_before_later_ones() -> None:
    log: list = []

    def fail(report: CheckReport, case) -> None:
        report.fail(f"wrong at D={case.cfg['D']}")

    spec = _spec(
        log,
        stages=(
            Stage(fail, while_building=True),
            Stage(lambda report, case: log.append("never")),
        ),
    )
    with pytest.raises(CheckFailure, match="wrong at D=2"):
        check_module(CheckReport("check_scale"), _Scale, spec, CFGS)
    assert log == []


def test_each_dtype_runs_while_building_and_before_the_gradient_check() -> None:
    """The order the shared generator is drawn in (messages with numbers depend on it):
    the first configuration's dtypes, its gradient inputs, then the next configuration."""
    log: list = []

    def cases(report, student, reference, cfg, dtype, gen) -> None:
        assert next(student.parameters()).dtype == dtype == next(reference.parameters()).dtype
        log.append((cfg["D"], dtype))

    def gradient_inputs(gen, cfg):
        log.append(("gradients", cfg["D"]))
        return (torch.randn(3, cfg["D"], generator=gen),)

    spec = _spec([], gradient_inputs=gradient_inputs, stages=(each_dtype(cases),))
    check_module(CheckReport("check_scale"), _Scale, spec, CFGS, torch.Generator().manual_seed(0))
    assert log == [
        (2, torch.float32),
        (2, torch.float64),
        ("gradients", 2),
        (3, torch.float32),
    ]
