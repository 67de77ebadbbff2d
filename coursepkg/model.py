"""The models: Encoder and Decoder stacks, the encoder-decoder :class:`Transformer` and the
GPT-style :class:`DecoderOnlyLM`.

Dimension legend: B batch, S source length, L target length, D d_model, V vocabulary.
At model level masks are *token* masks (B, S)/(B, L), bool, True = real token; the causal
mask is built inside the decoder, never passed in.

Every module checks its arguments in its public method (``forward``, ``encode``, ``decode``,
``generate``) and computes in the private one of the same name (``_forward``, ``_encode``, ...),
which the models call once their inputs are checked.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validation import check_float, check_token_mask, check_tokens
from .config import TransformerConfig
from .kv_cache import KVCache
from .layers import DecoderLayer, Dropout, EncoderLayer, LayerNorm, RMSNorm, make_norm
from .masks import causal_mask, key_mask
from .positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


def _layer_kwargs(config: TransformerConfig) -> dict:
    return dict(
        d_model=config.d_model,
        n_heads=config.n_heads,
        d_ff=config.d_ff,
        dropout=config.dropout,
        norm_first=config.norm_first,
        d_k=config.d_k,
        d_v=config.d_v,
        attention_dropout=config.attention_dropout,
        activation=config.activation,
        bias=config.bias,
        layer_norm_eps=config.layer_norm_eps,
        norm=config.norm,
    )


def _final_norm(config: TransformerConfig) -> LayerNorm | RMSNorm | None:
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

    def forward(self, tokens: Tensor, name: str = "tokens") -> Tensor:
        """Shape: (B, L) integer ids -> (B, L, D)."""
        check_tokens(name, tokens, self.vocab_size)
        return self._forward(tokens)

    def _forward(self, tokens: Tensor) -> Tensor:
        """:meth:`forward` without the argument check, for callers that checked ``tokens``.

        Shape: (B, L) -> (B, L, D).
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


def _logits_bias(module: nn.Module, config: TransformerConfig) -> None:
    # A fixed (not trained) bias on the logits, as Marian's final_logits_bias; None when absent.
    bias = torch.zeros(config.vocab_size) if config.hf.logits_bias else None
    module.register_buffer("logits_bias", bias)


class Encoder(nn.Module):
    """N encoder layers (and a final LayerNorm when ``config.use_final_norm``).

    Submodules ``layers`` and ``norm`` (None without a final norm).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(**_layer_kwargs(config)) for _ in range(config.n_layers)
        )
        self.norm = _final_norm(config)

    def forward(self, x: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Encode embedded source positions.

        Args:
            x: embedded source (tokens + positions).
            src_mask: bool token mask, True = real token; padded keys are hidden.

        Shape:
            x (B, S, D), src_mask (B, S) -> (B, S, D).
        """
        check_float("x", x, ndim=3)
        if src_mask is not None:
            check_token_mask("src_mask", src_mask, tuple(x.shape[:2]))
        return self._forward(x, src_mask)

    def _forward(self, x: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """:meth:`forward` without its argument checks, for models that checked already.

        Shape:
            x (B, S, D), src_mask (B, S) -> (B, S, D).
        """
        mask = None if src_mask is None else key_mask(src_mask)  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, mask)  # (B, S, D)
        return x if self.norm is None else self.norm(x)


class Decoder(nn.Module):
    """N decoder layers (and a final LayerNorm when ``config.use_final_norm``).

    Submodules ``layers`` and ``norm``.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        config.reject_sliding_window("an encoder-decoder model")
        self.layers = nn.ModuleList(
            DecoderLayer(**_layer_kwargs(config)) for _ in range(config.decoder_layers)
        )
        self.norm = _final_norm(config)

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
        check_float("y", y, ndim=3)
        check_float("memory", memory, ndim=3)
        if memory.size(0) != y.size(0):
            raise ValueError(
                f"memory and target must share the batch size, got {memory.size(0)} and {y.size(0)}"
            )
        past = 0 if cache is None else cache.length
        if tgt_mask is not None:
            check_token_mask("tgt_mask", tgt_mask, (y.size(0), past + y.size(1)))
        if src_mask is not None:
            check_token_mask("src_mask", src_mask, tuple(memory.shape[:2]))
        return self._forward(y, memory, src_mask, tgt_mask, cache)

    def _forward(
        self,
        y: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """:meth:`forward` without its argument checks, for models that checked already.

        Shape:
            y (B, L, D), memory (B, S, D) -> (B, L, D).
        """
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
        self.dropout = Dropout(config.dropout)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        _logits_bias(self, config)
        init_linear_weights(self)
        if config.tie_embeddings:
            self.lm_head.weight = self.tgt_embed.weight

    # ----- masks --------------------------------------------------------------------------------
    def _token_mask(self, name: str, tokens: Tensor, mask: Tensor | None) -> Tensor | None:
        if mask is None and self.config.pad_id is not None:
            mask = tokens != self.config.pad_id  # (B, L)
        if mask is not None:
            check_token_mask(name, mask, tuple(tokens.shape))
        return mask

    def source_mask(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor | None:
        """The source token mask: ``src_mask`` checked, or derived from ``pad_id``, or None."""
        return self._token_mask("src_mask", src, src_mask)

    # ----- pieces used by generation ------------------------------------------------------------
    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty key/value cache for :meth:`decode`, holding up to ``capacity`` targets."""
        return KVCache(self.config.decoder_layers, cross=True, capacity=capacity)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Run the encoder.

        Args:
            src: source ids.
            src_mask: bool (B, S), True = real token (derived from ``pad_id`` when omitted).

        Shape:
            src (B, S) -> memory (B, S, D).
        """
        check_tokens("src", src, self.config.source_vocab_size)
        return self._encode(src, self.source_mask(src, src_mask))  # (B, S, D)

    def _encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        # encode() after its checks.
        x = self.dropout(self.positions(self.src_embed._forward(src)))  # (B, S, D)
        return self.encoder._forward(x, src_mask)  # (B, S, D)

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
        check_tokens("tgt", tgt, self.config.vocab_size)
        if memory.size(0) != tgt.size(0):
            raise ValueError(
                f"memory has batch size {memory.size(0)} but tgt has {tgt.size(0)}; they must match"
            )
        if cache is None:
            tgt_mask = self._token_mask("tgt_mask", tgt, tgt_mask)
        return self._decode(tgt, memory, src_mask, tgt_mask, cache)  # (B, L, V)

    def _decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        cache: KVCache | None = None,
    ) -> Tensor:
        # decode() after its checks.
        offset = 0 if cache is None else cache.length
        y = self.dropout(self.positions(self.tgt_embed._forward(tgt), offset))  # (B, L, D)
        h = self.decoder._forward(y, memory, src_mask, tgt_mask, cache)  # (B, L, D)
        logits = self.lm_head(h)  # (B, L, V)
        return logits if self.logits_bias is None else logits + self.logits_bias

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
        check_tokens("src", src, self.config.source_vocab_size)
        check_tokens("tgt", tgt, self.config.vocab_size)
        if src.size(0) != tgt.size(0):
            raise ValueError(
                f"src and tgt must have the same batch size, got {src.size(0)} and {tgt.size(0)}"
            )
        src_mask = self.source_mask(src, src_mask)
        tgt_mask = self._token_mask("tgt_mask", tgt, tgt_mask)
        memory = self._encode(src, src_mask)  # (B, S, D)
        return self._decode(tgt, memory, src_mask, tgt_mask)  # (B, L, V)


class DecoderOnlyLM(nn.Module):
    """A GPT-style language model: token + position embeddings, N self-attention layers with a
    causal mask, and an output head tied to the token embedding.

    The layers are :class:`~coursepkg.layers.EncoderLayer` blocks (self-attention + FFN):
    a decoder without cross-attention is exactly that, under a causal mask.

    Args:
        config: the hyper-parameters (``n_layers`` layers; GPT-2 uses ``norm_first=True``).

    Submodules ``embed``, ``positions``, ``layers``, ``norm`` (None without a final norm),
    ``lm_head`` (D -> V, no bias, weight tied to ``embed.weight`` when ``tie_embeddings``).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        config.hf.reject_unsupported("DecoderOnlyLM")
        self.config = config
        self.embed = token_embedding(config, config.vocab_size)
        self.positions = make_positions(config)
        self.dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(**_layer_kwargs(config)) for _ in range(config.n_layers)
        )
        self.norm = _final_norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        _logits_bias(self, config)
        init_linear_weights(self)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty key/value cache for :meth:`forward`, holding up to ``capacity`` positions."""
        return KVCache(self.config.n_layers, False, capacity, self.config.sliding_window)

    def forward(
        self,
        tokens: Tensor,
        token_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Next-token logits at every position.

        Args:
            tokens: ids (only the new ones when a cache is given).
            token_mask: bool (B, past + L), True = real token (derived from ``pad_id`` when
                omitted and no cache is used).
            cache: see :meth:`new_cache`.

        Shape:
            tokens (B, L) -> logits (B, L, V).
        """
        check_tokens("tokens", tokens, self.config.vocab_size)
        b, n = tokens.shape
        keys = n if cache is None else cache.keys_after(n)  # a window's ring: the last ones only
        if token_mask is None and cache is None and self.config.pad_id is not None:
            token_mask = tokens != self.config.pad_id  # (B, L)
        mask = causal_mask(n, keys, device=tokens.device, window=self.config.sliding_window)
        if token_mask is not None:
            check_token_mask("token_mask", token_mask, (b, n + (cache.length if cache else 0)))
            mask = mask & key_mask(token_mask)[..., -keys:]  # (B, 1, L, keys)
        elif n == 1:
            mask = None
        return self._forward(tokens, mask, cache)

    def _forward(self, tokens: Tensor, mask: Tensor | None, cache: KVCache | None) -> Tensor:
        # forward() after its checks: ``tokens`` are valid ids, ``mask`` the attention mask
        # (causal and padding, broadcastable to (B, H, L, past + L)), not a token mask.
        past = 0 if cache is None else cache.length
        x = self.dropout(self.positions(self.embed._forward(tokens), past))  # (B, L, D)
        caches = [None] * len(self.layers) if cache is None else cache.self_attn
        for layer, layer_cache in zip(self.layers, caches, strict=True):
            x = layer(x, mask, layer_cache)  # (B, L, D)
        if self.norm is not None:
            x = self.norm(x)
        logits = self.lm_head(x)  # (B, L, V)
        return logits if self.logits_bias is None else logits + self.logits_bias

    @torch.no_grad()  # as documented; the loop itself runs in inference mode, cheaper still
    def generate(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        use_cache: bool = True,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue ``tokens`` by ``max_new_tokens`` tokens.

        Arguments are checked once; each step runs under ``torch.inference_mode`` without a mask
        (a new query sees all it is given: every cached position, or a sliding window's ring).

        Args:
            tokens: the prompt ids (no padding).
            max_new_tokens: how many tokens to append.
            use_cache: keep keys/values of earlier positions instead of recomputing them;
                greedy outputs are identical either way.
            temperature: 0 means greedy (argmax); otherwise sample from softmax(logits / T).
            top_k: sample only among the ``top_k`` most probable tokens.
            generator: a ``torch.Generator`` for reproducible sampling.

        Shape:
            tokens (B, L) -> (B, L + max_new_tokens).
        """
        check_tokens("tokens", tokens, self.config.vocab_size)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
        prompt_len = tokens.size(1)
        total = prompt_len + max_new_tokens
        if total > self.config.max_len:
            raise ValueError(
                f"prompt length {prompt_len} + max_new_tokens {max_new_tokens} = {total} "
                f"exceeds max_len={self.config.max_len} of the positional table"
            )
        if prompt_len == 0:
            raise ValueError("tokens must hold at least one prompt token per row, got length 0")
        cache = self.new_cache(capacity=total) if use_cache else None
        seq = tokens  # what the model reads next: the prompt, then one token at a time
        new: list[Tensor] = []
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                n = seq.size(1)  # every token is real: the causal mask only, none for one query
                window = self.config.sliding_window
                mask = causal_mask(n, None, seq.device, window) if n > 1 else None
                logits = self._forward(seq, mask, cache)  # (B, n, V)
                new.append(sample_next(logits[:, -1], temperature, top_k, generator)[:, None])
                # With the cache the model reads only the new token; without, the whole prefix.
                seq = new[-1] if cache is not None else torch.cat([seq, new[-1]], dim=1)  # (B, *)
            out = torch.cat([tokens, *new], dim=1)  # (B, L + new)
        # A plain tensor again: an inference-mode one could not be saved for a backward pass.
        return out.clone()  # (B, L + new)


def sample_next(logits: Tensor, temperature: float, top_k: int | None, generator=None) -> Tensor:
    """Pick the next token from logits: argmax when ``temperature == 0``, else sample.

    Args:
        logits: next-token scores.
        temperature: 0 for greedy; otherwise logits are divided by it before the softmax.
        top_k: keep only the ``top_k`` most probable tokens before sampling.
        generator: optional ``torch.Generator`` for reproducible samples.

    Shape:
        logits (B, V) -> (B,).
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)  # (B,)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
