"""The BERT-style encoder-only model: the encoder stack with token-type embeddings, an
embedding LayerNorm, an optional pooler, and the masked-language-model head.

Dimension legend: B batch, L length, D d_model, V vocabulary.
Token masks are bool (B, L), True = real token.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._validation import check_token_mask, check_tokens
from .config import TransformerConfig
from .layers import ACTIVATIONS, make_norm
from .model import Encoder
from .model_parts import init_linear_weights, make_positions, token_embedding


class MaskedLMHead(nn.Module):
    """Logits over the vocabulary at every position: dense, activation, LayerNorm, then the
    output matrix (tied to the token embedding in BERT) plus a bias per token.

    Args:
        config: the hyper-parameters (``d_model``, ``vocab_size``, ``activation``, ``bias``).

    Submodules ``dense`` (D -> D), ``norm`` and ``output`` (D -> V).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        d = config.d_model
        self.dense = nn.Linear(d, d, bias=config.bias)
        if config.activation not in ACTIVATIONS:  # the head's dense layer has no gate branch
            raise ValueError(
                f"the masked-LM head needs an ungated activation, one of {tuple(ACTIVATIONS)}, "
                f"got activation={config.activation!r}; set hf.mlm_head=False or change activation"
            )
        self.activation = ACTIVATIONS[config.activation]
        self.norm = make_norm(config.norm, d, config.layer_norm_eps, config.bias)
        self.output = nn.Linear(d, config.vocab_size, bias=config.bias)

    def forward(self, h: Tensor) -> Tensor:
        """Shape: (B, L, D) -> (B, L, V)."""
        return self.output(self.norm(self.activation(self.dense(h))))  # (B, L, V)


class EncoderOnlyLM(nn.Module):
    """An encoder-only (BERT-style) model: embeddings, N encoder layers, and heads.

    The input is token + position (+ token type) embeddings, optionally normalised
    (``hf.embed_norm``); the encoder sees every position (no causal mask). With ``hf.mlm_head``
    the output is masked-LM logits, otherwise the hidden states; with ``hf.pooler``,
    :meth:`pool` gives BERT's tanh(W h_0 + b) summary of the first token.

    Args:
        config: the hyper-parameters; BERT uses ``positional="learned"``,
            ``scale_embeddings=False``, post-LN, and
            ``hf=HFOptions(n_token_types=2, embed_norm=True)``.

    Submodules ``embed``, ``positions``, ``token_types`` (None without token types),
    ``embed_norm`` (None without), ``encoder``, ``pooler`` (None without), ``head``
    (a :class:`MaskedLMHead`, None without; its ``output.weight`` is ``embed.weight`` when
    ``tie_embeddings``).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        config.reject_decoder_only_options("EncoderOnlyLM")
        config.hf.reject_unsupported("EncoderOnlyLM")
        self.config = config
        d, hf = config.d_model, config.hf
        self.embed = token_embedding(config, config.vocab_size)
        self.positions = make_positions(config)
        self.token_types = nn.Embedding(hf.n_token_types, d) if hf.n_token_types else None
        self.embed_norm = (
            make_norm(config.norm, d, config.layer_norm_eps, config.bias) if hf.embed_norm else None
        )
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config)
        self.pooler = nn.Linear(d, d, bias=config.bias) if hf.pooler else None
        self.head = MaskedLMHead(config) if hf.mlm_head else None
        init_linear_weights(self)
        if self.head is not None and config.tie_embeddings:
            self.head.output.weight = self.embed.weight

    def encode(
        self,
        tokens: Tensor,
        token_mask: Tensor | None = None,
        token_types: Tensor | None = None,
    ) -> Tensor:
        """The encoder's hidden states.

        Args:
            tokens: ids.
            token_mask: bool, True = real token (derived from ``pad_id`` when omitted).
            token_types: segment ids in [0, hf.n_token_types) (default all 0).

        Shape:
            tokens (B, L) -> (B, L, D).
        """
        self._check_encode(tokens, token_mask, token_types)
        if token_mask is None and self.config.pad_id is not None:
            token_mask = tokens != self.config.pad_id  # (B, L)
        x = self.positions(self.embed(tokens))  # (B, L, D)
        if self.token_types is not None:
            if token_types is None:
                token_types = torch.zeros_like(tokens)  # (B, L)
            x = x + self.token_types(token_types)  # (B, L, D)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return self.encoder(self.dropout(x), token_mask)  # (B, L, D)

    def _check_encode(
        self, tokens: Tensor, token_mask: Tensor | None, token_types: Tensor | None
    ) -> None:
        check_tokens("tokens", tokens, self.config.vocab_size)
        if token_mask is not None:
            check_token_mask("token_mask", token_mask, tuple(tokens.shape))
        if token_types is None:
            return
        if self.token_types is None:
            raise ValueError("token_types given, but the config has hf.n_token_types=0")
        check_tokens("token_types", token_types, self.config.hf.n_token_types)
        if token_types.shape != tokens.shape:
            raise ValueError(
                f"token_types must have the shape of tokens {tuple(tokens.shape)}, "
                f"got {tuple(token_types.shape)}"
            )

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT's pooled summary tanh(W h_0 + b) of the first position.

        Shape:
            (B, L, D) -> (B, D).
        """
        if self.pooler is None:
            raise ValueError("this model has no pooler; build it with hf=HFOptions(pooler=True)")
        return torch.tanh(self.pooler(hidden[:, 0]))  # (B, D)

    def forward(
        self,
        tokens: Tensor,
        token_mask: Tensor | None = None,
        token_types: Tensor | None = None,
    ) -> Tensor:
        """Masked-LM logits (with ``hf.mlm_head``), else the hidden states.

        Args: as :meth:`encode`.

        Shape:
            tokens (B, L) -> (B, L, V) with the head, (B, L, D) without.
        """
        hidden = self.encode(tokens, token_mask, token_types)  # (B, L, D)
        return hidden if self.head is None else self.head(hidden)  # (B, L, V)
