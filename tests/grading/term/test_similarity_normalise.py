"""The normal form behind ``coursepkg similarity``'s second signal, and the disguise generator
that measures it (no Node.js needed).

* Rewrites that keep the meaning reach the same normal form; rewrites that change it do not.
* The disguise generator keeps the meaning: each disguised copy of the project's pure
  functions computes what its original computes, for several seeds.
* On every made-up class (each student in turn copied and disguised), the copy's normal-form
  similarity to its original is the class's highest and at or above the threshold.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from similarity_corpus import GROUPS, classes, groups
from similarity_disguise import KINDS, rewrite
from torch import Tensor, nn

from coursepkg.grading.term.similarity import DEFAULT_THRESHOLD
from coursepkg.grading.term.similarity_normalise import (
    normal_form,
    normal_similarity,
    normal_tokens,
)

KEEP = {name for _, name, _ in GROUPS.values()}

SAME = [
    ("y = a + b", "y = b + a"),
    ("y = a * b * c", "y = c * (b * a)"),
    ("x += y", "x = x + y"),
    ("z = a - b", "z = -b + a"),
    ("ok = a > b", "ok = b < a"),
    ("ok = m is not None", "ok = None is not m"),
    ("s = torch.softmax(x, dim=-1)", "s = x.softmax(-1)"),
    ("s = F.softmax(x, dim=-1)", "s = x.softmax(dim=-1)"),
    ("p = torch.matmul(q, k)", "p = q @ k"),
    ("d = x.size(-1)", "d = x.shape[-1]"),
    ("r = math.sqrt(d)", "r = d ** 0.5"),
    ("t = x.transpose(-2, -1)", "t = x.transpose(-1, -2)"),
    ("v = x.view(2, 3)", "v = x.reshape(2, 3)"),
    ("y = x * 1 + 0", "y = +x"),
    ("def f(x: int) -> int:\n    '''Doc.'''\n    return x", "def f(x):\n    return x"),
    (
        "def f(x):\n    u = 3\n    if False:\n        x = 1\n    x = x\n    pass\n    return x",
        "def f(x):\n    return x",
    ),
    ("def f(x):\n    y = g(x)\n    return y\n    x = 2", "def f(x):\n    return g(x)"),
    (
        "class A:\n def m(self):\n  self.unused = 1\n  self.w = 2\n  return self.w",
        "class A:\n def m(self):\n  self.w = 2\n  return self.w",
    ),
]
DIFFERENT = [
    ("z = a - b", "z = a + b"),
    ("p = q @ k.T", "p = q.T @ k"),
    ("y = a / b", "y = a * b"),
    ("y = a ** 2", "y = a ** 0.5"),
    ("def f(x):\n    return g(x)", "def f(x):\n    g(x)\n    return x"),
]


def _in_function(line: str) -> str:
    """A one-line snippet as the body of a function of the names it reads."""
    if line.startswith(("def ", "class ")):
        return line
    target = line.split("=")[0].strip(" +")
    return f"def f(a, b, c, d, k, m, q, x, y):\n    {line}\n    return {target}"


@pytest.mark.parametrize(("a", "b"), SAME)
def test_rewrites_that_keep_the_meaning_have_one_normal_form(a, b):
    """What is compared: the normal form's tokens, the names the student chose anonymous."""
    a, b = _in_function(a), _in_function(b)
    assert normal_tokens(a) == normal_tokens(b)
    assert len(normal_tokens(a)) > 1


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_rewrites_that_change_the_meaning_do_not(a, b):
    assert normal_tokens(_in_function(a)) != normal_tokens(_in_function(b))


def test_names_are_anonymous_and_code_that_does_not_parse_still_has_tokens():
    assert normal_tokens("def f(a):\n    return a.sum()") == normal_tokens(
        "def g(b):\n    return b.sum()"
    )
    assert normal_form("def f(:") is None
    # a body left empty (annotations, a docstring dropped) is still Python
    compile(normal_form("class A:\n    'Doc.'\n    x: int\n"), "<normal>", "exec")
    assert "sum" in normal_tokens("x = y.sum(  # broken")


def _inputs(item: str):
    g = torch.Generator().manual_seed(0)
    if item == "answer_scaled_dot_product_attention":
        q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
        return (q, k, v, torch.rand(2, 1, 5, 5, generator=g) > 0.3)
    if item == "answer_sinusoidal_positional_encoding":
        return (7, 6)
    if item == "answer_causal_mask":
        return (5,)
    if item == "answer_noam_lr":
        return (37, 16, 10)
    if item == "answer_label_smoothed_cross_entropy":
        return (torch.randn(2, 4, 9, generator=g), torch.tensor([[1, 2, -100, 3], [0, 8, 7, 6]]))
    if item == "answer_transformer_parameter_count":
        return (50, 16, 4, 32, 2)
    return None


def _run(code: str, name: str, args: tuple):
    space = {"torch": torch, "nn": nn, "F": F, "math": math, "np": np, "Tensor": Tensor}
    exec(compile(code, "<answer>", "exec"), space)  # noqa: S102
    out = space[name](*args)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_disguised_copy_computes_what_its_original_computes(seed):
    checked = 0
    for item, (sources, _) in groups().items():
        args = _inputs(item)
        if args is None:
            continue
        name = GROUPS[item][1]
        for label, code in sources.items():
            try:
                want = _run(code, name, args)
            except NameError:  # it calls a helper of its corpus module: not alone
                continue
            copy = rewrite(code, KEEP, seed=seed)
            assert copy != code
            got = _run(copy, name, args)
            if isinstance(want, Tensor):
                torch.testing.assert_close(got, want, equal_nan=True, msg=f"{item} {label}")
            else:
                assert got == pytest.approx(want), (item, label)
            checked += 1
    assert checked >= 15


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_the_generator_is_seeded_and_checks_its_kinds():
    code = classes()["ex04_encoder"][0]["s1"]
    assert rewrite(code, KEEP, seed=3) == rewrite(code, KEEP, seed=3)
    assert rewrite(code, KEEP, seed=3) != rewrite(code, KEEP, seed=4)
    assert set(KINDS) >= {"rename", "reorder", "respell", "padding"}
    with pytest.raises(ValueError, match="kinds must be among"):
        rewrite(code, KEEP, kinds=("shuffle",))


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_a_disguised_copy_is_first_and_above_the_threshold_by_its_normal_form():
    """Every student of every made-up class copied in turn (outside ex05, whose answers the
    exercise dictates): the copy's pair has the class's highest normal-form similarity."""
    first = 0
    for assignment, (students, template) in classes().items():
        for i, victim in enumerate(students):
            copied = {**students, "copier": rewrite(students[victim], KEEP, seed=i)}
            scores = normal_similarity(copied, template)
            copy = scores[(victim, "copier")]
            if assignment != "ex05_decoder":
                assert copy >= DEFAULT_THRESHOLD, (assignment, victim, copy)
                assert copy == max(scores.values()), (assignment, victim)
                first += 1
    assert first == 34
