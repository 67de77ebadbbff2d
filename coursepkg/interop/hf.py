"""Hugging Face ``transformers`` models in the reference implementation: GPT-2
(:class:`~coursepkg.DecoderOnlyLM`), BERT (:class:`~coursepkg.EncoderOnlyLM`) and Marian, the
OPUS-MT translators (:class:`~coursepkg.Transformer`), plus the way back for GPT-2.

``transformers`` is an optional dependency (``pip install 'coursepkg[interop]'``); it is imported
only when one of these functions is called. Each ``from_hf_*`` reads the architecture from the
model's config, builds the reference model with the matching :class:`TransformerConfig`
options, and copies every weight, so that the logits agree (fp32, to about 1e-6). Training-time
differences that do not change the function in eval mode (GPT-2's separate embedding dropout,
Marian's activation dropout) are not carried over; the reference uses ``dropout`` for them all.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..config import HFOptions, TransformerConfig
from ..decoder_only import DecoderOnlyLM
from ..encoder_only import EncoderOnlyLM
from ..layers import LayerNorm
from ..model import Transformer
from .common import (
    check_model_class,
    copy_linear,
    copy_tensor,
    placed_like,
    require,
    transformers_module,
)

__all__ = [
    "bert_config",
    "from_hf_bert",
    "from_hf_gpt2",
    "from_hf_marian",
    "gpt2_config",
    "marian_config",
    "marian_en_de_hf_config",
    "to_hf_gpt2",
]

# Hugging Face activation names -> ours. "gelu_new" is GPT-2's tanh approximation written out.
_ACTIVATION_FROM_HF = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}
_ACTIVATION_TO_HF = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"}


def _activation(name: str, model: str) -> str:
    if name not in _ACTIVATION_FROM_HF:
        raise ValueError(
            f"{model}: activation_function {name!r} has no counterpart here; "
            f"supported: {sorted(_ACTIVATION_FROM_HF)}"
        )
    return _ACTIVATION_FROM_HF[name]


def _copy_conv1d(dst: nn.Linear, weight: Tensor, bias: Tensor, name: str) -> None:
    """Copy a GPT-2 ``Conv1D`` weight (in, out) into ``dst`` keeping its memory layout:
    ``dst.weight`` is the (out, in) transpose of an (in, out) tensor (a view, like
    ``weight.t()``). Values, shapes and every use are those of any ``nn.Linear``; at batch 1
    the matrix-vector products of decoding read this layout faster, as Hugging Face's GPT-2
    does (measured in ``benchmarks/decode_hf.py``)."""
    stored = torch.empty_like(dst.weight.t(), memory_format=torch.contiguous_format)  # (in, out)
    dst.weight = nn.Parameter(stored.t(), requires_grad=dst.weight.requires_grad)  # (out, in)
    copy_linear(dst, weight.t(), bias, name)  # checks the shapes, as for any Linear


def _copy_norm(dst: LayerNorm, src: nn.LayerNorm, name: str) -> None:
    copy_linear(dst, src.weight, src.bias, name)  # gain and shift are weight and bias too


# ----------------------------------------------------------------------------------- GPT-2
def gpt2_config(hf_config: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a ``transformers.GPT2Config``.

    GPT-2 is pre-LN with a final LayerNorm, learned positions, unscaled
    token embeddings tied to the output, and GELU (tanh approximation) in
    the feed-forward network.
    """
    c = hf_config
    for name, supported in (
        ("scale_attn_weights", c.scale_attn_weights),
        ("scale_attn_by_inverse_layer_idx", not c.scale_attn_by_inverse_layer_idx),
        ("add_cross_attention", not c.add_cross_attention),
    ):
        require(supported, f"GPT-2: {name}={getattr(c, name)} is not supported")
    return TransformerConfig(
        vocab_size=c.vocab_size,
        d_model=c.n_embd,
        n_heads=c.n_head,
        d_ff=c.n_inner if c.n_inner is not None else 4 * c.n_embd,
        n_layers=c.n_layer,
        dropout=c.resid_pdrop,
        attention_dropout=c.attn_pdrop,
        max_len=c.n_positions,
        norm_first=True,
        final_norm=True,
        positional="learned",
        tie_embeddings=c.tie_word_embeddings,
        activation=_activation(c.activation_function, "GPT-2"),
        layer_norm_eps=c.layer_norm_epsilon,
        scale_embeddings=False,
    )


@torch.no_grad()
def from_hf_gpt2(model: nn.Module) -> DecoderOnlyLM:
    """A :class:`~coursepkg.DecoderOnlyLM` with the weights of a Hugging Face GPT-2.

    GPT-2 stores its projections as ``Conv1D`` (y = x W + b, W of shape (in, out)), the
    transpose of ``nn.Linear``; its attention input projection ``c_attn`` holds W^Q, W^K and
    W^V side by side.

    Args:
        model: a ``GPT2LMHeadModel`` or a ``GPT2Model`` (whose output head is then the tied
            token embedding).

    Returns:
        The reference model on ``model``'s device and dtype, in its train/eval mode;
        ``lm(tokens, token_mask)`` equals ``model(tokens, attention_mask=...).logits``.
    """
    tf = transformers_module()
    if isinstance(model, tf.GPT2LMHeadModel):
        body, head = model.transformer, model.lm_head
    elif isinstance(model, tf.GPT2Model):
        body, head = model, None
    else:
        raise TypeError(f"model must be a GPT2LMHeadModel or GPT2Model, got {type(model).__name__}")
    config = gpt2_config(model.config)
    if head is None:
        config = config.replace(tie_embeddings=True)
    lm = DecoderOnlyLM(config)
    d = config.d_model
    copy_tensor(lm.embed.weight, body.wte.weight, "wte")
    copy_tensor(lm.positions.weight, body.wpe.weight, "wpe")
    for i, (dst, src) in enumerate(zip(lm.layers, body.h, strict=True)):
        name = f"h.{i}"
        attn = dst.self_attn
        w_q, w_k, w_v = src.attn.c_attn.weight.split(d, dim=1)  # 3 x (D, D), Conv1D (in, out)
        b_q, b_k, b_v = src.attn.c_attn.bias.split(d)
        _copy_conv1d(attn.q_proj, w_q, b_q, f"{name}.attn.c_attn[q]")
        _copy_conv1d(attn.k_proj, w_k, b_k, f"{name}.attn.c_attn[k]")
        _copy_conv1d(attn.v_proj, w_v, b_v, f"{name}.attn.c_attn[v]")
        c_proj = src.attn.c_proj
        _copy_conv1d(attn.out_proj, c_proj.weight, c_proj.bias, f"{name}.attn.c_proj")
        c_fc, m_proj = src.mlp.c_fc, src.mlp.c_proj
        _copy_conv1d(dst.ffn.linear1, c_fc.weight, c_fc.bias, f"{name}.mlp.c_fc")
        _copy_conv1d(dst.ffn.linear2, m_proj.weight, m_proj.bias, f"{name}.mlp.c_proj")
        _copy_norm(dst.norm1, src.ln_1, f"{name}.ln_1")
        _copy_norm(dst.norm2, src.ln_2, f"{name}.ln_2")
    _copy_norm(lm.norm, body.ln_f, "ln_f")
    if head is not None and not config.tie_embeddings:
        copy_tensor(lm.lm_head.weight, head.weight, "lm_head")
    return placed_like(lm, model)


@torch.no_grad()
def to_hf_gpt2(lm: DecoderOnlyLM) -> nn.Module:
    """The way back: a ``transformers.GPT2LMHeadModel`` with the weights of ``lm``.

    ``lm`` must have GPT-2's architecture (pre-LN, final norm, learned positions, no embedding
    scale, biases, d_k = d_v = D / H, no logits bias); anything else raises ``ValueError``.
    """
    tf = transformers_module()
    if not isinstance(lm, DecoderOnlyLM):
        raise TypeError(f"lm must be a DecoderOnlyLM, got {type(lm).__name__}")
    c = lm.config
    needs = dict(
        norm_first=True,
        use_final_norm=True,
        positional="learned",
        scale_embeddings=False,
        bias=True,
        hf=HFOptions(),
        head_dim_k=c.d_model // c.n_heads,
        head_dim_v=c.d_model // c.n_heads,
    )
    wrong = {k: getattr(c, k) for k, v in needs.items() if getattr(c, k) != v}
    require(not wrong, f"lm is not GPT-2 shaped: needs {needs}, differs in {wrong}")
    require(c.activation in _ACTIVATION_TO_HF, f"activation {c.activation!r} has no GPT-2 name")
    hf_config = tf.GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.max_len,
        n_embd=c.d_model,
        n_layer=c.n_layers,
        n_head=c.n_heads,
        n_inner=c.d_ff,
        activation_function=_ACTIVATION_TO_HF[c.activation],
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.attention_dropout,
        layer_norm_epsilon=c.layer_norm_eps,
        tie_word_embeddings=c.tie_embeddings,
    )
    model = tf.GPT2LMHeadModel(hf_config)
    body = model.transformer
    copy_tensor(body.wte.weight, lm.embed.weight, "embed")
    copy_tensor(body.wpe.weight, lm.positions.weight, "positions")
    for src, dst in zip(lm.layers, body.h, strict=True):
        a = src.self_attn
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])  # (3D, D)
        copy_tensor(dst.attn.c_attn.weight, qkv.t(), "c_attn.weight")
        qkv_bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])  # (3D,)
        copy_tensor(dst.attn.c_attn.bias, qkv_bias, "c_attn.bias")
        copy_tensor(dst.attn.c_proj.weight, a.out_proj.weight.t(), "attn.c_proj.weight")
        copy_tensor(dst.attn.c_proj.bias, a.out_proj.bias, "attn.c_proj.bias")
        copy_tensor(dst.mlp.c_fc.weight, src.ffn.linear1.weight.t(), "mlp.c_fc.weight")
        copy_tensor(dst.mlp.c_fc.bias, src.ffn.linear1.bias, "mlp.c_fc.bias")
        copy_tensor(dst.mlp.c_proj.weight, src.ffn.linear2.weight.t(), "mlp.c_proj.weight")
        copy_tensor(dst.mlp.c_proj.bias, src.ffn.linear2.bias, "mlp.c_proj.bias")
        for ours, theirs in ((src.norm1, dst.ln_1), (src.norm2, dst.ln_2)):
            copy_tensor(theirs.weight, ours.weight, "ln.weight")
            copy_tensor(theirs.bias, ours.bias, "ln.bias")
    copy_tensor(body.ln_f.weight, lm.norm.weight, "ln_f.weight")
    copy_tensor(body.ln_f.bias, lm.norm.bias, "ln_f.bias")
    if not c.tie_embeddings:
        copy_tensor(model.lm_head.weight, lm.lm_head.weight, "lm_head")
    return placed_like(model, lm)


# ------------------------------------------------------------------------------------ BERT
def bert_config(hf_config: Any, mlm_head: bool = True, pooler: bool = False) -> TransformerConfig:
    """The :class:`TransformerConfig` of a ``transformers.BertConfig``.

    BERT is post-LN with learned positions, two token types, a LayerNorm on the embeddings,
    unscaled embeddings and exact GELU.

    Args:
        hf_config: the BERT config.
        mlm_head: include the masked-LM head (``BertForMaskedLM``).
        pooler: include the pooler (``BertModel`` with its default pooling layer).
    """
    c = hf_config
    require(not c.is_decoder, "BERT: is_decoder=True (a causal BERT) is not supported")
    position_type = getattr(c, "position_embedding_type", "absolute")
    require(position_type == "absolute", f"BERT: position_embedding_type {position_type!r}")
    return TransformerConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
        d_ff=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        dropout=c.hidden_dropout_prob,
        attention_dropout=c.attention_probs_dropout_prob,
        max_len=c.max_position_embeddings,
        norm_first=False,
        final_norm=False,
        positional="learned",
        tie_embeddings=c.tie_word_embeddings,
        activation=_activation(c.hidden_act, "BERT"),
        layer_norm_eps=c.layer_norm_eps,
        scale_embeddings=False,
        hf=HFOptions(
            n_token_types=c.type_vocab_size, embed_norm=True, pooler=pooler, mlm_head=mlm_head
        ),
    )


@torch.no_grad()
def from_hf_bert(model: nn.Module) -> EncoderOnlyLM:
    """A :class:`~coursepkg.EncoderOnlyLM` with the weights of a Hugging Face BERT.

    Args:
        model: a ``BertForMaskedLM`` (encoder and masked-LM head; then
            ``ours(tokens, mask, types)`` equals ``model(...).logits``) or a ``BertModel``
            (encoder and, if it has one, the pooler; then ``ours(...)`` equals
            ``last_hidden_state`` and ``ours.pool(hidden)`` equals ``pooler_output``).

    Returns:
        The reference model on ``model``'s device and dtype, in its train/eval mode.
    """
    tf = transformers_module()
    if isinstance(model, tf.BertForMaskedLM):
        body, head = model.bert, model.cls.predictions
    elif isinstance(model, tf.BertModel):
        body, head = model, None
    else:
        raise TypeError(f"model must be a BertForMaskedLM or BertModel, got {type(model).__name__}")
    config = bert_config(model.config, mlm_head=head is not None, pooler=body.pooler is not None)
    ours = EncoderOnlyLM(config)
    emb = body.embeddings
    copy_tensor(ours.embed.weight, emb.word_embeddings.weight, "word_embeddings")
    copy_tensor(ours.positions.weight, emb.position_embeddings.weight, "position_embeddings")
    copy_tensor(ours.token_types.weight, emb.token_type_embeddings.weight, "token_type_embeddings")
    _copy_norm(ours.embed_norm, emb.LayerNorm, "embeddings.LayerNorm")
    for i, (dst, src) in enumerate(zip(ours.encoder.layers, body.encoder.layer, strict=True)):
        name = f"encoder.layer.{i}"
        s, o = src.attention.self, src.attention.output
        for ours_proj, theirs in (("q_proj", s.query), ("k_proj", s.key), ("v_proj", s.value)):
            proj = getattr(dst.self_attn, ours_proj)
            copy_linear(proj, theirs.weight, theirs.bias, f"{name}.attention.self")
        copy_linear(dst.self_attn.out_proj, o.dense.weight, o.dense.bias, f"{name}.output")
        _copy_norm(dst.norm1, o.LayerNorm, f"{name}.attention.output.LayerNorm")
        inter, out = src.intermediate.dense, src.output.dense
        copy_linear(dst.ffn.linear1, inter.weight, inter.bias, f"{name}.intermediate.dense")
        copy_linear(dst.ffn.linear2, out.weight, out.bias, f"{name}.output.dense")
        _copy_norm(dst.norm2, src.output.LayerNorm, f"{name}.output.LayerNorm")
    if body.pooler is not None:
        pool = body.pooler.dense
        copy_linear(ours.pooler, pool.weight, pool.bias, "pooler.dense")
    if head is not None:
        t = head.transform
        copy_linear(ours.head.dense, t.dense.weight, t.dense.bias, "predictions.transform.dense")
        _copy_norm(ours.head.norm, t.LayerNorm, "predictions.transform.LayerNorm")
        if not config.tie_embeddings:
            copy_tensor(ours.head.output.weight, head.decoder.weight, "predictions.decoder.weight")
        copy_tensor(ours.head.output.bias, head.decoder.bias, "predictions.decoder.bias")
    return placed_like(ours, model)


# ---------------------------------------------------------------------------------- Marian
def marian_en_de_hf_config() -> Any:
    """The ``transformers.MarianConfig`` of the OPUS-MT English-German model
    (Helsinki-NLP/opus-mt-en-de), built offline from the numbers of its ``config.json``."""
    tf = transformers_module()
    return tf.MarianConfig(
        vocab_size=58101,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        max_position_embeddings=512,
        activation_function="swish",
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        pad_token_id=58100,
        decoder_start_token_id=58100,
        eos_token_id=0,
    )


def marian_config(
    hf_config: Any, share: bool | None = None, tie: bool | None = None
) -> TransformerConfig:
    """The :class:`TransformerConfig` of a ``transformers.MarianConfig``.

    Marian is the paper's post-LN encoder-decoder with sinusoidal positions whose table holds
    all sines, then all cosines (``sinusoidal_layout="halves"``), embeddings scaled by sqrt(D),
    a fixed bias on the logits, and usually swish (SiLU) in the feed-forward network.

    Args:
        hf_config: the Marian config.
        share: one embedding matrix for source and target; by default as Hugging Face builds
            it (``share_encoder_decoder_embeddings``, and only when ``tie_word_embeddings``:
            transformers 5 unties every tied matrix otherwise).
        tie: the output projection is the target embedding; by default ``tie_word_embeddings``.
    """
    c = hf_config
    tie = c.tie_word_embeddings if tie is None else tie
    if share is None:
        share = c.share_encoder_decoder_embeddings and c.tie_word_embeddings
    require(
        c.encoder_attention_heads == c.decoder_attention_heads,
        "Marian: encoder and decoder must have the same number of heads",
    )
    require(
        c.encoder_ffn_dim == c.decoder_ffn_dim,
        "Marian: encoder and decoder must have the same feed-forward width",
    )
    # With one vocabulary (share_encoder_decoder_embeddings) the target vocabulary is vocab_size.
    one_vocab = c.share_encoder_decoder_embeddings
    tgt_vocab = c.vocab_size if one_vocab else (c.decoder_vocab_size or c.vocab_size)
    require(
        not share or tgt_vocab == c.vocab_size,
        f"Marian: shared embeddings need one vocabulary, got vocab_size={c.vocab_size} and "
        f"decoder_vocab_size={tgt_vocab}",
    )
    return TransformerConfig(
        vocab_size=tgt_vocab,
        src_vocab_size=None if tgt_vocab == c.vocab_size else c.vocab_size,
        share_embeddings=share,
        d_model=c.d_model,
        n_heads=c.encoder_attention_heads,
        d_ff=c.encoder_ffn_dim,
        n_layers=c.encoder_layers,
        n_decoder_layers=c.decoder_layers,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        max_len=c.max_position_embeddings,
        norm_first=False,
        final_norm=False,
        positional="sinusoidal",
        sinusoidal_layout="halves",
        scale_embeddings=c.scale_embedding,
        tie_embeddings=tie,
        activation=_activation(c.activation_function, "Marian"),
        pad_id=c.pad_token_id,
        hf=HFOptions(logits_bias=True),
    )


@torch.no_grad()
def from_hf_marian(model: nn.Module) -> Transformer:
    """A :class:`~coursepkg.Transformer` with the weights of a Hugging Face Marian model.

    Args:
        model: a ``MarianMTModel`` (e.g. an OPUS-MT translator).

    Returns:
        The reference model on ``model``'s device and dtype, in its train/eval mode;
        ``ours(src, tgt, src_mask, tgt_mask)`` equals ``model(input_ids=src,
        attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits``
        and :func:`~coursepkg.greedy_decode` with ``bos_id=decoder_start_token_id`` gives the
        tokens of ``model.generate(..., num_beams=1, do_sample=False)``.
    """
    check_model_class(model, "MarianMTModel")
    enc, dec = model.model.encoder, model.model.decoder
    share = enc.embed_tokens.weight is dec.embed_tokens.weight
    tie = model.lm_head.weight is dec.embed_tokens.weight
    config = marian_config(model.config, share=share, tie=tie)
    ours = Transformer(config)
    copy_tensor(ours.src_embed.weight, enc.embed_tokens.weight, "encoder.embed_tokens")
    if not config.share_embeddings:
        copy_tensor(ours.tgt_embed.weight, dec.embed_tokens.weight, "decoder.embed_tokens")
    # The same numbers in both stacks; copied so that the table is Hugging Face's exactly.
    copy_tensor(ours.positions.table, enc.embed_positions.weight, "encoder.embed_positions")
    for i, (dst, src) in enumerate(zip(ours.encoder.layers, enc.layers, strict=True)):
        name = f"encoder.layers.{i}"
        _copy_attention(dst.self_attn, src.self_attn, f"{name}.self_attn")
        _copy_norm(dst.norm1, src.self_attn_layer_norm, f"{name}.self_attn_layer_norm")
        copy_linear(dst.ffn.linear1, src.fc1.weight, src.fc1.bias, f"{name}.fc1")
        copy_linear(dst.ffn.linear2, src.fc2.weight, src.fc2.bias, f"{name}.fc2")
        _copy_norm(dst.norm2, src.final_layer_norm, f"{name}.final_layer_norm")
    for i, (dst, src) in enumerate(zip(ours.decoder.layers, dec.layers, strict=True)):
        name = f"decoder.layers.{i}"
        _copy_attention(dst.self_attn, src.self_attn, f"{name}.self_attn")
        _copy_norm(dst.norm1, src.self_attn_layer_norm, f"{name}.self_attn_layer_norm")
        _copy_attention(dst.cross_attn, src.encoder_attn, f"{name}.encoder_attn")
        _copy_norm(dst.norm2, src.encoder_attn_layer_norm, f"{name}.encoder_attn_layer_norm")
        copy_linear(dst.ffn.linear1, src.fc1.weight, src.fc1.bias, f"{name}.fc1")
        copy_linear(dst.ffn.linear2, src.fc2.weight, src.fc2.bias, f"{name}.fc2")
        _copy_norm(dst.norm3, src.final_layer_norm, f"{name}.final_layer_norm")
    if not config.tie_embeddings:
        copy_tensor(ours.lm_head.weight, model.lm_head.weight, "lm_head")
    copy_tensor(ours.logits_bias, model.final_logits_bias[0], "final_logits_bias")
    return placed_like(ours, model)


def _copy_attention(dst: nn.Module, src: nn.Module, name: str) -> None:
    # Marian (like BART) already names its projections q_proj, k_proj, v_proj, out_proj.
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        theirs = getattr(src, proj)
        copy_linear(getattr(dst, proj), theirs.weight, theirs.bias, f"{name}.{proj}")
