"""The results the book ships (``chapters/shipped.py``, ``coursepkg/chapters/results/``): every
shipped file loads and holds the fields the data-and-scale chapter reads, and the loader refuses a
missing, malformed or incomplete file with a message naming what is wrong and the command that
writes it. (Whether the numbers are right is the commands' business, not this test's.)"""

from __future__ import annotations

import json

import pytest

from coursepkg.chapters.constraints import CONSTRAINTS, PAIRS
from coursepkg.chapters.data_effect import DataEffect
from coursepkg.chapters.scaling import ScalingLaw, ScalingStudy
from coursepkg.chapters.shipped import PROVENANCE_FIELDS, REQUIRED, load_results, write_results


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_each_shipped_file_loads_with_its_provenance(name):
    shipped = load_results(name)
    provenance = shipped["provenance"]
    assert set(PROVENANCE_FIELDS) <= set(provenance)
    assert provenance["command"].startswith("benchmarks/")
    assert provenance["settings"] == shipped["result"]["settings"]
    assert provenance["cpu_seconds"] > 0


def test_the_shipped_verdicts_hold_what_the_page_reads():
    verdicts = load_results("constraints")["result"]
    for pair in PAIRS:
        for constraint in CONSTRAINTS:
            row = verdicts["pairs"][pair][constraint]
            assert row["winner"] in (None, 0, 1)
            assert {"mean_a", "mean_b", "z"} <= set(row)
            for side in ("baseline", "challenger"):
                assert len(row[side]) == len(verdicts["settings"]["seeds"])
                assert {"bpb", "seconds", "params"} <= set(row[side][0])


def test_a_missing_malformed_or_incomplete_file_is_refused_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="scaling_study.py"):
        load_results("scaling", tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"provenance": {"command": ')
    with pytest.raises(ValueError, match="not valid JSON"):
        load_results("scaling", broken)
    broken.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_results("scaling", broken)
    broken.write_text("[1, 2]")
    with pytest.raises(ValueError, match="no 'result'"):
        load_results("scaling", broken)
    whole = load_results("constraints")
    whole["result"]["table"] = whole["result"].pop("pairs")
    del whole["provenance"]["date"]
    broken.write_text(json.dumps(whole))
    with pytest.raises(ValueError, match=r"result\.pairs, provenance\.date") as err:
        load_results("constraints", broken)
    assert REQUIRED["constraints"][1] in str(err.value)
    with pytest.raises(KeyError, match="no shipped result"):
        load_results("scaling_law")


def test_what_is_written_is_read_back_with_non_finite_numbers_as_null(tmp_path):
    result = {"bpb": {"raw": [2.5, 2.6]}, "corpus_bytes": {}, "removed": {}, "details": {}}
    result["settings"] = {"seeds": (0, 1), "z": float("inf")}
    path = tmp_path / "effect.json"
    write_results(
        path,
        result,
        command="benchmarks/data_effect.py",
        settings={},
        cpu_seconds=1,
        wall_seconds=2,
    )
    shipped = load_results("data_effect", path)
    assert shipped["result"]["settings"] == {"seeds": [0, 1], "z": None}
    assert shipped["provenance"]["command"] == "benchmarks/data_effect.py"


def test_the_shipped_scaling_study_and_data_effect_hold_what_the_page_reads():
    study = ScalingStudy(**load_results("scaling")["result"])
    law = ScalingLaw(**study.law)
    assert len(study.runs) == len(study.settings["widths"]) * len(study.settings["steps"]) >= 5
    assert {"d_model", "steps", "params", "tokens", "bpb"} <= set(study.runs[0])
    assert {"params", "tokens", "bpb", "predicted", "error"} <= set(study.check)
    assert study.check["predicted"] == pytest.approx(
        law.predict(study.check["params"], study.check["tokens"])
    )
    effect = DataEffect(**load_results("data_effect")["result"])
    assert len(effect.bpb["raw"]) == len(effect.bpb["curated"]) == len(effect.settings["seeds"])
    assert effect.corpus_bytes["curated"] < effect.corpus_bytes["raw"]
    assert effect.verdict() in ("better", "worse", "no clear difference")
