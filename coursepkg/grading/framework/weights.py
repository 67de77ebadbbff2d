"""Weights and parameters: building a student's module, copying the reference's weights into it
by name, counting parameters per submodule, and swapping reference pieces in.
"""

from __future__ import annotations

import copy
import inspect
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .calling import call_student, reject_reference_class
from .inputs import describe, shape_text
from .layout import explain_layout
from .results import BugVariant, CheckFailure, CheckReport

# ---------------------------------------------------------------------------------------------
# Weights and parameter counts
# ---------------------------------------------------------------------------------------------

#: The naming contract of DESIGN.md, quoted when names do not match.
NAMING_CONTRACT = (
    "attention: q_proj k_proj v_proj out_proj (nn.Linear); layers: self_attn cross_attn ffn "
    "norm1 norm2 norm3; feed-forward: linear1 linear2 (nn.Linear); LayerNorm: weight bias"
)


def copy_weights(reference: nn.Module, student: nn.Module, item: str) -> None:
    """Copy the reference's parameters into the student's module, matching them by name.

    Args:
        reference: the reference module (its parameters are read).
        student: the student's module (its parameters are overwritten, cast to their dtype).
        item: what the student implements (named in the message).

    Raises:
        CheckFailure: when a name is missing, extra or of the wrong shape; the message lists
            the parameter names and shapes the contract expects.
    """
    ref = dict(reference.named_parameters())
    stu = dict(student.named_parameters())
    missing = [n for n in ref if n not in stu]
    extra = [n for n in stu if n not in ref]
    wrong = [n for n in ref if n in stu and stu[n].shape != ref[n].shape]
    if missing or extra or wrong:
        lines = [
            f"{item}: the check copies the reference weights into your module by parameter "
            "name, and your names or shapes do not match the contract."
        ]
        if missing:
            lines.append(
                "Missing: " + ", ".join(f"{n} {shape_text(ref[n])}" for n in missing) + "."
            )
        if extra:
            lines.append(
                "Not in the contract: "
                + ", ".join(f"{n} {shape_text(stu[n])}" for n in extra)
                + "."
            )
        for n in wrong:
            text = f"{n} has shape {shape_text(stu[n])}, expected {shape_text(ref[n])}"
            if stu[n].dim() == 2 and tuple(stu[n].shape) == tuple(ref[n].shape)[::-1]:
                text += " (nn.Linear(in, out) stores its weight as (out, in))"
            lines.append(text + ".")
        lines.append(
            "Expected parameters: "
            + ", ".join(f"{n} {shape_text(p)}" for n, p in ref.items())
            + "."
        )
        lines.append(f"Naming contract: {NAMING_CONTRACT}.")
        raise CheckFailure("\n".join(lines))
    with torch.no_grad():
        for name, param in ref.items():
            stu[name].copy_(param.to(stu[name].dtype))


def clone_module(module: nn.Module) -> nn.Module:
    """A deep copy of a (student's) module that also works after a forward pass with autograd
    on: tensors a module keeps on ``self`` (attention weights stored to plot them, caches) are
    copied detached, since ``copy.deepcopy`` refuses tensors that are not graph leaves."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for value in vars(sub).values():
            stored = value if isinstance(value, (list, tuple)) else [value]
            for t in stored:
                if isinstance(t, Tensor) and not isinstance(t, nn.Parameter) and not t.is_leaf:
                    memo[id(t)] = t.detach().clone()
    return copy.deepcopy(module, memo)


def materialise_lazy(module: nn.Module, run: Callable[[nn.Module], Any], item: str) -> None:
    """Give the lazy parameters of a student's module (``nn.LazyLinear`` ...) their shapes by
    one forward pass, so that they can be counted and copied like any other.

    Args:
        module: the student's module.
        run: ``run(module)`` calls it once on inputs of the check's configuration.
        item: what the student implements (named in the message).

    Raises:
        CheckFailure: when the parameters are still uninitialised after that call.
    """
    lazy = nn.parameter.is_lazy
    if not any(lazy(p) for p in module.parameters()):
        return
    with torch.no_grad():
        run(module)
    still = [n for n, p in module.named_parameters() if lazy(p)]
    if still:
        raise CheckFailure(
            f"your {item} has lazy parameters ({', '.join(still)}) that one forward pass does "
            "not initialise; give their sizes in the constructor (nn.Linear(in, out))."
        )


class _Adapted(nn.Module):
    """A reference piece put where the student's piece was: it accepts the calls the student's
    layer makes to its own piece (the student's parameter names and order) and passes them on
    positionally to the reference piece."""

    def __init__(self, reference: nn.Module, signature: inspect.Signature | None) -> None:
        super().__init__()
        self.inner = reference
        self.signature = signature

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.signature is None or not kwargs:
            return self.inner(*args, **kwargs)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return self.inner(*bound.arguments.values())


def swap_in(layer: nn.Module, name: str, reference_piece: nn.Module) -> None:
    """Replace ``layer.<name>`` (a student's piece) by a copy of ``reference_piece`` that the
    student's forward can call the way it calls its own piece (keyword names included)."""
    own = getattr(layer, name, None)
    try:
        signature = inspect.signature(own.forward) if own is not None else None
    except (TypeError, ValueError):
        signature = None
    setattr(layer, name, _Adapted(copy.deepcopy(reference_piece), signature))


def _symbolic(shape: Sequence[int], dims: dict[str, int] | None) -> tuple[str, ...]:
    """Factors of a shape as letters when they match a named dimension (e.g. ('D', 'F')); a
    small multiple of the model width (a fused projection's 3·D) becomes ('3', 'D')."""
    names: dict[int, str] = {}
    for letter, size in (dims or {}).items():
        names.setdefault(size, letter)
    factors: list[str] = []
    for s in shape:
        if s in names:
            factors.append(names[s])
            continue
        d = (dims or {}).get("D")
        k = next((k for k in (2, 3, 4) if d and s == k * d), None)
        factors.extend((str(k), "D") if k else (str(s),))
    return tuple(sorted(factors))


def _polynomial(terms: Counter[tuple[str, ...]]) -> str:
    """Format {('D','F'): 2, ('D',): 1} as '2D·F + D' (numbers among the factors are folded
    into the coefficient: {('3','D','D'): 1, ('D','D'): 1} reads '4D²')."""
    folded: Counter[tuple[str, ...]] = Counter()
    for factors, coef in terms.items():
        value = coef
        for f in factors:
            if f.isdigit():
                value *= int(f)
        folded[tuple(f for f in factors if not f.isdigit())] += value
    parts = []
    for letters_of, value in sorted(folded.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        if value == 0:
            continue
        letters = "·".join(
            f + ("²" if k == 2 else "" if k == 1 else f"^{k}")
            for f, k in sorted(Counter(letters_of).items())
        )
        if not letters:
            parts.append(str(value))
        else:
            parts.append(("" if value == 1 else str(value)) + letters)
    return " + ".join(parts) if parts else "0"


def _grouped(poly: str) -> str:
    """Bracket a sum, so that a minus sign in front of it applies to every term."""
    return f"({poly})" if " + " in poly else poly


def _numel(p: Tensor) -> int:
    """Number of entries; 0 for a lazy parameter not yet initialised (``nn.LazyLinear``)."""
    return 0 if nn.parameter.is_lazy(p) else p.numel()


def _renaming_advice(
    student: dict[str, dict[str, Tensor]], reference: dict[str, dict[str, Tensor]]
) -> str:
    """The sentence for a module with the reference's number of parameters under other
    names: which names to use, and whether a fused projection has to be split."""
    wanted = ", ".join(reference)
    text = (
        "Same number of parameters under other names: the check copies the weights by name, "
        f"so name the submodules {wanted} (the naming contract: {NAMING_CONTRACT})."
    )
    sizes = sorted(_numel(p) for g in reference.values() for p in g.values())
    fused = []
    for group in student.values():
        for name, p in group.items():
            n = _numel(p)
            if (
                p.dim() >= 1
                and n not in sizes
                and any(n == k * m for m in sizes for k in (2, 3, 4))
            ):
                fused.append(name)
    if fused:
        text += (
            f" Split a fused projection ({', '.join(fused)}) into separate nn.Linear layers, "
            "e.g. one d_model x 3*d_model matrix into q_proj, k_proj and v_proj."
        )
    return text


def _terms(params: dict[str, Tensor], dims: dict[str, int]) -> Counter:
    """How many parameters of each symbolic shape (``D*F``, ``D``, ...) ``params`` holds."""
    terms: Counter = Counter()
    for p in params.values():
        terms[_symbolic(p.shape, dims)] += 1
    return terms


def parameter_table(
    student: nn.Module, reference: nn.Module, dims: dict[str, int] | None = None
) -> tuple[bool, str]:
    """Per-submodule parameter counts of the student's module next to the reference's.

    Args:
        student: the student's module.
        reference: the reference module of the same configuration.
        dims: named sizes (e.g. ``{"D": 12, "F": 40, "H": 3}``) to explain a gap in symbols,
            "out_proj has no bias: −D", rather than in numbers.

    Returns:
        ``(ok, text)``: ``ok`` when every submodule's count matches; ``text`` is the table,
        followed by one line per difference explaining it.
    """

    def group(module: nn.Module) -> dict[str, dict[str, Tensor]]:
        groups: dict[str, dict[str, Tensor]] = {}
        for name, p in module.named_parameters():
            top = name.split(".", 1)[0]
            groups.setdefault(top, {})[name] = p
        return groups

    gs, gr = group(student), group(reference)
    tops = list(gr) + [t for t in gs if t not in gr]
    count = {
        k: {t: sum(_numel(p) for p in g.get(t, {}).values()) for t in tops}
        for k, g in (("s", gs), ("r", gr))
    }
    width = max([len(t) for t in tops] + [9])
    rows = [f"{'submodule':<{width}}  {'yours':>9}  {'reference':>9}"]
    for t in tops:
        flag = "" if count["s"][t] == count["r"][t] else "   <-"
        rows.append(f"{t:<{width}}  {count['s'][t]:>9}  {count['r'][t]:>9}{flag}")
    total_s, total_r = sum(count["s"].values()), sum(count["r"].values())
    rows.append(f"{'total':<{width}}  {total_s:>9}  {total_r:>9}")
    ok = all(count["s"][t] == count["r"][t] for t in tops)
    notes: list[str] = []
    if not ok and total_s == total_r:
        notes.append(_renaming_advice(gs, gr))
    ps, pr = dict(student.named_parameters()), dict(reference.named_parameters())
    for t in tops:
        if count["s"][t] == count["r"][t]:
            continue
        if t not in gs:
            notes.append(f"{t} missing: −{_grouped(_polynomial(_terms(gr[t], dims)))}")
            continue
        if t not in gr:
            notes.append(f"{t} is not in the reference: +{_polynomial(_terms(gs[t], dims))}")
            continue
        for name, p in gr[t].items():
            if name not in ps:
                poly = _grouped(_polynomial(Counter([_symbolic(p.shape, dims)])))
                if name.endswith(".bias"):
                    notes.append(f"{name.rsplit('.', 1)[0]} has no bias: −{poly}")
                else:
                    notes.append(f"{name} missing: −{poly}")
            elif ps[name].shape != p.shape:
                notes.append(
                    f"{name} has shape {shape_text(ps[name])} instead of {shape_text(p)}: "
                    f"{ps[name].numel() - p.numel():+d}"
                )
        for name, p in gs[t].items():
            if name not in pr:
                poly = _polynomial(Counter([_symbolic(p.shape, dims)]))
                notes.append(f"{name} is not in the reference: +{poly}")
    text = "\n".join(rows + notes)
    return ok, text


def build_module(
    cls: Any,
    args: Sequence[Any],
    item: str,
    *,
    seed: int,
    extra: Sequence[type] = (),
    kwargs: dict[str, Any] | None = None,
    probe: Sequence[Any] | None = None,
) -> nn.Module:
    """Construct the student's module safely, reject reference classes, switch to eval mode.

    Args:
        cls: the student's class.
        args: constructor arguments.
        item: what the student implements.
        seed: seeds the student's initialisation (the check overwrites it anyway).
        extra: more forbidden classes for this item (see :func:`reject_reference_class`).
        kwargs: keyword arguments of the constructor.
        probe: inputs of one forward pass that initialises lazy parameters
            (``nn.LazyLinear``), run only when the module has some.
    """
    reject_reference_class(cls, item, extra=extra)
    torch.manual_seed(seed)
    module = call_student(cls, *args, item=item, **(kwargs or {}))
    if not isinstance(module, nn.Module):
        raise CheckFailure(f"{item}(...) should build an nn.Module, got {type(module).__name__}.")
    reject_reference_class(cls, item, instance=module, extra=extra)
    if probe is not None:
        materialise_lazy(module, lambda m: call_student(m, *probe, item=item), item)
    return module.eval()


def structure(module: nn.Module) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes."""
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


def diagnose_structure(
    student: nn.Module, reference: nn.Module, bugs: Sequence[BugVariant], args: Sequence[Any]
) -> BugVariant | None:
    """The known mistake the student's parameters show, when they differ from the
    reference's: a variant with exactly the student's parameters (names and shapes, e.g. a
    missing output projection), or, for a mistake with ``shows``, a variant with the student's
    number of parameters whose behaviour the student's module shows (whatever its names: a
    fused projection without biases is named like separate ones)."""
    mine = structure(student)
    if mine == structure(reference):
        return None
    count = sum(_numel(p) for p in student.parameters())
    for bug in bugs:
        if bug.calls:
            continue
        try:
            variant = bug.impl(*args)
        except Exception:  # noqa: BLE001 - a variant that cannot be built here is skipped
            continue
        if not isinstance(variant, nn.Module):
            continue
        if bug.shows is None and structure(variant) == mine:
            return bug
        if (
            bug.shows is not None
            and sum(_numel(p) for p in variant.parameters()) == count
            and _shows(bug, student, args)
        ):
            return bug
    return None


def _shows(bug: BugVariant, student: nn.Module, args: Sequence[Any]) -> bool:
    """``bug.shows`` on the student's module; an error in the student's code shows nothing."""
    try:
        with torch.no_grad():
            return bool(bug.shows(student, tuple(args)))
    except Exception:  # noqa: BLE001 - the student's code failed: no evidence
        return False


def module_runner(
    reference: nn.Module, args: Sequence[Any], call: Callable[..., Any] | None = None
) -> Callable[[Any, Sequence[Any]], Any]:
    """A ``run`` for :func:`diagnose`: build a buggy variant with ``args``, give it the
    reference's weights (and dtype), and call it on the inputs.

    Args:
        reference: the reference module whose weights the variant receives.
        args: the constructor arguments.
        call: ``call(module, *inputs)`` (default ``module(*inputs)``).
    """
    dtype = next(reference.parameters()).dtype

    def run(impl: Any, inputs: Sequence[Any]) -> Any:
        variant = impl(*args)
        copy_weights(reference, variant, "variant")
        variant = variant.to(dtype).eval()
        return call(variant, *inputs) if call is not None else variant(*inputs)

    return run


def param_gap(report: CheckReport, student: nn.Module, reference: nn.Module, item: str, **kw: Any):
    """Fail with the per-submodule parameter table when the counts differ.

    Keyword Args:
        dims: named sizes for :func:`parameter_table`.
        bugs: catalogue to match structurally; ``args``: the constructor arguments.
        explain: ``() -> BugVariant | None``, tried when the catalogue names nothing (a
            layer asks its pieces' catalogues); then :func:`~.layout.explain_layout` says
            how the layouts differ when that accounts for the whole gap.
    """
    ok, table = parameter_table(student, reference, kw.get("dims"))
    if ok:
        return
    bug = diagnose_structure(student, reference, kw.get("bugs", ()), kw.get("args", ()))
    if bug is None and kw.get("explain") is not None:
        bug = kw["explain"]()
    layout = explain_layout(student, reference, item) if bug is None else None
    if layout is not None:
        bug, sentence = layout
        table = f"{table}\n{sentence}"
    report.fail(
        f"your {item} has a different number of parameters from the reference "
        f"({describe(kw.get('dims') or {})}):\n{table}",
        bug,
    )
