"""The capstone's notebook and its self-check: the released notebook states the grader's own
rules and verdicts, its recipe is what the grader runs (never its check cells), and the check runs
a recipe through the grader itself (real confined processes, no mocks)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from coursepkg.grading.classroom import capstone_check
from coursepkg.grading.classroom.capstone import (
    VERDICTS,
    CapstoneRules,
    corpus_splits,
    grade_entry,
    recipe_from_notebook,
)
from coursepkg.grading.classroom.capstone_check import SELF_CHECK_RULES, check_capstone_recipe
from coursepkg.grading.framework.results import NotImplementedYet
from coursepkg.stubs import ex19_capstone as stub

ROOT = Path(__file__).resolve().parents[3]
SOLUTION = ROOT / "solutions" / "ex19_capstone" / "ex19_capstone.ipynb"
RELEASE = ROOT / "exercises" / "ex19_capstone" / "ex19_capstone.ipynb"


def _text(notebook: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(str(notebook), as_version=4).cells)


def _recipe(notebook: Path) -> dict:
    """The notebook's recipe run as a kernel runs it (functions of ``__main__``)."""
    namespace = {"__name__": "__main__"}
    exec(compile(recipe_from_notebook(notebook), str(notebook), "exec"), namespace)
    return namespace


def test_the_notebook_states_the_graders_rules_and_every_verdict():
    text = " ".join(_text(RELEASE).split())
    for verdict in VERDICTS:
        assert f"`{verdict}`" in text, f"the notebook does not explain {verdict}"
    rules = CapstoneRules()
    stated = {
        f"({rules.budget_s:g} by default)": "budget_s",
        f"at most {rules.max_params:,} parameters": "max_params",
        f"{rules.max_artifact_mb:g} MiB of saved weights": "max_artifact_mb",
        f"{rules.memory_mb} MiB of memory": "memory_mb",
        f"at most {rules.max_processes} processes": "max_processes",
        f"at most {rules.disk_mb} MiB each": "disk_mb",
        f"within {rules.tolerance_bpb:g} bits per byte": "tolerance_bpb",
        f"on {rules.threads} CPU threads": "threads",
        f"a budget of {SELF_CHECK_RULES.budget_s:g} seconds": "the self-check's budget_s",
    }
    for phrase, field in stated.items():
        assert phrase in text, f"the notebook's {field} differs from the grader's: {phrase!r}"


def test_the_recipe_leaves_out_the_check_cells_and_defines_config_and_train():
    recipe = recipe_from_notebook(SOLUTION)
    assert "check_capstone_recipe(" not in recipe and "check_notebook(" not in recipe
    namespace = _recipe(SOLUTION)
    assert callable(namespace["config"]) and callable(namespace["train"])
    assert namespace["config"](0).vocab_size == 256


def test_an_untouched_config_is_not_implemented_yet_without_a_run():
    with pytest.raises(NotImplementedYet, match="config is not implemented yet"):
        check_capstone_recipe(stub.config, stub.train)


@pytest.mark.slow
def test_the_course_recipe_passes_its_check_and_the_graders_run_of_the_notebook(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # as in a student's folder
    recipe = _recipe(SOLUTION)
    result = check_capstone_recipe(recipe["config"], recipe["train"])
    assert result.passed and "capstone.ok" in str(result), str(result)
    # The notebook as `coursepkg leaderboard --grade` runs it: its setup imports nothing that
    # opens a file outside the run's view, and its check cells are left out.
    train, held_out, protected = corpus_splits()
    entry = grade_entry(
        "course",
        recipe_from_notebook(SOLUTION),
        train[: capstone_check.TRAIN_BYTES],
        held_out,
        SELF_CHECK_RULES,
        protected,
        tmp_path,
        capstone_check.SCORE_BYTES,
    )
    assert entry["verdict"] == "capstone.ok", entry["detail"]
    checked = float(re.search(r"([0-9.]+) held-out bits per byte", str(result)).group(1))
    assert entry["scores"][0] == pytest.approx(checked, abs=1e-3)  # one seed, one score
