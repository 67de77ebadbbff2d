"""Bad input gets a clear error naming the argument (and, where it helps, the expected and the
actual value): one parametrized case per kind of mistake."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from coursepkg import (
    DecoderOnlyLM,
    Encoder,
    LabelSmoothingLoss,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    PositionwiseFeedForward,
    SinusoidalPositionalEncoding,
    Transformer,
    TransformerConfig,
    attention_fast,
    beam_search,
    causal_mask,
    greedy_decode,
    label_smoothed_cross_entropy,
    noam_lr,
    parameter_breakdown,
    scaled_dot_product_attention,
)
from coursepkg._validation import broadcast_shape, broadcasts_to

V = 11


@pytest.fixture(scope="module")
def m() -> SimpleNamespace:
    base = dict(vocab_size=V, d_model=8, n_heads=2, d_ff=16, n_layers=1, dropout=0.0, max_len=6)
    torch.manual_seed(0)
    return SimpleNamespace(
        tf=Transformer(TransformerConfig(**base)).eval(),
        learned=Transformer(TransformerConfig(**base, positional="learned")).eval(),
        sep=Transformer(
            TransformerConfig(**base, src_vocab_size=13, share_embeddings=False)
        ).eval(),
        lm=DecoderOnlyLM(TransformerConfig(**base)).eval(),
        enc=Encoder(TransformerConfig(**base)),
        mha=MultiHeadAttention(8, 2),
        ids=torch.tensor([[1, 2, 3], [4, 5, 6]]),
        q=torch.randn(2, 3, 4),
        k=torch.randn(2, 5, 4),
        v=torch.randn(2, 5, 6),
        x=torch.randn(2, 3, 8),
    )


def _cfg(**kw):
    return lambda m: TransformerConfig(**{"vocab_size": V, "d_model": 8, "n_heads": 2, **kw})


CASES = {
    # ------------------------------------------------------------------------------- config
    "d_model_not_divisible": (_cfg(d_model=10, n_heads=3), ValueError, r"d_model=10.*n_heads=3"),
    "d_model_not_divisible_d_k_only": (
        _cfg(d_model=10, n_heads=3, d_k=4),
        ValueError,
        "divisible by n_heads",
    ),
    "positional_name": (_cfg(positional="rotary"), ValueError, r"positional.*'rotary'"),
    "activation_name": (_cfg(activation="tanh"), ValueError, r"activation.*'tanh'"),
    "dropout_is_1": (_cfg(dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
    "dropout_negative": (_cfg(dropout=-0.1), ValueError, "dropout"),
    "attention_dropout": (_cfg(attention_dropout=1.5), ValueError, "attention_dropout"),
    "vocab_size_zero": (_cfg(vocab_size=0), ValueError, "vocab_size must be a positive integer"),
    "d_model_negative": (_cfg(d_model=-8), ValueError, r"d_model must be a positive.*-8"),
    "n_heads_zero": (_cfg(n_heads=0), ValueError, "n_heads"),
    "d_ff_zero": (_cfg(d_ff=0), ValueError, "d_ff"),
    "n_layers_zero": (_cfg(n_layers=0), ValueError, "n_layers"),
    "n_decoder_layers_zero": (_cfg(n_decoder_layers=0), ValueError, "n_decoder_layers"),
    "max_len_zero": (_cfg(max_len=0), ValueError, "max_len"),
    "d_k_zero": (_cfg(d_k=0, d_v=4), ValueError, "d_k"),
    "d_v_float": (_cfg(d_k=4, d_v=4.0), ValueError, "d_v"),
    "n_layers_bool": (_cfg(n_layers=True), ValueError, "n_layers"),
    "src_vocab_size_zero": (_cfg(src_vocab_size=0), ValueError, "src_vocab_size"),
    "layer_norm_eps": (_cfg(layer_norm_eps=0.0), ValueError, "layer_norm_eps"),
    "share_with_separate_vocab": (
        _cfg(src_vocab_size=13),
        ValueError,
        r"share_embeddings.*src_vocab_size=13.*vocab_size=11",
    ),
    "pad_id_too_big": (_cfg(pad_id=V), ValueError, r"pad_id.*\[0, vocab_size=11\), got 11"),
    "pad_id_negative": (_cfg(pad_id=-1), ValueError, "pad_id"),
    "mha_not_divisible": (lambda m: MultiHeadAttention(10, 3), ValueError, "n_heads=3"),
    "ffn_activation": (
        lambda m: PositionwiseFeedForward(8, 16, activation="swish"),
        ValueError,
        "activation",
    ),
    # --------------------------------------------------------------------------- token ids
    "src_float_ids": (lambda m: m.tf(m.ids.float(), m.ids), TypeError, r"src.*integer.*float32"),
    "tgt_float_ids": (lambda m: m.tf(m.ids, m.ids.float()), TypeError, "tgt"),
    "lm_float_ids": (lambda m: m.lm(m.ids.double()), TypeError, "tokens"),
    "src_not_a_tensor": (lambda m: m.tf([[1, 2]], m.ids), TypeError, "src must be a torch.Tensor"),
    "src_1d": (lambda m: m.tf(m.ids[0], m.ids), ValueError, r"src must have shape \(B, L\)"),
    "tokens_3d": (lambda m: m.lm(m.ids[None]), ValueError, r"tokens must have shape \(B, L\)"),
    "tgt_id_negative": (
        lambda m: m.tf(m.ids, m.ids - 2),
        ValueError,
        r"tgt holds id -1, outside the vocabulary \[0, 11\)",
    ),
    "tgt_id_too_big": (
        lambda m: m.tf(m.ids, m.ids + 5),
        ValueError,
        r"tgt holds id 11, outside the vocabulary \[0, 11\)",
    ),
    "src_id_beyond_src_vocab": (
        lambda m: m.sep(m.ids + 7, m.ids),
        ValueError,
        r"src holds id 13.*\[0, 13\)",
    ),
    "tgt_id_valid_for_src_only": (
        lambda m: m.sep(m.ids + 6, m.ids + 6),
        ValueError,
        r"tgt holds id 12.*\[0, 11\)",
    ),
    "lm_id_too_big": (lambda m: m.lm(m.ids * 3), ValueError, "tokens holds id 18"),
    # ------------------------------------------------------------------- too long for max_len
    "src_longer_than_max_len_sinusoidal": (
        lambda m: m.tf(torch.ones(1, 7, dtype=torch.long), m.ids[:1]),
        ValueError,
        r"length 7.*max_len=6.*sinusoidal",
    ),
    "tgt_longer_than_max_len_learned": (
        lambda m: m.learned(m.ids[:1], torch.ones(1, 7, dtype=torch.long)),
        ValueError,
        r"length 7.*max_len=6.*learned",
    ),
    "lm_longer_than_max_len": (
        lambda m: m.lm(torch.ones(1, 9, dtype=torch.long)),
        ValueError,
        "max_len=6",
    ),
    "learned_module_too_long": (
        lambda m: LearnedPositionalEmbedding(4, 3)(torch.zeros(1, 4, 4)),
        ValueError,
        "max_len=3",
    ),
    "sinusoidal_module_offset": (
        lambda m: SinusoidalPositionalEncoding(4, 3)(torch.zeros(1, 2, 4), offset=2),
        ValueError,
        "max_len=3",
    ),
    # ----------------------------------------------------------------------------- token masks
    "src_mask_shape": (
        lambda m: m.tf(m.ids, m.ids, src_mask=torch.ones(2, 4, dtype=torch.bool)),
        ValueError,
        r"src_mask must have shape \(2, 3\).*got \(2, 4\)",
    ),
    "tgt_mask_shape": (
        lambda m: m.tf(m.ids, m.ids, tgt_mask=torch.ones(3, dtype=torch.bool)),
        ValueError,
        "tgt_mask",
    ),
    "token_mask_shape": (
        lambda m: m.lm(m.ids, token_mask=torch.ones(2, 2, dtype=torch.bool)),
        ValueError,
        "token_mask",
    ),
    "src_mask_float": (
        lambda m: m.tf(m.ids, m.ids, src_mask=torch.ones(2, 3)),
        TypeError,
        r"src_mask must be a bool tensor.*float32",
    ),
    "tgt_mask_int": (
        lambda m: m.tf(m.ids, m.ids, tgt_mask=torch.ones(2, 3, dtype=torch.long)),
        TypeError,
        r"tgt_mask.*int64",
    ),
    "encoder_src_mask_int": (
        lambda m: m.enc(torch.randn(2, 3, 8), torch.ones(2, 3, dtype=torch.int32)),
        TypeError,
        "src_mask",
    ),
    "encoder_input_int": (
        lambda m: m.enc(torch.ones(2, 3, 8, dtype=torch.long)),
        TypeError,
        "x must be a floating-point tensor",
    ),
    # ------------------------------------------------------------------------ attention masks
    "attention_mask_float": (
        lambda m: scaled_dot_product_attention(m.q, m.k, m.v, torch.ones(3, 5)),
        TypeError,
        r"mask must be a bool tensor.*float32",
    ),
    "attention_mask_int": (
        lambda m: scaled_dot_product_attention(m.q, m.k, m.v, torch.ones(3, 5, dtype=torch.int)),
        TypeError,
        "mask must be a bool tensor",
    ),
    "attention_mask_not_broadcastable": (
        lambda m: scaled_dot_product_attention(m.q, m.k, m.v, torch.ones(3, 4, dtype=torch.bool)),
        ValueError,
        r"mask of shape \(3, 4\) does not broadcast.*\(2, 3, 5\)",
    ),
    "attention_mask_too_big": (
        lambda m: scaled_dot_product_attention(
            m.q, m.k, m.v, torch.ones(4, 2, 3, 5, dtype=torch.bool)
        ),
        ValueError,
        "does not broadcast",
    ),
    "mha_mask_float": (
        lambda m: m.mha(m.x, m.x, m.x, torch.ones(3, 3)),
        TypeError,
        "mask must be a bool tensor",
    ),
    "mha_mask_not_broadcastable": (
        lambda m: m.mha(m.x, m.x, m.x, torch.ones(2, 3, 3, 3, dtype=torch.bool)),
        ValueError,
        r"mask of shape \(2, 3, 3, 3\)",
    ),
    # ---------------------------------------------------------------------- attention shapes
    "query_key_dim_mismatch": (
        lambda m: scaled_dot_product_attention(m.q, torch.randn(2, 5, 3), m.v),
        ValueError,
        r"query and key must share their last dimension Dk.*\(2, 3, 4\).*\(2, 5, 3\)",
    ),
    "key_value_length_mismatch": (
        lambda m: scaled_dot_product_attention(m.q, m.k, torch.randn(2, 4, 6)),
        ValueError,
        "key and value must have the same length",
    ),
    "attention_int_query": (
        lambda m: scaled_dot_product_attention(m.q.long(), m.k, m.v),
        TypeError,
        "query must be a floating-point tensor",
    ),
    "mha_query_width": (
        lambda m: m.mha(torch.randn(2, 3, 6), m.x, m.x),
        ValueError,
        r"query must have last dimension d_model=8, got shape \(2, 3, 6\)",
    ),
    "mha_value_width": (
        lambda m: m.mha(m.x, m.x, torch.randn(2, 3, 5)),
        ValueError,
        "value must have last dimension d_model=8",
    ),
    "mha_2d_input": (lambda m: m.mha(m.x[0], m.x, m.x), ValueError, "query must have 3 dimensions"),
    "mha_batch_mismatch": (
        lambda m: m.mha(m.x, m.x[:1], m.x[:1]),
        ValueError,
        "batch size",
    ),
    # ------------------------------------------------------------------------------ decoding
    "beam_size_zero": (
        lambda m: beam_search(m.tf, m.ids, 0, 3, 1, 2),
        ValueError,
        r"beam_size must be an integer >= 1, got 0",
    ),
    "beam_size_float": (lambda m: beam_search(m.tf, m.ids, 2.0, 3, 1, 2), ValueError, "beam_size"),
    "length_penalty_negative": (
        lambda m: beam_search(m.tf, m.ids, 2, 3, 1, 2, length_penalty=-1.0),
        ValueError,
        "length_penalty",
    ),
    "greedy_max_len_zero": (
        lambda m: greedy_decode(m.tf, m.ids, 0, 1, 2),
        ValueError,
        "max_len must be a positive integer, got 0",
    ),
    "beam_max_len_zero": (lambda m: beam_search(m.tf, m.ids, 2, 0, 1, 2), ValueError, "max_len"),
    "bos_out_of_range": (
        lambda m: greedy_decode(m.tf, m.ids, 3, V, 2),
        ValueError,
        r"bos_id must be a token id in \[0, 11\), got 11",
    ),
    "eos_out_of_range": (lambda m: beam_search(m.tf, m.ids, 2, 3, 1, -1), ValueError, "eos_id"),
    "greedy_src_float": (lambda m: greedy_decode(m.tf, m.ids.float(), 3, 1, 2), TypeError, "src"),
    "generate_temperature": (
        lambda m: m.lm.generate(m.ids, 2, temperature=-0.5),
        ValueError,
        r"temperature must be >= 0.*-0.5",
    ),
    "generate_top_k_zero": (lambda m: m.lm.generate(m.ids, 2, top_k=0), ValueError, "top_k"),
    "generate_top_k_float": (lambda m: m.lm.generate(m.ids, 2, top_k=1.5), ValueError, "top_k"),
    "generate_past_max_len": (
        lambda m: m.lm.generate(m.ids, 4),
        ValueError,
        r"3 \+ max_new_tokens 4 = 7 exceeds max_len=6",
    ),
    "generate_negative_new_tokens": (
        lambda m: m.lm.generate(m.ids, -1),
        ValueError,
        "max_new_tokens",
    ),
    "generate_empty_prompt": (
        lambda m: m.lm.generate(m.ids[:, :0], 2),
        ValueError,
        "tokens must hold at least one",
    ),
    # ------------------------------------------------------------------------------ training
    "noam_negative_step": (lambda m: noam_lr(-1, 512, 10), ValueError, "step must be >= 0, got -1"),
    "noam_warmup_zero": (lambda m: noam_lr(1, 512, 0), ValueError, "warmup_steps must be >= 1"),
    "noam_d_model_zero": (lambda m: noam_lr(1, 0, 10), ValueError, "d_model"),
    "smoothing_is_1": (
        lambda m: label_smoothed_cross_entropy(torch.randn(2, 5), torch.zeros(2).long(), 1.0),
        ValueError,
        r"smoothing must be in \[0, 1\), got 1.0",
    ),
    "smoothing_negative": (
        lambda m: LabelSmoothingLoss(smoothing=-0.1),
        ValueError,
        "smoothing",
    ),
    "loss_shape_mismatch": (
        lambda m: label_smoothed_cross_entropy(torch.randn(2, 3, 5), torch.zeros(2, 4).long()),
        ValueError,
        r"logits.*target.*\(2, 3, 5\).*\(2, 4\)",
    ),
    # --------------------------------------------------------------------------------- misc
    "src_tgt_batch_mismatch": (
        lambda m: m.tf(m.ids, m.ids[:1]),
        ValueError,
        "src and tgt must have the same batch size, got 2 and 1",
    ),
    "decode_memory_batch_mismatch": (
        lambda m: m.tf.decode(m.ids, torch.randn(3, 3, 8)),
        ValueError,
        "batch size",
    ),
    "causal_mask_keys_shorter": (lambda m: causal_mask(5, 2), ValueError, "key_len=2"),
    "breakdown_model_name": (
        lambda m: parameter_breakdown(TransformerConfig(vocab_size=5), model="gpt"),
        ValueError,
        r"model must be.*'gpt'",
    ),
}


@pytest.mark.parametrize(("call", "exc", "match"), list(CASES.values()), ids=list(CASES))
def test_bad_input_raises_a_clear_error(m, call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call(m)


def test_there_are_many_kinds_of_bad_input() -> None:
    assert len(CASES) >= 12
    assert {exc for _, exc, _ in CASES.values()} == {ValueError, TypeError}


@pytest.mark.parametrize(
    ("mask", "exc"),
    [
        (torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]), TypeError),
        (torch.ones(3, 4, dtype=torch.bool), ValueError),
    ],
    ids=["float_0_1_mask", "not_broadcastable"],
)
def test_fast_path_validates_masks_like_the_textbook_path(m, mask, exc) -> None:
    """attention_fast is public and documented as "the same computation": a 0/1 float mask
    must not be silently taken as an additive bias by the fused kernel."""
    with pytest.raises(exc, match="mask"):
        scaled_dot_product_attention(m.q, m.k, m.v, mask)
    with pytest.raises(exc, match="mask"):
        attention_fast(m.q, m.k, m.v, mask)


def test_the_mask_broadcast_rule_is_torchs() -> None:
    """``broadcasts_to`` (the attention-mask check, in plain Python) answers as
    ``torch.broadcast_shapes(shape, target) == target`` over every shape up to rank 4 built
    from the sizes 0, 1, 2, 3 against a few targets."""
    targets = [(2, 3, 1, 5), (1, 3, 4), (3,), (2, 0, 3), ()]
    for target in targets:
        for rank in range(5):
            for shape in itertools.product((0, 1, 2, 3, 5), repeat=rank):
                try:
                    want = torch.broadcast_shapes(shape, target) == target
                except RuntimeError:
                    want = False
                assert broadcasts_to(shape, target) == want, (shape, target)


def test_broadcast_shape_is_torchs() -> None:
    """``broadcast_shape`` (attention's batch check, in plain Python) gives
    ``torch.broadcast_shapes(a, b)`` for every pair of shapes up to rank 3 built from the sizes
    0, 1, 3, and a ValueError naming both shapes where torch refuses them."""
    shapes = [s for rank in range(4) for s in itertools.product((0, 1, 3), repeat=rank)]
    for a, b in itertools.product(shapes, repeat=2):
        try:
            want = tuple(torch.broadcast_shapes(a, b))
        except RuntimeError:
            with pytest.raises(ValueError, match=rf"a of shape \({a[0]}.*b of shape"):
                broadcast_shape("a", a, "b", b)
            continue
        assert broadcast_shape("a", a, "b", b) == want, (a, b)
