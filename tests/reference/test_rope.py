"""apply_rope (issue 30): against the complex-number form, Hugging Face's, and its relative
position property."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg.positional import apply_rope


def _complex_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Interleaved RoPE as Meta's original Llama writes it: pairs as complex numbers times
    exp(i * pos * theta^(-2k/Dh)), in float64."""
    dh = x.shape[-1]
    freqs = theta ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)  # (Dh/2,)
    turn = torch.polar(torch.ones(1, dtype=torch.float64), positions[:, None].double() * freqs)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], dh // 2, 2).contiguous())
    return torch.view_as_real(z * turn).flatten(-2)


@settings(max_examples=25, deadline=None)
@given(
    half=st.integers(1, 8),
    length=st.integers(1, 9),
    start=st.integers(0, 500),
    theta=st.sampled_from([100.0, 10000.0, 500000.0]),
    seed=st.integers(0, 2**16),
)
def test_interleaved_is_the_complex_product(half, length, start, theta, seed) -> None:
    x = torch.randn(2, 3, length, 2 * half, generator=torch.Generator().manual_seed(seed))
    pos = torch.arange(start, start + length)
    expected = _complex_rope(x, pos, theta).float()
    torch.testing.assert_close(
        apply_rope(x, pos, theta, "interleaved"), expected, atol=2e-4, rtol=1e-4
    )
    # "halves" is the same rotation on columns (0, Dh/2), (1, Dh/2 + 1), ...
    perm = torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).flatten()
    halves = apply_rope(x[..., torch.argsort(perm)], pos, theta, "halves")
    torch.testing.assert_close(halves[..., perm], expected, atol=2e-4, rtol=1e-4)


@settings(max_examples=30, deadline=None)
@given(
    pairs=st.sampled_from(["halves", "interleaved"]),
    m=st.integers(0, 300),
    n=st.integers(0, 300),
    shift=st.integers(-300, 300),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_only_on_the_offset(pairs, m, n, shift, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    m2, n2 = m + max(shift, -min(m, n)), n + max(shift, -min(m, n))  # positions stay >= 0

    def score(a: int, b: int) -> torch.Tensor:
        qa = apply_rope(q, torch.tensor([a]), pairs=pairs)
        kb = apply_rope(k, torch.tensor([b]), pairs=pairs)
        return (qa * kb).sum()

    torch.testing.assert_close(score(m, n), score(m2, n2), atol=1e-3, rtol=1e-4)
    # and the rotation keeps lengths, and position 0 is the identity
    torch.testing.assert_close(apply_rope(q, torch.tensor([m]), pairs=pairs).norm(), q.norm())
    torch.testing.assert_close(apply_rope(q, torch.tensor([0]), pairs=pairs), q)


def test_halves_equals_hugging_face_llama() -> None:
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=32, num_attention_heads=2, rope_theta=5000.0)
    rotary = llama.LlamaRotaryEmbedding(config)
    q, k = torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    pos = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [0, 1, 2, 3, 4, 5, 6]])  # (B, L), per row
    cos, sin = rotary(q, pos)
    hf_q, hf_k = llama.apply_rotary_pos_emb(q, k, cos, sin)
    theta = rotary.inv_freq[1].item() ** (-16 / 2)  # the base the config resolved to
    assert theta == pytest.approx(5000.0, rel=1e-3)
    torch.testing.assert_close(apply_rope(q, pos, theta, "halves"), hf_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(apply_rope(k, pos, theta, "halves"), hf_k, atol=1e-5, rtol=1e-5)


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="even head width, got x.shape.-1.=3"):
        apply_rope(torch.zeros(1, 1, 2, 3), torch.arange(2))
    with pytest.raises(ValueError, match="pairs must be .* got 'adjacent'"):
        apply_rope(torch.zeros(1, 1, 2, 4), torch.arange(2), pairs="adjacent")
