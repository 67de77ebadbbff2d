"""The warm-up schedule (peak at warm-up, linear before, inverse square root after), its
LambdaLR wrapper, and the label-smoothed loss (== F.cross_entropy(label_smoothing=eps))."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from coursepkg import LabelSmoothingLoss, label_smoothed_cross_entropy, noam_lr, noam_scheduler


@pytest.mark.parametrize(("d_model", "warmup"), [(512, 4000), (64, 10), (16, 1), (1024, 37)])
def test_noam_peaks_at_warmup(d_model, warmup) -> None:
    lrs = [noam_lr(s, d_model, warmup) for s in range(1, 3 * warmup + 1)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == warmup
    assert noam_lr(warmup, d_model, warmup) == pytest.approx(d_model**-0.5 * warmup**-0.5)
    assert all(a < b for a, b in zip(lrs[: warmup - 1], lrs[1:warmup], strict=True))
    assert all(a > b for a, b in zip(lrs[warmup - 1 : -1], lrs[warmup:], strict=True))


@pytest.mark.parametrize(("d_model", "warmup"), [(512, 4000), (64, 100)])
def test_noam_linear_then_inverse_sqrt(d_model, warmup) -> None:
    for s in (1, 3, warmup // 4, warmup // 2):  # warm-up: lr proportional to the step
        assert noam_lr(2 * s, d_model, warmup) == pytest.approx(2 * noam_lr(s, d_model, warmup))
    for s in (warmup, 2 * warmup, 7 * warmup):  # afterwards: lr proportional to step^-1/2
        assert noam_lr(4 * s, d_model, warmup) == pytest.approx(noam_lr(s, d_model, warmup) / 2)
    assert noam_lr(0, d_model, warmup) == 0.0
    assert noam_lr(10, d_model, warmup, factor=3.0) == pytest.approx(
        3 * noam_lr(10, d_model, warmup)
    )
    # the formula itself, at a few points
    for s in (1, 17, warmup, 3 * warmup):
        want = d_model**-0.5 * min(s**-0.5, s * warmup**-1.5)
        assert noam_lr(s, d_model, warmup) == pytest.approx(want)


@pytest.mark.parametrize("warmup", [1, 5])
def test_noam_scheduler_drives_the_optimizer(warmup) -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = noam_scheduler(opt, d_model=32, warmup_steps=warmup, factor=2.0)
    seen = []
    for n in range(1, 3 * warmup + 3):  # update n uses noam_lr(n)
        seen.append(opt.param_groups[0]["lr"])
        assert seen[-1] == pytest.approx(noam_lr(n, 32, warmup, factor=2.0)), n
        p.grad = torch.ones(3)
        before = p.detach().clone()
        opt.step()
        assert_close(before - p.detach(), torch.full((3,), seen[-1]))  # SGD moved by lr * 1
        sched.step()
    assert max(range(len(seen)), key=seen.__getitem__) + 1 == warmup


@pytest.mark.parametrize("ignore_index", [None, 0, 3])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3, 0.9])
def test_label_smoothing_equals_torch(eps, ignore_index) -> None:
    logits = torch.randn(4, 6, 9, requires_grad=True)  # (B, T, V)
    target = torch.randint(0, 9, (4, 6))
    target[0, :3] = 0
    target[2, 1] = 3
    ours = label_smoothed_cross_entropy(logits, target, eps, ignore_index)
    kw = {} if ignore_index is None else {"ignore_index": ignore_index}
    want = F.cross_entropy(logits.reshape(-1, 9), target.reshape(-1), label_smoothing=eps, **kw)
    assert_close(ours, want)
    (g_ours,) = torch.autograd.grad(ours, logits)
    (g_want,) = torch.autograd.grad(want, logits)
    assert_close(g_ours, g_want)
    assert_close(LabelSmoothingLoss(eps, ignore_index)(logits, target), want)


def test_zero_smoothing_is_plain_cross_entropy() -> None:
    logits, target = torch.randn(5, 7), torch.randint(0, 7, (5,))
    plain = F.cross_entropy(logits, target)
    assert_close(label_smoothed_cross_entropy(logits, target, 0.0), plain)
    assert_close(
        label_smoothed_cross_entropy(logits, target, 0.0),
        -torch.log_softmax(logits, -1)[torch.arange(5), target].mean(),
    )
    # smoothing puts eps/V on every class: the loss is then higher for confident right answers
    confident = 10 * F.one_hot(target, 7).float()
    assert label_smoothed_cross_entropy(confident, target, 0.1) > label_smoothed_cross_entropy(
        confident, target, 0.0
    )


def test_ignored_positions_do_not_count() -> None:
    logits = torch.randn(2, 4, 5)
    target = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0]])
    full = label_smoothed_cross_entropy(logits, target, 0.1, ignore_index=0)
    keep = target != 0
    assert_close(full, label_smoothed_cross_entropy(logits[keep], target[keep], 0.1))
    logits2 = logits.clone()
    logits2[~keep] = 100 * torch.randn_like(logits2[~keep])
    assert_close(label_smoothed_cross_entropy(logits2, target, 0.1, ignore_index=0), full)
    # every position ignored: 0, not NaN (F.cross_entropy would give NaN)
    zero = label_smoothed_cross_entropy(logits, torch.zeros_like(target), 0.1, ignore_index=0)
    assert zero.item() == 0.0
