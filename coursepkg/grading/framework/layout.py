"""Structural diagnosis of a parameter layout: when a student's module has a different number of
parameters from the reference and no catalogued mistake explains it, say *how* the layouts
differ (a bias the task's layers do not have, an extra normalisation, another hidden width, a
missing projection), whatever the student named things.

The evidence is the modules' parameters alone, grouped into leaves: a *linear* leaf holds one
weight matrix and at most one bias vector of its output size; a *norm* leaf holds one or two
vectors of one size (a gain, and for LayerNorm a bias). A difference is named only when the
differences found account for the whole gap in the parameter count; otherwise the check's
parameter table stands alone (no guess).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from torch import nn

from .results import BugVariant

__all__ = ["LAYOUT_MISTAKES", "explain_layout"]

_ROOT = "module"


def _generic(id_: str, description: str, advice: str) -> BugVariant:
    return BugVariant(id=id_, item="any module", description=description, advice=advice)


#: The layout differences this module names; a failure carries one of these ids, and a sentence
#: naming the student's modules.
LAYOUT_MISTAKES: tuple[BugVariant, ...] = (
    _generic(
        "layout.extra_norm",
        "your module normalises where the task's does not",
        "Remove the extra normalisation layers.",
    ),
    _generic(
        "layout.missing_norm",
        "a normalisation layer of the task's module is missing",
        "Add the normalisation the task describes.",
    ),
    _generic(
        "layout.extra_projection",
        "your module has a weight matrix the task's does not",
        "Remove the extra linear layer.",
    ),
    _generic(
        "layout.missing_projection",
        "a weight matrix of the task's module is missing",
        "Add the linear layer the task describes.",
    ),
    _generic(
        "layout.hidden_width",
        "your hidden layer has another width than the task's",
        "Size it from the argument the constructor is given.",
    ),
    _generic(
        "layout.extra_bias",
        "your linear layers have biases the task's do not",
        "Build them with bias=False.",
    ),
    _generic(
        "layout.missing_bias",
        "your linear layers lack biases the task's have",
        "Keep nn.Linear's bias (bias=True, the default).",
    ),
    _generic(
        "layout.norm_bias",
        "your normalisation has a bias the task's does not",
        "Keep only the gain (an RMSNorm has no bias).",
    ),
    _generic(
        "layout.norm_without_bias",
        "your normalisation lacks the bias the task's has",
        "Give it a bias as well as a gain (a LayerNorm has both).",
    ),
)
_BY_ID = {bug.id: bug for bug in LAYOUT_MISTAKES}


@dataclass(frozen=True)
class _Leaf:
    """One module's own parameters, read as a linear layer or a normalisation."""

    path: str
    kind: str  # "linear" or "norm"
    shape: tuple[int, ...]  # (out, in) for a linear, (size,) for a norm
    bias: bool

    @property
    def key(self) -> tuple[int, ...]:
        """The shape up to transposition (some code stores (in, out))."""
        return tuple(sorted(self.shape))

    @property
    def weight_numel(self) -> int:
        return math.prod(self.shape)


def _leaves(module: nn.Module) -> list[_Leaf] | None:
    """Every module's own parameters as leaves; None when a module holds parameters that are
    neither one linear layer nor one normalisation (then nothing is diagnosed)."""
    leaves: list[_Leaf] = []
    for path, sub in module.named_modules():
        own = list(sub.named_parameters(recurse=False))
        if not own:
            continue
        mats = [p for _, p in own if p.dim() == 2]
        vecs = [p for _, p in own if p.dim() == 1]
        if len(mats) + len(vecs) != len(own):
            return None
        name = path or _ROOT
        if len(mats) == 1 and len(vecs) <= 1:
            out = mats[0].shape
            if vecs and vecs[0].numel() not in out:
                return None
            leaves.append(_Leaf(name, "linear", tuple(out), bool(vecs)))
        elif not mats and len(vecs) <= 2 and len({v.numel() for v in vecs}) == 1:
            leaves.append(_Leaf(name, "norm", (vecs[0].numel(),), len(vecs) == 2))
        else:
            return None
    return leaves


def _names(leaves: list[_Leaf]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    names = [leaf.path for leaf in leaves]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _with_shapes(leaves: list[_Leaf]) -> str:
    """``linear3 (12, 8) and up (12, 8)``."""
    return " and ".join(f"{leaf.path} {tuple(leaf.shape)}" for leaf in leaves)


def _subject(leaves: list[_Leaf], one: str, many: str) -> str:
    """ "your norm1 and norm2 have", with the verb ``one`` or ``many`` as the count asks."""
    if len(leaves) == 1 and leaves[0].path == _ROOT:
        return f"your module {one}"
    return f"your {_names(leaves)} {one if len(leaves) == 1 else many}"


def _pick(leaves: list[_Leaf], count: int, others: list[_Leaf], keys: Counter) -> list[_Leaf]:
    """``count`` leaves whose shapes are in ``keys``, those whose names ``others`` lack first."""
    names = {leaf.path for leaf in others}
    fitting = [leaf for leaf in leaves if leaf.key in keys]
    fitting.sort(key=lambda leaf: leaf.path in names)
    return fitting[:count]


def _norm_findings(mine: list[_Leaf], ref: list[_Leaf]) -> tuple[list[tuple[str, str]], int]:
    """Findings on normalisations, and the parameter gap they account for."""
    found: list[tuple[str, str]] = []
    ref_paths = {leaf.path for leaf in ref}
    if len(mine) > len(ref):
        extra = [leaf for leaf in mine if leaf.path not in ref_paths][: len(mine) - len(ref)]
        if len(extra) < len(mine) - len(ref):
            extra = mine[len(ref) :]
        found.append(
            (
                "layout.extra_norm",
                f"{_subject(extra, 'is a normalisation', 'are normalisations')} the task's "
                f"module does not have (you have {len(mine)}, the task {len(ref)}; a query/key "
                "norm or a final norm belongs to other models, not this one)",
            )
        )
    elif len(mine) < len(ref):
        mine_paths = {leaf.path for leaf in mine}
        missing = [leaf for leaf in ref if leaf.path not in mine_paths] or ref[len(mine) :]
        found.append(
            (
                "layout.missing_norm",
                f"your module has {len(mine)} normalisation layers where the task's has "
                f"{len(ref)} ({_names(missing[: len(ref) - len(mine)])} in the reference)",
            )
        )
    biased_mine = [leaf for leaf in mine if leaf.bias]
    biased_ref = [leaf for leaf in ref if leaf.bias]
    if len(mine) == len(ref) and biased_mine and not biased_ref:
        found.append(
            (
                "layout.norm_bias",
                f"{_subject(biased_mine, 'has', 'have')} a bias (a LayerNorm's) where the "
                "task's normalisation has only a gain",
            )
        )
    elif len(mine) == len(ref) and biased_ref and not biased_mine:
        found.append(
            (
                "layout.norm_without_bias",
                f"{_subject(mine, 'has', 'have')} only a gain where the task's normalisation "
                "also has a bias",
            )
        )
    gap = sum(leaf.shape[0] * (1 + leaf.bias) for leaf in mine) - sum(
        leaf.shape[0] * (1 + leaf.bias) for leaf in ref
    )
    return found, gap


def _width_finding(extra: Counter, missing: Counter, every: Counter) -> tuple[str, str] | None:
    """One hidden width used consistently in place of the task's: every matrix of the
    reference (``every``) with that width is unmatched, and becomes one of the student's when
    the student's width is put in its place."""
    if sum(extra.values()) != sum(missing.values()):
        return None
    theirs = {d for key in missing for d in key} - {d for key in extra for d in key}
    mine = {d for key in extra for d in key} - {d for key in missing for d in key}
    if len(theirs) != 1 or len(mine) != 1:
        return None
    (want,), (have,) = theirs, mine
    swapped = Counter(
        {tuple(sorted(have if d == want else d for d in key)): n for key, n in missing.items()}
    )
    uses = sum(n for key, n in every.items() if want in key)
    if swapped != extra or uses != sum(n for key, n in missing.items() if want in key):
        return None
    return (
        "layout.hidden_width",
        f"your hidden layer is {have} wide where the task's is {want} (the width argument the "
        "constructor is given; not a rule such as 4·D or Llama's 8D/3 rounded up)",
    )


def _linear_findings(mine: list[_Leaf], ref: list[_Leaf]) -> tuple[list[tuple[str, str]], bool]:
    """Findings on weight matrices and biases, and whether they account for every difference
    of the linear leaves."""
    found: list[tuple[str, str]] = []
    have, want = Counter(leaf.key for leaf in mine), Counter(leaf.key for leaf in ref)
    extra, missing = have - want, want - have
    if extra and missing:
        width = _width_finding(extra, missing, want)
        if width is None:
            return [], False
        found.append(width)
    elif missing:
        lost = _pick(ref, sum(missing.values()), mine, missing)
        text = f"nothing of yours stands for the reference's {_with_shapes(lost)}"
        found.append(
            (
                "layout.missing_projection",
                f"your module has {len(mine)} weight matrices where the task's has {len(ref)}: "
                + text,
            )
        )
    elif extra:
        more = _pick(mine, sum(extra.values()), ref, extra)
        counts = f"{len(mine)} weight matrices against {len(ref)}: {_with_shapes(more)}"
        found.append(
            (
                "layout.extra_projection",
                f"{_subject(more, 'has', 'have')} no counterpart in the task's module ({counts})",
            )
        )
    biased_mine = [leaf for leaf in mine if leaf.bias]
    biased_ref = [leaf for leaf in ref if leaf.bias]
    if len(biased_mine) > len(biased_ref) and not (missing or extra):
        room = Counter(leaf.key for leaf in biased_ref)
        surplus = []
        for leaf in biased_mine:  # the biased leaves beyond the reference's, shape by shape
            if room[leaf.key]:
                room[leaf.key] -= 1
            else:
                surplus.append(leaf)
        found.append(
            (
                "layout.extra_bias",
                f"{_subject(surplus, 'has a bias', 'have biases')} where the task's linear "
                "layers have none",
            )
        )
    elif len(biased_mine) < len(biased_ref) and not (missing or extra):
        found.append(
            (
                "layout.missing_bias",
                f"{len(biased_ref) - len(biased_mine)} of your linear layers have no bias where "
                "the task's do",
            )
        )
    elif len(biased_mine) != len(biased_ref):
        return [], False
    return found, True


def explain_layout(
    student: nn.Module, reference: nn.Module, item: str
) -> tuple[BugVariant, str] | None:
    """The layout difference that accounts for the student's parameter count, if one does.

    Args:
        student: the student's module (built with the check's arguments).
        reference: the reference module of the same arguments.
        item: what the student implements (named in the sentence).

    Returns:
        ``(mistake, sentence)``: the first difference found, one of :data:`LAYOUT_MISTAKES`,
        and a sentence naming the student's modules for every difference found; None when the
        layouts are the same, when a module holds parameters of another kind, or when the
        differences found leave part of the gap unexplained.
    """
    mine, ref = _leaves(student), _leaves(reference)
    if mine is None or ref is None:
        return None
    norms = ([x for x in mine if x.kind == "norm"], [x for x in ref if x.kind == "norm"])
    linears = ([x for x in mine if x.kind == "linear"], [x for x in ref if x.kind == "linear"])
    norm_found, norm_gap = _norm_findings(*norms)
    linear_found, whole = _linear_findings(*linears)
    found = norm_found + linear_found
    if not whole or not found or (norm_gap and not norm_found):
        return None
    sentence = "; and ".join(text for _, text in found)
    return _BY_ID[found[0][0]], f"In your {item}, {sentence}."
