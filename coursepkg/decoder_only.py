"""The GPT-style language model :class:`DecoderOnlyLM` and its generation loop.

Dimension legend: B batch, L length, D d_model, V vocabulary. Masks at model level are token
masks (B, L), True = real token; the causal mask is built inside.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from ._validation import check_token_mask, check_tokens
from .alibi import ALiBiAttention
from .config import BlockConfig, TransformerConfig
from .fast_attention import FastDropout
from .kv_cache import KVCache
from .layers import EncoderLayer, block_attention
from .masks import PackedMask, as_mask, causal_mask, key_mask
from .mla import LatentCache, MultiHeadLatentAttention
from .model_parts import (
    add_logits_bias,
    final_norm,
    init_linear_weights,
    make_positions,
    token_embedding,
)
from .moe import MoEFeedForward, Routing, load_balancing_loss
from .positional import RopeAngles, positions_from_mask, rope_frequencies

__all__ = ["DecoderOnlyLM", "DecoderOnlyLayer", "LMOutput", "sample_next"]


class LMOutput(NamedTuple):
    """:meth:`DecoderOnlyLM.forward`'s result with ``return_aux=True``, as Hugging Face's
    Mixtral returns ``logits`` and ``aux_loss``: the logits (B, L, V) and the auxiliary loss a
    trainer adds times its coefficient (a mixture of experts' load balancing,
    :meth:`DecoderOnlyLM.load_balancing_loss`, over the ``token_mask`` given; None when dense)."""

    logits: Tensor
    aux_loss: Tensor | None


class DecoderOnlyLayer(EncoderLayer):
    """A decoder-only model's layer: an :class:`~coursepkg.layers.EncoderLayer` whose
    sub-layers follow its block's groups, built here directly (Hugging Face's Mixtral builds
    its ``mlp`` so): multi-head latent attention with a ``latent`` group, ALiBi's attention
    with ``alibi``, a mixture of experts with a ``moe`` group, else the dense ones.

    Args:
        config: the layer's block, ``TransformerConfig.block(i)`` for layer ``i``.
    """

    def __init__(self, config: BlockConfig) -> None:
        super().__init__(config)

    def build_self_attention(self, config: BlockConfig) -> nn.Module:
        """Latent attention with ``config.latent``, ALiBi's with ``config.alibi``, else the
        block's multi-head attention."""
        if config.latent is not None:
            return MultiHeadLatentAttention.from_block(config)
        if config.alibi:
            return block_attention(config, ALiBiAttention)
        return super().build_self_attention(config)

    def build_ffn(self, config: BlockConfig) -> nn.Module:
        """A mixture of experts with ``config.moe``, else the block's feed-forward."""
        if config.moe is not None:
            return MoEFeedForward.from_block(config)
        return super().build_ffn(config)


class DecoderOnlyLM(nn.Module):
    """A GPT-style language model: token + position embeddings, N self-attention layers with a
    causal mask, and an output head tied to the token embedding.

    The layers are :class:`~coursepkg.layers.EncoderLayer` blocks (self-attention + FFN):
    a decoder without cross-attention is exactly that, under a causal mask. With
    ``positional="rope"``, ``norm="rmsnorm"``, ``activation="swiglu"``, ``n_kv_heads`` and
    ``bias=False`` it is a Llama-style model (:mod:`coursepkg.interop.llama` loads Llama and
    Qwen3 into it).

    Args:
        config: the hyper-parameters (``n_layers`` layers; GPT-2 uses ``norm_first=True``).

    Submodules ``embed``, ``positions`` (the table added to the embeddings; None with RoPE
    or ALiBi, whose attention adds a bias to its scores: :mod:`coursepkg.alibi`),
    ``layers`` (:class:`DecoderOnlyLayer`: with a ``moe`` group, the ``ffn`` of each MoE layer
    is a :class:`~coursepkg.moe.MoEFeedForward`; with a ``latent`` group, every ``self_attn`` is
    a :class:`~coursepkg.mla.MultiHeadLatentAttention`), ``norm`` (None without a final norm),
    ``lm_head`` (D -> V, no bias, weight tied
    to ``embed.weight`` when ``tie_embeddings``); buffer ``rope_freqs`` (Dk/2,), RoPE's
    frequencies (None without RoPE).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        config.hf.reject_unsupported("DecoderOnlyLM")
        self.config = config
        self.embed = token_embedding(config, config.vocab_size)
        rope = config.positional == "rope"
        table = config.positional in ("sinusoidal", "learned")
        self.positions = make_positions(config) if table else None
        freqs = rope_frequencies(config.rope_dim, config.rope.theta) if rope else None
        self.register_buffer("rope_freqs", freqs, persistent=False)
        self.dropout = FastDropout(config.dropout)
        self.layers = nn.ModuleList(
            DecoderOnlyLayer(config.block(i)) for i in range(config.n_layers)
        )
        self.norm = final_norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        add_logits_bias(self, config)
        init_linear_weights(self)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty key/value cache for :meth:`forward`, holding up to ``capacity`` positions."""
        cache = KVCache(self.config.n_layers, False, capacity, self.config.sliding_window)
        if self.config.latent is not None:  # only the latents and the rotated key parts
            cache.self_attn = [LatentCache() for _ in self.layers]
        return cache

    def routings(self) -> list[Routing]:
        """The routers' decisions in the last forward pass, one per MoE layer (none if dense)."""
        moe = [layer.ffn for layer in self.layers if isinstance(layer.ffn, MoEFeedForward)]
        if any(ffn.routing is None for ffn in moe):
            raise RuntimeError("routings() reads the last forward pass; call the model first")
        return [ffn.routing for ffn in moe]

    def load_balancing_loss(self, token_mask: Tensor | None = None) -> Tensor:
        """The auxiliary loss of the last forward pass (:func:`~coursepkg.moe.load_balancing_loss`
        over every MoE layer); add ``coefficient * loss`` to the language-modelling loss.

        Args:
            token_mask: bool (B, L) of that pass, True = real token; padding takes no part.

        Returns:
            A scalar tensor that carries gradients to the routers.
        """
        if self.config.moe is None:
            raise ValueError("load_balancing_loss needs a mixture of experts: config.moe is None")
        return load_balancing_loss(self.routings(), self.config.moe.n_experts, token_mask)

    def forward(
        self,
        tokens: Tensor,
        token_mask: Tensor | None = None,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        attn_mask: Tensor | PackedMask | None = None,
        return_aux: bool = False,
    ) -> Tensor | LMOutput:
        """Next-token logits at every position (and, if asked, the auxiliary loss).

        Args:
            tokens: ids (only the new ones when a cache is given).
            token_mask: bool (B, past + L), True = real token (derived from ``pad_id`` when
                omitted and no cache is used).
            cache: see :meth:`new_cache`.
            positions: RoPE only: the absolute position of each new token (Hugging Face's
                ``position_ids``). By default the cache's length plus 0..L-1, or with a
                ``token_mask`` the count of real tokens before each one
                (:func:`~coursepkg.positional.positions_from_mask`: left padding shifts
                nothing). A position table (learned, sinusoidal) always counts from the cache's
                length.
            attn_mask: bool, True = may attend: the attention mask itself, in place of the
                causal one built from ``token_mask`` (e.g. the document mask of packed
                examples, :func:`coursepkg.posttrain.packing.document_mask`). With a cache its
                last axis counts every key the step sees, cached ones first (e.g. the packed
                step of :class:`coursepkg.serving.packed.PackedBatcher`, whose
                :class:`~coursepkg.masks.PackedMask` the attention reads to score each request
                against its own keys); give the ``positions`` too, since the default counts
                from the cache's length.
            return_aux: return an :class:`LMOutput` (the logits and the auxiliary loss of this
                pass) instead of the logits alone.

        Shape:
            tokens (B, L), positions (B, L) or (L,), attn_mask (B, 1, L, L) or (L, L), with a
            cache (B, 1, L, S) or (L, S) for its S keys after the step -> logits (B, L, V).
        """
        self._check_forward(tokens, token_mask, cache, positions)
        self._check_attn_mask(tokens, token_mask, cache, attn_mask)
        b, n = tokens.shape
        given_mask = token_mask  # the auxiliary loss counts the tokens the caller marked
        past = 0 if cache is None else cache.length
        keys = n if cache is None else cache.keys_after(n)  # a window's ring: the last ones only
        if token_mask is None and cache is None and self.config.pad_id is not None:
            token_mask = tokens != self.config.pad_id  # (B, L)
        mask = causal_mask(n, keys, device=tokens.device, window=self.config.sliding_window)
        if attn_mask is not None:
            mask = attn_mask  # (B, 1, L, L): the caller's, as given
        elif token_mask is not None:
            mask = mask & key_mask(token_mask)[..., -keys:]  # (B, 1, L, keys)
        elif n == 1:
            mask = None  # one new query and no padding: it may see every key it is given
        x = self.embed(tokens)  # (B, L, D)
        rope = None  # ALiBi: neither, its attention biases the scores by the keys' distances
        if self.positions is not None:  # a position table, added to the embeddings
            x = self.positions(x, past)  # (B, L, D)
        elif self.rope_freqs is not None:  # rotary: the new positions' angles, for every layer
            if positions is None and token_mask is not None:  # left padding shifts nothing
                positions = positions_from_mask(token_mask)[:, -n:]  # (B, L)
            elif positions is None:
                positions = torch.arange(past, past + n, device=tokens.device)  # (L,)
            rope = RopeAngles(positions, self.rope_freqs, self.config.rope.pairs)
        x = self.dropout(x)
        caches = [None] * len(self.layers) if cache is None else cache.self_attn
        for layer, layer_cache in zip(self.layers, caches, strict=True):
            x = layer(x, mask, layer_cache, rope)  # (B, L, D)
        if self.norm is not None:
            x = self.norm(x)
        logits = self.lm_head(x)  # (B, L, V)
        if self.logits_bias is not None:
            logits = logits + self.logits_bias  # (B, L, V)
        if not return_aux:
            return logits
        return LMOutput(logits, self._aux_loss(given_mask, n))

    def _aux_loss(self, token_mask: Tensor | None, n: int) -> Tensor | None:
        """The load-balancing loss of the pass just made over its ``n`` new tokens (the real
        ones of the caller's ``token_mask``); None when dense."""
        if self.config.moe is None:
            return None
        return self.load_balancing_loss(None if token_mask is None else token_mask[:, -n:])

    def _check_forward(
        self,
        tokens: Tensor,
        token_mask: Tensor | None,
        cache: KVCache | None,
        positions: Tensor | None,
    ) -> None:
        check_tokens("tokens", tokens, self.config.vocab_size)
        b, n = tokens.shape
        if token_mask is not None:
            check_token_mask("token_mask", token_mask, (b, n + (cache.length if cache else 0)))
        if positions is None:
            return
        if self.rope_freqs is None:
            raise ValueError(
                f"positions are for positional='rope'; this model's positions "
                f"({self.config.positional!r}) count from the cache's length"
            )
        if positions.shape not in ((b, n), (n,)) or positions.dtype.is_floating_point:
            raise ValueError(
                f"positions must be integer positions of shape (B, L)={(b, n)} or (L,)={(n,)}, "
                f"got {positions.dtype} of shape {tuple(positions.shape)}"
            )

    @staticmethod
    def _check_attn_mask(
        tokens: Tensor,
        token_mask: Tensor | None,
        cache: KVCache | None,
        attn_mask: Tensor | PackedMask | None,
    ) -> None:
        if attn_mask is None:
            return
        attn_mask = as_mask(attn_mask)  # a PackedMask is checked as its dense (T, S) mask
        b, n = tokens.shape
        if token_mask is not None:
            raise ValueError(
                "attn_mask replaces the mask built from token_mask: "
                "give attn_mask without token_mask"
            )
        keys = n if cache is None else cache.keys_after(n)  # with a cache: cached + new
        if attn_mask.dtype != torch.bool or tuple(attn_mask.shape) not in (
            (b, 1, n, keys),
            (n, keys),
        ):
            raise ValueError(
                f"attn_mask must be bool of shape (B, 1, L, S)={(b, 1, n, keys)} or (L, S)="
                f"{(n, keys)} (S: the keys after this step), got {attn_mask.dtype} of shape "
                f"{tuple(attn_mask.shape)}"
            )

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
        self._check_generate(tokens, max_new_tokens, temperature, top_k)
        total = tokens.size(1) + max_new_tokens
        cache = self.new_cache(capacity=total) if use_cache else None
        seq = tokens  # what the model reads next: the prompt, then one token at a time
        new: list[Tensor] = []
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                # Every token is real: without a cache, say so, or pad_id could hide one.
                real = None if cache is not None else torch.ones_like(seq, dtype=torch.bool)
                logits = self(seq, real, cache)  # (B, n, V)
                new.append(sample_next(logits[:, -1], temperature, top_k, generator)[:, None])
                # With the cache the model reads only the new token; without, the whole prefix.
                seq = new[-1] if cache is not None else torch.cat([seq, new[-1]], dim=1)  # (B, *)
            out = torch.cat([tokens, *new], dim=1)  # (B, L + new)
        # A plain tensor again: an inference-mode one could not be saved for a backward pass.
        return out.clone()  # (B, L + new)

    def _check_generate(
        self, tokens: Tensor, max_new_tokens: int, temperature: float, top_k: int | None
    ) -> None:
        check_tokens("tokens", tokens, self.config.vocab_size)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
        prompt_len = tokens.size(1)
        total = prompt_len + max_new_tokens
        if total > self.config.max_len and self.positions is not None:  # RoPE has no table
            raise ValueError(
                f"prompt length {prompt_len} + max_new_tokens {max_new_tokens} = {total} "
                f"exceeds max_len={self.config.max_len} of the positional table"
            )
        if prompt_len == 0:
            raise ValueError("tokens must hold at least one prompt token per row, got length 0")


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
