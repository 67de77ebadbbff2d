"""The sub-layers and layers of the Transformer: LayerNorm, the position-wise FFN, and the
encoder and decoder layers in the paper's post-LN form and the pre-LN form (``norm_first``).

Dimension legend: B batch, L target/query length, S source length, D d_model, F d_ff.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import BlockConfig
from .fast_attention import FastDropout, FastMultiHeadAttention
from .kv_cache import LayerCache
from .positional import RopeAngles


def layer_norm_reference(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    """LayerNorm written out: (x - mean) / sqrt(var + eps) * gamma + beta over the last axis.

    The variance is the biased one (divide by D), as in ``nn.LayerNorm``.

    Shape:
        x (..., D), weight (D,), bias (D,) -> (..., D).
    """
    mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
    y = (x - mean) / torch.sqrt(var + eps)  # (..., D)
    y = y * weight
    return y + bias if bias is not None else y


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al., 2016) over the last dimension, with gain and bias.

    Args:
        d_model: width D.
        eps: added to the variance inside the square root.
        bias: whether to learn the additive ``bias`` (beta).

    Parameters ``weight`` (gamma, ones) and ``bias`` (beta, zeros). The forward pass uses the
    fused kernel; :func:`layer_norm_reference` is the same formula written out, and a test
    checks both against ``nn.LayerNorm``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """Shape: (..., D) -> (..., D)."""
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm written out: x / sqrt(mean(x^2) + eps) * gamma over the last axis.

    Unlike LayerNorm it subtracts no mean and adds no shift; eps sits inside the square root.

    Shape:
        x (..., D), weight (D,) -> (..., D).
    """
    rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    return x / rms * weight  # (..., D)


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang and Sennrich, 2019): scale only, no centring.

    Args:
        d_model: width D.
        eps: added to the mean square inside the square root.

    Parameter ``weight`` (gamma, ones); there is never a bias. Equal to ``torch.nn.RMSNorm``
    (a test checks it); :func:`rms_norm_reference` is the same formula written out.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        """Shape: (..., D) -> (..., D)."""
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def make_norm(norm: str, d_model: int, eps: float, bias: bool) -> LayerNorm | RMSNorm:
    """The normalisation layer named by ``TransformerConfig.norm`` (RMSNorm ignores ``bias``).

    Args:
        norm: ``"layernorm"`` or ``"rmsnorm"``.
        d_model: width D.
        eps: epsilon inside the square root.
        bias: LayerNorm's additive shift (RMSNorm has none).

    Returns:
        A fresh module mapping (..., D) -> (..., D).
    """
    if norm == "layernorm":
        return LayerNorm(d_model, eps, bias)
    if norm == "rmsnorm":
        return RMSNorm(d_model, eps)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {norm!r}")


def relu_squared(x: Tensor) -> Tensor:
    """ReLU(x)^2, the feed-forward activation of Primer (So et al. 2021) and nanochat."""
    return F.relu(x).square()


# The feed-forward activations by name (also used by the BERT-style encoder's heads).
ACTIVATIONS = {
    "relu": F.relu,
    "relu2": relu_squared,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}


# Gated feed-forwards by name, and the activation each applies to its gate (Shazeer, 2020).
GATED_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu"}


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = W2 act(W1 x + b1) + b2, applied at each position alone (Eq. 2).

    The gated variants (Llama, Qwen3) multiply the activated branch by a second, linear one:
    FFN(x) = W2 (act(W1 x) * W3 x), with act = SiLU for "swiglu" and GELU for "geglu".

    Args:
        d_model: width D of input and output.
        d_ff: inner width F (the hidden width of each branch when gated).
        dropout: dropout after the activation (after the product when gated), as
            ``nn.TransformerEncoderLayer`` does.
        activation: "relu" (paper), "relu2" (ReLU squared), "gelu" (exact), "gelu_tanh"
            (its tanh approximation, as in GPT-2), "silu" (x * sigmoid(x), also called swish;
            Marian), or the gated "swiglu" and "geglu".
        bias: whether the linears have biases.

    Submodules ``linear1`` (W1, D -> F, the activated branch: Hugging Face's ``gate_proj``),
    ``linear2`` (W2, F -> D, ``down_proj``) and, when gated, ``linear3`` (W3, D -> F, the
    linear branch: ``up_proj``; ``None`` otherwise).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        known = (*ACTIVATIONS, *GATED_ACTIVATIONS)
        if activation not in known:
            raise ValueError(f"activation must be one of {known}, got {activation!r}")
        gated = activation in GATED_ACTIVATIONS
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.linear3 = nn.Linear(d_model, d_ff, bias=bias) if gated else None
        self.dropout = FastDropout(dropout)
        self.activation = ACTIVATIONS[GATED_ACTIVATIONS.get(activation, activation)]

    def forward(self, x: Tensor) -> Tensor:
        """Shape: (B, L, D) -> (B, L, D)."""
        h = self.activation(self.linear1(x))  # (B, L, F)
        if self.linear3 is not None:
            h = h * self.linear3(x)  # (B, L, F): the gate times the linear branch
        return self.linear2(self.dropout(h))  # (B, L, D)


def block_attention(
    config: BlockConfig, attention: type[FastMultiHeadAttention] = FastMultiHeadAttention
) -> FastMultiHeadAttention:
    """A block's multi-head attention, each size and option taken by name from its config.

    Args:
        config: the block's resolved config (QK-norm is an RMSNorm over each head's Dk).
        attention: the class, the models' attention or a subclass that attends otherwise
            (:class:`~coursepkg.alibi.ALiBiAttention`).

    Returns:
        A fresh attention mapping (B, L, D) queries to (B, L, D).
    """
    c = config
    qk_norm = partial(RMSNorm, eps=c.layer_norm_eps) if c.qk_norm else None
    return attention(
        c.d_model,
        c.n_heads,
        d_k=c.d_k,
        d_v=c.d_v,
        dropout=c.attention_dropout,
        bias=c.bias,
        n_kv_heads=c.n_kv_heads,
        qk_norm=qk_norm,
    )


def block_norm(config: BlockConfig) -> LayerNorm | RMSNorm:
    """A block's normalisation: ``config.norm`` over D with its eps (and bias for LayerNorm)."""
    return make_norm(config.norm, config.d_model, config.layer_norm_eps, config.bias)


def _block_config(
    config: BlockConfig | int, n_heads: int | None, d_ff: int | None, dropout: float
) -> BlockConfig:
    # A layer's config, or the exercises' (d_model, n_heads, d_ff, dropout): ex09 lets a
    # student build this class in place of their own with those arguments.
    if isinstance(config, BlockConfig):
        if n_heads is not None or d_ff is not None or dropout != 0.0:
            raise ValueError(
                "a layer takes either a BlockConfig or d_model, n_heads, d_ff and dropout, "
                f"got a BlockConfig and n_heads={n_heads}, d_ff={d_ff}, dropout={dropout}"
            )
        return config
    if n_heads is None or d_ff is None:
        raise ValueError(
            f"a layer built from d_model={config!r} needs n_heads and d_ff too, got "
            f"n_heads={n_heads}, d_ff={d_ff} (or pass a BlockConfig)"
        )
    return BlockConfig.of(config, n_heads, d_ff, dropout)


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each wrapped in a residual connection and LayerNorm (Sec. 3.1).

    Post-LN (paper, ``norm_first=False``): x = norm(x + drop(sublayer(x))).
    Pre-LN (``norm_first=True``): x = x + drop(sublayer(norm(x))).

    Args:
        config: every size and option, resolved (:meth:`TransformerConfig.block()
            <coursepkg.config.TransformerConfig.block>` in a model, :meth:`BlockConfig.of
            <coursepkg.config.BlockConfig.of>` alone); or d_model D, the exercises' form.
        n_heads, d_ff, dropout: with an integer ``config`` only: H, F and the dropout of the
            paper's layer ``EncoderLayer(d_model, n_heads, d_ff, dropout)``, every other
            option at its default (ex09 lets students use this class as a stand-in so).

    Submodules ``self_attn``, ``ffn``, ``norm1``, ``norm2``. A decoder-only LM stacks these
    layers with a causal mask.
    """

    def __init__(
        self,
        config: BlockConfig | int,
        n_heads: int | None = None,
        d_ff: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        c = _block_config(config, n_heads, d_ff, dropout)
        self.norm_first = c.norm_first
        self.self_attn = self.build_self_attention(c)
        self.ffn = self.build_ffn(c)
        self.norm1 = block_norm(c)
        self.norm2 = block_norm(c)
        self.dropout1 = FastDropout(c.dropout)
        self.dropout2 = FastDropout(c.dropout)

    def build_self_attention(self, config: BlockConfig) -> nn.Module:
        """The self-attention sub-layer ``config`` describes (a subclass builds a variant of
        it here, e.g. :class:`~coursepkg.decoder_only.DecoderOnlyLayer`)."""
        return block_attention(config)

    def build_ffn(self, config: BlockConfig) -> nn.Module:
        """The feed-forward sub-layer ``config`` describes (a subclass builds a variant here)."""
        c = config
        return PositionwiseFeedForward(c.d_model, c.d_ff, c.dropout, c.activation, c.bias)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        cache: LayerCache | None = None,
        rope: RopeAngles | None = None,
    ) -> Tensor:
        """Encode ``x``.

        Args:
            x: input sequence.
            mask: attention mask, bool, True = may attend, broadcastable to (B, H, L, L).
            cache: self-attention key/value cache (decoder-only generation).
            rope: rotary positions for self-attention's queries and keys (decoder-only models
                with ``positional="rope"``).

        Shape:
            x (B, L, D) -> (B, L, D).
        """
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), mask, cache, rope)  # (B, L, D)
            x = x + self._ff_block(self.norm2(x))  # (B, L, D)
        else:
            x = self.norm1(x + self._sa_block(x, mask, cache, rope))  # (B, L, D)
            x = self.norm2(x + self._ff_block(x))  # (B, L, D)
        return x

    def _sa_block(
        self,
        x: Tensor,
        mask: Tensor | None,
        cache: LayerCache | None,
        rope: RopeAngles | None = None,
    ) -> Tensor:
        # Self-attention and its residual dropout; (B, L, D) -> (B, L, D).
        return self.dropout1(self.self_attn(x, x, x, mask, cache, rope))

    def _ff_block(self, x: Tensor) -> Tensor:
        # The position-wise FFN and its residual dropout; (B, L, D) -> (B, L, D).
        return self.dropout2(self.ffn(x))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder output, then FFN (Sec. 3.1).

    Cross-attention takes its queries from the decoder and its keys and values from
    ``memory`` (the encoder output). Residual/LayerNorm placement as in :class:`EncoderLayer`.

    Args: as :class:`EncoderLayer`.

    Submodules ``self_attn``, ``cross_attn``, ``ffn``, ``norm1``, ``norm2``, ``norm3``.
    """

    def __init__(
        self,
        config: BlockConfig | int,
        n_heads: int | None = None,
        d_ff: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        c = _block_config(config, n_heads, d_ff, dropout)
        self.norm_first = c.norm_first
        self.self_attn = block_attention(c)
        self.cross_attn = block_attention(c)
        self.ffn = PositionwiseFeedForward(c.d_model, c.d_ff, c.dropout, c.activation, c.bias)
        self.norm1 = block_norm(c)
        self.norm2 = block_norm(c)
        self.norm3 = block_norm(c)
        self.dropout1 = FastDropout(c.dropout)
        self.dropout2 = FastDropout(c.dropout)
        self.dropout3 = FastDropout(c.dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None = None,
        cross_mask: Tensor | None = None,
        self_cache: LayerCache | None = None,
        cross_cache: LayerCache | None = None,
    ) -> Tensor:
        """Decode one layer.

        Args:
            x: decoder input (shifted-right target embeddings, or the previous layer).
            memory: encoder output.
            self_mask: bool, True = may attend, broadcastable to (B, H, L, L); normally the
                causal mask combined with target padding.
            cross_mask: bool, broadcastable to (B, H, L, S); normally source padding.
            self_cache, cross_cache: key/value caches for incremental decoding.

        Shape:
            x (B, L, D), memory (B, S, D) -> (B, L, D).
        """
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), self_mask, self_cache)  # (B, L, D)
            x = x + self._ca_block(self.norm2(x), memory, cross_mask, cross_cache)  # (B, L, D)
            x = x + self._ff_block(self.norm3(x))  # (B, L, D)
        else:
            x = self.norm1(x + self._sa_block(x, self_mask, self_cache))  # (B, L, D)
            x = self.norm2(x + self._ca_block(x, memory, cross_mask, cross_cache))  # (B, L, D)
            x = self.norm3(x + self._ff_block(x))  # (B, L, D)
        return x

    def _sa_block(self, x: Tensor, mask: Tensor | None, cache: LayerCache | None) -> Tensor:
        # Masked self-attention and its residual dropout; (B, L, D) -> (B, L, D).
        return self.dropout1(self.self_attn(x, x, x, mask, cache))

    def _ca_block(
        self, x: Tensor, memory: Tensor, mask: Tensor | None, cache: LayerCache | None
    ) -> Tensor:
        # Cross-attention to the encoder output and its residual dropout; -> (B, L, D).
        return self.dropout2(self.cross_attn(x, memory, memory, mask, cache))

    def _ff_block(self, x: Tensor) -> Tensor:
        # The position-wise FFN and its residual dropout; (B, L, D) -> (B, L, D).
        return self.dropout3(self.ffn(x))
