"""scripts/robustness.py: it reads the figures a page glued and reports their spread."""

import argparse
import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("robustness", ROOT / "scripts" / "robustness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _glue_output(name, text):
    return nbformat.v4.new_output(
        "display_data",
        data={"application/papermill.record/text/plain": text},
        metadata={"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}},
    )


def test_glued_numbers_are_read_and_other_outputs_ignored():
    robustness = _script()
    cell = nbformat.v4.new_code_cell("...")
    cell.outputs = [
        _glue_output("accuracy", "0.991"),
        _glue_output("steps", "1600"),
        _glue_output("format", "'YYYY Mon D'"),  # text, not a figure
        nbformat.v4.new_output("stream", name="stdout", text="accuracy 0.5\n"),
    ]
    notebook = nbformat.v4.new_notebook(cells=[cell])
    assert robustness.glued(notebook) == {"accuracy": 0.991, "steps": 1600.0}


def test_the_table_shows_each_setting_and_the_spread():
    robustness = _script()
    columns = ["default/1t", "avx2/1t"]
    text = robustness.table({"default/1t": {"acc": 0.99}, "avx2/1t": {"acc": 0.995}}, columns)
    header, row = text.splitlines()
    assert header.split()[1:] == [*columns, "spread"]
    assert row.split() == ["acc", "0.99", "0.995", "0.005"]


def test_the_four_settings_are_two_kernels_by_two_thread_counts():
    robustness = _script()
    assert sorted(robustness.SETTINGS, key=str) == sorted(
        [(None, 1), (None, 2), ("avx2", 1), ("avx2", 2)], key=str
    )
    pages = robustness.TRAINING_PAGES
    assert pages.index("08_training") < pages.index("09_decoding")  # 9 reuses 8's translator
    assert all((ROOT / "book" / f"{p}.md").exists() for p in pages)


def test_a_claim_broken_under_one_setting_is_reported():
    robustness = _script()
    columns = ["default/1t", "avx2/1t"]
    fine = {
        "default/1t": {
            "08_training/translator_accuracy": 0.995,
            "12_decoder_only/gpt_heldout": 1.9,
        },
        "avx2/1t": {"08_training/translator_accuracy": 0.992, "12_decoder_only/gpt_heldout": 1.94},
    }
    assert robustness.failures(fine, columns) == []
    broken = {c: dict(v) for c, v in fine.items()}
    broken["avx2/1t"]["12_decoder_only/gpt_heldout"] = 1.97
    broken["default/1t"]["08_training/translator_accuracy"] = 0.98
    lines = robustness.failures(broken, columns)
    assert len(lines) == 2
    assert any("gpt_heldout = 1.9700 > 1.95 under avx2/1t" in line for line in lines)
    assert any("translator_accuracy = 0.9800 < 0.99 under default/1t" in line for line in lines)


def test_settings_pick_a_subset_in_order_and_refuse_unknown_ones():
    robustness = _script()
    assert robustness.parse_settings("avx2/2t, default/2t") == [(None, 2), ("avx2", 2)]
    assert robustness.parse_settings("default/1t") == [(None, 1)]
    for bad in ("avx512/1t", "", "default/3t"):
        with pytest.raises(argparse.ArgumentTypeError, match="choose from default/1t"):
            robustness.parse_settings(bad)


def test_every_claim_names_a_figure_its_page_glues():
    robustness = _script()
    for name in [*robustness.REQUIRED, *robustness.REQUIRED_AT_MOST]:
        page, figure = name.split("/")
        assert page in robustness.TRAINING_PAGES, name
        text = (ROOT / "book" / f"{page}.md").read_text()
        if re.search(rf'glue\(\s*"{figure}"', text):
            continue
        # a page may glue a chapter module's figures in one loop: `for name, value in
        # figures(...).items(): glue(name, value, ...)`, the names being that module's keys
        loop = re.search(r"from (coursepkg\.chapters\.\w+) import \([^)]*\bfigures\b", text)
        assert loop and re.search(r"for name, value in figures\(.*\n\s+glue\(name", text), (
            f"{page} glues no {figure!r}"
        )
        module = ROOT / (loop.group(1).replace(".", "/") + ".py")
        assert f'"{figure}":' in module.read_text(), f"{page} glues no {figure!r}"
