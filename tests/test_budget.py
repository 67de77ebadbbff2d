"""The time budget (``tests/budget.toml``, ``tests/fixtures/budgets.py``): a test past twice its
budget times the machine factor fails at its teardown, naming the numbers; within it, or on a
machine slow enough to explain it, it passes; the file's entries are checked."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import budgets
import pytest
from processes import run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "tests/test_budget.py::test_an_example_that_takes_a_quarter_second"


@pytest.mark.skipif(os.environ.get("COURSE_BUDGET_EXAMPLE") != "1", reason="run by the test below")
def test_an_example_that_takes_a_quarter_second():
    time.sleep(0.25)  # the duration is what the budget's test measures, not a wait
    assert True


@pytest.mark.slow  # a pytest of its own (10-40 s: torch and the package imported again)
def test_a_test_past_twice_its_scaled_budget_fails_at_its_teardown(tmp_path):
    file = tmp_path / "budget.toml"
    file.write_text(f'[tests]\n"{EXAMPLE}" = 0.05\n\n[pages]\n')
    env = {
        **os.environ,
        "COURSE_BUDGET_FILE": str(file),
        "COURSE_TIME_FACTOR": "2",
        "COURSE_BUDGET_EXAMPLE": "1",
        "PYTHONPATH": str(ROOT),
    }
    done = run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", EXAMPLE],
        cwd=ROOT,
        env=env,
        idle=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "1 passed, 1 error" in out, out
    assert "ERROR at teardown of test_an_example_that_takes_a_quarter_second" in out, out
    assert "OVER BUDGET: took 0." in out and "budget 0.05 s x machine factor 2.0 x 2 = 0.2 s" in out
    assert "time budget (tests/budget.toml)" in out, out  # the summary lists it too


def test_a_verdict_brings_its_seconds_back_to_the_reference_machine():
    verdict = budgets.Verdict("t", seconds=30.0, factor=3.0, budget=6.0)
    assert verdict.reference_seconds == 10.0 and verdict.limit == 36.0 and not verdict.over
    assert budgets.Verdict("t", seconds=37.0, factor=3.0, budget=6.0).over
    assert budgets.Verdict("t", seconds=1e6, factor=1.0, budget=None).limit is None
    assert budgets.toml_line(verdict) == '"t" = 10'
    assert budgets.toml_line(budgets.Verdict("t", 31.0, 3.0, None)) == '"t" = 11'


@pytest.mark.parametrize("bad", ["0", "-3", '"ten"', "true"])
def test_a_budget_that_is_not_a_positive_number_is_refused_by_name(tmp_path, bad):
    file = tmp_path / "budget.toml"
    file.write_text(f'[tests]\n"tests/x.py::t" = {bad}\n')
    with pytest.raises(ValueError, match=r"\[tests\] 'tests/x.py::t' must be a positive number"):
        budgets.load(file)
    file.write_text("[test]\n")
    with pytest.raises(ValueError, match="unknown sections \\['test'\\]"):
        budgets.load(file)


def test_the_budget_file_reads_and_names_only_tests_that_exist():
    entries = budgets.load()
    for node in entries["tests"]:
        path = ROOT / node.split("::")[0]
        assert path.is_file(), f"tests/budget.toml names a missing file: {node}"
        name = node.split("::")[1].split("[")[0]
        assert f"def {name}(" in path.read_text(encoding="utf-8"), node
    for page in entries["pages"]:
        assert (ROOT / page).is_file(), f"tests/budget.toml names a missing page: {page}"
