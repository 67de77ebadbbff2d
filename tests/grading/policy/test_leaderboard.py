"""The capstone's record rule (its false-positive rate measured by simulation), the leaderboard's
ranking and pages, and `coursepkg leaderboard` on a results file."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from scipy import stats

from coursepkg.cli import main
from coursepkg.grading.policy.leaderboard import (
    is_record,
    leaderboard_rows,
    pseudonym,
    record_false_positive_rate,
    welch_one_sided_p,
    write_pages,
)

MARGIN_BITS = 0.005 / math.log(2)


@pytest.mark.parametrize("spread", [0.002, 0.01, 0.05])
def test_equal_recipes_make_a_record_at_most_one_time_in_a_hundred(spread):
    assert record_false_positive_rate(spread, trials=20_000, seed=1) <= 0.01


@pytest.mark.parametrize("spread", [0.002, 0.01])
def test_a_gain_of_exactly_the_margin_is_a_record_at_most_at_the_tests_level(spread):
    # the boundary of the null hypothesis: the test's level, not more
    rate = record_false_positive_rate(spread, trials=20_000, seed=2, true_gain_nats=0.005)
    assert rate <= 0.01 + 3 * math.sqrt(0.01 * 0.99 / 20_000)


def test_a_clear_gain_is_found():
    assert record_false_positive_rate(0.002, trials=2_000, seed=3, true_gain_nats=0.02) > 0.9


@pytest.mark.parametrize("seed", range(5))
def test_welch_p_equals_scipys_test_shifted_by_the_margin(seed):
    rng = np.random.default_rng(seed)
    new, best = rng.normal(3.9, 0.03, 3), rng.normal(4.0, 0.01, 4)
    ours = welch_one_sided_p(new, best, MARGIN_BITS)
    theirs = stats.ttest_ind(new, best - MARGIN_BITS, equal_var=False, alternative="less")
    assert ours == pytest.approx(theirs.pvalue, rel=1e-9)


def test_exact_scores_decide_by_the_margin_alone():
    assert is_record([3.0, 3.0], [4.0, 4.0])
    assert not is_record([4.0, 4.0], [4.0, 4.0])
    with pytest.raises(ValueError, match="2 seeds"):
        welch_one_sided_p([3.0], [4.0, 4.1], 0.0)


def _entries():
    return [
        {"student": "base", "verdict": "capstone.ok", "scores": [4.00, 4.01, 3.99]},
        {"student": "tie", "verdict": "capstone.ok", "scores": [3.999, 4.0, 4.001]},
        {"student": "better", "verdict": "capstone.ok", "scores": [3.50, 3.51, 3.49]},
        {"student": "late", "verdict": "capstone.over_budget", "scores": [3.0, 3.0, 3.0]},
        {"student": "hack", "verdict": "capstone.read_outside_inputs", "scores": []},
        {"student": "best", "verdict": "capstone.ok", "scores": [3.20, 3.21, 3.19]},
    ]


def test_rows_rank_by_mean_and_mark_records_in_submission_order():
    rows = leaderboard_rows(_entries())
    by = {r["student"]: r for r in rows}
    assert [r["student"] for r in rows] == ["late", "best", "better", "base", "tie", "hack"]
    assert [s for s, r in by.items() if r["record"]] == ["best", "better"]
    assert by["hack"]["rank"] is None and by["hack"]["mean"] is None
    assert by["better"]["spread"] == pytest.approx(0.01)
    assert not by["late"]["record"]  # over budget: ranked, never a record


def test_pages_keep_names_off_the_students_page_and_the_csv_reads_back(tmp_path):
    paths = write_pages(leaderboard_rows(_entries()), tmp_path, "pseudonyms", secret="s3")
    students = paths["students"].read_text()
    assert pseudonym("better", "s3") in students and ">better<" not in students
    assert "read_outside_inputs" not in students and pseudonym("hack", "s3") not in students
    assert "read_outside_inputs" in paths["instructor"].read_text()
    with paths["csv"].open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6 and rows[1]["student"] == "best" and rows[1]["record"] == "True"
    assert pseudonym("better", "s3") != pseudonym("better", "other secret")


def test_the_command_writes_the_pages_from_a_results_file(tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(_entries()))
    status = main(["leaderboard", str(results), "--out", str(tmp_path / "lb"), "--names", "names"])
    assert status == 0
    assert "6 entries, 2 new record(s)" in capsys.readouterr().out
    assert ">better<" in (tmp_path / "lb" / "students.html").read_text()
