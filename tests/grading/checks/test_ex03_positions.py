"""Tests of the ex03 check: its catalogue (each mistake rerun: test_check_protocol.py), the
reference and two independent tables pass, hidden sizes depend on the seed, and a call to the
reference table is named."""

from __future__ import annotations

import grading_impls_encoder as impls
import pytest
import torch

from coursepkg.grading import CheckFailure
from coursepkg.grading.checks import ex03_positions as positions
from coursepkg.grading.checks import ex03_positions_mistakes as mistakes
from coursepkg.grading.framework import configs
from coursepkg.positional import sinusoidal_table


def test_each_mistake_really_differs_from_the_reference():
    # A variant equal to the reference could never be told apart: each must differ on the
    # probe table the diagnosis falls back to.
    for bug in mistakes.BUGS:
        assert not torch.allclose(bug.impl(*positions._PROBE), sinusoidal_table(*positions._PROBE))


@pytest.mark.parametrize(
    "impl", [sinusoidal_table, impls.pe_python_loops, impls.pe_pow_stack], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_correct_tables_pass(impl, seed):
    result = positions.check_positional_encoding(impl, thorough=seed is not None, seed=seed)
    assert result.passed


def test_thorough_configs_depend_on_the_seed():
    visible = configs("positional_encoding")
    assert len(visible) >= 3 and any(c["max_len"] == 1 for c in visible)
    assert configs("positional_encoding", True, 0) != configs("positional_encoding", True, 1)


def _calls_reference(max_len, d_model):
    return sinusoidal_table(max_len, d_model)


def test_call_to_the_reference_is_named():
    with pytest.raises(CheckFailure, match="coursepkg.positional.sinusoidal_table"):
        positions.check_positional_encoding(_calls_reference)


def test_transposed_table_is_told_its_shape():
    with pytest.raises(CheckFailure, match=r"shape \(8, 7\), expected \(7, 8\)"):
        positions.check_positional_encoding(lambda n, d: impls.pe_pow_stack(n, d).T)


def test_integer_table_is_told_its_dtype():
    with pytest.raises(CheckFailure, match="floating point"):
        positions.check_positional_encoding(lambda n, d: impls.pe_pow_stack(n, d).long())


def test_unknown_mistake_gets_the_formula():
    def off_by_a_bit(max_len, d_model):
        return impls.pe_pow_stack(max_len, d_model) * 0.9

    with pytest.raises(CheckFailure) as info:
        positions.check_positional_encoding(off_by_a_bit)
    assert info.value.diagnosis is None
    assert "PE(pos, 2i) = sin(pos / 10000^(2i/d_model))" in str(info.value)
