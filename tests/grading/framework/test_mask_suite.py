"""Tests of the one mask-property suite (``grading/framework/masks.py``): a correct callable
passes every property; ignoring the mask, leaking the future and a NaN row each fail with the
property's message and the block's known mistake; the comparison with the reference runs
before or after an invariance as the case asks; every check that tests masks goes through it."""

from __future__ import annotations

import inspect

import pytest
import torch

from coursepkg.attention import scaled_dot_product_attention
from coursepkg.grading import CheckFailure
from coursepkg.grading.checks import ex01_attention, ex02_multihead, ex04_encoder, ex05_decoder
from coursepkg.grading.framework import (
    BugVariant,
    CheckReport,
    FullyMasked,
    Invariance,
    MaskCases,
    MaskedBlock,
    assert_close,
    run_mask_properties,
)
from coursepkg.masks import causal_mask

B, L, D = 2, 5, 4
NOTICED = BugVariant("test.noticed", "f", "a test mistake", "advice", lambda *a: None)


def _correct(x, mask):
    return scaled_dot_product_attention(x, x, x, mask)[0]  # (B, L, D)


def _ignores_mask(x, mask):
    return _correct(x, None)


def _nan_rows(x, mask):
    scores = (
        (x @ x.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
        if mask is not None
        else x @ x.transpose(-2, -1)
    )
    return torch.softmax(scores, -1) @ x  # a fully masked row: softmax of -inf is NaN


def _block(student, calls=None):
    report = CheckReport("check_test")

    def output(inputs):
        if calls is not None:
            calls.append("output")
        return student(*inputs)

    def compare(inputs, case):
        if calls is not None:
            calls.append(f"compare {case}")
        out = student(*inputs)
        try:
            assert_close(out, _correct(*inputs), f"the output ({case})")
        except CheckFailure as failure:
            report.fail(failure.message, NOTICED)
        return out

    return MaskedBlock(report, output, compare, mistake=lambda inputs: NOTICED)


def _cases(compare_after=False):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, L, D, generator=gen)  # (B, L, D)
    keep = torch.ones(B, L, dtype=torch.bool)  # (B, L)
    keep[:, 3:] = False
    changed = torch.where(keep[..., None], x, 5 * torch.randn(B, L, D, generator=gen))
    later = x.clone()
    later[:, 2:] = torch.randn(B, L - 2, D, generator=gen)
    none = torch.ones(B, 1, L, dtype=torch.bool)  # (B, 1, L)
    none[0] = False
    pad = keep[:, None, :]  # (B, 1, L)
    return MaskCases(
        no_mask=(x, None),
        invariances=[
            Invariance(
                (x, pad),
                (changed, pad),
                "padded positions",
                case="padding",
                compare_after=compare_after,
                keep=lambda out: out[keep],
                hint="the hint",
            ),
            Invariance(
                (x, causal_mask(L)),
                (later, causal_mask(L)),
                "the first two positions",
                case="causal",
                keep=lambda out: out[:, :2],
            ),
        ],
        fully_masked=FullyMasked((x, none), "fully masked", lambda name: f"NaN in the {name}"),
    )


def test_a_correct_callable_passes_every_property():
    run_mask_properties(_block(_correct), _cases())


def test_ignoring_the_mask_fails_the_padding_invariance_naming_the_mistake():
    # The block's compare would also fail under the mask: comparing after the invariance
    # makes the invariance's message the one the student sees.
    with pytest.raises(CheckFailure) as info:
        run_mask_properties(_block(_ignores_mask), _cases(compare_after=True))
    assert str(info.value).startswith("padded positions differs")
    assert info.value.diagnosis == "test.noticed"


def test_compare_runs_before_or_after_the_invariance_as_asked():
    for after, expected in (
        (False, ["compare padding", "output"]),
        (True, ["output", "output", "compare padding"]),
    ):
        calls: list[str] = []
        cases = _cases(compare_after=after)
        run_mask_properties(_block(_correct, calls), MaskCases(invariances=cases.invariances[:1]))
        assert calls[: len(expected)] == expected


def test_a_largest_change_message_replaces_the_comparison_text():
    cases = _cases()
    invariance = cases.invariances[0]
    with_message = Invariance(
        invariance.inputs, invariance.changed, "unused", message=lambda err: f"moved by {err:.2f}"
    )
    with pytest.raises(CheckFailure, match=r"^moved by \d") as info:
        run_mask_properties(_block(_ignores_mask), MaskCases(invariances=[with_message]))
    assert info.value.diagnosis == "test.noticed"


def test_a_nan_row_fails_with_the_part_named_and_the_mistake():
    cases = _cases()
    with pytest.raises(CheckFailure, match="^NaN in the output") as info:
        run_mask_properties(_block(_nan_rows), MaskCases(fully_masked=cases.fully_masked))
    assert info.value.diagnosis == "test.noticed"
    quiet = FullyMasked(
        cases.fully_masked.inputs, "fully masked", lambda n: "NaN", name_mistake=False
    )
    with pytest.raises(CheckFailure) as info:
        run_mask_properties(_block(_nan_rows), MaskCases(fully_masked=quiet))
    assert info.value.diagnosis is None


@pytest.mark.parametrize("module", [ex01_attention, ex02_multihead, ex04_encoder, ex05_decoder])
def test_every_check_that_tests_masks_uses_the_suite(module):
    source = inspect.getsource(module)
    assert "run_mask_properties(" in source or "run_attention_cases(" in source
    assert "isnan" not in source and "isfinite(out" not in source
