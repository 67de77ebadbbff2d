"""The catalogue of ex05_decoder: the known mistakes of the causal mask and of how
``DecoderLayer.forward`` wires its pieces, each a runnable variant with the advice a student
gets when their output matches it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..framework import BugVariant, FeedForwardBlock, HeadsBlock

__all__ = [
    "BUGS",
    "CAUSAL_MASK_BUGS",
    "CAUSAL_MASK_ITEM",
    "DECODER_LAYER_BUGS",
    "DECODER_LAYER_ITEM",
    "SUBLAYERS",
]

CAUSAL_MASK_ITEM = "causal_mask"
DECODER_LAYER_ITEM = "DecoderLayer"

# ---------------------------------------------------------------------------------------------
# Known mistakes: the causal mask
# ---------------------------------------------------------------------------------------------


def _mask_hides_diagonal(length: int) -> Tensor:
    return torch.ones(length, length, dtype=torch.bool).tril(diagonal=-1)  # (L, L)


def _mask_upper_triangle(length: int) -> Tensor:
    return torch.ones(length, length, dtype=torch.bool).triu()  # (L, L)


def _mask_inverted(length: int) -> Tensor:
    return torch.ones(length, length, dtype=torch.bool).triu(diagonal=1)  # (L, L)


def _mask_float_ones(length: int) -> Tensor:
    return torch.ones(length, length).tril()  # (L, L)


def _mask_inverted_float(length: int) -> Tensor:
    return torch.ones(length, length).triu(diagonal=1)  # (L, L)


def _mask_additive(length: int) -> Tensor:
    blocked = torch.ones(length, length, dtype=torch.bool).triu(diagonal=1)  # (L, L)
    return torch.zeros(length, length).masked_fill(blocked, float("-inf"))  # (L, L)


CAUSAL_MASK_BUGS: list[BugVariant] = [
    BugVariant(
        id="causal_mask.hides_diagonal",
        item=CAUSAL_MASK_ITEM,
        description="the mask hides the diagonal: position i may not attend itself",
        advice="Position i may attend keys 0..i, itself included: use tril() with the default "
        "diagonal=0 (or j <= i, not j < i).",
        impl=_mask_hides_diagonal,
    ),
    BugVariant(
        id="causal_mask.upper_triangle",
        item=CAUSAL_MASK_ITEM,
        description="the mask is transposed (upper triangle): position i attends the future "
        "positions i..L-1 instead of the past 0..i",
        advice="Rows are queries and columns are keys; query i may attend key j when j <= i, "
        "which is the lower triangle: use tril(), not triu().",
        impl=_mask_upper_triangle,
    ),
    BugVariant(
        id="causal_mask.inverted",
        item=CAUSAL_MASK_ITEM,
        description="the mask uses the opposite convention (True = blocked, as "
        "nn.MultiheadAttention's attn_mask)",
        advice="In this course True means 'may attend': return the lower triangle including "
        "the diagonal (or negate your mask with ~).",
        impl=_mask_inverted,
    ),
    BugVariant(
        id="causal_mask.float_ones",
        item=CAUSAL_MASK_ITEM,
        description="the mask is a float tensor of ones and zeros instead of a boolean tensor",
        advice="Return a torch.bool tensor, e.g. add dtype=torch.bool or call .bool(); "
        "masked_fill and ~mask need booleans.",
        impl=_mask_float_ones,
    ),
    BugVariant(
        id="causal_mask.additive",
        item=CAUSAL_MASK_ITEM,
        description="the mask is an additive float mask (0 where allowed, -inf where blocked)",
        advice="The course's masks are boolean, True = may attend; attention turns them into "
        "-inf itself. Return the lower-triangular boolean mask instead.",
        impl=_mask_additive,
    ),
    BugVariant(
        id="causal_mask.inverted_float",
        item=CAUSAL_MASK_ITEM,
        description="the mask is a float tensor with 1 = blocked (the future positions), "
        "as torch.triu(torch.ones(L, L), diagonal=1) gives: both the dtype and the meaning "
        "are the opposite of the course's",
        advice="Return the boolean lower triangle, True = may attend: "
        "torch.ones(L, L, dtype=torch.bool).tril() (or triu(..., diagonal=1) == 0).",
        impl=_mask_inverted_float,
    ),
]

# ---------------------------------------------------------------------------------------------
# Known mistakes: how DecoderLayer.forward wires its pieces
# ---------------------------------------------------------------------------------------------
# Each variant is a buggy ``forward(layer, x, memory, self_mask, cross_mask)``: the check runs it
# on the reference layer's own pieces, and the tests bind it to a layer built from independent
# pieces. No correct piece lives here.


def _fwd_cross_from_decoder(layer, x, memory, self_mask=None, cross_mask=None):
    x = layer.norm1(x + layer.self_attn(x, x, x, self_mask))
    x = layer.norm2(x + layer.cross_attn(x, x, x, cross_mask))
    return layer.norm3(x + layer.ffn(x))


def _fwd_cross_queries_from_memory(layer, x, memory, self_mask=None, cross_mask=None):
    x = layer.norm1(x + layer.self_attn(x, x, x, self_mask))
    x = layer.norm2(x + layer.cross_attn(memory, x, x, cross_mask))
    return layer.norm3(x + layer.ffn(x))


def _fwd_no_residual_self(layer, x, memory, self_mask=None, cross_mask=None):
    x = layer.norm1(layer.self_attn(x, x, x, self_mask))
    x = layer.norm2(x + layer.cross_attn(x, memory, memory, cross_mask))
    return layer.norm3(x + layer.ffn(x))


def _fwd_no_residual_cross(layer, x, memory, self_mask=None, cross_mask=None):
    x = layer.norm1(x + layer.self_attn(x, x, x, self_mask))
    x = layer.norm2(layer.cross_attn(x, memory, memory, cross_mask))
    return layer.norm3(x + layer.ffn(x))


def _fwd_no_residual_ffn(layer, x, memory, self_mask=None, cross_mask=None):
    x = layer.norm1(x + layer.self_attn(x, x, x, self_mask))
    x = layer.norm2(x + layer.cross_attn(x, memory, memory, cross_mask))
    return layer.norm3(layer.ffn(x))


def _fwd_pre_ln(layer, x, memory, self_mask=None, cross_mask=None):
    h = layer.norm1(x)
    x = x + layer.self_attn(h, h, h, self_mask)
    h = layer.norm2(x)
    x = x + layer.cross_attn(h, memory, memory, cross_mask)
    return x + layer.ffn(layer.norm3(x))


def _fwd_norms_reversed(layer, x, memory, self_mask=None, cross_mask=None):
    x = layer.norm3(x + layer.self_attn(x, x, x, self_mask))
    x = layer.norm2(x + layer.cross_attn(x, memory, memory, cross_mask))
    return layer.norm1(x + layer.ffn(x))


def _fwd_norm_before_residual(layer, x, memory, self_mask=None, cross_mask=None):
    x = x + layer.norm1(layer.self_attn(x, x, x, self_mask))
    x = x + layer.norm2(layer.cross_attn(x, memory, memory, cross_mask))
    return x + layer.norm3(layer.ffn(x))


def _fwd_self_mask_ignored(layer, x, memory, self_mask=None, cross_mask=None):
    x = layer.norm1(x + layer.self_attn(x, x, x))
    x = layer.norm2(x + layer.cross_attn(x, memory, memory, cross_mask))
    return layer.norm3(x + layer.ffn(x))


def _fwd_cross_mask_ignored(layer, x, memory, self_mask=None, cross_mask=None):
    x = layer.norm1(x + layer.self_attn(x, x, x, self_mask))
    x = layer.norm2(x + layer.cross_attn(x, memory, memory))
    return layer.norm3(x + layer.ffn(x))


def _fwd_masks_swapped(layer, x, memory, self_mask=None, cross_mask=None):
    x = layer.norm1(x + layer.self_attn(x, x, x, cross_mask))
    x = layer.norm2(x + layer.cross_attn(x, memory, memory, self_mask))
    return layer.norm3(x + layer.ffn(x))


SUBLAYERS = (
    "x = norm1(x + self_attn(x, x, x, self_mask)); "
    "x = norm2(x + cross_attn(x, memory, memory, cross_mask)); "
    "return norm3(x + ffn(x))"
)

DECODER_LAYER_BUGS: list[BugVariant] = [
    BugVariant(
        id="decoder_layer.cross_attention_from_decoder",
        item=DECODER_LAYER_ITEM,
        description="cross-attention takes its keys and values from the decoder (x) instead "
        "of the encoder output (memory)",
        advice="Call cross_attn(x, memory, memory, cross_mask): queries from the decoder, keys "
        "and values from memory.",
        impl=_fwd_cross_from_decoder,
    ),
    BugVariant(
        id="decoder_layer.cross_attention_queries_from_memory",
        item=DECODER_LAYER_ITEM,
        description="cross-attention takes its queries from memory and its keys and values "
        "from the decoder (the arguments are swapped)",
        advice="The order is cross_attn(query, key, value): cross_attn(x, memory, memory, "
        "cross_mask).",
        impl=_fwd_cross_queries_from_memory,
    ),
    BugVariant(
        id="decoder_layer.no_residual_self_attention",
        item=DECODER_LAYER_ITEM,
        description="the residual connection around the self-attention sub-layer is missing",
        advice="Add the input back before the norm: x = norm1(x + self_attn(x, x, x, self_mask)).",
        impl=_fwd_no_residual_self,
    ),
    BugVariant(
        id="decoder_layer.no_residual_cross_attention",
        item=DECODER_LAYER_ITEM,
        description="the residual connection around the cross-attention sub-layer is missing",
        advice="Add the input back before the norm: x = norm2(x + cross_attn(x, memory, "
        "memory, cross_mask)).",
        impl=_fwd_no_residual_cross,
    ),
    BugVariant(
        id="decoder_layer.no_residual_ffn",
        item=DECODER_LAYER_ITEM,
        description="the residual connection around the feed-forward sub-layer is missing",
        advice="Add the input back before the norm: x = norm3(x + ffn(x)).",
        impl=_fwd_no_residual_ffn,
    ),
    BugVariant(
        id="decoder_layer.pre_ln",
        item=DECODER_LAYER_ITEM,
        description="the norms are applied before each sub-layer (pre-LN) instead of after the "
        "residual sum (post-LN, the paper's order)",
        advice=f"Use the paper's post-LN order: {SUBLAYERS}.",
        impl=_fwd_pre_ln,
    ),
    BugVariant(
        id="decoder_layer.norms_reversed",
        item=DECODER_LAYER_ITEM,
        description="the norms are used in the wrong order (norm3 after self-attention and "
        "norm1 after the feed-forward network)",
        advice="norm1 belongs to self-attention, norm2 to cross-attention and norm3 to the "
        "feed-forward network.",
        impl=_fwd_norms_reversed,
    ),
    BugVariant(
        id="decoder_layer.norm_inside_residual",
        item=DECODER_LAYER_ITEM,
        description="each norm is applied to the sub-layer's output before the residual sum, "
        "x + norm(sublayer(x)), instead of to the sum",
        advice=f"Normalise the sum: {SUBLAYERS}.",
        impl=_fwd_norm_before_residual,
    ),
    BugVariant(
        id="decoder_layer.self_mask_ignored",
        item=DECODER_LAYER_ITEM,
        description="self-attention ignores self_mask, so every position sees the future",
        advice="Pass the mask on: self_attn(x, x, x, self_mask).",
        impl=_fwd_self_mask_ignored,
    ),
    BugVariant(
        id="decoder_layer.cross_mask_ignored",
        item=DECODER_LAYER_ITEM,
        description="cross-attention ignores cross_mask, so padded source positions are attended",
        advice="Pass the mask on: cross_attn(x, memory, memory, cross_mask).",
        impl=_fwd_cross_mask_ignored,
    ),
    BugVariant(
        id="decoder_layer.masks_swapped",
        item=DECODER_LAYER_ITEM,
        description="self_mask and cross_mask are swapped",
        advice="self_mask (causal, L x L) goes to self-attention and cross_mask (source "
        "padding, L x S) to cross-attention.",
        impl=_fwd_masks_swapped,
    ),
]


class DecoderLayer_builtin_decoder_layer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        """PyTorch's nn.TransformerDecoderLayer, wrapped."""
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(d_model, n_heads, d_ff, 0.0, batch_first=True)

    def forward(self, x, memory, self_mask=None, cross_mask=None):  # noqa: ANN001, ANN201
        blocked = None if self_mask is None else ~self_mask  # PyTorch's: True = blocked
        crossed = None if cross_mask is None else ~cross_mask
        return self.layer(x, memory, tgt_mask=blocked, memory_mask=crossed)  # (B, L, D)


class _FusedHeads(HeadsBlock):
    """Multi-head attention on PyTorch's fused kernel (the built-in of the mistakes below)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, L, Dk)


class DecoderLayer_builtin_sdpa(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        """The contract's pieces, both attention blocks on PyTorch's fused kernel."""
        super().__init__()
        self.self_attn = _FusedHeads(d_model, n_heads)
        self.cross_attn = _FusedHeads(d_model, n_heads)
        self.ffn = FeedForwardBlock(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))

    def attend(self, block: nn.Module, query: Tensor, memory: Tensor, mask: Tensor | None):
        """One attention sub-layer: the course's block takes the course's mask."""
        return block(query, memory, memory, mask)  # (B, L, D)

    def forward(self, x, memory, self_mask=None, cross_mask=None):  # noqa: ANN001, ANN201
        x = self.norm1(x + self.attend(self.self_attn, x, x, self_mask))  # (B, L, D)
        x = self.norm2(x + self.attend(self.cross_attn, x, memory, cross_mask))  # (B, L, D)
        return self.norm3(x + self.ffn(x))  # (B, L, D)


class DecoderLayer_builtin_multihead_attention(DecoderLayer_builtin_sdpa):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        """PyTorch's nn.MultiheadAttention for both attention blocks."""
        super().__init__(d_model, n_heads, d_ff)
        self.self_attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def attend(self, block: nn.Module, query: Tensor, memory: Tensor, mask: Tensor | None):
        """PyTorch's block takes the opposite mask (True = blocked) and returns a pair."""
        blocked = None if mask is None else ~mask
        return block(query, memory, memory, attn_mask=blocked, need_weights=False)[0]


DECODER_LAYER_BUGS += [
    BugVariant(
        id="decoder_layer.builtin_decoder_layer",
        item=DECODER_LAYER_ITEM,
        description="your DecoderLayer uses PyTorch's nn.TransformerDecoderLayer, where the "
        "exercise asks you to build the layer from your own pieces",
        advice="Build self_attn, cross_attn, ffn and norm1..norm3 from your own classes and "
        f"wire them yourself: {SUBLAYERS}.",
        impl=DecoderLayer_builtin_decoder_layer,
        calls=(nn.TransformerDecoderLayer,),
    ),
    BugVariant(
        id="decoder_layer.builtin_multihead_attention",
        item=DECODER_LAYER_ITEM,
        description="your DecoderLayer uses PyTorch's nn.MultiheadAttention, where the "
        "exercise asks you to use your own MultiHeadAttention",
        advice="Paste your MultiHeadAttention from ex02 and build self_attn and cross_attn "
        "from it.",
        impl=DecoderLayer_builtin_multihead_attention,
        calls=(nn.MultiheadAttention,),
    ),
    BugVariant(
        id="decoder_layer.builtin_sdpa",
        item=DECODER_LAYER_ITEM,
        description="your DecoderLayer's attention calls PyTorch's fused "
        "torch.nn.functional.scaled_dot_product_attention, where the exercise asks for your "
        "own attention step",
        advice="Paste your MultiHeadAttention from ex02, whose attention you wrote with matmul, "
        "masking and softmax.",
        impl=DecoderLayer_builtin_sdpa,
        calls=(F.scaled_dot_product_attention,),
    ),
]

BUGS: list[BugVariant] = [*CAUSAL_MASK_BUGS, *DECODER_LAYER_BUGS]
