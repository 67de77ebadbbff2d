"""The capstone's grader: recipes re-run confined, scored on a split they never see, each bad
recipe ending within its budget with its named verdict (real confined processes, no mocks)."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import capstone_recipes as recipes
import pytest

from coursepkg.grading.classroom.capstone import (
    VERDICTS,
    CapstoneRules,
    corpus_splits,
    grade_class,
    grade_recipe,
)
from coursepkg.grading.classroom.orchestrate import connect
from coursepkg.grading.kernel.capstone import granted_reads, student_frames

TRAIN_BYTES = 20_000
SCORE_BYTES = 4_096
COURSE = Path(__file__).resolve().parents[3]


def _rules(**changes) -> CapstoneRules:
    base = dict(budget_s=3.0, memory_mb=4096, max_params=60_000, seeds=(0,), threads=1)
    base["disk_mb"], base["max_processes"] = 16, 48
    return CapstoneRules(**{**base, **changes})


def _grade(folder: Path, name: str, source: str, rules: CapstoneRules):
    train, held_out, protected = corpus_splits()
    path = recipes.write(folder, name, source, held_out=protected[0])
    return grade_recipe(
        path, train[:TRAIN_BYTES], held_out, rules, folder / name, protected, COURSE, SCORE_BYTES
    )


def test_granted_reads_leave_out_exactly_the_protected_files(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/keep.txt", "a/b/secret.txt", "a/b/other.txt", "c.txt"):
        (tmp_path / name).write_text(name)
    granted = granted_reads([str(tmp_path)], [tmp_path / "a" / "b" / "secret.txt"])
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in granted) == [
        "a/b/other.txt",
        "a/keep.txt",
        "c.txt",
    ]


def test_student_frames_keep_the_recipes_lines_only(tmp_path):
    recipe = str(tmp_path / "r.py")
    code = compile("def f():\n    return math.sqrt(-1)\n", recipe, "exec")
    namespace = {"math": math}
    exec(code, namespace)
    with pytest.raises(ValueError) as caught:
        namespace["f"]()
    text = student_frames(caught.value, recipe)
    assert "r.py" in text and "ValueError" in text
    assert __file__ not in text


def test_rules_name_a_bad_setting():
    with pytest.raises(ValueError, match="budget_s"):
        CapstoneRules(budget_s=0)
    with pytest.raises(ValueError, match="capstone.typo"):
        CapstoneRules(points={"capstone.typo": 1})


@pytest.mark.slow
def test_a_deterministic_recipe_is_scored_over_seeds_and_repeats_its_first(tmp_path):
    # a budget far above the run (a loaded machine is slow): the budget is not what is tested
    result = _grade(tmp_path, "baseline", recipes.recipe(), _rules(seeds=(0, 1), budget_s=300))
    assert result.verdict == "capstone.ok", result.detail
    assert len(result.scores) == 2 and len(result.runs) == 3
    assert result.runs[0].bpb == pytest.approx(result.runs[2].bpb, abs=1e-6)
    assert all(2.0 < s < 8.5 for s in result.scores), result.scores  # bytes: at most 8 bits
    assert result.points == 1.0 and result.spread >= 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(recipes.BAD))
def test_each_bad_recipe_ends_within_its_budget_with_its_verdict(tmp_path, name):
    rules = _rules(repeat_first_seed=name == "nondeterministic")
    result = _grade(tmp_path, name, recipes.BAD[name], rules)
    assert result.verdict == recipes.EXPECTED[name], (result.detail, result.runs)
    assert result.verdict in VERDICTS
    for run in result.runs:  # stopped by the budget (or sooner), never the grader's last resort
        assert "was killed" not in run.detail
    if name == "read_outside_inputs":
        assert "tinyshakespeare.txt" in result.detail
        assert "denied" in result.runs[0].output  # refused by Landlock, not only logged
    if name == "crashed":
        assert "helper" in result.detail and "ZeroDivisionError" in result.detail
        assert "coursepkg" not in result.detail
    if name in ("over_budget", "prints_without_end"):
        assert result.scores and result.points == 0.5
    if name == "prints_without_end":
        assert len(result.runs[0].output) <= rules.output_limit


@pytest.mark.slow
def test_two_recipes_graded_side_by_side_do_not_disturb_each_other(tmp_path):
    with ThreadPoolExecutor(2) as pool:
        good = pool.submit(_grade, tmp_path, "good", recipes.recipe(), _rules(budget_s=300))
        bad = pool.submit(_grade, tmp_path, "bad", recipes.BAD["too_many_processes"], _rules())
    assert good.result().verdict == "capstone.ok"
    assert bad.result().verdict == "capstone.too_many_processes"


@pytest.mark.slow
def test_a_class_is_graded_on_dask_workers_in_submission_order(tmp_path):
    names = {"honest": recipes.recipe(), "peeks": recipes.BAD["read_outside_inputs"]}
    _, _, protected = corpus_splits()
    paths = {n: recipes.write(tmp_path, n, src, held_out=protected[0]) for n, src in names.items()}
    with connect(None, 2) as client:
        entries = grade_class(paths, _rules(budget_s=300), None, COURSE, SCORE_BYTES, client)
    assert [e["student"] for e in entries] == ["honest", "peeks"]
    assert [e["verdict"] for e in entries] == ["capstone.ok", "capstone.read_outside_inputs"]
    assert len(entries[0]["scores"]) == 1 and entries[1]["scores"] == []
