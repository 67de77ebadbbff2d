"""The fast update and clipping (:mod:`coursepkg.fast_optim`) equal the plain ones
(:mod:`coursepkg.optim`) and PyTorch's, step for step, and share their state dict."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from adamw_cases import ADAMW_SETTINGS  # tests/fixtures
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg.fast_optim import FusedAdamW, foreach_clip_grad_norm_
from coursepkg.optim import AdamW, clip_grad_norm_, param_groups

SETTINGS = settings(max_examples=25, deadline=None)


def _problem(seed: int):
    """A random little model with matrices, biases and a norm, and a fixed batch."""
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Tanh(), torch.nn.Linear(7, 3)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x, y = torch.randn(16, 5, generator=g), torch.randn(16, 3, generator=g)
    return model, x, y


def _train(model, optimizer, x, y, steps: int, clip=None) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        if clip is not None:
            clip(model.parameters(), 0.5)
        optimizer.step()


@SETTINGS
@given(seed=st.integers(0, 10_000), **ADAMW_SETTINGS)
def test_fused_adamw_equals_plain_and_torch(seed, lr, beta1, beta2, eps, decay):
    # Two groups (decayed matrices, undecayed vectors), six steps: the fused kernel agrees
    # with the plain update (which equals torch's) to float32 rounding (its arithmetic order
    # differs, so not bit for bit).
    kwargs = dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=decay)
    models = [_problem(seed)[0] for _ in range(3)]
    _, x, y = _problem(seed)
    optimizers = [
        FusedAdamW(param_groups(models[0], decay), **kwargs),
        AdamW(param_groups(models[1], decay), **kwargs),
        torch.optim.AdamW(param_groups(models[2], decay), foreach=False, **kwargs),
    ]
    for model, opt in zip(models, optimizers, strict=True):
        _train(model, opt, x, y, 6)
    for fused, plain, ref in zip(*(m.parameters() for m in models), strict=True):
        torch.testing.assert_close(plain, ref, rtol=1e-6, atol=1e-7)  # as test_optim.py
        # a few float32 roundings of weights of order 1 over six steps (a last-bit difference
        # in a step can also move the next one's update by as little)
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)


def test_fused_adamw_moves_every_parameter_and_counts_steps():
    model, x, y = _problem(0)
    before = [p.detach().clone() for p in model.parameters()]
    opt = FusedAdamW(param_groups(model, 0.1), lr=1e-2)
    _train(model, opt, x, y, 3)
    for a, b in zip(before, model.parameters(), strict=True):
        assert not torch.equal(a, b)
    assert all(float(opt.state[p]["step"]) == 3.0 for p in model.parameters())


def test_fused_adamw_skips_parameters_without_gradient():
    # A parameter without a gradient (an expert no token chose) keeps its weight and its
    # step count, so the two counts part, as in the plain update.
    model, x, y = _problem(1)
    frozen = model[3].bias
    fused, plain = FusedAdamW(model.parameters(), lr=1e-2), AdamW(model.parameters(), lr=1e-2)
    for opt in (fused, plain):
        _train(model, opt, x, y, 1)
    for opt in (fused, plain):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        frozen.grad = None
        kept = frozen.detach().clone()
        opt.step()
        assert torch.equal(frozen, kept)
        assert float(opt.state[frozen]["step"]) == 1.0
        assert float(opt.state[model[0].weight]["step"]) == 2.0


def test_state_dicts_move_between_plain_and_fused():
    # A checkpoint written by either continues under the other (the same keys and layout):
    # three plain steps then three fused ones end where six plain ones do.
    model_a, x, y = _problem(2)
    model_b = copy.deepcopy(model_a)
    plain_a = AdamW(param_groups(model_a, 0.1), lr=1e-2)
    _train(model_a, plain_a, x, y, 3)
    model_b.load_state_dict(model_a.state_dict())
    fused_b = FusedAdamW(param_groups(model_b, 0.1), lr=1e-2)
    fused_b.load_state_dict(copy.deepcopy(plain_a.state_dict()))
    assert fused_b.state_dict()["state"].keys() == plain_a.state_dict()["state"].keys()
    _train(model_a, plain_a, x, y, 3)
    _train(model_b, fused_b, x, y, 3)
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    back = AdamW(param_groups(model_b, 0.1), lr=1e-2)
    back.load_state_dict(copy.deepcopy(fused_b.state_dict()))
    for p in model_b.parameters():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(back.state[p][key], fused_b.state[p][key])


def test_fused_adamw_takes_a_tensor_decay_as_the_plain_one():
    # course-fsdp's per-element decay: the plain update, bit for bit.
    models = [_problem(3)[0] for _ in range(2)]
    _, x, y = _problem(3)
    opts = [
        cls([{"params": list(m.parameters()), "weight_decay": torch.tensor(0.1)}], lr=1e-2)
        for cls, m in zip((FusedAdamW, AdamW), models, strict=True)
    ]
    for model, opt in zip(models, opts, strict=True):
        _train(model, opt, x, y, 3)
    for a, b in zip(*(m.parameters() for m in models), strict=True):
        assert torch.equal(a, b)


@SETTINGS
@given(seed=st.integers(0, 10_000), max_norm=st.floats(1e-3, 10.0), scale=st.floats(1e-3, 1e3))
def test_foreach_clip_equals_plain_bit_for_bit(seed, max_norm, scale):
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (4,), (2, 2, 2), (5,)]
    grads = [torch.randn(s, generator=g) * scale for s in shapes]
    sets = [[torch.nn.Parameter(torch.zeros(s)) for s in shapes] for _ in range(2)]
    for params in sets:
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad.clone()
        params[1].grad = None  # one parameter without a gradient is skipped
    fast = foreach_clip_grad_norm_(sets[0], max_norm)
    plain = clip_grad_norm_(sets[1], max_norm)
    assert torch.equal(fast, plain)
    for a, b in zip(*sets, strict=True):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad)


def test_foreach_clip_without_gradients_returns_zero():
    assert float(foreach_clip_grad_norm_([torch.nn.Parameter(torch.zeros(2))], 1.0)) == 0.0
