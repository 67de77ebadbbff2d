"""Hugging Face models loaded into the reference: randomly initialised GPT-2, BERT and Marian
models built from configs (nothing is downloaded), their weights copied, and the logits compared
(fp32, atol 1e-5) with and without padding; greedy generation gives the tokens of
``model.generate``; closed-form parameter counts equal the Hugging Face models'."""

from __future__ import annotations

import os

import pytest
import torch
from torch.testing import assert_close

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

from coursepkg import (  # noqa: E402
    DecoderOnlyLM,
    EncoderOnlyLM,
    Transformer,
    TransformerConfig,
    count_parameters,
    greedy_decode,
)
from coursepkg.interop import (  # noqa: E402
    bert_config,
    from_hf_bert,
    from_hf_gpt2,
    from_hf_marian,
    gpt2_config,
    marian_config,
    marian_en_de_hf_config,
    to_hf_gpt2,
)

ATOL = dict(atol=1e-5, rtol=1e-5)


def _randomise_norms_and_biases(model: torch.nn.Module) -> None:
    """Fresh models have unit LayerNorms, zero biases and small (std 0.02) matrices, which make
    nearly constant outputs; give them unit-scale weights and random norms and biases."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:  # Marian's frozen sinusoidal tables
                continue
            if p.dim() == 2:
                p.normal_(0.0, p.size(-1) ** -0.5)
            elif name.endswith("bias") or "norm" in name.lower() or "ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)


def _tokens(b: int, t: int, vocab: int, seed: int, low: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab, (b, t), generator=g)


def _right_padding(b: int, t: int, lengths: list[int]) -> torch.Tensor:
    mask = torch.zeros(b, t, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    return mask


# ------------------------------------------------------------------------------------- GPT-2
GPT2_SHAPES = [
    dict(n_embd=32, n_head=4, n_layer=2, vocab_size=97, n_positions=40),
    dict(n_embd=48, n_head=3, n_layer=3, vocab_size=61, n_positions=24, n_inner=80),
    dict(n_embd=16, n_head=1, n_layer=1, vocab_size=50, n_positions=30, tie_word_embeddings=False),
    dict(n_embd=24, n_head=2, n_layer=2, vocab_size=40, n_positions=32, activation_function="relu"),
]


def _gpt2(seed: int, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = tf.GPT2Config(bos_token_id=0, eos_token_id=None, pad_token_id=0, **kw)
    model = tf.GPT2LMHeadModel(config).eval()
    _randomise_norms_and_biases(model)
    return model


@pytest.mark.parametrize("shape", GPT2_SHAPES)
@pytest.mark.parametrize("padded", [False, True])
def test_gpt2_logits_equal(shape, padded) -> None:
    hf = _gpt2(0, **shape)
    lm = from_hf_gpt2(hf)
    assert isinstance(lm, DecoderOnlyLM) and not lm.training
    tokens = _tokens(3, 11, shape["vocab_size"], seed=1)
    mask = _right_padding(3, 11, [11, 7, 3] if padded else [11, 11, 11])
    with torch.no_grad():
        theirs = hf(tokens, attention_mask=mask.long()).logits
        ours = lm(tokens, mask)
    assert theirs.abs().max() > 0.1  # a real signal, not zeros
    assert_close(ours[mask], theirs[mask], **ATOL)  # every real position


@pytest.mark.parametrize("shape", GPT2_SHAPES[:2])
@pytest.mark.parametrize("batch", [1, 3])
def test_gpt2_greedy_generation_equals_generate(shape, batch) -> None:
    hf = _gpt2(2, **shape)
    lm = from_hf_gpt2(hf)
    prompt = _tokens(batch, 5, shape["vocab_size"], seed=3)
    n_new = shape["n_positions"] - 5
    theirs = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=n_new,
        do_sample=False,
        num_beams=1,
    )
    ours = lm.generate(prompt, n_new)
    assert ours.shape == theirs.shape == (batch, shape["n_positions"])
    assert torch.equal(ours, theirs)
    assert torch.equal(lm.generate(prompt, n_new, use_cache=False), ours)


def test_gpt2_weights_keep_the_conv1d_layout_and_train() -> None:
    """GPT-2's projections arrive as (in, out) Conv1D weights; the loaded ``nn.Linear``
    weights are their (out, in) transposes stored in that layout (a view, no extra copy), which
    decoding reads faster. Anything a model does with its weights still works: a
    ``state_dict`` round trip, float64, and a training step that changes them."""
    hf = _gpt2(9, **GPT2_SHAPES[1])
    lm = from_hf_gpt2(hf)
    linears = [m for m in lm.layers.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 6 * 3  # W^Q, W^K, W^V, W^O and the FFN's two, three layers
    for m in linears:
        assert m.weight.t().is_contiguous() and not m.weight.is_contiguous()
        assert isinstance(m.weight, torch.nn.Parameter) and m.weight.requires_grad
    assert_close(linears[3].weight, hf.transformer.h[0].attn.c_proj.weight.t(), rtol=0, atol=0)
    tokens = _tokens(2, 9, GPT2_SHAPES[1]["vocab_size"], seed=10)
    copy = DecoderOnlyLM(lm.config).eval()
    copy.load_state_dict(lm.state_dict())
    wide = from_hf_gpt2(_gpt2(9, **GPT2_SHAPES[1]).double())
    with torch.no_grad():
        assert_close(copy(tokens), lm(tokens), rtol=0, atol=0)
        assert_close(wide(tokens).float(), lm(tokens), **ATOL)
    lm.train()
    before = linears[0].weight.detach().clone()
    optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-3)
    lm(tokens).logsumexp(-1).mean().backward()
    assert linears[0].weight.grad.shape == linears[0].weight.shape
    optimizer.step()
    assert not torch.equal(linears[0].weight, before)


def test_gpt2_from_base_model_uses_the_tied_head() -> None:
    hf = _gpt2(4, **GPT2_SHAPES[0])
    lm = from_hf_gpt2(hf.transformer)
    tokens = _tokens(2, 9, GPT2_SHAPES[0]["vocab_size"], seed=5)
    with torch.no_grad():
        assert_close(lm(tokens), hf(tokens).logits, **ATOL)


@pytest.mark.parametrize("shape", GPT2_SHAPES)
def test_gpt2_round_trip(shape) -> None:
    hf = _gpt2(6, **shape)
    back = to_hf_gpt2(from_hf_gpt2(hf))
    assert isinstance(back, tf.GPT2LMHeadModel) and not back.training
    tokens = _tokens(2, 9, shape["vocab_size"], seed=7)
    with torch.no_grad():
        assert_close(back(tokens).logits, hf(tokens).logits, **ATOL)
    # and from a model trained here: our own DecoderOnlyLM, GPT-2 shaped
    config = gpt2_config(hf.config)
    torch.manual_seed(8)
    ours = DecoderOnlyLM(config).eval()
    _randomise_norms_and_biases(ours)
    with torch.no_grad():
        assert_close(to_hf_gpt2(ours)(tokens).logits, ours(tokens), **ATOL)


def test_gpt2_bad_input_is_named() -> None:
    with pytest.raises(TypeError, match="GPT2LMHeadModel"):
        from_hf_gpt2(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="activation_function 'gelu_fast'"):
        gpt2_config(tf.GPT2Config(activation_function="gelu_fast"))
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        gpt2_config(tf.GPT2Config(scale_attn_by_inverse_layer_idx=True))
    post_ln = DecoderOnlyLM(TransformerConfig(vocab_size=10, d_model=8, n_heads=2, d_ff=8))
    with pytest.raises(ValueError, match="not GPT-2 shaped"):
        to_hf_gpt2(post_ln)


# -------------------------------------------------------------------------------------- BERT
BERT_SHAPES = [
    dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64),
    dict(hidden_size=24, num_attention_heads=2, num_hidden_layers=3, intermediate_size=40),
    dict(
        hidden_size=16,
        num_attention_heads=1,
        num_hidden_layers=1,
        intermediate_size=24,
        type_vocab_size=3,
        tie_word_embeddings=False,
    ),
]


def _bert(cls, seed: int, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = tf.BertConfig(vocab_size=83, max_position_embeddings=20, pad_token_id=0, **kw)
    model = cls(config).eval()
    _randomise_norms_and_biases(model)
    return model


@pytest.mark.parametrize("shape", BERT_SHAPES)
@pytest.mark.parametrize("padded", [False, True])
def test_bert_masked_lm_logits_equal(shape, padded) -> None:
    hf = _bert(tf.BertForMaskedLM, 0, **shape)
    ours = from_hf_bert(hf)
    assert isinstance(ours, EncoderOnlyLM) and ours.pooler is None and ours.head is not None
    tokens = _tokens(3, 12, 83, seed=1, low=1)
    types = _tokens(3, 12, hf.config.type_vocab_size, seed=2)
    mask = _right_padding(3, 12, [12, 8, 2] if padded else [12, 12, 12])
    with torch.no_grad():
        theirs = hf(tokens, attention_mask=mask.long(), token_type_ids=types).logits
        mine = ours(tokens, mask, types)
    assert theirs.abs().max() > 0.1
    assert_close(mine[mask], theirs[mask], **ATOL)


@pytest.mark.parametrize("shape", BERT_SHAPES[:2])
def test_bert_model_hidden_states_and_pooler_equal(shape) -> None:
    hf = _bert(tf.BertModel, 3, **shape)
    ours = from_hf_bert(hf)
    assert ours.head is None and ours.pooler is not None
    tokens = _tokens(2, 10, 83, seed=4, low=1)
    mask = _right_padding(2, 10, [10, 6])
    with torch.no_grad():
        out = hf(tokens, attention_mask=mask.long())
        hidden = ours(tokens, mask)  # token types default to 0, as in Hugging Face
        assert_close(hidden[mask], out.last_hidden_state[mask], **ATOL)
        assert_close(ours.pool(hidden), out.pooler_output, **ATOL)


def test_bert_bad_input_is_named() -> None:
    with pytest.raises(TypeError, match="BertForMaskedLM or BertModel"):
        from_hf_bert(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="is_decoder"):
        bert_config(tf.BertConfig(is_decoder=True))


# ------------------------------------------------------------------------------------ Marian
MARIAN_SHAPES = [
    dict(d_model=32, attn=4, ffn=64, enc=2, dec=3),
    dict(d_model=24, attn=2, ffn=40, enc=1, dec=2, activation_function="relu"),
    dict(d_model=16, attn=2, ffn=24, enc=2, dec=1, scale_embedding=False, tie=False),
    dict(d_model=16, attn=4, ffn=32, enc=1, dec=1, shared=False),
]
VOCAB, PAD, EOS = 71, 70, 0


def _marian(seed: int, **kw) -> torch.nn.Module:
    shared = kw.pop("shared", True)
    config = tf.MarianConfig(
        vocab_size=VOCAB,
        decoder_vocab_size=VOCAB if shared else VOCAB - 11,
        share_encoder_decoder_embeddings=shared,
        d_model=kw.pop("d_model"),
        encoder_attention_heads=kw["attn"],
        decoder_attention_heads=kw.pop("attn"),
        encoder_ffn_dim=kw["ffn"],
        decoder_ffn_dim=kw.pop("ffn"),
        encoder_layers=kw.pop("enc"),
        decoder_layers=kw.pop("dec"),
        max_position_embeddings=40,
        activation_function=kw.pop("activation_function", "swish"),
        scale_embedding=kw.pop("scale_embedding", True),
        tie_word_embeddings=kw.pop("tie", True),
        pad_token_id=PAD if shared else VOCAB - 12,
        decoder_start_token_id=PAD if shared else VOCAB - 12,
        eos_token_id=EOS,
        forced_eos_token_id=None,
    )
    assert not kw
    torch.manual_seed(seed)
    model = tf.MarianMTModel(config).eval()
    _randomise_norms_and_biases(model)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.1)
    return model


@pytest.mark.parametrize("shape", MARIAN_SHAPES)
@pytest.mark.parametrize("padded", [False, True])
def test_marian_logits_equal(shape, padded) -> None:
    hf = _marian(0, **dict(shape))
    ours = from_hf_marian(hf)
    assert isinstance(ours, Transformer) and not ours.training
    tgt_vocab = hf.config.decoder_vocab_size
    src = _tokens(3, 9, VOCAB - 12, seed=1, low=1)
    tgt = _tokens(3, 7, tgt_vocab - 12, seed=2, low=1)
    src_mask = _right_padding(3, 9, [9, 5, 1] if padded else [9, 9, 9])
    tgt_mask = _right_padding(3, 7, [7, 7, 3] if padded else [7, 7, 7])
    with torch.no_grad():
        theirs = hf(
            input_ids=src,
            attention_mask=src_mask.long(),
            decoder_input_ids=tgt,
            decoder_attention_mask=tgt_mask.long(),
        ).logits
        mine = ours(src, tgt, src_mask, tgt_mask)
    assert theirs.abs().max() > 0.1
    assert_close(mine[tgt_mask], theirs[tgt_mask], **ATOL)


def _eos_with_most_varied_stops(out: torch.Tensor) -> tuple[int, list[int | None]]:
    """Among the tokens a run without EOS produced, the one that, declared EOS, makes the
    rows stop at the most varied steps (None: the row never emits it)."""
    rows = out[:, 1:].tolist()
    best: tuple[int, int, list[int | None]] = (0, -1, [])
    for tok in sorted({t for row in rows for t in row}):
        stops = [row.index(tok) if tok in row else None for row in rows]
        if len(set(stops)) > best[0]:
            best = (len(set(stops)), tok, stops)
    return best[1], best[2]


@pytest.mark.parametrize("shape", MARIAN_SHAPES[:3])
def test_marian_greedy_decoding_equals_generate(shape) -> None:
    hf = _marian(6, **dict(shape))
    ours = from_hf_marian(hf)
    src = _tokens(4, 8, VOCAB - 1, seed=6, low=1)
    src_mask = _right_padding(4, 8, [8, 6, 3, 1])
    src = src.masked_fill(~src_mask, PAD)
    start = hf.config.decoder_start_token_id
    # Declare as EOS a token the model really emits, so that rows stop at different steps
    # (or never) and the padding after EOS is compared too.
    eos, stops = _eos_with_most_varied_stops(greedy_decode(ours, src, 15, start, eos_id=EOS))
    assert len(set(stops)) >= 3, stops
    theirs = hf.generate(
        input_ids=src,
        attention_mask=src_mask.long(),
        max_new_tokens=15,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos,
    )
    mine = greedy_decode(ours, src, 15, bos_id=start, eos_id=eos)
    assert torch.equal(mine, theirs)


def test_marian_positions_are_the_halves_layout() -> None:
    hf = _marian(7, **dict(MARIAN_SHAPES[0]))
    config = marian_config(hf.config)
    assert config.sinusoidal_layout == "halves"
    fresh = Transformer(config)  # our own table, not the one copied from hf
    assert_close(fresh.positions.table, hf.model.encoder.embed_positions.weight, atol=1e-6, rtol=0)


def test_marian_bad_input_is_named() -> None:
    with pytest.raises(TypeError, match="MarianMTModel"):
        from_hf_marian(torch.nn.Linear(2, 2))
    config = tf.MarianConfig(encoder_attention_heads=4, decoder_attention_heads=8)
    with pytest.raises(ValueError, match="same number of heads"):
        marian_config(config)


# ------------------------------------------------------------------------- parameter counts
def _hf_count(cls, config, trainable_only: bool = False) -> int:
    with torch.device("meta"):
        model = cls(config)
    params = [p for p in model.parameters() if p.requires_grad or not trainable_only]
    return sum(p.numel() for p in params)


def test_parameter_count_gpt2_small() -> None:
    hf_config = tf.GPT2Config()  # the defaults are GPT-2 small
    ours = count_parameters(gpt2_config(hf_config), "decoder-only")
    assert ours == _hf_count(tf.GPT2LMHeadModel, hf_config) == 124_439_808


def test_parameter_count_bert_base() -> None:
    hf_config = tf.BertConfig()  # the defaults are BERT-base (uncased)
    base = bert_config(hf_config, mlm_head=False, pooler=True)
    assert count_parameters(base, "encoder-only") == _hf_count(tf.BertModel, hf_config)
    assert count_parameters(base, "encoder-only") == 109_482_240
    mlm = bert_config(hf_config)
    assert count_parameters(mlm, "encoder-only") == _hf_count(tf.BertForMaskedLM, hf_config)


def test_parameter_count_marian_en_de() -> None:
    hf_config = marian_en_de_hf_config()
    ours = count_parameters(marian_config(hf_config))
    # Hugging Face keeps the two sinusoidal tables as frozen parameters: count the trained ones.
    assert ours == _hf_count(tf.MarianMTModel, hf_config, trainable_only=True)
    frozen = 2 * hf_config.max_position_embeddings * hf_config.d_model
    assert ours + frozen == _hf_count(tf.MarianMTModel, hf_config)
