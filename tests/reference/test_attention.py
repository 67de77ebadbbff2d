"""Scaled dot-product attention (textbook path == fast path == a naive loop) and multi-head
attention (shapes, paths, per-head structure, gradients, cache). Masks: bool, True = may attend."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from coursepkg import MultiHeadAttention, attention_fast, causal_mask, scaled_dot_product_attention
from coursepkg.kv_cache import AttentionCache


def _rand(*shape: int, dtype: torch.dtype = torch.float32, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def _make_mask(kind: str, b: int, h: int, n_q: int, n_k: int) -> torch.Tensor | None:
    """Masks of several broadcast shapes; every query row keeps at least one key."""
    if kind == "none":
        return None
    if kind == "causal":  # (L, S), bottom-right aligned
        return causal_mask(n_q, n_k)
    if kind == "keys":  # (B, 1, 1, S): padding of the keys
        lengths = torch.randint(1, n_k + 1, (b,))
        return (torch.arange(n_k)[None, :] < lengths[:, None])[:, None, None, :]
    if kind == "per_head":  # (1, H, L, S)
        m = torch.rand(1, h, n_q, n_k) < 0.5
    elif kind == "full":  # (B, H, L, S)
        m = torch.rand(b, h, n_q, n_k) < 0.5
    else:
        raise AssertionError(kind)
    keep = torch.randint(0, n_k, m.shape[:-1])  # one surviving key per row
    return m.scatter(-1, keep[..., None], True)


CASES = [
    # (B, H, L, S, Dk, Dv)
    (2, 3, 4, 4, 8, 8),
    (2, 3, 3, 5, 4, 6),  # L < S, Dk != Dv
    (1, 2, 6, 2, 5, 3),  # L > S
    (3, 1, 1, 7, 2, 9),  # a single query
]


def _with_masks(cases, kinds, lengths):
    """Every (case, mask kind) pair, except causal masks with more queries than keys;
    ``lengths`` gives the positions of L and S in a case."""
    i, j = lengths
    return [(*c, k) for c in cases for k in kinds if not (k == "causal" and c[i] > c[j])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("b", "h", "n_q", "n_k", "dk", "dv", "mask_kind"),
    _with_masks(CASES, ["none", "causal", "keys", "per_head", "full"], (2, 3)),
)
def test_textbook_path_equals_fast_path(b, h, n_q, n_k, dk, dv, mask_kind, dtype) -> None:
    q, k = _rand(b, h, n_q, dk, dtype=dtype), _rand(b, h, n_k, dk, dtype=dtype)
    v = _rand(b, h, n_k, dv, dtype=dtype)
    mask = _make_mask(mask_kind, b, h, n_q, n_k)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (b, h, n_q, dv) and weights.shape == (b, h, n_q, n_k)
    assert out.dtype == dtype
    assert_close(out, attention_fast(q, k, v, mask))


@pytest.mark.parametrize("mask_kind", ["none", "causal", "full"])
def test_paths_agree_on_three_dimensional_inputs(mask_kind) -> None:
    q, k, v = _rand(2, 3, 4), _rand(2, 5, 4), _rand(2, 5, 6)
    mask = _make_mask(mask_kind, 2, 1, 3, 5)
    mask = mask if mask is None or mask.dim() == 2 else mask[:, 0]  # (B, L, S) or (L, S)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (2, 3, 6) and weights.shape == (2, 3, 5)
    assert_close(out, attention_fast(q, k, v, mask))


def _naive_attention(q, k, v, mask):
    """Row by row in plain Python floats: the definition, with no tensor tricks."""
    b, n_q, dk = q.shape
    n_k, dv = k.shape[1], v.shape[2]
    out = torch.zeros(b, n_q, dv, dtype=torch.float64)
    for bi in range(b):
        for i in range(n_q):
            allowed = [j for j in range(n_k) if mask is None or bool(mask[bi, i, j])]
            if not allowed:
                continue  # a query with no visible key gets a zero output
            scores = {
                j: sum(float(q[bi, i, c]) * float(k[bi, j, c]) for c in range(dk)) / math.sqrt(dk)
                for j in allowed
            }
            top = max(scores.values())
            exps = {j: math.exp(s - top) for j, s in scores.items()}
            z = sum(exps.values())
            for j in allowed:
                for c in range(dv):
                    out[bi, i, c] += exps[j] / z * float(v[bi, j, c])
    return out


@pytest.mark.parametrize("masked", [False, True])
def test_textbook_path_equals_naive_loop(masked) -> None:
    q, k = _rand(2, 3, 3, dtype=torch.float64), _rand(2, 4, 3, dtype=torch.float64)
    v = _rand(2, 4, 2, dtype=torch.float64)
    mask = None
    if masked:
        mask = torch.tensor(
            [
                [[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]],  # the last row is fully masked
                [[0, 0, 0, 1], [1, 1, 0, 0], [0, 1, 1, 1]],
            ],
            dtype=torch.bool,
        )
    want = _naive_attention(q, k, v, mask)
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    assert_close(out, want)
    assert_close(attention_fast(q, k, v, mask), want)


@pytest.mark.parametrize("mask_kind", ["none", "causal", "full"])
def test_weights_rows_sum_to_one_and_masked_weights_are_zero(mask_kind) -> None:
    q, k, v = _rand(2, 2, 4, 8), _rand(2, 2, 5, 8), _rand(2, 2, 5, 3)
    mask = _make_mask(mask_kind, 2, 2, 4, 5)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert_close(weights.sum(-1), torch.ones(2, 2, 4))
    assert bool((weights >= 0).all())
    if mask is not None:
        assert bool((weights.masked_select(~mask.expand_as(weights)) == 0).all())


@pytest.mark.parametrize("path", ["textbook", "fast"])
def test_fully_masked_row_gives_zeros_and_finite_gradients(path) -> None:
    q, k = _rand(2, 2, 3, 4, grad=True), _rand(2, 2, 5, 4, grad=True)
    v = _rand(2, 2, 5, 6, grad=True)
    mask = torch.ones(2, 2, 3, 5, dtype=torch.bool)
    mask[0, 1, 2] = False  # one query of one head sees nothing
    mask[1, :, 0] = False  # query 0 of batch 1 sees nothing, in every head
    if path == "textbook":
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        assert not weights.isnan().any()
        assert bool((weights[0, 1, 2] == 0).all()) and bool((weights[1, :, 0] == 0).all())
    else:
        out = attention_fast(q, k, v, mask)
    assert not out.isnan().any()
    assert torch.equal(out[0, 1, 2], torch.zeros(6))
    assert torch.equal(out[1, :, 0], torch.zeros(2, 6))
    (out * torch.randn_like(out)).sum().backward()
    for name, t in (("query", q), ("key", k), ("value", v)):
        assert torch.isfinite(t.grad).all(), f"NaN/inf in the gradient of {name}"
    # the output of a blind query is a constant 0, so its query gets no gradient
    assert torch.equal(q.grad[0, 1, 2], torch.zeros(4))
    assert torch.equal(q.grad[1, :, 0], torch.zeros(2, 4))
    assert q.grad.abs().sum() > 0


@pytest.mark.parametrize("path", ["textbook", "fast"])
def test_mask_true_means_may_attend(path) -> None:
    def attend(q, k, v, mask):
        if path == "textbook":
            return scaled_dot_product_attention(q, k, v, mask)[0]
        return attention_fast(q, k, v, mask)

    q, k, v = _rand(2, 3, 4), _rand(2, 5, 4), _rand(2, 5, 6)
    # Only key 3 allowed: the output is exactly value 3 (one-hot weights).
    only = torch.zeros(5, dtype=torch.bool)
    only[3] = True
    assert_close(attend(q, k, v, only), v[:, 3:4].expand(2, 3, 6))
    # Masking key 1: its weight is exactly 0, and its key and value no longer matter.
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[:, :, 1] = False
    out = attend(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    k2[:, 1] += 100.0 * torch.randn(2, 4)
    v2[:, 1] += 100.0 * torch.randn(2, 6)
    assert torch.equal(attend(q, k2, v2, mask), out)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert bool((weights[..., 1] == 0).all())
    # ... while without the mask, changing value 1 does change the output.
    assert not torch.allclose(attend(q, k, v2, None), attend(q, k, v, None))


def test_textbook_dropout_returns_weights_before_dropout() -> None:
    q, k, v = _rand(2, 4, 8), _rand(2, 6, 8), _rand(2, 6, 3)
    plain, w_plain = scaled_dot_product_attention(q, k, v)
    dropped, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert_close(w, w_plain)
    assert not torch.allclose(dropped, plain)


# ----------------------------------------------------------------------- MultiHeadAttention
MHA_CASES = [
    # (D, H, Dk, Dv, L, S)
    (8, 2, None, None, 4, 4),
    (8, 2, 3, 5, 3, 6),  # Dk != Dv, L < S
    (6, 4, 2, 3, 5, 2),  # D not divisible by H, L > S
    (12, 3, None, None, 1, 7),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("d", "h", "dk", "dv", "n_q", "n_k"), MHA_CASES)
def test_mha_shapes(d, h, dk, dv, n_q, n_k, bias) -> None:
    mha = MultiHeadAttention(d, h, dk, dv, bias=bias)
    dk, dv = dk or d // h, dv or d // h
    assert mha.q_proj.weight.shape == (h * dk, d) and mha.k_proj.weight.shape == (h * dk, d)
    assert mha.v_proj.weight.shape == (h * dv, d) and mha.out_proj.weight.shape == (d, h * dv)
    assert (mha.q_proj.bias is None) is (not bias)
    out = mha(_rand(2, n_q, d), _rand(2, n_k, d), _rand(2, n_k, d))
    assert out.shape == (2, n_q, d)


@pytest.mark.parametrize(
    ("d", "h", "dk", "dv", "n_q", "n_k", "mask_kind"),
    _with_masks(MHA_CASES, ["none", "keys", "full", "causal"], (4, 5)),
)
def test_mha_record_weights_path_equals_fast_path(d, h, dk, dv, n_q, n_k, mask_kind) -> None:
    mha = MultiHeadAttention(d, h, dk, dv).eval()
    x, mem = _rand(2, n_q, d), _rand(2, n_k, d)
    mask = _make_mask(mask_kind, 2, h, n_q, n_k)
    fast = mha(x, mem, mem, mask)
    assert mha.last_weights is None
    mha.record_weights = True
    slow = mha(x, mem, mem, mask)
    assert_close(slow, fast)
    assert mha.last_weights.shape == (2, h, n_q, n_k)
    assert_close(mha.last_weights.sum(-1), torch.ones(2, h, n_q))


def _per_head_by_hand(mha: MultiHeadAttention, x, mem, mask):
    """Each head from the projection weights, then out = sum_h head_h W^O_h^T + b^O."""
    dk, dv = mha.d_k, mha.d_v
    heads = []
    for hd in range(mha.n_heads):
        sk, sv = slice(hd * dk, (hd + 1) * dk), slice(hd * dv, (hd + 1) * dv)
        q = x @ mha.q_proj.weight[sk].T + mha.q_proj.bias[sk]  # (B, L, Dk)
        k = mem @ mha.k_proj.weight[sk].T + mha.k_proj.bias[sk]  # (B, S, Dk)
        v = mem @ mha.v_proj.weight[sv].T + mha.v_proj.bias[sv]  # (B, S, Dv)
        scores = q @ k.transpose(1, 2) / math.sqrt(dk)  # (B, L, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        head = torch.softmax(scores, -1) @ v  # (B, L, Dv)
        heads.append(head @ mha.out_proj.weight[:, sv].T)  # (B, L, D): head h's contribution
    return heads


@torch.no_grad()
@pytest.mark.parametrize(("d", "h", "dk", "dv", "n_q", "n_k"), MHA_CASES)
def test_mha_heads_are_independent(d, h, dk, dv, n_q, n_k) -> None:
    mha = MultiHeadAttention(d, h, dk, dv).double()
    nn.init.normal_(mha.out_proj.bias)
    nn.init.normal_(mha.q_proj.bias)
    x, mem = _rand(2, n_q, d, dtype=torch.float64), _rand(2, n_k, d, dtype=torch.float64)
    mask = torch.rand(2, 1, n_k) < 0.7
    mask[:, :, 0] = True  # (B, 1, S): padding of the keys
    contributions = _per_head_by_hand(mha, x, mem, mask)
    full = mha(x, mem, mem, mask[:, None])
    assert_close(full, sum(contributions) + mha.out_proj.bias)
    for hd in range(h):
        sv = slice(hd * mha.d_v, (hd + 1) * mha.d_v)
        saved = mha.out_proj.weight[:, sv].clone()
        mha.out_proj.weight[:, sv] = 0.0  # silence head hd
        without = mha(x, mem, mem, mask[:, None])
        mha.out_proj.weight[:, sv] = saved
        assert_close(full - without, contributions[hd])


def test_mha_gradients_reach_every_parameter() -> None:
    mha = MultiHeadAttention(8, 2, 3, 5)
    x, mem = _rand(2, 3, 8, grad=True), _rand(2, 4, 8, grad=True)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])[:, None, None]
    (mha(x, mem, mem, mask) * torch.randn(2, 3, 8)).sum().backward()
    for name, p in mha.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert x.grad.abs().sum() > 0 and mem.grad.abs().sum() > 0
    assert torch.equal(mem.grad[1, 2:], torch.zeros(2, 8))  # masked keys get no gradient


def test_mha_matches_torch_multihead_attention_with_inverted_mask() -> None:
    """nn.MultiheadAttention uses the opposite mask meaning (True = blocked)."""
    ours = MultiHeadAttention(8, 2).eval()
    ref = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(
            torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
        )
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    x, mem = _rand(2, 3, 8), _rand(2, 5, 8)
    keep = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    want, _ = ref(x, mem, mem, key_padding_mask=~keep)
    assert_close(ours(x, mem, mem, keep[:, None, None]), want)


@torch.no_grad()
@pytest.mark.parametrize("chunks", [(1, 1, 1, 1, 1), (2, 3), (4, 1)])
def test_mha_growing_cache_equals_full_causal_attention(chunks) -> None:
    mha = MultiHeadAttention(8, 2, 3, 5).eval()
    x = _rand(2, sum(chunks), 8)
    full = mha(x, x, x, causal_mask(x.size(1)))
    cache, outs, start = AttentionCache(), [], 0
    for n in chunks:
        part = x[:, start : start + n]
        mask = causal_mask(n, start + n)
        outs.append(mha(part, part, part, mask, cache=cache))
        start += n
        assert cache.length == start
    assert_close(torch.cat(outs, 1), full)
