"""Closed-form parameter counts, from the formulas alone (nothing is allocated).

Dimension legend: D d_model, H heads, Dk/Dv per-head sizes, F d_ff, V vocabulary, N layers.
"""

from __future__ import annotations

from .config import TransformerConfig
from .mla import mla_parameters


def attention_parameters(config: TransformerConfig) -> int:
    """W^Q (D x H*Dk), W^K (D x Hkv*Dk), W^V (D x Hkv*Dv), W^O (H*Dv x D), plus biases if any.

    Hkv is ``config.kv_heads`` (H unless grouped-query attention shares key/value heads);
    ``qk_norm`` adds the gains of the query and key RMSNorms (Dk each). With a ``latent``
    group, multi-head latent attention's count (:func:`~coursepkg.mla.mla_parameters`).
    """
    if config.latent is not None:
        latent = config.latent
        return mla_parameters(
            config.d_model,
            config.n_heads,
            latent.kv_rank,
            config.head_dim_k,
            latent.d_rope,
            config.head_dim_v,
            latent.q_rank,
        )
    d, h, dk, dv = config.d_model, config.n_heads, config.head_dim_k, config.head_dim_v
    g = config.kv_heads
    weights = d * h * dk + d * g * (dk + dv) + h * dv * d
    biases = (h * dk + g * (dk + dv) + d) if config.bias else 0
    return weights + biases + (2 * dk if config.qk_norm else 0)


def feed_forward_parameters(config: TransformerConfig) -> int:
    """W1 (D x F), W2 (F x D), plus biases b1 (F) and b2 (D) if any.

    The gated activations ("swiglu", "geglu") add W3 (D x F) and, with biases, b3 (F).
    """
    d, f = config.d_model, config.d_ff
    branches = 2 if config.activation in ("swiglu", "geglu") else 1  # D -> F matrices
    return (branches + 1) * d * f + ((branches * f + d) if config.bias else 0)


def moe_parameters(config: TransformerConfig, active: bool = False) -> int:
    """One mixture-of-experts feed-forward: the router (D x E, no bias), E experts and the
    shared experts, each a feed-forward of hidden width ``config.expert_d_ff``.

    Args:
        config: its ``moe`` group (E, k, shared experts) and the experts' shape.
        active: count only what one token uses: the router, its k experts and the shared ones.
    """
    if config.moe is None:
        raise ValueError("moe_parameters needs a mixture of experts: config.moe is None")
    moe = config.moe
    expert = feed_forward_parameters(config.replace(d_ff=config.expert_d_ff))
    shared = moe.shared_experts  # one feed-forward of width shared * expert_d_ff
    shared_ffn = (
        feed_forward_parameters(config.replace(d_ff=shared * config.expert_d_ff)) if shared else 0
    )
    used = moe.top_k if active else moe.n_experts
    return config.d_model * moe.n_experts + used * expert + shared_ffn


def decoder_stack_parameters(config: TransformerConfig, active: bool = False) -> int:
    """The N self-attention layers of a decoder-only model, MoE layers counted as such.

    Args:
        config: the hyper-parameters (``is_moe_layer`` says which layers have experts).
        active: count only the experts a token uses (see :func:`moe_parameters`).
    """
    attn, ln = attention_parameters(config), layer_norm_parameters(config)
    total = 0
    for i in range(config.n_layers):
        moe = config.is_moe_layer(i)
        ffn = moe_parameters(config, active) if moe else feed_forward_parameters(config)
        total += attn + ffn + 2 * ln
    return total


def active_parameters(config: TransformerConfig) -> int:
    """Parameters a decoder-only model uses per token: all of them, less the experts a token
    is not routed to (E - k per MoE layer). Equals :func:`count_parameters` when dense; the
    embedding, read by lookup, is counted, as published "active" counts do (Qwen3-30B-A3B)."""
    inactive = decoder_stack_parameters(config) - decoder_stack_parameters(config, active=True)
    return count_parameters(config, "decoder-only") - inactive


def layer_norm_parameters(config: TransformerConfig) -> int:
    """One normalisation layer: gain (D) and, for LayerNorm with biases, shift (D).

    RMSNorm (``config.norm == "rmsnorm"``) has the gain only.
    """
    shift = config.bias and config.norm == "layernorm"
    return config.d_model * (2 if shift else 1)


_MODELS = ("encoder-decoder", "decoder-only", "encoder-only")


def parameter_breakdown(
    config: TransformerConfig, model: str = "encoder-decoder"
) -> dict[str, int]:
    """Parameters per part of the model, in closed form.

    Tied or shared matrices are counted once, in the first part that owns them
    (``embeddings``), and the parts they are reused by count zero.

    Args:
        config: the hyper-parameters.
        model: ``"encoder-decoder"`` (:class:`~coursepkg.Transformer`), ``"decoder-only"``
            (:class:`~coursepkg.DecoderOnlyLM`) or ``"encoder-only"``
            (:class:`~coursepkg.EncoderOnlyLM`, BERT-style: token types, embedding norm,
            pooler and masked-LM head as ``config.hf`` says).

    Returns:
        An ordered mapping part -> count whose values sum to :func:`count_parameters`.
    """
    if model not in _MODELS:
        raise ValueError(f"model must be one of {_MODELS}, got {model!r}")
    d, v = config.d_model, config.vocab_size
    attn, ffn, ln = (
        attention_parameters(config),
        feed_forward_parameters(config),
        layer_norm_parameters(config),
    )
    final = ln if config.use_final_norm else 0
    positions = config.max_len * d if config.positional == "learned" else 0
    out: dict[str, int] = {}
    if model == "decoder-only":
        out["embeddings"] = v * d
        out["positions"] = positions
        out["layers"] = decoder_stack_parameters(config)
        out["final_norm"] = final
        out["output_head"] = 0 if config.tie_embeddings else v * d
        return out
    if model == "encoder-only":
        hf = config.hf
        out["embeddings"] = v * d
        out["positions"] = positions
        out["token_types"] = hf.n_token_types * d
        out["embed_norm"] = ln if hf.embed_norm else 0
        out["layers"] = config.n_layers * (attn + ffn + 2 * ln) + final
        out["pooler"] = (d * d + (d if config.bias else 0)) if hf.pooler else 0
        head = 0
        if hf.mlm_head:  # dense D x D, LayerNorm, output D x V (unless tied), output bias
            dense = d * d + (d if config.bias else 0)
            output = (0 if config.tie_embeddings else v * d) + (v if config.bias else 0)
            head = dense + ln + output
        out["mlm_head"] = head
        return out
    src_embed = config.source_vocab_size * d
    tgt_embed = 0 if config.share_embeddings else v * d
    out["embeddings"] = src_embed + tgt_embed
    out["positions"] = positions
    out["encoder"] = config.n_layers * (attn + ffn + 2 * ln) + final
    out["decoder"] = config.decoder_layers * (2 * attn + ffn + 3 * ln) + final
    out["output_head"] = 0 if config.tie_embeddings else v * d
    return out


def count_parameters(config: TransformerConfig, model: str = "encoder-decoder") -> int:
    """Total number of distinct trainable parameters, in closed form.

    Equals ``sum(p.numel() for p in Transformer(config).parameters())`` (or
    :class:`~coursepkg.DecoderOnlyLM` with ``model="decoder-only"``,
    :class:`~coursepkg.EncoderOnlyLM` with ``model="encoder-only"``) without building it.
    """
    return sum(parameter_breakdown(config, model).values())


def layer_breakdown(config: TransformerConfig) -> dict[str, int]:
    """Parameters of one encoder layer and one decoder layer, per sub-layer."""
    attn, ffn, ln = (
        attention_parameters(config),
        feed_forward_parameters(config),
        layer_norm_parameters(config),
    )
    return {
        "encoder.self_attn": attn,
        "encoder.ffn": ffn,
        "encoder.norms": 2 * ln,
        "decoder.self_attn": attn,
        "decoder.cross_attn": attn,
        "decoder.ffn": ffn,
        "decoder.norms": 3 * ln,
    }


def forward_multiply_adds(
    config: TransformerConfig,
    model: str = "encoder-decoder",
    *,
    src_len: int,
    tgt_len: int | None = None,
) -> dict[str, int]:
    """Multiply-adds of the matrix products of one forward pass over one sequence, by part.

    Every weight matrix multiplies each token it sees once, so a part's share is its
    weights times its tokens; attention adds the products of queries with keys and of the
    weights with the values, which grow with the square of the length. The score matrix is
    counted in full, as the model computes it (a causal mask blanks half of it, after the
    product). Elementwise work (softmax, LayerNorm, biases, activations, the embedding
    lookup) is left out: it grows with D, not D^2. One multiply-add is two FLOPs.

    Args:
        config: the hyper-parameters.
        model: ``"encoder-decoder"`` (:class:`~coursepkg.Transformer`) or ``"decoder-only"``
            (:class:`~coursepkg.DecoderOnlyLM`).
        src_len: S, the source length (for a decoder-only model, the sequence length).
        tgt_len: L, the target length of an encoder-decoder (default: ``src_len``).
            A mixture-of-experts layer counts the router and the experts a token goes to.

    Returns:
        part -> multiply-adds for the whole sequence (pair): ``encoder`` (its weights, S
        tokens), ``decoder`` or ``layers`` (the decoder's weights; cross-attention projects
        the S source tokens to keys and values once per layer), ``output_head`` (D x V per
        target token, tied or not) and ``attention_scores`` (Q K^T and the weighted sum of
        the values in every layer).
    """
    if model not in ("encoder-decoder", "decoder-only"):
        raise ValueError(f"model must be 'encoder-decoder' or 'decoder-only', got {model!r}")
    if config.latent is not None:
        raise ValueError("forward_multiply_adds does not count latent attention (latent) yet")
    for name, value in (("src_len", src_len), ("tgt_len", tgt_len)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    s = src_len
    t = src_len if tgt_len is None else tgt_len
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    qk, vo = config.n_heads * config.head_dim_k, config.n_heads * config.head_dim_v
    kv = config.kv_heads * (config.head_dim_k + config.head_dim_v)  # one token's K and V
    # per token: W^Q (D x H*Dk), W^K and W^V (D x Hkv*Dk, D x Hkv*Dv), W^O (H*Dv x D); W1, W2
    branches = 3 if config.activation in ("swiglu", "geglu") else 2  # W1, W2 (and W3)
    projections, ffn = d * qk + d * kv + d * vo, branches * d * f
    # per query and key: one dot product of H*Dk, one weighted sum of H*Dv
    pair = qk + vo
    if model == "decoder-only":
        # a mixture of experts: the router (D x E) and the k experts (and shared ones) a token uses
        moe = config.moe
        used = moe.top_k + moe.shared_experts if moe else 0
        experts = moe.n_experts if moe else 0
        moe_ffn = config.d_model * experts + used * branches * d * config.expert_d_ff
        ffns = sum(moe_ffn if config.is_moe_layer(i) else ffn for i in range(config.n_layers))
        return {
            "layers": s * (config.n_layers * projections + ffns),
            "output_head": s * d * v,
            "attention_scores": config.n_layers * s * s * pair,
        }
    n_dec = config.decoder_layers
    cross_queries, cross_keys = d * qk + vo * d, d * kv  # (W^Q, W^O), (W^K, W^V)
    return {
        "encoder": config.n_layers * s * (projections + ffn),
        "decoder": n_dec * (t * (projections + cross_queries + ffn) + s * cross_keys),
        "output_head": t * d * v,
        "attention_scores": (config.n_layers * s * s + n_dec * (t * t + t * s)) * pair,
    }


def kv_cache_bytes_per_token(config: TransformerConfig, bytes_per_number: int = 4) -> int:
    """Memory the KV cache of a decoder-only model holds per position: every layer keeps one
    key (Hkv x Dk numbers) and one value (Hkv x Dv) per token. Grouped-query attention divides
    it by H / Hkv; multi-query (Hkv = 1) by H.

    Multi-head latent attention (``latent``) keeps the latent and the rotated key part
    instead, R + Dr numbers per layer, whatever the heads.

    Args:
        config: its ``n_layers``, ``kv_heads``, ``head_dim_k`` and ``head_dim_v`` (or
            ``latent.kv_rank`` and ``latent.d_rope``).
        bytes_per_number: 4 for float32, 2 for float16/bfloat16.

    Returns:
        Bytes per cached token (per batch row).
    """
    per_layer = config.kv_heads * (config.head_dim_k + config.head_dim_v)
    if config.latent is not None:
        per_layer = config.latent.kv_rank + config.latent.d_rope
    return config.n_layers * per_layer * bytes_per_number


def training_flops(parameters: float, tokens: float) -> float:
    """The usual estimate of a training run's arithmetic: 6 FLOPs per parameter per token.

    A forward pass spends one multiply-add (2 FLOPs) per weight per token; the backward pass
    spends about twice that (the gradients with respect to the inputs and to the weights), so
    a training step costs 3 x 2 = 6 FLOPs per parameter per token. Attention's
    length-dependent products and elementwise work are left out (Kaplan et al., 2020).

    Args:
        parameters: the number of weights that multiply each token (an embedding read by
            lookup counts nothing; used as the output projection, it counts once).
        tokens: the tokens processed in the whole run.

    Returns:
        FLOPs of the whole run.
    """
    if parameters < 0 or tokens < 0:
        raise ValueError(f"parameters and tokens must be >= 0, got {parameters}, {tokens}")
    return 6.0 * parameters * tokens
