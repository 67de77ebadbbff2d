"""What the message of an exception raised by a student's code says about the input that
triggered it (coursepkg.grading.framework.evidence, through call_student)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg.grading import CheckFailure
from coursepkg.grading.framework.calling import call_student
from coursepkg.grading.framework.evidence import input_clues


def _heads(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x + (1 - mask).sum()  # torch refuses `-` on a bool tensor


def test_a_transposed_view_and_a_bool_mask_are_named() -> None:
    x = torch.randn(2, 5, 3).transpose(1, 2)  # a non-contiguous input
    mask = torch.ones(5, dtype=torch.bool)

    def student(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x.view(-1) * mask.sum()

    with pytest.raises(CheckFailure) as info:
        call_student(student, x, mask, item="f")
    text = str(info.value)
    assert "Your code was called with: x (2, 3, 5) float32, mask (5,) bool." in text
    assert "The input x is not contiguous" in text
    with pytest.raises(CheckFailure) as info:
        call_student(_heads, torch.randn(2, 5, 3), mask, item="f")
    assert "The input mask is a bool tensor (True = may attend)." in str(info.value)


@settings(max_examples=30, deadline=None)
@given(a=st.integers(2, 40), b=st.integers(2, 40))
def test_each_size_in_a_shape_error_is_traced_to_its_argument(a: int, b: int) -> None:
    """Adding (a, b) to (b, a) tensors fails, quoting sizes; each quoted size the input has is
    read back as the argument dimensions it is."""
    x, y = torch.zeros(a, b), torch.zeros(b + 1, a)

    def student(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    with pytest.raises(CheckFailure) as info:
        call_student(student, x, y, item="f")
    text = str(info.value)
    for size, where in ((b, "x.shape[1]"), (b + 1, "y.shape[0]")):
        if f"({size})" in text.split("Your code was called with")[0]:
            clue = next(line for line in text.splitlines() if f"In the error, {size} is" in line)
            assert where in clue


def test_nothing_is_said_without_tensors_or_when_reading_fails() -> None:
    assert input_clues(len, ("abc",), {}, "TypeError: 3") == []

    class Odd:
        __signature__ = property(lambda self: 1 / 0)

    with pytest.raises(CheckFailure) as info:
        call_student(lambda t: t.nope, torch.zeros(2), item="f")
    assert "AttributeError" in str(info.value)
    assert input_clues(Odd(), (torch.zeros(3),), {}, "3")  # falls back to argument 1
