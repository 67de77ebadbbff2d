"""causal_mask (bottom-right aligned, True = may attend), padding_mask (True = real token) and
the packed requests' mask (each token sees its own request's past only)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg import causal_mask, padding_mask
from coursepkg.masks import PackedMask, as_mask, key_mask


@pytest.mark.parametrize("length", [1, 2, 5])
def test_square_causal_mask_is_lower_triangular(length) -> None:
    m = causal_mask(length)
    assert m.dtype == torch.bool and m.shape == (length, length)
    want = torch.tensor([[j <= i for j in range(length)] for i in range(length)])
    assert torch.equal(m, want)
    assert bool(m.diagonal().all())  # a position attends to itself


@pytest.mark.parametrize(("query_len", "key_len"), [(1, 1), (1, 6), (2, 5), (3, 7), (4, 4)])
def test_causal_mask_bottom_right_alignment(query_len, key_len) -> None:
    m = causal_mask(query_len, key_len)
    assert m.shape == (query_len, key_len)
    offset = key_len - query_len  # query i sits at absolute position i + offset
    for i in range(query_len):
        for j in range(key_len):
            assert bool(m[i, j]) == (j <= i + offset), (i, j)
        assert bool(m[i, i + offset])  # the diagonal (the query itself) is included
    assert bool(m[-1].all())  # the newest query sees every key
    # With a KV cache the new queries' rows are the last rows of the full square mask.
    assert torch.equal(m, causal_mask(key_len)[offset:])


def test_causal_mask_device_and_errors() -> None:
    assert causal_mask(3, device="cpu").device.type == "cpu"
    assert causal_mask(0, 3).shape == (0, 3)
    with pytest.raises(ValueError, match="query_len"):
        causal_mask(4, 3)


def test_padding_mask() -> None:
    tokens = torch.tensor([[5, 6, 7, 0, 0], [3, 0, 4, 0, 0]])
    m = padding_mask(tokens, pad_id=0)
    assert m.dtype == torch.bool and m.shape == tokens.shape
    want = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(m, want)
    assert bool(padding_mask(tokens, pad_id=9).all())


def test_key_mask_hides_padded_keys_from_every_query() -> None:
    token_mask = torch.tensor([[True, True, False], [True, False, False]])
    km = key_mask(token_mask)
    assert km.shape == (2, 1, 1, 3)
    full = km.expand(2, 4, 5, 3)  # (B, H, L, S)
    assert torch.equal(full[:, :, :, 2], torch.zeros(2, 4, 5, dtype=torch.bool))
    assert torch.equal(full[1, :, :, 1], torch.zeros(4, 5, dtype=torch.bool))
    assert bool(full[:, :, :, 0].all())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 5), st.integers(0, 6)), min_size=1, max_size=6
    )  # (new tokens, past keys) of each request
)
def test_a_packed_mask_lets_each_token_see_its_own_requests_past_and_itself(runs) -> None:
    n_new = [n for n, _ in runs]
    n_keys = [n + past for n, past in runs]
    mask = PackedMask(n_new, n_keys)
    tokens = [(r, past + j) for r, (n, past) in enumerate(runs) for j in range(n)]
    keys = [(r, p) for r, k in enumerate(n_keys) for p in range(k)]
    want = torch.tensor([[kr == tr and kp <= tp for kr, kp in keys] for tr, tp in tokens])
    assert torch.equal(mask.dense, want) and as_mask(mask) is mask.dense
    assert mask.query_request.tolist() == [r for r, _ in tokens]
    assert mask.query_position.tolist() == [p for _, p in tokens]
    assert mask.key_request.tolist() == [r for r, _ in keys]
    assert mask.key_position.tolist() == [p for _, p in keys]
    for (q0, q1, k0, k1), n, k in zip(mask.runs(), n_new, n_keys, strict=True):
        assert (q1 - q0, k1 - k0) == (n, k)
        assert torch.equal(mask.dense[q0:q1, k0:k1], causal_mask(n, k))  # its own block: causal
    rows, index, real = mask.one_token_rows()
    decoding = [i for i, n in enumerate(n_new) if n == 1]
    assert rows.tolist() == [mask.runs()[i][0] for i in decoding]
    for row, i in enumerate(decoding):
        k0, k1 = mask.runs()[i][2:]
        assert index[row][real[row, 0, 0]].tolist() == list(range(k0, k1))  # its keys, in order
    assert not isinstance(mask, torch.Tensor)  # a structure that holds its mask, no subclass


def test_bad_packed_counts_are_named() -> None:
    with pytest.raises(ValueError, match="n_new must be one positive count per request"):
        PackedMask([1, 0], [1, 2])
    with pytest.raises(ValueError, match="as many as n_keys"):
        PackedMask([1, 1], [3])
    with pytest.raises(ValueError, match="each of n_keys must be at least its n_new"):
        PackedMask([3], [2])
