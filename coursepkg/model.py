"""The encoder-decoder models: the Encoder and Decoder stacks, :class:`EncoderDecoder` (on
embeddings) and the :class:`Transformer` of "Attention Is All You Need". The GPT-style
:class:`~coursepkg.decoder_only.DecoderOnlyLM` has its own module.

Dimension legend: B batch, S source length, L target length, D d_model, V vocabulary.
At model level masks are *token* masks (B, S)/(B, L), bool, True = real token; the causal
mask is built inside the decoder, never passed in.

Every public entry point (``forward``, ``encode``, ``decode``, ``generate``) checks its
arguments first, in small ``_check_*`` helpers, and then computes in the same method.
"""

from __future__ import annotations

from torch import Tensor, nn

from ._validation import check_float, check_token_mask, check_tokens
from .config import TransformerConfig
from .fast_attention import FastDropout
from .kv_cache import KVCache
from .layers import DecoderLayer, EncoderLayer
from .masks import causal_mask, key_mask
from .model_parts import (
    add_logits_bias,
    final_norm,
    init_linear_weights,
    make_positions,
    token_embedding,
)

__all__ = ["Decoder", "Encoder", "EncoderDecoder", "Transformer"]


class Encoder(nn.Module):
    """N encoder layers (and a final LayerNorm when ``config.use_final_norm``).

    Submodules ``layers`` and ``norm`` (None without a final norm).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config.block()) for _ in range(config.n_layers))
        self.norm = final_norm(config)

    def forward(self, x: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Encode embedded source positions.

        Args:
            x: embedded source (tokens + positions).
            src_mask: bool token mask, True = real token; padded keys are hidden.

        Shape:
            x (B, S, D), src_mask (B, S) -> (B, S, D).
        """
        self._check_inputs(x, src_mask)
        mask = None if src_mask is None else key_mask(src_mask)  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, mask)  # (B, S, D)
        return x if self.norm is None else self.norm(x)

    def _check_inputs(self, x: Tensor, src_mask: Tensor | None) -> None:
        check_float("x", x, ndim=3)
        if src_mask is not None:
            check_token_mask("src_mask", src_mask, tuple(x.shape[:2]))


class Decoder(nn.Module):
    """N decoder layers (and a final LayerNorm when ``config.use_final_norm``).

    Submodules ``layers`` and ``norm``.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        config.reject_decoder_only_options("an encoder-decoder model")
        self.layers = nn.ModuleList(
            DecoderLayer(config.block()) for _ in range(config.decoder_layers)
        )
        self.norm = final_norm(config)

    def forward(
        self,
        y: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Decode embedded (shifted-right) target positions against the encoder output.

        Args:
            y: embedded target positions (only the new ones when a cache is given).
            memory: encoder output.
            src_mask: bool (B, S), True = real source token.
            tgt_mask: bool (B, past + L), True = real target token; with a cache it covers
                the cached positions too.
            cache: a :class:`~coursepkg.kv_cache.KVCache` for incremental decoding.

        Shape:
            y (B, L, D), memory (B, S, D) -> (B, L, D).
        """
        self._check_inputs(y, memory, tgt_mask, cache)
        n = y.size(1)
        past = 0 if cache is None else cache.length
        self_mask = None  # one new query and no padding: it may see every earlier position
        if n > 1 or tgt_mask is not None:
            self_mask = causal_mask(n, past + n, device=y.device)  # (L, past + L)
        if tgt_mask is not None:
            self_mask = self_mask & key_mask(tgt_mask)  # (B, 1, L, past + L)
        cross_mask = None if src_mask is None else key_mask(src_mask)  # (B, 1, 1, S)
        for i, layer in enumerate(self.layers):
            self_cache = None if cache is None else cache.self_attn[i]
            cross_cache = None if cache is None else cache.cross_attn[i]
            y = layer(y, memory, self_mask, cross_mask, self_cache, cross_cache)  # (B, L, D)
        return y if self.norm is None else self.norm(y)

    def _check_inputs(
        self, y: Tensor, memory: Tensor, tgt_mask: Tensor | None, cache: KVCache | None
    ) -> None:
        # ``src_mask`` is the encoder's to check (the cross-attention checks its shape again).
        check_float("y", y, ndim=3)
        check_float("memory", memory, ndim=3)
        if memory.size(0) != y.size(0):
            raise ValueError(
                f"memory and target must share the batch size, got {memory.size(0)} and {y.size(0)}"
            )
        if tgt_mask is not None:
            past = 0 if cache is None else cache.length
            check_token_mask("tgt_mask", tgt_mask, (y.size(0), past + y.size(1)))


class EncoderDecoder(nn.Module):
    """The encoder-decoder stack alone, on embeddings (no token embedding, no output layer).

    This is what :func:`coursepkg.interop.from_torch_transformer` returns: the same function as
    ``torch.nn.Transformer`` with batch-first inputs.

    Submodules ``encoder`` and ``decoder``.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)

    def forward(
        self,
        src_emb: Tensor,
        tgt_emb: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """Encode ``src_emb`` and decode ``tgt_emb`` (causal mask applied inside).

        Args:
            src_emb: source embeddings.
            tgt_emb: target embeddings.
            src_mask: bool (B, S), True = real token.
            tgt_mask: bool (B, L), True = real token.

        Shape:
            src_emb (B, S, D), tgt_emb (B, L, D) -> (B, L, D).
        """
        memory = self.encoder(src_emb, src_mask)  # (B, S, D)
        return self.decoder(tgt_emb, memory, src_mask, tgt_mask)  # (B, L, D)


class Transformer(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    Embeddings are scaled by sqrt(D) and summed with positions; with a shared vocabulary the
    source and target embeddings are one matrix (``share_embeddings``), and the output
    projection reuses the target embedding (``tie_embeddings``), as in Sec. 3.4.

    Args:
        config: the hyper-parameters.

    Submodules ``src_embed``, ``tgt_embed`` (the same object when shared), ``positions``
    (one table for source and target), ``encoder``, ``decoder``, ``lm_head`` (D -> V, no bias).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        config.hf.reject_unsupported("Transformer")
        self.config = config
        self.src_embed = token_embedding(config, config.source_vocab_size)
        self.tgt_embed = (
            self.src_embed
            if config.share_embeddings
            else token_embedding(config, config.vocab_size)
        )
        self.positions = make_positions(config)
        self.dropout = FastDropout(config.dropout)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        add_logits_bias(self, config)
        init_linear_weights(self)
        if config.tie_embeddings:
            self.lm_head.weight = self.tgt_embed.weight

    # ----- masks --------------------------------------------------------------------------------
    def _token_mask(self, tokens: Tensor, mask: Tensor | None) -> Tensor | None:
        # The token mask given, or derived from ``pad_id`` (the stacks check its shape).
        if mask is None and self.config.pad_id is not None:
            mask = tokens != self.config.pad_id  # (B, L)
        return mask

    def source_mask(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor | None:
        """The source token mask: ``src_mask`` checked, or derived from ``pad_id``, or None."""
        mask = self._token_mask(src, src_mask)
        if mask is not None:
            check_token_mask("src_mask", mask, tuple(src.shape))
        return mask

    # ----- pieces used by generation ------------------------------------------------------------
    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty key/value cache for :meth:`decode`, holding up to ``capacity`` targets."""
        return KVCache(self.config.decoder_layers, cross=True, capacity=capacity)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Run the encoder: embed the source, scale, add positions, then N encoder layers.

        Args:
            src: source ids.
            src_mask: bool (B, S), True = real token (derived from ``pad_id`` when omitted).

        Shape:
            src (B, S) -> memory (B, S, D).
        """
        check_tokens("src", src, self.config.source_vocab_size)
        x = self.dropout(self.positions(self.src_embed(src)))  # (B, S, D)
        return self.encoder(x, self._token_mask(src, src_mask))  # (B, S, D)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Run the decoder and the output projection.

        Args:
            tgt: target ids, shifted right (they start with BOS); with a cache, only the
                new ids.
            memory: encoder output.
            src_mask: bool (B, S), True = real source token.
            tgt_mask: bool (B, L), True = real target token (derived from ``pad_id`` when
                omitted and no cache is used).
            cache: see :meth:`new_cache`.

        Shape:
            tgt (B, L), memory (B, S, D) -> logits (B, L, V).
        """
        self._check_decode(tgt, memory)
        if cache is None:
            tgt_mask = self._token_mask(tgt, tgt_mask)
        offset = 0 if cache is None else cache.length
        y = self.dropout(self.positions(self.tgt_embed(tgt), offset))  # (B, L, D)
        h = self.decoder(y, memory, src_mask, tgt_mask, cache)  # (B, L, D)
        logits = self.lm_head(h)  # (B, L, V)
        return logits if self.logits_bias is None else logits + self.logits_bias

    def _check_decode(self, tgt: Tensor, memory: Tensor) -> None:
        check_tokens("tgt", tgt, self.config.vocab_size)
        if memory.size(0) != tgt.size(0):
            raise ValueError(
                f"memory has batch size {memory.size(0)} but tgt has {tgt.size(0)}; they must match"
            )

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """Teacher-forced pass: logits for every target position.

        Args:
            src: source ids.
            tgt: target ids shifted right (BOS first).
            src_mask: bool (B, S), True = real token; derived from ``pad_id`` when omitted.
            tgt_mask: bool (B, L), True = real token; derived from ``pad_id`` when omitted.

        Shape:
            src (B, S), tgt (B, L) -> logits (B, L, V).
        """
        self._check_forward(src, tgt)
        src_mask = self._token_mask(src, src_mask)  # the encoder checks it
        memory = self.encode(src, src_mask)  # (B, S, D)
        return self.decode(tgt, memory, src_mask, tgt_mask)  # (B, L, V)

    def _check_forward(self, src: Tensor, tgt: Tensor) -> None:
        # The ids are checked by encode and decode; here only what pairs them.
        for name, tokens in (("src", src), ("tgt", tgt)):
            check_tokens(name, tokens)
        if src.size(0) != tgt.size(0):
            raise ValueError(
                f"src and tgt must have the same batch size, got {src.size(0)} and {tgt.size(0)}"
            )
