"""Today's decoder in the reference (issue 30): rotary positions inside self-attention,
grouped-query attention and its cache, QK-norm, an untied head: DecoderOnlyLM as Llama/Qwen3."""

from __future__ import annotations

import math

import pytest
import torch

from coursepkg import TransformerConfig
from coursepkg.attention import MultiHeadAttention
from coursepkg.encoder_only import EncoderOnlyLM
from coursepkg.model import DecoderOnlyLM, Transformer
from coursepkg.positional import RopeAngles, rope_frequencies

V = 53


def _config(**kw) -> TransformerConfig:
    fields = dict(
        vocab_size=V, d_model=32, n_heads=4, d_ff=48, n_layers=2, dropout=0.0, max_len=64,
        positional="rope", norm_first=True, norm="rmsnorm", activation="swiglu", bias=False,
        scale_embeddings=False,
    )  # fmt: skip
    fields.update(kw)
    return TransformerConfig(**fields)


def _lm(seed: int = 0, **kw) -> DecoderOnlyLM:
    torch.manual_seed(seed)
    return DecoderOnlyLM(_config(**kw)).eval()


def _tokens(b: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, n), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- RoPE
@pytest.mark.parametrize("pairs", ["halves", "interleaved"])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("chunks", [(9,), (4, 1, 1, 3), (1,) * 9])
def test_rope_cache_equals_no_cache(pairs, window, chunks) -> None:
    """Decoding with the cache turns the new keys by positions past + i: the logits equal one
    pass over the whole sequence, however it is cut into steps (a sliding window too)."""
    lm = _lm(rope_pairs=pairs, sliding_window=window)
    tokens = _tokens(2, sum(chunks))
    with torch.no_grad():
        full = lm(tokens)
        cache, out, start = lm.new_cache(), [], 0
        for n in chunks:
            out.append(lm(tokens[:, start : start + n], cache=cache))
            start += n
    torch.testing.assert_close(torch.cat(out, dim=1), full, atol=1e-5, rtol=1e-5)
    assert torch.equal(lm.generate(tokens[:, :3], 12), lm.generate(tokens[:, :3], 12, False))


@pytest.mark.parametrize("pairs", ["halves", "interleaved"])
@pytest.mark.parametrize("shift", [1, 7, 40])
def test_rope_model_depends_only_on_offsets(pairs, shift) -> None:
    """Scores depend only on m - n, and values are not turned: moving every position by the
    same amount leaves the logits unchanged (a position table would change them)."""
    lm = _lm(rope_pairs=pairs)
    tokens = _tokens(2, 10)
    with torch.no_grad():
        at_zero = lm(tokens)
        shifted = lm(tokens, positions=torch.arange(10) + shift)
        moved = lm(tokens, positions=torch.arange(10) * 2)  # other offsets: other logits
    torch.testing.assert_close(shifted, at_zero, atol=2e-5, rtol=1e-4)
    assert (moved - at_zero).abs().max() > 1e-3


def _independent_rope(x: torch.Tensor, pos: torch.Tensor, theta: float, pairs: str):
    """RoPE from its definition, in float64: pair (x_j, x_j') turned by pos * theta^(-2i/Dh),
    with j, j' = i, i + Dh/2 ("halves") or 2i, 2i + 1 ("interleaved")."""
    dh = x.shape[-1]
    out = x.double().clone()
    for i in range(dh // 2):
        j, k = (i, i + dh // 2) if pairs == "halves" else (2 * i, 2 * i + 1)
        angle = pos.double() * theta ** (-2.0 * i / dh)  # (L,)
        c, s = torch.cos(angle)[:, None], torch.sin(angle)[:, None]  # (L, 1)
        a, b = x[..., :, j].double(), x[..., :, k].double()  # (B, H, L)
        out[..., j] = a * c.squeeze(-1) - b * s.squeeze(-1)
        out[..., k] = a * s.squeeze(-1) + b * c.squeeze(-1)
    return out


@pytest.mark.parametrize("pairs", ["halves", "interleaved"])
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_attention_with_rope_equals_the_formula(pairs, theta) -> None:
    """MultiHeadAttention with RoPE: softmax(R(q) R(k)^T / sqrt(Dk)) v W^O, q, k turned by their
    own positions (offset 5, as after 5 cached tokens), v not, computed independently."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, bias=False).eval()
    x = torch.randn(2, 6, 32)
    pos = torch.arange(5, 11)
    rope = RopeAngles(pos, rope_frequencies(8, theta), pairs)
    with torch.no_grad():
        ours = attn(x, x, x, rope=rope)

        def heads(w):
            return (x @ w.T).view(2, 6, 4, 8).transpose(1, 2).double()  # (B, H, L, Dk)

        q = _independent_rope(heads(attn.q_proj.weight), pos, theta, pairs)
        k = _independent_rope(heads(attn.k_proj.weight), pos, theta, pairs)
        v = heads(attn.v_proj.weight)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)  # (B, H, L, L)
        out = (w @ v).transpose(1, 2).reshape(2, 6, 32) @ attn.out_proj.weight.T.double()
    torch.testing.assert_close(ours, out.float(), atol=1e-5, rtol=1e-5)


def test_rope_never_turns_the_values() -> None:
    """With W^Q = W^K = 0 every query weighs the keys alike; the output is the mean of the
    values, which then does not depend on the positions (turned values would)."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, bias=False).eval()
    with torch.no_grad():
        attn.q_proj.weight.zero_()
        attn.k_proj.weight.zero_()
        x = torch.randn(1, 5, 16)
        a = attn(x, x, x, rope=RopeAngles(torch.arange(5), rope_frequencies(8), "halves"))
        b = attn(x, x, x, rope=RopeAngles(torch.arange(5) * 13, rope_frequencies(8), "halves"))
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("window", [None, 4])
def test_left_padding_shifts_no_position(window) -> None:
    """Positions count real tokens (Hugging Face's position_ids from the mask): a row padded on
    the left gives, at its real tokens, the logits of the same row alone."""
    lm = _lm(sliding_window=window)
    tokens = _tokens(2, 8)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, :3] = False  # row 1: three pads, then five real tokens
    with torch.no_grad():
        padded = lm(tokens, mask)
        alone = lm(tokens[1:, 3:])
        cache = lm.new_cache()  # and step by step through the cache, the mask growing
        lm(tokens[:, :6], mask[:, :6], cache)
        last = lm(tokens[:, 6:], mask, cache)
    torch.testing.assert_close(padded[1, 3:], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded[0], lm(tokens[:1])[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last, padded[:, 6:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(d_model=20, n_heads=4), "Dk must be even, got Dk=5"),
        (dict(rope_pairs="adjacent"), "rope_pairs must be one of"),
        (dict(rope_theta=0.0), "rope_theta must be > 0"),
        (dict(positional="learned", rope_theta=5e5), "rope_theta=500000.0 needs positional='rope'"),
        (dict(positional="sinusoidal", rope_pairs="interleaved"), "needs positional='rope'"),
        (dict(sinusoidal_layout="halves"), "describes a sinusoidal table"),
    ],
)
def test_impossible_rope_configs_are_named(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        _config(**fields)


@pytest.mark.parametrize("cls", [Transformer, EncoderOnlyLM])
def test_rope_only_in_the_decoder_only_model(cls) -> None:
    with pytest.raises(ValueError, match="does not support positional='rope'"):
        cls(_config())


def test_positions_are_checked() -> None:
    lm = _lm()
    with pytest.raises(ValueError, match=r"positions must be integer positions of shape"):
        lm(_tokens(2, 4), positions=torch.arange(5))
    learned = _lm(positional="learned")
    with pytest.raises(ValueError, match="positions are for positional='rope'"):
        learned(_tokens(2, 4), positions=torch.arange(4))


def test_rope_model_has_no_position_table() -> None:
    lm = _lm()
    assert lm.positions is None and "rope_freqs" not in lm.state_dict()
    assert not any("position" in name for name, _ in lm.named_parameters())
