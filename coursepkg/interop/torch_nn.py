"""Weight transfer from ``torch.nn.Transformer`` into the reference encoder-decoder stack."""

from __future__ import annotations

import torch
from torch import nn

from ..attention import MultiHeadAttention
from ..config import TransformerConfig
from ..layers import LayerNorm
from ..model import EncoderDecoder


def _copy_mha(dst: MultiHeadAttention, src: nn.MultiheadAttention) -> None:
    if not src._qkv_same_embed_dim:
        dst.q_proj.weight.copy_(src.q_proj_weight)
        dst.k_proj.weight.copy_(src.k_proj_weight)
        dst.v_proj.weight.copy_(src.v_proj_weight)
    else:
        wq, wk, wv = src.in_proj_weight.chunk(3, dim=0)  # 3 x (D, D)
        dst.q_proj.weight.copy_(wq)
        dst.k_proj.weight.copy_(wk)
        dst.v_proj.weight.copy_(wv)
    if src.in_proj_bias is not None:
        bq, bk, bv = src.in_proj_bias.chunk(3)
        dst.q_proj.bias.copy_(bq)
        dst.k_proj.bias.copy_(bk)
        dst.v_proj.bias.copy_(bv)
    dst.out_proj.weight.copy_(src.out_proj.weight)
    if src.out_proj.bias is not None:
        dst.out_proj.bias.copy_(src.out_proj.bias)


def _copy_norm(dst: LayerNorm | None, src: nn.LayerNorm | None, where: str) -> None:
    if (dst is None) != (src is None):
        raise ValueError(f"{where}: one model has a final LayerNorm and the other has not")
    if dst is None:
        return
    dst.weight.copy_(src.weight)
    if src.bias is not None:
        dst.bias.copy_(src.bias)


def _activation_name(layer: nn.Module) -> str:
    act = layer.activation
    name = getattr(act, "__name__", type(act).__name__).lower()
    if "relu" in name:
        return "relu"
    if "gelu" in name:
        return "gelu"
    raise ValueError(f"unsupported activation {act!r}: only relu and gelu transfer")


@torch.no_grad()
def from_torch_transformer(m: nn.Transformer) -> EncoderDecoder:
    """Build the reference encoder-decoder stack with the weights of ``m``.

    The result computes, with batch-first inputs and token masks (True = real token),
    ``m(src_emb, tgt_emb, tgt_mask=causal, src_key_padding_mask=~src_mask,
    tgt_key_padding_mask=~tgt_mask, memory_key_padding_mask=~src_mask)``. Post-LN and pre-LN
    (``norm_first``) both transfer; ``m.batch_first`` only changes ``m``'s input layout, not its
    weights, so the returned stack is always batch first.

    Args:
        m: a ``torch.nn.Transformer`` built with its standard layers.

    Returns:
        An :class:`~coursepkg.model.EncoderDecoder` on the same device and dtype as ``m``,
        in ``m``'s training/eval mode.
    """
    if not isinstance(m, nn.Transformer):
        raise TypeError(f"m must be a torch.nn.Transformer, got {type(m).__name__}")
    enc_layers, dec_layers = m.encoder.layers, m.decoder.layers
    first = enc_layers[0]
    attn = first.self_attn
    config = TransformerConfig(
        vocab_size=1,  # the stack has no embeddings; the vocabulary is irrelevant here
        d_model=m.d_model,
        n_heads=m.nhead,
        d_ff=first.linear1.out_features,
        n_layers=len(enc_layers),
        n_decoder_layers=len(dec_layers),
        dropout=first.dropout.p,
        norm_first=first.norm_first,
        final_norm=m.encoder.norm is not None,
        activation=_activation_name(first),
        bias=attn.in_proj_bias is not None,
        layer_norm_eps=first.norm1.eps,
        attention_dropout=attn.dropout,
    )
    if (m.decoder.norm is not None) != config.use_final_norm:
        raise ValueError("encoder and decoder of m disagree on having a final LayerNorm")
    p = next(m.parameters())
    out = EncoderDecoder(config).to(device=p.device, dtype=p.dtype)
    for dst, src in zip(out.encoder.layers, enc_layers, strict=True):
        _copy_mha(dst.self_attn, src.self_attn)
        dst.ffn.linear1.load_state_dict(src.linear1.state_dict())
        dst.ffn.linear2.load_state_dict(src.linear2.state_dict())
        _copy_norm(dst.norm1, src.norm1, "encoder layer")
        _copy_norm(dst.norm2, src.norm2, "encoder layer")
    for dst, src in zip(out.decoder.layers, dec_layers, strict=True):
        _copy_mha(dst.self_attn, src.self_attn)
        _copy_mha(dst.cross_attn, src.multihead_attn)
        dst.ffn.linear1.load_state_dict(src.linear1.state_dict())
        dst.ffn.linear2.load_state_dict(src.linear2.state_dict())
        _copy_norm(dst.norm1, src.norm1, "decoder layer")
        _copy_norm(dst.norm2, src.norm2, "decoder layer")
        _copy_norm(dst.norm3, src.norm3, "decoder layer")
    _copy_norm(out.encoder.norm, m.encoder.norm, "encoder")
    _copy_norm(out.decoder.norm, m.decoder.norm, "decoder")
    return out.train(m.training)
