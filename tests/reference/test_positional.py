"""Positional information: the sinusoidal table (formula, relative-position property, odd widths)
and the two modules that add positions (fixed sinusoidal, learned)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from coursepkg import LearnedPositionalEmbedding, SinusoidalPositionalEncoding, sinusoidal_table


@pytest.mark.parametrize("d_model", [4, 7, 16, 33])
def test_table_matches_the_formula(d_model) -> None:
    table = sinusoidal_table(50, d_model)
    assert table.shape == (50, d_model) and table.dtype == torch.float32
    for pos in (0, 1, 7, 49):
        for col in range(d_model):
            i = col // 2  # the pair index: columns 2i and 2i+1 share a frequency
            angle = pos / 10000 ** (2 * i / d_model)
            want = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert table[pos, col].item() == pytest.approx(want, abs=1e-6), (pos, col)


def test_first_row_and_bounds() -> None:
    table = sinusoidal_table(100, 10)
    assert torch.equal(table[0], torch.tensor([0.0, 1.0] * 5))
    assert bool((table.abs() <= 1).all())
    # column 0 is sin(pos): the highest frequency, wavelength 2*pi
    assert_close(table[:, 0], torch.sin(torch.arange(100.0)))


@pytest.mark.parametrize("d_model", [8, 16, 64])
def test_dot_product_depends_only_on_the_offset(d_model) -> None:
    """PE(pos+k) . PE(pos) = sum_i cos(k w_i): a function of k alone (for even D)."""
    table = sinusoidal_table(200, d_model).double()
    freqs = 1.0 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    for k in (0, 1, 3, 10, 50):
        dots = torch.stack([table[p + k] @ table[p] for p in (0, 5, 17, 60, 120)])
        assert_close(
            dots, torch.full_like(dots, float(torch.cos(k * freqs).sum())), atol=1e-5, rtol=0
        )
    assert_close(table[3] @ table[3], torch.tensor(d_model / 2, dtype=torch.float64))


def test_odd_width_keeps_the_last_sine() -> None:
    table = sinusoidal_table(20, 7)
    pos = torch.arange(20.0)
    assert_close(table[:, 6], torch.sin(pos / 10000 ** (6 / 7)))  # no cosine partner
    assert_close(table[:, 5], torch.cos(pos / 10000 ** (4 / 7)))
    # the first six columns of D=7 use exponents 2i/7, unlike those of D=8
    assert not torch.allclose(sinusoidal_table(20, 8)[1:, 2], table[1:, 2])


def test_sinusoidal_module_adds_the_table() -> None:
    pe = SinusoidalPositionalEncoding(d_model=6, max_len=10)
    assert list(pe.parameters()) == []
    assert "table" not in pe.state_dict()  # a fixed, non-persistent buffer
    x = torch.randn(2, 4, 6)
    assert_close(pe(x), x + sinusoidal_table(10, 6)[:4])
    assert_close(pe(x, offset=3), x + sinusoidal_table(10, 6)[3:7])
    x64 = x.double()
    assert pe(x64).dtype == torch.float64


def test_learned_module_adds_its_rows_and_trains_only_them() -> None:
    pe = LearnedPositionalEmbedding(d_model=6, max_len=10)
    assert pe.weight.shape == (10, 6) and pe.weight.requires_grad
    x = torch.randn(2, 4, 6)
    assert_close(pe(x, offset=2), x + pe.weight[2:6])
    pe(x, offset=2).sum().backward()
    used = torch.zeros(10, dtype=torch.bool)
    used[2:6] = True
    assert bool((pe.weight.grad[used] != 0).all()) and bool((pe.weight.grad[~used] == 0).all())


@pytest.mark.parametrize("cls", [SinusoidalPositionalEncoding, LearnedPositionalEmbedding])
def test_modules_reject_sequences_longer_than_max_len(cls) -> None:
    pe = cls(d_model=4, max_len=5)
    assert pe(torch.zeros(1, 5, 4)).shape == (1, 5, 4)  # exactly max_len is fine
    with pytest.raises(ValueError, match="max_len"):
        pe(torch.zeros(1, 6, 4))
    with pytest.raises(ValueError, match="max_len"):
        pe(torch.zeros(1, 2, 4), offset=4)  # positions 4 and 5; 5 is past the table


def test_table_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="max_len"):
        sinusoidal_table(0, 4)
    with pytest.raises(ValueError, match="d_model"):
        sinusoidal_table(4, 0)
