"""FastMultiHeadAttention (the models' attention) computes what the plain MultiHeadAttention
computes: outputs, gradients and cached decoding, over grouped-query heads, RoPE, QK-norm,
caches, masks and the projection routes; and the two share parameter names."""

from __future__ import annotations

import itertools
from functools import partial

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from coursepkg.attention import MultiHeadAttention
from coursepkg.fast_attention import FUSE_MIN_ROWS, FastDropout, FastMultiHeadAttention
from coursepkg.kv_cache import AttentionCache, SlidingWindowCache
from coursepkg.layers import RMSNorm
from coursepkg.masks import PackedMask, causal_mask
from coursepkg.positional import RopeAngles, rope_frequencies

D, H, DK = 16, 4, 4


def _pair(n_kv: int, qk_norm: bool, d_v: int = DK) -> tuple[nn.Module, nn.Module]:
    """A plain and a fast module with the same weights (copied by name)."""
    torch.manual_seed(0)
    norm = partial(RMSNorm, eps=1e-6) if qk_norm else None
    plain = MultiHeadAttention(D, H, DK, d_v, n_kv_heads=n_kv, qk_norm=norm)
    fast = FastMultiHeadAttention(D, H, DK, d_v, n_kv_heads=n_kv, qk_norm=norm)
    with torch.no_grad():
        for p in plain.parameters():  # not all ones: QK-norm's gain must matter
            p.copy_(torch.randn_like(p))
    fast.load_state_dict(plain.state_dict())
    return plain.eval(), fast.eval()


def _close(got: torch.Tensor, want: torch.Tensor, scale: float | None = None) -> None:
    """Equal up to float32 rounding at the scale of what was summed. The fast class multiplies
    in another order (one stacked product for q, k, v), which moves an element by a few units in
    the last place of the largest terms, not of its own value: a small element next to large
    ones (or a gradient that cancels, as a key bias's does) can differ by more than a fixed atol
    allows, by an amount that depends on the CPU's kernels (AVX2 and AVX-512 differ). ``scale``
    (default: the largest element of ``want``) sets that size. A real mistake (a mask, a head's
    order, a missing gradient) moves elements by the scale itself, 10^4 times more."""
    size = want.abs().max().item() if scale is None else scale
    assert_close(got, want, rtol=1e-4, atol=1e-4 * max(1.0, size))


def _rope(positions: torch.Tensor) -> RopeAngles:
    return RopeAngles(positions, rope_frequencies(DK, 10000.0), "halves")


def test_the_two_classes_share_parameter_names() -> None:
    """Weights move between them by name (checkpoints, interop, the graders)."""
    for n_kv, qk in itertools.product((H, 2, 1), (False, True)):
        plain, fast = _pair(n_kv, qk)
        assert list(plain.state_dict()) == list(fast.state_dict())


# n_kv: H (multi-head), 2 (grouped-query), 1 (multi-query); rows: below and above FUSE_MIN_ROWS.
OPTIONS = list(
    itertools.product((H, 2, 1), (False, True), (False, True), ("none", "causal", "keys"))
)


@pytest.mark.parametrize("n_kv, rope, qk_norm, mask_kind", OPTIONS)
@pytest.mark.parametrize("n", [3, FUSE_MIN_ROWS])
def test_self_attention_outputs_and_gradients_are_equal(n_kv, rope, qk_norm, mask_kind, n) -> None:
    plain, fast = _pair(n_kv, qk_norm)
    torch.manual_seed(1)
    x = torch.randn(2, n, D)
    mask = {"none": None, "causal": causal_mask(n)}.get(mask_kind)
    if mask_kind == "keys":
        mask = torch.ones(2, 1, 1, n, dtype=torch.bool)
        mask[1, ..., n // 2 :] = False
    angles = _rope(torch.arange(n)) if rope else None
    outs, grads = [], []
    for module in (plain, fast):
        xi = x.clone().requires_grad_(True)
        out = module(xi, xi, xi, mask, rope=angles)  # (B, L, D)
        (out * torch.linspace(-1, 1, D)).sum().backward()
        outs.append(out.detach())
        grads.append([xi.grad, *(p.grad for p in module.parameters())])
    _close(outs[1], outs[0])
    scale = max(g.abs().max().item() for g in grads[0])  # the largest gradient's
    for got, want in zip(grads[1], grads[0], strict=True):
        _close(got, want, scale)


@pytest.mark.parametrize("n_kv", [H, 1])
@pytest.mark.parametrize("n", [3, FUSE_MIN_ROWS])
@pytest.mark.parametrize("same_kv", [True, False])
def test_cross_attention_outputs_and_gradients_are_equal(n_kv, n, same_kv) -> None:
    plain, fast = _pair(n_kv, False, d_v=5)
    torch.manual_seed(2)
    x, memory = torch.randn(2, n, D), torch.randn(2, 7, D)
    value = memory if same_kv else torch.randn(2, 7, D)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[0, ..., 4:] = False
    results = []
    for module in (plain, fast):
        mem = memory.clone().requires_grad_(True)
        val = mem if same_kv else value
        out = module(x, mem, val, mask)  # (B, L, D)
        out.square().sum().backward()
        results.append((out.detach(), mem.grad, module.k_proj.weight.grad))
    scale = max(r.abs().max().item() for r in results[0])
    for got, want in zip(results[1], results[0], strict=True):
        _close(got, want, scale)


@pytest.mark.parametrize("n_kv, rope, qk_norm", list(itertools.product((H, 2, 1), (0, 1), (0, 1))))
@pytest.mark.parametrize("cache_kind", ["growing", "preallocated", "window"])
@torch.no_grad()
def test_cached_decoding_is_equal(n_kv, rope, qk_norm, cache_kind) -> None:
    """A prompt then one token at a time, each through its own cache (the fast class stacks
    its projections for its cache): the same outputs at every step."""
    plain, fast = _pair(n_kv, bool(qk_norm))
    torch.manual_seed(3)
    chunks, window = (5, 1, 1, 1, 1), 3
    x = torch.randn(2, sum(chunks), D)

    def new_cache():
        if cache_kind == "window":
            return SlidingWindowCache(window)
        return AttentionCache(capacity=sum(chunks) if cache_kind == "preallocated" else None)

    caches = {plain: new_cache(), fast: new_cache()}
    start = 0
    for n in chunks:
        part = x[:, start : start + n]
        win = window if cache_kind == "window" else None
        keys = caches[plain].keys_after(n) if cache_kind == "window" else start + n
        mask = causal_mask(n, keys, window=win) if n > 1 else None
        angles = _rope(torch.arange(start, start + n)) if rope else None
        want = plain(part, part, part, mask, caches[plain], angles)
        got = fast(part, part, part, mask, caches[fast], angles)
        _close(got, want)
        start += n


@pytest.mark.parametrize("n_kv", [2, 1])
@pytest.mark.parametrize("mask_kind", ["causal", "keys", "rows", "heads", "cached"])
@pytest.mark.parametrize("n", [1, 4])
@torch.no_grad()
def test_grouped_heads_read_in_place_under_a_shared_mask_are_equal(n_kv, mask_kind, n) -> None:
    """Without gradients, grouped query heads become rows of their K/V head under any mask the
    heads share (causal (L, S), a token mask (B, 1, 1, S), per-row (B, 1, L, S)); a mask per
    head (B, H, L, S) takes the copying route. Every kind gives the plain class's output."""
    plain, fast = _pair(n_kv, False)
    torch.manual_seed(4)
    past = 3 if mask_kind == "cached" else 0
    x, s = torch.randn(2, past + n, D), past + n
    keep = torch.rand(2, H, n, s) > 0.3
    keep[..., -1] = True  # every query row sees at least one key
    mask = {
        "causal": causal_mask(n, s),
        "keys": keep[:, :1, :1],  # (B, 1, 1, S)
        "rows": keep[:, :1],  # (B, 1, L, S)
        "heads": keep,  # (B, H, L, S)
        "cached": causal_mask(n, s),
    }[mask_kind]
    outs = []
    for module in (plain, fast):
        cache = AttentionCache()
        if past:
            module(x[:, :past], x[:, :past], x[:, :past], causal_mask(past), cache)
        part = x[:, past:]
        outs.append(module(part, part, part, mask, cache))
    _close(outs[1], outs[0])


@torch.no_grad()
def test_cross_attention_with_a_static_cache_is_equal() -> None:
    """Decoding against an encoder's memory: the fast class projects only Q after the first
    step and reuses the cached K, V; the plain one projects them again."""
    plain, fast = _pair(2, False)
    torch.manual_seed(4)
    memory = torch.randn(2, 6, D)
    caches = {plain: AttentionCache(static=True), fast: AttentionCache(static=True)}
    for _ in range(3):
        y = torch.randn(2, 1, D)
        want = plain(y, memory, memory, None, caches[plain])
        got = fast(y, memory, memory, None, caches[fast])
        _close(got, want)


def test_recorded_weights_are_the_plain_ones() -> None:
    plain, fast = _pair(2, True)
    x = torch.randn(2, 5, D)
    for module in (plain, fast):
        module.record_weights = True
        module(x, x, x, causal_mask(5))
    assert fast.last_weights.shape == (2, H, 5, 5)
    assert_close(fast.last_weights, plain.last_weights)


def test_fast_dropout_is_nn_dropout_when_on_and_the_identity_when_off() -> None:
    x = torch.randn(4, 50)
    drop, ref = FastDropout(0.5), nn.Dropout(0.5)
    torch.manual_seed(5)
    want = ref(x)
    torch.manual_seed(5)
    assert_close(drop(x), want)
    assert drop.eval()(x) is x
    assert FastDropout(0.0).train()(x) is x


# Route 2's stacked W^Q, W^K, W^V is kept on the module across generations: it must follow
# every change of the three weights, and training must still reach them.


def _decode(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A prompt of 4 then one row at a time through a growing cache, without gradients.

    Shape: x (B, L, D) -> (B, L, D)."""
    cache, outs = AttentionCache(), []
    with torch.no_grad():
        for chunk in (x[:, :4], *x[:, 4:].split(1, dim=1)):
            outs.append(module(chunk, chunk, chunk, cache=cache))  # (B, n, D)
    return torch.cat(outs, dim=1)  # (B, L, D)


def _assert_decodes_equal(plain: nn.Module, fast: nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    x = torch.randn(2, 7, D)
    _close(_decode(fast, x), _decode(plain, x))


@pytest.mark.parametrize("n_kv", [H, 2, 1])
def test_the_kept_stack_follows_an_optimizer_step(n_kv) -> None:
    """Generate, train both classes one step (same loss, same optimizer), generate again: the
    stack kept from the first generation is made again, and the gradients of the separate
    q/k/v weights are the plain class's."""
    plain, fast = _pair(n_kv, False)
    _assert_decodes_equal(plain, fast, 0)
    kept = fast.__dict__["_qkv_stack"][1][0]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (plain, fast)]
    x = torch.randn(2, 5, D)
    for m, opt in zip((plain, fast), opts, strict=True):
        m(x, x, x, mask=causal_mask(5)).square().sum().backward()
        opt.step()
    for name in ("q_proj", "k_proj", "v_proj"):
        got, want = getattr(fast, name).weight.grad, getattr(plain, name).weight.grad
        assert got is not None and got.abs().sum() > 0
        _close(got, want)
    assert "_qkv_stack" not in fast.__dict__  # the training pass dropped it
    _assert_decodes_equal(plain, fast, 1)
    assert not torch.equal(fast.__dict__["_qkv_stack"][1][0], kept)
    for m, opt in zip((plain, fast), opts, strict=True):  # a step with no forward before it
        torch.manual_seed(2)
        for p in m.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    _assert_decodes_equal(plain, fast, 3)


def test_the_kept_stack_follows_load_state_dict_and_in_place_writes() -> None:
    plain, fast = _pair(2, False)
    _assert_decodes_equal(plain, fast, 0)
    torch.manual_seed(5)
    with torch.no_grad():
        for p in plain.parameters():
            p.copy_(torch.randn_like(p))
    fast.load_state_dict(plain.state_dict())
    _assert_decodes_equal(plain, fast, 1)
    with torch.no_grad():  # one of the three alone, in place
        plain.v_proj.weight.mul_(-2.0)
        fast.v_proj.weight.mul_(-2.0)
    _assert_decodes_equal(plain, fast, 2)


def test_the_kept_stack_is_made_once_while_the_weights_stay() -> None:
    """The point of keeping it: a second generation reuses the first one's stack."""
    _, fast = _pair(2, False)
    x = torch.randn(2, 7, D)
    first = _decode(fast, x)
    kept = fast.__dict__["_qkv_stack"][1][0]
    assert torch.equal(_decode(fast, x), first)
    assert fast.__dict__["_qkv_stack"][1][0] is kept


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_the_kept_stack_follows_to_dtype(dtype) -> None:
    plain, fast = _pair(1, True)
    _assert_decodes_equal(plain, fast, 0)
    plain, fast = plain.to(dtype), fast.to(dtype)
    torch.manual_seed(1)
    x = torch.randn(2, 7, D, dtype=dtype)
    got, want = _decode(fast, x), _decode(plain, x)
    assert got.dtype == dtype and fast.__dict__["_qkv_stack"][1][0].dtype == dtype
    tol = 1e-10 if dtype == torch.float64 else 2e-2
    assert_close(got, want, atol=tol, rtol=tol)


def test_the_kept_stack_made_under_inference_mode_serves_no_grad_and_stays_out_of_state() -> None:
    plain, fast = _pair(2, False)
    torch.manual_seed(0)
    x = torch.randn(2, 7, D)
    with torch.inference_mode():
        in_inference = _decode(fast, x)
    assert not fast.__dict__["_qkv_stack"][1][0].is_inference()
    assert_close(_decode(fast, x), in_inference.clone())
    _close(in_inference.clone(), _decode(plain, x))
    assert list(fast.state_dict()) == list(plain.state_dict())


PACKED_LAYOUTS = [
    ([1, 1, 1], [4, 1, 7]),  # decoding only
    ([5, 3], [5, 3]),  # prompts only
    ([1, 4, 1, 1, 3], [6, 4, 1, 9, 5]),  # decoding beside prompts, one of them continued
]


@pytest.mark.parametrize("n_kv", [H, 2, 1])
@pytest.mark.parametrize("n_new, n_keys", PACKED_LAYOUTS)
@torch.no_grad()
def test_packed_requests_attend_by_request_to_the_dense_masks_values(n_kv, n_new, n_keys) -> None:
    """A PackedMask sends the fast class's attention by request (the one-token requests as a
    padded batch, each longer run as its own causal prefill): the plain class's values under the
    same mask read densely; and no score between two requests is computed, so a NaN in one
    request's values, which the dense route multiplies by a weight of zero, reaches no other."""
    plain, fast = _pair(n_kv, False)
    mask = PackedMask(n_new, n_keys)
    t, s = mask.dense.shape
    torch.manual_seed(1)
    q, k, v = torch.randn(1, H, t, DK), torch.randn(1, n_kv, s, DK), torch.randn(1, n_kv, s, DK)
    want = plain._attend(q, k, v, mask)  # (1, H, T, Dk)
    _close(fast._attend(q, k, v, mask), want)
    (q0, q1, k0, k1), *others = mask.runs()
    v[:, :, k0:k1] = float("nan")  # the first request's values
    got = fast._attend(q, k, v, mask)
    assert got[:, :, q0:q1].isnan().all()
    _close(got[:, :, q1:], want[:, :, q1:])
    assert plain._attend(q, k, v, mask)[:, :, q1:].isnan().all()  # the dense route: NaN * 0


def test_packed_requests_with_gradients_take_the_dense_route() -> None:
    """Training-style calls (gradients on) keep the plain kernel's route: same values."""
    plain, fast = _pair(2, False)
    mask = PackedMask([1, 3], [5, 3])
    q = torch.randn(1, H, 4, DK, requires_grad=True)
    k, v = torch.randn(1, 2, 8, DK), torch.randn(1, 2, 8, DK)
    _close(fast._attend(q, k, v, mask), plain._attend(q, k, v, mask))
    v[:, :, :5] = float("nan")
    assert fast._attend(q, k, v, mask)[:, :, 1:].isnan().all()  # dense: NaN * 0 everywhere
