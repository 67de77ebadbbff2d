"""The course's AdamW, warm-up + cosine schedule, clipping, softmax and cross-entropy equal
PyTorch's on random problems, step for step."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from adamw_cases import ADAMW_SETTINGS  # tests/fixtures
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg.functional import cross_entropy, log_softmax, softmax
from coursepkg.optim import AdamW, clip_grad_norm_, param_groups, warmup_cosine_lr

SETTINGS = settings(max_examples=25, deadline=None)


def _problem(seed: int):
    """A random little regression model and a fixed batch, for comparing optimisers."""
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x, y = torch.randn(16, 5, generator=g), torch.randn(16, 3, generator=g)
    return model, x, y


@SETTINGS
@given(seed=st.integers(0, 10_000), **ADAMW_SETTINGS)
def test_adamw_equals_torch_step_for_step(seed, lr, beta1, beta2, eps, decay):
    ours_model, x, y = _problem(seed)
    ref_model, _, _ = _problem(seed)
    kwargs = dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=decay)
    ours = AdamW(param_groups(ours_model, decay), **kwargs)
    ref = torch.optim.AdamW(param_groups(ref_model, decay), foreach=False, **kwargs)
    for _ in range(6):
        for model, opt in ((ours_model, ours), (ref_model, ref)):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        for a, b in zip(ours_model.parameters(), ref_model.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_adamw_decay_is_decoupled():
    # With a zero gradient Adam's update is 0: only the decay moves the weight, by lr * wd * w.
    w = torch.nn.Parameter(torch.tensor([2.0, -4.0]))
    opt = AdamW([w], lr=0.1, weight_decay=0.5)
    w.grad = torch.zeros(2)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([2.0, -4.0]) * (1 - 0.1 * 0.5))


def test_adamw_state_dict_round_trip_continues_identically():
    model_a, x, y = _problem(1)
    model_b, _, _ = _problem(1)
    opt_a = AdamW(model_a.parameters(), lr=0.01)
    for _ in range(3):
        opt_a.zero_grad()
        F.mse_loss(model_a(x), y).backward()
        opt_a.step()
    model_b.load_state_dict(model_a.state_dict())
    opt_b = AdamW(model_b.parameters(), lr=0.01)
    # a copy, as a checkpoint file gives: state_dict() hands out the live state tensors
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    for model, opt in ((model_a, opt_a), (model_b, opt_b)):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [dict(lr=-1.0), dict(betas=(0.9, 1.0)), dict(weight_decay=-0.1)])
def test_adamw_bad_arguments_are_named(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        AdamW([torch.nn.Parameter(torch.zeros(1))], **bad)


@SETTINGS
@given(
    max_lr=st.floats(1e-4, 1.0),
    warmup=st.integers(1, 20),
    decay_steps=st.integers(1, 50),
    floor=st.floats(0.0, 0.9),
)
def test_schedule_equals_torch_linear_then_cosine(max_lr, warmup, decay_steps, floor):
    total, min_lr = warmup + decay_steps, floor * max_lr
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=max_lr)
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [
            torch.optim.lr_scheduler.LinearLR(
                opt, start_factor=1 / warmup, end_factor=1.0, total_iters=max(warmup - 1, 1)
            ),
            torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=decay_steps, eta_min=min_lr),
        ],
        milestones=[warmup],
    )
    for step in range(total + 1):
        ours = warmup_cosine_lr(step, max_lr, warmup, total, min_lr)
        if warmup > 1 or step >= warmup:  # LinearLR cannot start and end at one step
            assert math.isclose(ours, opt.param_groups[0]["lr"], rel_tol=1e-6, abs_tol=1e-12)
        opt.step()
        sched.step()
    assert warmup_cosine_lr(total + 5, max_lr, warmup, total, min_lr) == min_lr


def test_schedule_phases():
    lrs = [warmup_cosine_lr(s, 1.0, 10, 110, 0.1) for s in range(120)]
    assert lrs[9] == 1.0 and lrs[0] == 0.1  # warm-up reaches the peak linearly
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))  # then only decreases
    assert lrs[110:] == [0.1] * 10  # and stays at the floor
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_cosine_lr(0, 1.0, 10, 10)


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    max_norm=st.floats(1e-3, 10.0),
    scale=st.floats(1e-3, 1e3),
)
def test_clip_grad_norm_equals_torch(seed, max_norm, scale):
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (4,), (2, 2, 2)]
    ours = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    ref = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for a, b in zip(ours, ref, strict=True):
        a.grad = torch.randn(a.shape, generator=g) * scale
        b.grad = a.grad.clone()
    norm_ours = clip_grad_norm_(ours, max_norm)
    norm_ref = torch.nn.utils.clip_grad_norm_(ref, max_norm)
    torch.testing.assert_close(norm_ours, norm_ref)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    clipped = torch.cat([a.grad.flatten() for a in ours]).norm()
    assert clipped <= max_norm * (1 + 1e-5)


@SETTINGS
@given(seed=st.integers(0, 10_000), shift=st.floats(-1e4, 1e4), spread=st.floats(0.01, 100.0))
def test_softmax_and_cross_entropy_equal_torch(seed, shift, spread):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(4, 6, 9, generator=g) * spread + shift).requires_grad_()
    target = torch.randint(9, (4, 6), generator=g)
    torch.testing.assert_close(softmax(logits), torch.softmax(logits, -1))
    torch.testing.assert_close(log_softmax(logits, 1), torch.log_softmax(logits, 1))
    ours = cross_entropy(logits, target)
    ref = F.cross_entropy(logits.flatten(0, 1), target.flatten())
    torch.testing.assert_close(ours, ref)
    (grad_ours,) = torch.autograd.grad(ours, logits)
    (grad_ref,) = torch.autograd.grad(ref, logits)
    torch.testing.assert_close(grad_ours, grad_ref)


def test_cross_entropy_is_stable_and_ignores():
    logits = torch.tensor([[1e4, 0.0, -1e4], [0.0, 0.0, 0.0]])
    target = torch.tensor([1, 0])
    assert torch.isfinite(cross_entropy(logits, target))
    torch.testing.assert_close(cross_entropy(logits, target), F.cross_entropy(logits, target))
    ignored = cross_entropy(logits, target, ignore_index=1)
    torch.testing.assert_close(ignored, F.cross_entropy(logits, target, ignore_index=1))
    with pytest.raises(ValueError, match="leading dimensions"):
        cross_entropy(logits, torch.tensor([0]))


@pytest.mark.parametrize(("warmup", "total"), [(0, 7), (1, 5), (4, 20), (10, 11)])
def test_the_warm_up_from_zero_is_hugging_face_s_and_one_step_behind(warmup, total):
    """warmup_from_zero: 0 at step 0, max_lr at step warmup (get_cosine_schedule_with_warmup);
    the default reaches each warm-up value one step earlier; the decays are the same."""
    optimization = pytest.importorskip("transformers.optimization")
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3)
    sched = optimization.get_cosine_schedule_with_warmup(opt, warmup, total)
    for step in range(total):
        ours = warmup_cosine_lr(step, 0.3, warmup, total, warmup_from_zero=True)
        assert math.isclose(ours, opt.param_groups[0]["lr"], rel_tol=1e-12, abs_tol=1e-15)
        if 0 < step <= warmup:
            assert ours == warmup_cosine_lr(step - 1, 0.3, warmup, total)
        if step >= warmup:
            assert ours == warmup_cosine_lr(step, 0.3, warmup, total)
        opt.step()
        sched.step()
    if warmup:
        assert warmup_cosine_lr(0, 0.3, warmup, total, warmup_from_zero=True) == 0.0
