"""What every model builds from a :class:`~coursepkg.TransformerConfig`: the token embedding,
the position module, the final norm, the logits bias and the initialisation.

The encoder-decoder (:mod:`coursepkg.model`), the decoder-only LM (:mod:`coursepkg.decoder_only`)
and the encoder-only LM (:mod:`coursepkg.encoder_only`) share these, so each lives here once.

Dimension legend: B batch, L length, D d_model, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import TransformerConfig
from .layers import LayerNorm, RMSNorm, make_norm
from .positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


def final_norm(config: TransformerConfig) -> LayerNorm | RMSNorm | None:
    if not config.use_final_norm:
        return None
    return make_norm(config.norm, config.d_model, config.layer_norm_eps, config.bias)


class TokenEmbedding(nn.Module):
    """Token embedding multiplied by sqrt(D) (Sec. 3.4); its ``weight`` may be tied.

    Args:
        vocab_size: V.
        d_model: D.
        scale: multiply by sqrt(D) (the paper, Marian); GPT-2 and BERT do not.
    """

    def __init__(self, vocab_size: int, d_model: int, scale: bool = True) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.scale = math.sqrt(d_model) if scale else None
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        # std D^-1/2 makes the scaled embedding unit-variance, and the tied logits start small.
        nn.init.normal_(self.weight, std=d_model**-0.5)

    def forward(self, tokens: Tensor) -> Tensor:
        """Embed ids the model has checked (an id outside [0, V) raises ``F.embedding``'s error).

        Shape: (B, L) integer ids -> (B, L, D).
        """
        x = F.embedding(tokens, self.weight)  # (B, L, D)
        return x if self.scale is None else x * self.scale


def make_positions(config: TransformerConfig) -> nn.Module:
    """The position module ``config.positional`` names (shared with :mod:`~coursepkg.encoder_only`).

    Args:
        config: its ``positional``, ``d_model``, ``max_len`` and ``sinusoidal_layout``.

    Returns:
        A :class:`LearnedPositionalEmbedding` or :class:`SinusoidalPositionalEncoding`.
    """
    if config.positional == "learned":
        return LearnedPositionalEmbedding(config.d_model, config.max_len)
    return SinusoidalPositionalEncoding(config.d_model, config.max_len, config.sinusoidal_layout)


def token_embedding(config: TransformerConfig, vocab_size: int) -> TokenEmbedding:
    """A :class:`TokenEmbedding` of ``vocab_size`` rows, scaled as ``config`` says.

    Args:
        config: its ``d_model`` and ``scale_embeddings``.
        vocab_size: number of rows V.

    Returns:
        The (untied) embedding module.
    """
    return TokenEmbedding(vocab_size, config.d_model, config.scale_embeddings)


def add_logits_bias(module: nn.Module, config: TransformerConfig) -> None:
    # A fixed (not trained) bias on the logits, as Marian's final_logits_bias; None when absent.
    bias = torch.zeros(config.vocab_size) if config.hf.logits_bias else None
    module.register_buffer("logits_bias", bias)


def init_linear_weights(module: nn.Module) -> None:
    """Xavier-uniform for every ``nn.Linear`` weight in ``module``, zeros for the biases (a
    common choice; the paper does not say).

    Args:
        module: initialised in place.
    """
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.xavier_uniform_(sub.weight)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
