"""ex09_training_run against hostile notebooks (:mod:`hostile_ex09`): each earns nothing and
is told why; the scenarios run side by side, each in its own process."""

from __future__ import annotations

import pytest
from ex09_runner import start_scenario, verdict
from hostile_ex09 import hostile_runs

# Each scenario is a fresh Python process that imports torch and trains a little; they run side
# by side, and on a busy machine the lot takes minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, dict]:
    runs = hostile_runs(tmp_path_factory.mktemp("ex09_hostile"))
    procs = {run.name: (run, start_scenario(**run.scenario)) for run in runs}
    return {name: (run, verdict(proc)) for name, (run, proc) in procs.items()}


@pytest.mark.parametrize(
    "name", [run.name for run in hostile_runs(__import__("pathlib").Path("."))]
)
def test_a_hostile_run_earns_nothing_and_is_told_why(name, verdicts):
    run, result = verdicts[name]
    assert not result["passed"], f"{run.what}: passed"
    assert not result["checker_error"], result["message"]
    assert run.expect in result["message"], result["message"]
