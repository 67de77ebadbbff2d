"""Attention at length: the tiled kernel equals SDPA (forward and backward) for every mask the
course uses, causal linear attention equals its recurrent form, and the sliding-window cache
equals the full cache with the window mask while holding at most W positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from coursepkg import DecoderOnlyLM, EncoderOnlyLM, Transformer, TransformerConfig, attention
from coursepkg.efficient_attention import (
    LinearAttentionRecurrence,
    linear_attention,
    linear_attention_recurrent,
    tiled_attention,
)
from coursepkg.kv_cache import SlidingWindowCache
from coursepkg.masks import causal_mask

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _qkv(b, h, length, keys, dk, dv, seed=0, device="cpu", grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, h, length, dk), (b, h, keys, dk), (b, h, keys, dv)]
    return [torch.randn(s, generator=g).to(device).requires_grad_(grad) for s in shapes]


def _reference(q, k, v, mask):
    """SDPA, with the course's rule that a fully masked row gives zeros (SDPA gives NaN)."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (..., L, Dv)
    if mask is None:
        return out
    empty = ~mask.expand(*out.shape[:-1], k.size(-2)).any(dim=-1, keepdim=True)  # (..., L, 1)
    return out.masked_fill(empty, 0.0)


def _masks(b, length, keys, seed):
    """Every mask the course uses, broadcastable to (B, H, L, S)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, keys + 1, (b,), generator=g)
    padding = (torch.arange(keys) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    masks = {"none": None, "padding": padding}
    if length <= keys:
        masks["causal"] = causal_mask(length, keys)  # (L, S), bottom-right aligned
        masks["window"] = causal_mask(length, keys, window=3)
        masks["causal+padding"] = masks["causal"] & padding
    empty_rows = torch.rand(b, 1, length, keys, generator=g) < 0.5  # (B, 1, L, S)
    empty_rows[:, :, 0] = False  # a fully masked row
    masks["random with an empty row"] = empty_rows
    return masks


@pytest.mark.parametrize("block", [1, 4, 5, (3, 7), 64])
@pytest.mark.parametrize("length, keys", [(13, 13), (5, 17), (17, 17), (1, 9)])
def test_tiled_equals_sdpa_forward_and_backward_for_every_mask(block, length, keys):
    for name, mask in _masks(2, length, keys, seed=length * keys).items():
        q, k, v = _qkv(2, 3, length, keys, 8, 5, seed=keys, grad=True)
        out = tiled_attention(q, k, v, mask=mask, block=block)
        expected = _reference(q, k, v, mask)
        assert_close(out, expected, **TOL, msg=lambda m, name=name: f"{name}: {m}")
        grad_out = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        # The textbook path's gradient: zero rows get zero weights and no gradient either.
        text, _ = attention.scaled_dot_product_attention(q, k, v, mask)
        expected_grads = torch.autograd.grad(text, (q, k, v), grad_out)
        for got, want, which in zip(grads, expected_grads, "qkv", strict=True):
            assert_close(got, want, **TOL, msg=lambda m, w=which, n=name: f"{n}, d{w}: {m}")


def test_fully_masked_rows_give_zeros_and_zero_gradients():
    q, k, v = _qkv(1, 2, 6, 8, 4, 4, grad=True)
    mask = torch.ones(1, 1, 6, 8, dtype=torch.bool)
    mask[..., 2, :] = False
    out = tiled_attention(q, k, v, mask=mask, block=3)
    assert torch.equal(out[..., 2, :], torch.zeros_like(out[..., 2, :]))
    (grad_q,) = torch.autograd.grad(out.sum(), q)
    assert torch.isfinite(grad_q).all()
    assert torch.equal(grad_q[..., 2, :], torch.zeros_like(grad_q[..., 2, :]))


@pytest.mark.parametrize("window", [None, 1, 4])
def test_tiled_causal_flag_equals_the_causal_mask_tensor(window):
    q, k, v = _qkv(2, 2, 11, 19, 8, 8)
    mask = causal_mask(11, 19, window=window)
    flag = tiled_attention(q, k, v, block=4, causal=True, window=window)
    assert_close(flag, tiled_attention(q, k, v, mask=mask, block=4), **TOL)
    assert_close(flag, _reference(q, k, v, mask), **TOL)


@settings(max_examples=40, deadline=None)
@given(
    length=st.integers(1, 24),
    extra=st.integers(0, 12),
    dk=st.integers(1, 9),
    dv=st.integers(1, 9),
    bq=st.integers(1, 30),
    bk=st.integers(1, 30),
    kind=st.sampled_from(["none", "padding", "causal", "window", "random with an empty row"]),
    seed=st.integers(0, 2**16),
)
def test_tiled_equals_sdpa_over_shapes_and_blocks(length, extra, dk, dv, bq, bk, kind, seed):
    keys = length + extra
    mask = _masks(2, length, keys, seed)[kind]
    q, k, v = _qkv(2, 2, length, keys, dk, dv, seed=seed, grad=True)
    out = tiled_attention(q, k, v, mask=mask, block=(bq, bk))
    assert_close(out, _reference(q, k, v, mask), **TOL)
    grad_out = torch.randn_like(out)
    text, _ = attention.scaled_dot_product_attention(q, k, v, mask)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    want = torch.autograd.grad(text, (q, k, v), grad_out)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, **TOL)


def test_tiled_rejects_bad_input():
    q, k, v = _qkv(1, 1, 4, 4, 2, 2)
    with pytest.raises(ValueError, match="block"):
        tiled_attention(q, k, v, block=0)
    with pytest.raises(TypeError, match="mask"):
        tiled_attention(q, k, v, mask=torch.ones(4, 4))
    with pytest.raises(ValueError, match="window needs causal"):
        tiled_attention(q, k, v, window=2)
    with pytest.raises(ValueError, match="L <= S"):
        tiled_attention(*_qkv(1, 1, 5, 4, 2, 2), causal=True)
    with pytest.raises(ValueError, match="leading dims"):
        tiled_attention(q, k[:, :, :, :1].expand(1, 1, 4, 2)[None], v)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tiled_equals_sdpa_on_cuda():
    q, k, v = _qkv(2, 4, 300, 333, 64, 64, device="cuda", grad=True)
    for mask in (None, causal_mask(300, 333, device="cuda")):
        out = tiled_attention(q, k, v, mask=mask, block=(64, 48))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            expected = _reference(q, k, v, mask)
        # TF32 matmuls are off by default for fp32 in PyTorch, so fp32 precision holds.
        assert_close(out, expected, **TOL)
        grad_out = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), grad_out)
        want = torch.autograd.grad(expected, (q, k, v), grad_out)
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, atol=5e-5, rtol=1e-5)


# ---------------------------------------------------------------- linear attention


@settings(max_examples=30, deadline=None)
@given(
    length=st.integers(1, 20), dk=st.integers(1, 8), dv=st.integers(1, 8), seed=st.integers(0, 999)
)
def test_causal_linear_attention_equals_its_recurrent_form(length, dk, dv, seed):
    q, k, v = _qkv(2, 3, length, length, dk, dv, seed=seed)
    assert_close(linear_attention(q, k, v, causal=True), linear_attention_recurrent(q, k, v), **TOL)


def test_linear_attention_is_the_kernel_formula_and_its_state_has_a_fixed_size():
    q, k, v = _qkv(1, 2, 9, 9, 4, 3, seed=3)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    weights = phi_q @ phi_k.transpose(-2, -1)  # (1, 2, 9, 9): similarity phi(q) . phi(k)
    full = (weights / weights.sum(-1, keepdim=True)) @ v
    assert_close(linear_attention(q, k, v), full, **TOL)
    causal = weights * causal_mask(9)
    assert_close(
        linear_attention(q, k, v, causal=True), (causal / causal.sum(-1, keepdim=True)) @ v, **TOL
    )
    recurrence = LinearAttentionRecurrence()
    sizes = set()
    for t in range(9):
        recurrence.step(q[..., t, :], k[..., t, :], v[..., t, :])
        sizes.add((recurrence.state.numel(), recurrence.norm.numel()))
    assert sizes == {(1 * 2 * 4 * 3, 1 * 2 * 4)}
    with pytest.raises(ValueError, match="L == S"):
        linear_attention(q, k[..., :5, :], v[..., :5, :], causal=True)


# ---------------------------------------------------------------- the sliding-window cache


@pytest.mark.parametrize("window", [1, 3, 8, 40])
@pytest.mark.parametrize("chunks", [[1] * 20, [5, 1, 1, 7, 1, 2, 3], [20]])
def test_window_cache_equals_the_full_cache_with_the_window_mask(window, chunks):
    total = sum(chunks)
    q, k, v = _qkv(2, 3, total, total, 6, 5, seed=window)
    expected = _reference(q, k, v, causal_mask(total, window=window))  # all at once
    cache, outputs, start = SlidingWindowCache(window), [], 0
    for n in chunks:
        end = start + n
        keys, values = cache.update(k[..., start:end, :], v[..., start:end, :])
        assert keys.size(2) == min(start, window - 1) + n  # only what the new queries need
        assert cache.k.size(2) == window  # the ring never grows past W
        mask = causal_mask(n, keys.size(2), window=window)
        outputs.append(_reference(q[..., start:end, :], keys, values, mask))
        start = end
    assert_close(torch.cat(outputs, dim=2), expected, **TOL)
    assert cache.length == total


def test_window_cache_memory_is_bounded_by_the_window():
    cache = SlidingWindowCache(window=16)
    for _ in range(500):
        keys, _ = cache.update(torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8))
        assert keys.size(2) <= 16
    held = sum(t.numel() * t.element_size() for t in (cache.k, cache.v))
    assert held == 2 * (2 * 4 * 16 * 8) * 4  # two rings of W positions, after 500 steps
    with pytest.raises(ValueError, match="window"):
        SlidingWindowCache(0)
    with pytest.raises(ValueError, match="window"):
        causal_mask(3, window=0)


def test_causal_mask_window_keeps_the_last_w_positions():
    mask = causal_mask(4, 6, window=2)
    for i in range(4):
        absolute = i + 2
        assert mask[i].nonzero().flatten().tolist() == [absolute - 1, absolute]
    assert torch.equal(causal_mask(5, 7, window=100), causal_mask(5, 7))


# ---------------------------------------------------------------- the decoder's sliding window


def _windowed_lm(window, n_layers=2):
    torch.manual_seed(0)
    sizes = dict(vocab_size=23, d_model=16, n_heads=2, d_ff=32, max_len=64, dropout=0.0)
    config = TransformerConfig(**sizes, n_layers=n_layers, norm_first=True, sliding_window=window)
    return DecoderOnlyLM(config).eval()


@pytest.mark.parametrize("window", [1, 3, 7])
def test_decoder_window_cache_equals_the_full_forward_with_the_window_mask(window):
    lm = _windowed_lm(window)
    tokens = torch.randint(23, (2, 30), generator=torch.Generator().manual_seed(window))
    full = lm(tokens)  # (2, 30, V), whole sequence under causal_mask(window=W)
    cache, pieces, start = lm.new_cache(), [], 0
    for n in (4, 1, 1, 9, 1, 14):  # a prompt, single steps and chunks
        pieces.append(lm(tokens[:, start : start + n], cache=cache))
        start += n
        for layer_cache in cache.self_attn:
            assert isinstance(layer_cache, SlidingWindowCache)
            assert layer_cache.k.size(2) == window  # bounded by W, not by the 30 positions
    assert_close(torch.cat(pieces, dim=1), full, **TOL)
    greedy = lm.generate(tokens[:, :5], 20, use_cache=True)
    assert torch.equal(greedy, lm.generate(tokens[:, :5], 20, use_cache=False))


def test_decoder_window_limits_what_the_last_position_can_depend_on():
    window, layers = 3, 2
    lm = _windowed_lm(window, layers)
    tokens = torch.randint(23, (1, 20), generator=torch.Generator().manual_seed(0))
    reach = layers * (window - 1) + 1  # positions the last one can depend on
    changed = tokens.clone()
    changed[0, : 20 - reach] = (changed[0, : 20 - reach] + 1) % 23  # all beyond the reach
    assert_close(lm(changed)[0, -1], lm(tokens)[0, -1], **TOL)
    changed = tokens.clone()
    changed[0, 20 - reach] = (changed[0, 20 - reach] + 1) % 23  # the farthest one within it
    assert not torch.allclose(lm(changed)[0, -1], lm(tokens)[0, -1])


def test_sliding_window_config_is_checked_and_rejected_where_unsupported():
    with pytest.raises(ValueError, match="sliding_window must be a positive integer"):
        TransformerConfig(vocab_size=10, d_model=8, n_heads=2, sliding_window=0)
    config = TransformerConfig(vocab_size=10, d_model=8, n_heads=2, d_ff=8, sliding_window=4)
    for model in (Transformer, EncoderOnlyLM):
        with pytest.raises(ValueError, match="does not support sliding_window=4"):
            model(config)


def test_decoder_window_cache_with_a_token_mask_equals_the_full_forward():
    lm = _windowed_lm(4)
    tokens = torch.randint(23, (2, 12), generator=torch.Generator().manual_seed(5))
    token_mask = torch.ones(2, 12, dtype=torch.bool)
    token_mask[0, :3] = False  # left padding in one row
    full = lm(tokens, token_mask)  # (2, 12, V)
    cache, pieces = lm.new_cache(), []
    for start, end in ((0, 5), (5, 6), (6, 12)):
        pieces.append(lm(tokens[:, start:end], token_mask[:, :end], cache=cache))
    assert_close(torch.cat(pieces, dim=1), full, **TOL)
