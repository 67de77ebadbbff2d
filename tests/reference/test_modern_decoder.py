"""Today's decoder in the reference (issue 30): rotary positions inside self-attention,
grouped-query attention and its cache, QK-norm, an untied head: DecoderOnlyLM as Llama/Qwen3."""

from __future__ import annotations

import math

import pytest
import torch
from model_shapes import LLAMA_STYLE

from coursepkg import RopeConfig, TransformerConfig
from coursepkg.attention import MultiHeadAttention
from coursepkg.decoder_only import DecoderOnlyLM
from coursepkg.encoder_only import EncoderOnlyLM
from coursepkg.fast_attention import FastMultiHeadAttention
from coursepkg.model import Transformer
from coursepkg.positional import RopeAngles, rope_frequencies

V = 53


def _config(**kw) -> TransformerConfig:
    fields = dict(
        vocab_size=V,
        d_model=32,
        n_heads=4,
        d_ff=48,
        n_layers=2,
        dropout=0.0,
        max_len=64,
        **LLAMA_STYLE,
    )
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
    lm = _lm(rope=RopeConfig(pairs=pairs), sliding_window=window)
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
    lm = _lm(rope=RopeConfig(pairs=pairs))
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
        (dict(rope=dict(pairs="adjacent")), "rope.pairs must be one of"),
        (dict(rope=dict(theta=0.0)), "rope.theta must be a number > 0"),
        (dict(rope=dict(theta="big")), "rope.theta must be a number > 0, got 'big'"),
        (dict(rope=None), "rope must be a RopeConfig, got NoneType"),
        (dict(rope=dict(base=2.0)), r"rope has no options \['base'\]"),
        (dict(positional="learned", rope=RopeConfig(5e5)), "rope.theta=500000.0 needs positional"),
        (dict(positional="sinusoidal", rope=dict(pairs="interleaved")), "needs positional='rope'"),
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
    with pytest.raises(ValueError, match="does not support qk_norm=True"):
        cls(_config(positional="learned", qk_norm=True))


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


# --------------------------------------------------------------- grouped-query attention
def _grouped_as_full(gqa: MultiHeadAttention) -> MultiHeadAttention:
    """The same attention with every key/value head copied for each query head it serves
    (head j for query heads j*group .. (j+1)*group - 1): the definition of GQA."""
    h, g, dk = gqa.n_heads, gqa.n_kv_heads, gqa.d_k
    full = MultiHeadAttention(gqa.d_model, h, bias=gqa.q_proj.bias is not None)
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(full, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(gqa, name), getattr(full, name)
            dst.weight.copy_(src.weight.view(g, dk, -1).repeat_interleave(h // g, 0).flatten(0, 1))
            if src.bias is not None:
                dst.bias.copy_(src.bias.view(g, dk).repeat_interleave(h // g, 0).flatten())
    return full.eval()


@pytest.mark.parametrize("n_kv", [1, 2, 4])
@pytest.mark.parametrize("record", [False, True])
def test_grouped_query_is_attention_with_shared_heads(n_kv, record) -> None:
    torch.manual_seed(n_kv)
    gqa = MultiHeadAttention(32, 8, n_kv_heads=n_kv).eval()
    gqa.record_weights = record  # the textbook kernel, or the fused one
    x = torch.randn(2, 5, 32)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        torch.testing.assert_close(
            gqa(x, x, x, mask), _grouped_as_full(gqa)(x, x, x, mask), atol=1e-5, rtol=1e-5
        )
    assert gqa.k_proj.out_features == gqa.v_proj.out_features == n_kv * 4


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_the_cache_stores_the_kv_heads_only(n_kv) -> None:
    """The cache holds (B, Hkv, S, Dk) keys: its bytes per token are the closed form's, H/Hkv
    times fewer than multi-head attention's."""
    from coursepkg.params import kv_cache_bytes_per_token

    lm = _lm(n_kv_heads=n_kv)
    cache = lm.new_cache()
    with torch.no_grad():
        lm(_tokens(3, 7), cache=cache)
    stored = [t for c in cache.self_attn for t in (c.k, c.v)]
    assert all(t.shape == (3, n_kv, 7, 8) for t in stored)
    nbytes = sum(t.numel() * t.element_size() for t in stored)
    assert nbytes == 3 * 7 * kv_cache_bytes_per_token(lm.config)
    mha = kv_cache_bytes_per_token(lm.config.replace(n_kv_heads=None))  # H = 4 heads
    assert kv_cache_bytes_per_token(lm.config) * 4 == mha * n_kv


@pytest.mark.parametrize("n_kv", [1, 2])
@pytest.mark.parametrize("window", [None, 3])
def test_grouped_query_cache_equals_no_cache(n_kv, window) -> None:
    lm = _lm(n_kv_heads=n_kv, sliding_window=window, qk_norm=True)
    tokens = _tokens(2, 9)
    with torch.no_grad():
        full = lm(tokens)
        cache = lm.new_cache(capacity=9)
        steps = [lm(tokens[:, :4], cache=cache)] + [
            lm(tokens[:, i : i + 1], cache=cache) for i in range(4, 9)
        ]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert torch.equal(lm.generate(tokens[:, :2], 20), lm.generate(tokens[:, :2], 20, False))


@pytest.mark.parametrize(
    "fields",
    [
        dict(n_kv_heads=2),
        dict(n_kv_heads=1, bias=True, norm="layernorm", activation="gelu"),
        dict(n_kv_heads=2, qk_norm=True, tie_embeddings=False, d_k=6, d_v=10),
        dict(n_kv_heads=4, qk_norm=True, bias=True),
    ],
)
def test_closed_form_counts_equal_the_instantiated_model(fields) -> None:
    from coursepkg.params import count_parameters

    lm = _lm(**fields)
    assert count_parameters(lm.config, "decoder-only") == sum(p.numel() for p in lm.parameters())


@pytest.mark.parametrize("n_kv, message", [(3, "n_kv_heads must divide n_heads"), (0, "positive")])
def test_impossible_kv_heads_are_named(n_kv, message) -> None:
    with pytest.raises(ValueError, match=message):
        _config(n_kv_heads=n_kv)
    with pytest.raises(ValueError, match="n_kv_heads must divide n_heads=4"):
        MultiHeadAttention(32, 4, n_kv_heads=n_kv)


# ---------------------------------------------------------------------- QK-norm, the head
def test_qk_norm_is_an_rmsnorm_of_each_head_before_rope() -> None:
    """Qwen3's QK-norm: queries and keys of each head scaled to unit RMS (times a gain) before
    they are turned; so scaling W^Q or W^K by any factor changes nothing."""
    lm = _lm(qk_norm=True, n_kv_heads=2, layer_norm_eps=1e-10)  # eps out of the way
    attn = lm.layers[0].self_attn
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (8,)
    tokens = _tokens(2, 6)
    with torch.no_grad():
        before = lm(tokens)
        attn.q_proj.weight.mul_(7.0)
        attn.k_proj.weight.mul_(3.0)
        after = lm(tokens)
    torch.testing.assert_close(after, before, atol=2e-5, rtol=1e-4)
    plain = _lm(qk_norm=False, n_kv_heads=2)
    assert plain.layers[0].self_attn.q_norm is None


@pytest.mark.parametrize("tie", [True, False])
def test_tied_or_untied_head_without_biases(tie) -> None:
    lm = _lm(tie_embeddings=tie, qk_norm=True)
    assert (lm.lm_head.weight is lm.embed.weight) is tie
    assert not [n for n, p in lm.named_parameters() if n.endswith("bias")]


@pytest.mark.parametrize("n_kv", [1, 2])
def test_decoding_one_query_reads_the_kv_heads_in_place(n_kv) -> None:
    """The fast path for one query without a mask (query heads as rows of their K/V head)
    equals the textbook path that repeats K and V."""
    torch.manual_seed(0)
    attn = FastMultiHeadAttention(32, 8, n_kv_heads=n_kv).eval()
    k, v = torch.randn(3, n_kv, 7, 4), torch.randn(3, n_kv, 7, 4)
    q = torch.randn(3, 8, 1, 4)
    fast = attn._attend(q, k, v, None)
    slow = MultiHeadAttention._attend(attn, q, k, v, None)  # the plain step, on the same module
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)
