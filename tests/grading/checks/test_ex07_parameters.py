"""Tests of the ex07 check (closed-form parameter count): independent formulas pass, every
catalogued mistake is caught and named (each mistake's rerun: test_check_protocol.py), gaps are
explained by name, building the model is refused."""

from __future__ import annotations

import grading_impls_decoder as impls
import pytest
import torch

from coursepkg import Transformer, TransformerConfig, count_parameters
from coursepkg.grading import (
    CheckFailure,
    catalogue,
    check_parameter_count,
)
from coursepkg.grading.checks import ex07_parameters as grading
from coursepkg.grading.checks import ex07_parameters_mistakes as mistakes
from coursepkg.grading.framework import configs


@pytest.mark.parametrize(
    "impl", [impls.param_count_formula, impls.param_count_modules], ids=lambda f: f.__name__
)
def test_parameter_count_accepts_independent_formulas(impl) -> None:
    result = check_parameter_count(impl)
    assert result.passed
    assert "63,082,496" in str(result)
    for seed in (0, 1, 2):
        assert check_parameter_count(impl, thorough=True, seed=seed).passed


def test_visible_configs_switch_every_option() -> None:
    cases = configs(grading.PARAMETER_COUNT_ITEM)
    assert len(cases) >= 3
    for key, default in mistakes.DEFAULTS.items():
        assert any(case.get(key, default) != default for case in cases), key
    assert any(case.get("d_k") != case.get("d_v") for case in cases)


def test_reference_configs_match_the_instantiated_models() -> None:
    # The check's expectation is the closed form; it equals counting a built model.
    for kw in configs(grading.PARAMETER_COUNT_ITEM)[1:]:
        model = Transformer(mistakes.reference_config(kw))
        assert sum(p.numel() for p in model.parameters()) == count_parameters(
            mistakes.reference_config(kw)
        )


def test_gap_is_explained_by_name() -> None:
    with pytest.raises(CheckFailure) as info:
        check_parameter_count(mistakes.BUGS[1].impl)  # no LayerNorms
    text = str(info.value)
    assert "lower by 30,720" in text
    assert "misses the LayerNorms (30,720 = 2·D per LayerNorm" in text


def test_two_mistakes_at_once_are_explained_part_by_part() -> None:
    def two_mistakes(vocab_size, d_model, n_heads, d_ff, n_layers, **kw):
        # Forgets the linear biases and counts the tied output projection again.
        kw = {**kw, "bias": False, "tie_embeddings": False}
        return impls.param_count_formula(vocab_size, d_model, n_heads, d_ff, n_layers, **kw)

    with pytest.raises(CheckFailure) as info:
        check_parameter_count(two_mistakes)
    text = str(info.value)
    assert info.value.diagnosis is None
    assert "counts a V·D embedding matrix" in text and "misses" in text


def test_calling_the_reference_count_is_named() -> None:
    def reference(*args, **kw):
        return count_parameters(mistakes.reference_config(mistakes.call_kwargs(args, kw)))

    with pytest.raises(CheckFailure, match="calls coursepkg.params.count_parameters"):
        check_parameter_count(reference)


def test_building_the_model_is_refused() -> None:
    def build(vocab_size, d_model, n_heads, d_ff, n_layers, **kw):
        config = TransformerConfig(vocab_size, d_model, n_heads, d_ff, 1, **kw)
        return sum(p.numel() for p in Transformer(config).parameters())

    with pytest.raises(CheckFailure, match=r"coursepkg.Transformer \(building the model\)"):
        check_parameter_count(build)


def test_non_integer_count_is_reported() -> None:
    def halves(*args, **kw):
        return impls.param_count_formula(*args, **kw) + 0.5

    with pytest.raises(CheckFailure, match="not a whole number"):
        check_parameter_count(halves)


def test_integer_valued_results_are_accepted() -> None:
    assert check_parameter_count(lambda *a, **k: float(impls.param_count_formula(*a, **k)))
    assert check_parameter_count(lambda *a, **k: torch.tensor(impls.param_count_formula(*a, **k)))


def test_thorough_configs_depend_on_the_seed() -> None:
    a, b = (
        configs(grading.PARAMETER_COUNT_ITEM, True, 0),
        configs(grading.PARAMETER_COUNT_ITEM, True, 1),
    )
    assert a != b and a[:4] == configs(grading.PARAMETER_COUNT_ITEM)


def test_catalogue_lists_the_parameter_bugs() -> None:
    assert {bug.id for bug in mistakes.BUGS} <= {bug.id for bug in catalogue()}
