"""ALiBi (Press et al., 2022) against its definition: the slopes, the bias -m_h * (i - j) on the
scores, no position embedding, causal, the cache's logits equal to one pass, and the attention
equal to a hand-written reference (and to Hugging Face's BLOOM slopes, built offline)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from coursepkg import DecoderOnlyLM, EncoderOnlyLM, Transformer, TransformerConfig
from coursepkg.alibi import ALiBiAttention, alibi_bias, alibi_slopes
from coursepkg.masks import PackedMask, causal_mask

V = 37


def _lm(seed: int = 0, **fields) -> DecoderOnlyLM:
    options = dict(vocab_size=V, d_model=32, n_heads=4, d_ff=48, n_layers=2, dropout=0.0)
    torch.manual_seed(seed)
    return DecoderOnlyLM(TransformerConfig(**{**options, "positional": "alibi", **fields})).eval()


def _tokens(b: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, n), generator=torch.Generator().manual_seed(seed))


def test_eight_heads_have_the_papers_slopes() -> None:
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0**-h for h in range(1, 9)]))
    assert torch.equal(alibi_slopes(16)[1::2], alibi_slopes(8))  # 2^(-h/2): every other is 8's


@pytest.mark.parametrize("n_heads", [1, 3, 5, 6, 12, 20])
def test_other_head_counts_have_the_slopes_bloom_uses(n_heads) -> None:
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    theirs = bloom.build_alibi_tensor(torch.ones(1, 2), n_heads, torch.float32)  # m_h * j
    torch.testing.assert_close(alibi_slopes(n_heads), theirs[:, 0, 1])  # BLOOM: float32 powers


def test_twelve_heads_take_eight_then_every_other_of_sixteen() -> None:
    """The paper's code for H not a power of two: 2^(-8h/8) for h = 1..8, then 2^(-8h/16) for
    the odd h = 1, 3, 5, 7 of 16."""
    expected = [2.0 ** (-h) for h in range(1, 9)] + [2.0 ** (-h / 2) for h in (1, 3, 5, 7)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected), rtol=0, atol=0)


def test_the_bias_is_minus_slope_times_distance() -> None:
    slopes = alibi_slopes(4)
    at_q, at_k = torch.tensor([3, 4]), torch.arange(5)
    bias = alibi_bias(slopes, at_q, at_k)  # (H, L, S)
    for h in range(4):
        for i in range(2):
            for j in range(5):
                assert bias[h, i, j] == -slopes[h] * (at_q[i] - at_k[j])
    assert bias[:, 0, 3].abs().sum() == 0 and (bias[:, :, :3] < 0).all()


def test_no_position_is_added_to_the_embeddings() -> None:
    lm = _lm()
    assert lm.positions is None and lm.rope_freqs is None
    names = [name for name, _ in lm.named_parameters()]
    assert not any("position" in name for name in names)
    assert all(isinstance(layer.self_attn, ALiBiAttention) for layer in lm.layers)
    # the same model with a fixed table has the same parameters: ALiBi adds none
    table = dict(_lm(positional="sinusoidal").named_parameters())
    assert names == list(table) and not any("position" in key for key in lm.state_dict())


def test_a_token_sees_only_its_past() -> None:
    lm = _lm()
    tokens = _tokens(2, 9)
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % V
    with torch.no_grad():
        a, b = lm(tokens), lm(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=0)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def _reference_attention(attn: ALiBiAttention, x: torch.Tensor) -> torch.Tensor:
    # The definition written out, head by head, query by query: softmax over j <= i of
    # q_i . k_j / sqrt(Dk) - m_h (i - j), weighting v_j; grouped heads share their K/V head.
    b, n, _ = x.shape
    h, hkv, dk = attn.n_heads, attn.n_kv_heads, attn.d_k
    q = attn.q_proj(x).view(b, n, h, dk)
    k = attn.k_proj(x).view(b, n, hkv, dk)
    v = attn.v_proj(x).view(b, n, hkv, attn.d_v)
    m = [2.0 ** (-8.0 * (i + 1) / h) for i in range(h)]  # h is a power of two here
    out = torch.zeros(b, n, h, attn.d_v, dtype=x.dtype)
    for head in range(h):
        kv = head // (h // hkv)
        for i in range(n):
            scores = torch.stack(
                [
                    q[:, i, head] @ k[:, j, kv].T / math.sqrt(dk) - m[head] * (i - j)
                    for j in range(i + 1)
                ]
            )  # (i+1, B, B): the diagonal pairs each row with itself
            scores = scores.diagonal(dim1=1, dim2=2)  # (i+1, B)
            w = torch.softmax(scores, dim=0)  # (i+1, B)
            out[:, i, head] = sum(w[j, :, None] * v[:, j, kv] for j in range(i + 1))
    return attn.out_proj(out.reshape(b, n, h * attn.d_v))


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_the_attention_equals_the_definition_on_random_inputs(n_kv_heads) -> None:
    lm = _lm(seed=n_kv_heads, n_kv_heads=n_kv_heads, bias=False)
    attn = lm.layers[0].self_attn.double()
    x = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        mine = attn(x, x, x, causal_mask(7, 7))
        theirs = _reference_attention(attn, x)
    torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10)


def test_the_attention_equals_torchs_kernel_given_the_bias_as_its_float_mask() -> None:
    attn = _lm(n_kv_heads=2).layers[1].self_attn
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(6))
    keep = causal_mask(6, 6)
    bias = alibi_bias(attn.slopes, torch.arange(6), torch.arange(6))  # (H, L, S)
    with torch.no_grad():
        q, k, v = attn._project(x, x, x, None)  # (B, H, L, Dk), (B, Hkv, S, Dk), ...
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, bias.masked_fill(~keep, float("-inf")))
        theirs = attn.out_proj(out.transpose(1, 2).reshape(2, 6, -1))
        attn.record_weights = True
        mine = attn(x, x, x, keep)
    torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)
    assert (attn.last_weights.triu(1) == 0).all()  # nothing from the future


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("chunks", [(9,), (4, 1, 1, 3), (1,) * 9])
def test_the_cache_gives_the_logits_of_one_pass(window, chunks) -> None:
    """Keys cached before are the first ones, so the distances the bias sees are the same
    however the sequence is cut into steps (and in a sliding window's ring)."""
    lm = _lm(n_kv_heads=2, sliding_window=window)
    tokens = _tokens(2, sum(chunks))
    cache = lm.new_cache()
    with torch.no_grad():
        stepped = [lm(step, cache=cache) for step in tokens.split(list(chunks), dim=1)]
        torch.testing.assert_close(torch.cat(stepped, dim=1), lm(tokens), atol=1e-5, rtol=1e-5)
    assert torch.equal(lm.generate(tokens[:, :3], 8), lm.generate(tokens[:, :3], 8, False))


def test_left_padding_changes_nothing() -> None:
    lm = _lm(pad_id=0)
    tokens = _tokens(1, 6) % (V - 1) + 1  # no pad id inside
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), tokens], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(lm(padded)[:, 3:], lm(tokens), atol=1e-5, rtol=1e-5)


def test_packed_requests_are_biased_by_their_own_positions() -> None:
    attn = _lm().layers[0].self_attn
    x = torch.randn(1, 7, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        packed = attn(x, x, x, PackedMask([3, 4], [3, 4]))
        first = attn(x[:, :3], x[:, :3], x[:, :3], causal_mask(3, 3))
        second = attn(x[:, 3:], x[:, 3:], x[:, 3:], causal_mask(4, 4))
    torch.testing.assert_close(packed, torch.cat([first, second], dim=1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "model, fields, message",
    [
        (Transformer, {}, "encoder-decoder model does not support positional='alibi'"),
        (EncoderOnlyLM, {}, "EncoderOnlyLM does not support positional='alibi'"),
        (DecoderOnlyLM, dict(sinusoidal_layout="halves"), "which positional='alibi' does not"),
        (DecoderOnlyLM, dict(rope=dict(theta=5.0)), "rope.theta=5.0 needs positional='rope'"),
    ],
)
def test_what_alibi_cannot_be_is_named(model, fields, message) -> None:
    options = dict(vocab_size=V, d_model=8, n_heads=2, d_ff=8, n_layers=1, positional="alibi")
    with pytest.raises(ValueError, match=message):
        model(TransformerConfig(**options, **fields))
