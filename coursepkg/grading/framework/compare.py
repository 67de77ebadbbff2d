"""Comparing numbers: the tolerances (chosen here only), closeness with readable messages,
recognising a known mistake by its outputs, gradients reaching every input, and a function's
value and gradients compared with the reference's (:func:`compare_value_and_grads`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from .calling import call_student, expect_tensor
from .inputs import shape_text
from .results import BugVariant, CheckFailure, CheckReport

# ---------------------------------------------------------------------------------------------
# Tolerances (the one place they are chosen)
# ---------------------------------------------------------------------------------------------

#: Default ``(rtol, atol)`` per dtype for comparing a student's numbers with the reference.
#: Measured on the attention-family items (SDPA, MHA, LayerNorm, FFN, encoder layer) at the
#: check configurations: the float32 reference against the same computation in float64 differs
#: by at most ~1e-6 absolute (outputs of size ~1), and two correct float32 implementations that
#: order the operations differently (einsum vs matmul, per-head loop vs batched, scaling Q
#: before the product vs the scores after) differ by at most ~2e-6. The float32 defaults leave
#: a margin of ~10-50x over that spread while staying far below the smallest effect of any
#: catalogued mistake (>= 1e-3). In float64 the same spread is ~1e-15.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
    torch.float32: (1e-4, 5e-5),
    torch.float64: (1e-7, 1e-9),
}

#: Looser ``(rtol, atol)`` for deciding that a student's output matches a known buggy variant:
#: the student and the bug may order operations differently, and a near match is what counts.
DIAGNOSE_TOLERANCE: tuple[float, float] = (1e-3, 1e-4)


# ---------------------------------------------------------------------------------------------
# Comparing numbers
# ---------------------------------------------------------------------------------------------


def assert_close(
    actual: Any,
    expected: Tensor,
    what: str,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Fail with a useful message unless ``actual`` equals ``expected`` within tolerance.

    Args:
        actual: the student's value.
        expected: the reference value.
        what: the quantity, as the student knows it ("the output of your MultiHeadAttention").
        rtol, atol: tolerances; default :data:`TOLERANCES` for ``expected``'s dtype.

    Raises:
        CheckFailure: naming the shapes/dtypes when they differ, otherwise the largest absolute
            error, where it occurs and the two values there.
    """
    actual = expect_tensor(actual, what)
    if actual.shape != expected.shape:
        raise CheckFailure(
            f"{what} has shape {shape_text(actual)}, expected {shape_text(expected)}."
        )
    if actual.dtype != expected.dtype:
        raise CheckFailure(
            f"{what} has dtype {actual.dtype}, expected {expected.dtype} (the dtype of the "
            "inputs). Create new tensors with dtype=/device= taken from the inputs."
        )
    if actual.device != expected.device:
        raise CheckFailure(f"{what} is on {actual.device}, expected {expected.device}.")
    if not expected.is_floating_point():
        bad = (actual != expected).nonzero()
        if len(bad):
            idx = tuple(bad[0].tolist())
            raise CheckFailure(
                f"{what} differs from the reference at {len(bad)} of {expected.numel()} "
                f"entries, first at index {idx} (yours {actual[idx].item()}, reference "
                f"{expected[idx].item()})."
            )
        return
    default_rtol, default_atol = TOLERANCES.get(expected.dtype, TOLERANCES[torch.float32])
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if bool((nan_a & ~nan_e).any()):
        idx = tuple(torch.nonzero(nan_a & ~nan_e)[0].tolist())
        count = int((nan_a & ~nan_e).sum())
        raise CheckFailure(
            f"{what} contains NaN ({count} of {a.numel()} entries, first at index {idx}) "
            f"where the reference is {e[idx].item():.6g}."
        )
    err = (a - e).abs().nan_to_num(nan=0.0, posinf=float("inf"))
    err = torch.where(nan_a & nan_e, torch.zeros_like(err), err)
    bad = err > atol + rtol * e.abs().nan_to_num(nan=0.0)
    if bool(bad.any()):
        flat = int(err.reshape(-1).argmax())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
        raise CheckFailure(
            f"{what} differs from the reference: max abs error {err[idx].item():.3g} at index "
            f"{idx} (yours {a[idx].item():.6g}, reference {e[idx].item():.6g}); "
            f"{int(bad.sum())} of {a.numel()} entries are outside the tolerance "
            f"(rtol={rtol:g}, atol={atol:g})."
        )


def max_abs_error(actual: Tensor, expected: Tensor) -> float:
    """Largest absolute difference (NaN where both are NaN counts as equal)."""
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    err = (a - e).abs()
    err = torch.where(torch.isnan(a) & torch.isnan(e), torch.zeros_like(err), err)
    return float(err.max()) if err.numel() else 0.0


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        out: list[Tensor] = []
        for v in value:
            out.extend(_tensors(v))
        return out
    return []


def _outputs_match(a: Any, b: Any, rtol: float, atol: float) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    if not ta or len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb, strict=True):
        if x.shape != y.shape:
            return False
        x64 = x.detach().to("cpu", torch.float64)
        y64 = y.detach().to("cpu", torch.float64)
        if not torch.allclose(x64, y64, rtol=rtol, atol=atol, equal_nan=True):
            return False
    return True


def diagnose(
    student_output_fn: Callable[..., Any],
    bugs: Sequence[BugVariant],
    inputs: Sequence[Any],
    *,
    run: Callable[[Any, Sequence[Any]], Any] | None = None,
    reference_output: Any = None,
) -> BugVariant | None:
    """Find the known mistake whose output matches the student's on the same inputs.

    Args:
        student_output_fn: called as ``student_output_fn(*inputs)``; returns the student's
            output (a tensor or a tuple of tensors). Errors count as "no match".
        bugs: candidate :class:`BugVariant` s.
        inputs: the inputs, chosen so that the candidates differ from each other.
        run: ``run(bug.impl, inputs)`` computes a bug's output (default ``bug.impl(*inputs)``);
            checks of modules pass a ``run`` that builds the buggy module with the
            reference's weights.
        reference_output: when given, a bug that matches the reference on these inputs is
            skipped (it cannot be told apart here).

    Returns:
        The first matching bug, or None.
    """
    rtol, atol = DIAGNOSE_TOLERANCE
    try:
        with torch.no_grad():
            student = student_output_fn(*inputs)
    except Exception:  # noqa: BLE001 - an erroring student output matches nothing
        return None
    runner = run or (lambda impl, args: impl(*args))
    for bug in bugs:
        if bug.calls:  # named by the call itself (forbidden_calls), never by its numbers
            continue
        try:
            with torch.no_grad():
                candidate = runner(bug.impl, inputs)
        except Exception:  # noqa: BLE001 - a variant that cannot run these inputs is skipped
            continue
        if reference_output is not None and _outputs_match(candidate, reference_output, rtol, atol):
            continue
        if _outputs_match(student, candidate, rtol, atol):
            return bug
    return None


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------


def check_gradients(
    output: Tensor,
    named: Iterable[tuple[str, Tensor]],
    item: str,
    *,
    seed: int = 0,
) -> None:
    """Backpropagate a random projection of ``output`` and fail unless every tensor gets a
    finite, not-all-zero gradient.

    Args:
        output: the student's output (part of an autograd graph).
        named: ``(name, tensor)`` pairs that must receive gradients (parameters or inputs).
        item: what the student implements.
        seed: seed of the random projection.

    Raises:
        CheckFailure: naming the first tensor without a usable gradient.
    """
    named = list(named)
    for _, t in named:
        t.grad = None
    if not output.requires_grad:
        raise CheckFailure(
            f"the output of your {item} does not require grad, so nothing can be trained: "
            "do not wrap the computation in torch.no_grad(), and do not use .detach(), "
            ".item() or .numpy() on the way."
        )
    gen = torch.Generator().manual_seed(seed)
    probe = torch.randn(output.shape, generator=gen, dtype=torch.float64)
    (output * probe.to(output.dtype)).sum().backward()
    for name, t in named:
        if t.grad is None:
            raise CheckFailure(
                f"no gradient reaches `{name}` in your {item}: it does not take part in the "
                "output (or is used through .data, .detach() or torch.no_grad())."
            )
        if not bool(torch.isfinite(t.grad).all()):
            raise CheckFailure(f"the gradient of `{name}` in your {item} contains NaN or inf.")
        if not bool(t.grad.any()):
            raise CheckFailure(
                f"the gradient of `{name}` in your {item} is zero everywhere: it does not "
                "influence the output."
            )


def expect_close(
    report: CheckReport,
    actual: Any,
    expected: Tensor,
    what: str,
    *,
    diagnosis: Callable[[], BugVariant | None] | None = None,
    explain: Callable[[], tuple[str, BugVariant | None]] | None = None,
    hint: str = "",
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Fail (through ``report``) unless ``actual`` is close to ``expected``.

    Args:
        report: the running check's report.
        actual: the student's value.
        expected: the reference value.
        what: the quantity, with its configuration.
        diagnosis: called only on a mismatch; returns the known mistake it matches, if any.
        explain: instead of ``diagnosis``, for a mismatch that says more than its mistake
            (which piece of a layer is wrong, the distribution a loss implies): called only on
            a mismatch; returns a sentence added on a line of its own (when not empty) and the
            known mistake, if any.
        hint: advice added when no known mistake matches.
        rtol, atol: tolerances (default: the framework's per-dtype ones).
    """
    if diagnosis is not None and explain is not None:
        raise ValueError("expect_close takes diagnosis or explain, not both")
    try:
        assert_close(actual, expected, what, rtol=rtol, atol=atol)
    except CheckFailure as failure:
        message = failure.message
        if explain is not None:
            sentence, bug = explain()
            message += f"\n{sentence}" if sentence else ""
        else:
            bug = diagnosis() if diagnosis is not None else None
        if bug is None and hint:
            message += "\n" + hint
        report.fail(message, bug)


def outputs_match_safely(
    student: Callable[..., Any], inputs: Sequence[Any], expected: Tensor
) -> bool:
    """Whether the student's block gives ``expected`` on ``inputs`` (an error: no)."""
    try:
        out = student(*inputs)
    except CheckFailure:
        return False
    return isinstance(out, Tensor) and out.shape == expected.shape and near(out, expected)


def near(a: Tensor, b: Tensor) -> bool:
    """Whether two outputs agree within the loose tolerance used to recognise a mistake."""
    return bool(
        torch.allclose(
            a.detach().to("cpu", torch.float64),
            b.detach().to("cpu", torch.float64),
            rtol=1e-3,
            atol=1e-4,
            equal_nan=True,
        )
    )


# ---------------------------------------------------------------------------------------------
# A function's value and its gradients
# ---------------------------------------------------------------------------------------------


def value_and_grads(fn: Callable[..., Any], inputs: Sequence[Any], wrt: Sequence[int]) -> tuple:
    """``(output, grad of each input in wrt)``, zeros where no gradient reaches an input.

    A scalar output is differentiated as it is; a tensor output through a fixed weighting of
    its entries (0.5 to 1.5 in order), so every entry's gradient counts and none cancels.

    Args:
        fn: called as ``fn(*inputs)``, the inputs at ``wrt`` replaced by leaves that require grad.
        inputs: the arguments.
        wrt: the positions of the tensors to differentiate with respect to.

    Returns:
        The detached output, then one gradient per position in ``wrt``.
    """
    with torch.enable_grad():
        args = list(inputs)
        leaves = []
        for i in wrt:
            args[i] = args[i].detach().clone().requires_grad_(True)
            leaves.append(args[i])
        out = fn(*args)
        total = out
        if out.dim():
            weights = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype, device=out.device)
            total = (out * weights.reshape(out.shape)).sum()
        grads = torch.autograd.grad(total, leaves, allow_unused=True)
    return (
        out.detach(),
        *(torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads, strict=True)),
    )


def compare_value_and_grads(
    report: CheckReport,
    impl: Any,
    item: str,
    reference: Callable[..., Any],
    bugs: Sequence[BugVariant],
    inputs: Sequence[Any],
    wrt: Sequence[int],
    where: str,
    guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> None:
    """The student's function against ``reference``: its value (shape first), then its
    gradients with respect to the inputs at ``wrt``; each mismatch diagnosed on both.

    Args:
        report: the running check's report.
        impl: the student's function, called with ``inputs``.
        item: what the student implements, as messages name it.
        reference: the correct function, same arguments.
        bugs: the known mistakes, each rerun on the same inputs.
        inputs: the arguments (tensors are cloned for each call).
        wrt: the positions of the inputs that take a gradient.
        where: the configuration, for the messages.
        guard: the honesty rules every call of student code runs under (``forbidden_calls``).
    """
    fresh = [x.detach().clone() if isinstance(x, Tensor) else x for x in inputs]
    with guard():
        mine = expect_tensor(call_student(impl, *fresh, item=item), f"your {item}'s result")
    expected = value_and_grads(reference, inputs, wrt)

    def diagnosis() -> BugVariant | None:
        return diagnose(
            lambda *xs: value_and_grads(impl, xs, wrt),
            bugs,
            list(inputs),
            run=lambda fn, xs: value_and_grads(fn, xs, wrt),
            reference_output=expected,
        )

    if mine.shape != expected[0].shape:  # a known mistake of that shape is named too
        want = "a scalar" if expected[0].dim() == 0 else f"shape {tuple(expected[0].shape)}"
        message = f"your {item} should return {want}, got shape {tuple(mine.shape)} {where}"
        report.fail(message, diagnosis())

    expect_close(report, mine, expected[0], f"your {item} {where}", diagnosis=diagnosis)
    try:
        with guard():
            got = value_and_grads(impl, inputs, wrt)
    except RuntimeError as err:
        raise CheckFailure(
            f"your {item} has no gradient {where} ({err}): do not use .detach(), .item() or "
            "torch.no_grad() on the way from the inputs to the result."
        ) from None
    for k, (a, b) in enumerate(zip(got[1:], expected[1:], strict=True)):
        name = f"the gradient of your {item} with respect to argument {wrt[k] + 1} {where}"
        expect_close(report, a, b, name, diagnosis=diagnosis)
