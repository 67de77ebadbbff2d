"""The structural diagnosis of parameter layouts (coursepkg.grading.framework.layout): on random
layouts a single change is named as that change, and a gap the differences found do not account
for is never named. (Other models' layouts through the public checks: the grading corpus,
``tests/fixtures/grading_strangers_layouts.py``.)"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from coursepkg import grading
from coursepkg.grading.framework.layout import LAYOUT_MISTAKES, explain_layout


class _Norm(nn.Module):
    def __init__(self, d: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        if bias:
            self.bias = nn.Parameter(torch.zeros(d))


def _block(d: int, f: int, *, bias: bool, norm_bias: bool, norms: int, gated: bool) -> nn.Module:
    """A block of ``norms`` norms, attention projections and an MLP of width ``f``."""
    parts: dict[str, nn.Module] = {f"norm{i}": _Norm(d, norm_bias) for i in range(norms)}
    for name in ("q", "k", "v", "o"):
        parts[name] = nn.Linear(d, d, bias=bias)
    parts["up"] = nn.Linear(d, f, bias=bias)
    if gated:
        parts["gate"] = nn.Linear(d, f, bias=bias)
    parts["down"] = nn.Linear(f, d, bias=bias)
    return nn.ModuleDict(parts)


CHANGES = {
    "layout.extra_bias": lambda k: {**k, "bias": True},
    "layout.norm_bias": lambda k: {**k, "norm_bias": True},
    "layout.extra_norm": lambda k: {**k, "norms": k["norms"] + 1},
    "layout.missing_norm": lambda k: {**k, "norms": k["norms"] - 1},
    "layout.missing_projection": lambda k: {**k, "gated": False},
    "layout.hidden_width": lambda k: {**k, "f": k["f"] + 8},
}


@settings(max_examples=40, deadline=None)
@given(
    d=st.sampled_from([4, 6, 10]),
    f=st.sampled_from([12, 20, 36]),
    norms=st.integers(1, 3),
    change=st.sampled_from(sorted(CHANGES)),
)
def test_one_change_of_a_random_layout_is_named_as_that_change(d, f, norms, change) -> None:
    kw = {"d": d, "f": f, "bias": False, "norm_bias": False, "norms": norms, "gated": True}
    reference = _block(**kw)
    student = _block(**CHANGES[change](kw))
    found = explain_layout(student, reference, "block")
    assert found is not None and found[0].id == change, found
    assert found[0] in LAYOUT_MISTAKES and found[1].startswith("In your block, ")
    assert explain_layout(reference, _block(**kw), "block") is None


def test_a_gap_the_differences_do_not_explain_is_not_named() -> None:
    kw = {"d": 8, "f": 16, "bias": False, "norm_bias": False, "norms": 2, "gated": True}
    reference = _block(**kw)
    student = _block(**kw)
    student["extra"] = nn.Conv1d(8, 8, 3)  # a 3-D weight: no reading of the layout
    assert explain_layout(student, reference, "block") is None
    resized = _block(**kw)
    resized["norm0"] = _Norm(5, False)  # a norm of another size, counts equal
    assert explain_layout(resized, reference, "block") is None
    two_widths = _block(**kw)
    two_widths["up"] = nn.Linear(8, 24, bias=False)  # up and down disagree on the width
    assert explain_layout(two_widths, reference, "block") is None


def test_layout_ids_are_in_the_catalogue() -> None:
    ids = {bug.id for bug in grading.catalogue()}
    assert {bug.id for bug in LAYOUT_MISTAKES} <= ids
