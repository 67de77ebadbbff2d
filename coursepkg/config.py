"""Model configuration: one frozen dataclass shared by every model in the package, and the
options only Hugging Face's models need, grouped apart in :class:`HFOptions`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

_POSITIONAL = ("sinusoidal", "learned", "rope")
_ROPE_PAIRS = ("halves", "interleaved")
_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu")
_SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
_NORMS = ("layernorm", "rmsnorm")
_ROUTERS = ("softmax", "sigmoid")


# The models that build each HFOptions field; any other model given it off its default raises.
_HF_BUILT_BY = {
    "n_token_types": ("EncoderOnlyLM",),
    "embed_norm": ("EncoderOnlyLM",),
    "pooler": ("EncoderOnlyLM",),
    "mlm_head": ("EncoderOnlyLM",),
    "logits_bias": ("Transformer", "DecoderOnlyLM"),
}


@dataclass(frozen=True)
class HFOptions:
    """What Hugging Face's BERT and Marian have beyond the paper, kept apart from it.

    They exist to load those checkpoints exactly (:mod:`coursepkg.interop`); the defaults add
    nothing. ``TransformerConfig(..., hf=HFOptions(n_token_types=2, embed_norm=True))`` is a
    BERT-style configuration.

    Raises:
        ValueError: for a value of the wrong kind, naming the field (``hf.n_token_types``).
    """

    n_token_types: int = 0  # segment (token type) embeddings added to the input (BERT: 2)
    embed_norm: bool = False  # LayerNorm on the summed input embeddings (BERT)
    pooler: bool = False  # tanh-dense "pooler" on the first token (BERT's BertModel)
    mlm_head: bool = True  # the masked-LM head: dense, act, norm, output (BertForMaskedLM)
    logits_bias: bool = False  # a fixed bias buffer added to the output logits (Marian)

    def __post_init__(self) -> None:
        n = self.n_token_types
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"hf.n_token_types must be an integer >= 0, got {n!r}")
        for name in ("embed_norm", "pooler", "mlm_head", "logits_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"hf.{name} must be True or False, got {getattr(self, name)!r}")

    @classmethod
    def from_mapping(cls, options: Mapping) -> HFOptions:
        """The options of a mapping such as ``dataclasses.asdict`` writes, naming unknown keys."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"hf has no options {unknown}; expected some of {sorted(known)}")
        return cls(**options)

    def reject_unsupported(self, model: str) -> None:
        """Fail for an option, off its default, that ``model`` (a class name) does not build."""
        for f in dataclasses.fields(self):
            value, built_by = getattr(self, f.name), _HF_BUILT_BY[f.name]
            if value != f.default and model not in built_by:
                raise ValueError(
                    f"{model} does not support hf.{f.name}={value!r} "
                    f"(only {' and '.join(built_by)} build{'s' if len(built_by) == 1 else ''} it)"
                )


# The options of one block besides its sizes D, H, F and dropout (BlockConfig.of takes these).
_BLOCK_OPTIONS = (
    "norm_first", "d_k", "d_v", "attention_dropout", "activation", "bias", "layer_norm_eps",
    "norm", "n_kv_heads", "qk_norm",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BlockConfig:
    """What one layer (block) is built from, every default resolved: no field is None.

    A model makes one with :meth:`TransformerConfig.block`; a block on its own with
    :meth:`of`. The fields mean what :class:`TransformerConfig`'s fields of the same names
    mean (``d_k``, ``d_v`` and ``n_kv_heads`` are its ``head_dim_k``, ``head_dim_v`` and
    ``kv_heads``).

    Raises:
        ValueError: for an impossible value, naming the field, the expected and the actual.
    """

    d_model: int  # D
    n_heads: int  # H: query heads
    d_ff: int  # F: the feed-forward's inner width
    n_kv_heads: int  # Hkv: key/value heads (H without grouping)
    d_k: int  # Dk: per-head query/key width
    d_v: int  # Dv: per-head value width
    dropout: float  # on each sub-layer's output and inside the feed-forward
    attention_dropout: float  # on the attention weights
    norm_first: bool  # pre-LN when True, post-LN (the paper) when False
    norm: str  # "layernorm" or "rmsnorm"
    layer_norm_eps: float  # epsilon of every norm (and of QK-norm)
    activation: str  # the feed-forward's activation (gated: "swiglu", "geglu")
    bias: bool  # biases in the linears and LayerNorms
    qk_norm: bool  # an RMSNorm over each head's queries and keys

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "d_ff", "n_kv_heads", "d_k", "d_v"):
            _positive_int(name, getattr(self, name))
        head_sizes(self.d_model, self.n_heads, self.d_k, self.d_v, self.n_kv_heads)
        for name in ("dropout", "attention_dropout"):
            p = getattr(self, name)
            if not (0.0 <= p < 1.0):
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        if self.norm not in _NORMS:
            raise ValueError(f"norm must be one of {_NORMS}, got {self.norm!r}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")

    @classmethod
    def of(
        cls, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, **options
    ) -> BlockConfig:
        """A block on its own, e.g. ``BlockConfig.of(512, 8, 2048, norm_first=True)``: every
        option not given at :class:`TransformerConfig`'s default, which resolves it.

        Args:
            d_model: width D.
            n_heads: heads H.
            d_ff: the feed-forward's inner width F.
            dropout: residual and feed-forward dropout (0 here: a block alone is for study).
            **options: any of ``norm_first``, ``d_k``, ``d_v``, ``attention_dropout``,
                ``activation``, ``bias``, ``layer_norm_eps``, ``norm``, ``n_kv_heads``,
                ``qk_norm``.

        Returns:
            The resolved config.
        """
        unknown = sorted(set(options) - set(_BLOCK_OPTIONS))
        if unknown:
            raise ValueError(
                f"BlockConfig.of has no options {unknown}; "
                f"expected some of {sorted(_BLOCK_OPTIONS)}"
            )
        sizes = dict(d_model=d_model, n_heads=n_heads, d_ff=d_ff, dropout=dropout)
        return TransformerConfig(vocab_size=1, **sizes, **options).block()  # no vocabulary used


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the Transformer (Vaswani et al., 2017, Table 3 names).

    The defaults are the paper's *base* model. ``d_k`` and ``d_v`` default to
    ``d_model // n_heads``; set them explicitly to explore the rows of Table 3 that vary them
    (then ``d_model`` need not be divisible by ``n_heads``). What only Hugging Face's models
    need (BERT's token types, pooler and masked-LM head, Marian's logits bias) is in ``hf``.

    Raises:
        ValueError: if the combination is impossible, naming the field, the expected and the
            actual value.
    """

    vocab_size: int  # V: target vocabulary (also the source one unless src_vocab_size is set)
    d_model: int = 512  # D: width of every residual stream
    n_heads: int = 8  # H: attention heads per attention block
    d_ff: int = 2048  # F: inner width of the position-wise feed-forward network
    n_layers: int = 6  # N: encoder layers (and decoder layers unless n_decoder_layers is set)
    n_decoder_layers: int | None = None  # decoder layers; None means n_layers
    dropout: float = 0.1  # P_drop: on sub-layer outputs, embeddings+positions, attention weights
    max_len: int = 512  # longest sequence the positional table covers
    d_k: int | None = None  # Dk: per-head query/key size; None means d_model // n_heads
    d_v: int | None = None  # Dv: per-head value size; None means d_model // n_heads
    norm_first: bool = False  # False: post-LN as in the paper; True: pre-LN (GPT-2 and later)
    final_norm: bool | None = None  # LayerNorm after each stack; None means "iff norm_first"
    positional: str = "sinusoidal"  # "sinusoidal" (fixed table) or "learned" (trained table),
    # both added to the embeddings; or "rope": no table, queries and keys rotated in attention
    src_vocab_size: int | None = None  # source vocabulary when it differs; None means shared
    share_embeddings: bool = True  # one embedding matrix for source and target (shared vocab)
    tie_embeddings: bool = True  # output projection reuses the target embedding matrix
    pad_id: int | None = None  # padding id; when set, models derive token masks from it
    activation: str = "relu"  # FFN non-linearity: "relu" (paper), "gelu" (exact, BERT),
    # "gelu_tanh" (GPT-2's tanh approximation) or "silu" (swish, Marian/OPUS-MT)
    bias: bool = True  # biases in the attention projections, FFN linears and LayerNorms
    layer_norm_eps: float = 1e-5  # epsilon inside the LayerNorm square root
    attention_dropout: float = 0.0  # dropout on attention weights: none in the paper (Sec. 5.4);
    # tensor2tensor and torch.nn.Transformer use ``dropout`` here
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(D) (Sec. 3.4; not GPT/BERT)
    sinusoidal_layout: str = "interleaved"  # "interleaved": sin, cos, sin, ... (Eq. of Sec. 3.5);
    # "halves": all sines, then all cosines (tensor2tensor, Marian)
    hf: HFOptions = field(default_factory=HFOptions)  # what only Hugging Face models need
    # ----- today's decoders (Llama, Mistral, Qwen3) ---------------------------------------------
    # Options that turn the 2017 block into a Llama-style one; the defaults keep the paper's.
    norm: str = "layernorm"  # every norm: "layernorm" (gain and shift) or "rmsnorm" (gain only,
    # x / sqrt(mean(x^2) + layer_norm_eps)); RMSNorm has no shift whatever ``bias`` says
    # (``activation`` above also takes the gated "swiglu" and "geglu": W2(act(W1 x) * W3 x),
    # three matrices, with ``d_ff`` the hidden width of each branch)
    rope_theta: float = 10000.0  # positional="rope": the base of the frequencies theta^(-2i/Dk)
    rope_pairs: str = "halves"  # positional="rope": the columns turned together, "halves"
    # (i with i + Dk/2: Hugging Face's Llama, Qwen) or "interleaved" (2i with 2i+1: the paper)
    n_kv_heads: int | None = None  # key/value heads (grouped-query attention; 1 = multi-query):
    # each serves n_heads / n_kv_heads query heads, and the KV cache holds only these; None: H
    qk_norm: bool = False  # QK-norm (Qwen3): an RMSNorm over each head's Dk on queries and
    # keys, before RoPE (gain only, eps = layer_norm_eps)
    sliding_window: int | None = None  # W: decoder-only models attend to the last W positions
    # only, themselves included (Mistral; its KV cache is a ring of W); None: the whole past
    # ----- mixture of experts (Mixtral, Qwen3-MoE; decoder-only models) ------------------------
    n_experts: int = 0  # E: feed-forward experts in each MoE layer; 0: every layer is dense
    moe_top_k: int = 2  # k: experts each token is sent to (the router's top k of E)
    moe_d_ff: int | None = None  # hidden width of each expert; None means d_ff
    moe_renormalize: bool = True  # rescale the k chosen probabilities to sum to 1 (Mixtral,
    # Qwen3-MoE's norm_topk_prob); False keeps the softmax's values (Switch, OLMoE)
    moe_shared_experts: int = 0  # experts every token goes through as well (DeepSeek-MoE)
    moe_every: int = 1  # layer i (from 0) is MoE when (i + 1) % moe_every == 0, the others
    # dense with width d_ff (Qwen3-MoE's decoder_sparse_step)
    moe_first_dense: int = 0  # the first layers stay dense whatever moe_every says
    # (DeepSeek-V3's first_k_dense_replace: 3 of 61)
    moe_router: str = "softmax"  # "softmax": probabilities over the experts, then top-k
    # (Mixtral, Qwen3-MoE); "sigmoid": each expert's score on its own, top-k chosen after adding
    # a per-expert bias that steers the choice but not the weights (DeepSeek-V3)
    moe_groups: int = 1  # G: the experts split into G equal groups, and a token chooses among
    # those of its moe_top_groups best groups only (DeepSeek-V3's n_group; sigmoid router)
    moe_top_groups: int = 1  # the groups a token may use (DeepSeek-V3's topk_group)
    moe_scale: float = 1.0  # the routed experts' weights times this (routed_scaling_factor)
    moe_bias_update_rate: float = 0.0  # gamma: after each training step, each expert's choice
    # bias moves by gamma towards an even load, bias += gamma * sign(mean load - load)
    # (DeepSeek-V3's auxiliary-loss-free balancing; sigmoid router); 0: the bias stays put
    # ----- multi-head latent attention (DeepSeek-V2/V3; decoder-only, positional="rope") -------
    kv_rank: int | None = None  # R: keys and values rebuilt from a latent of R numbers per
    # token, all the cache keeps (with the rotated key part); d_k is then each head's unrotated
    # query/key part Dn; None: ordinary attention
    q_rank: int | None = None  # Rq: the queries' own latent (DeepSeek's q_lora_rank); None: one
    # projection
    d_rope: int = 0  # Dr: the rotated part of each head's query and of the key shared by heads

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            _positive_int(name, getattr(self, name))
        optional = ("n_decoder_layers", "d_k", "d_v", "src_vocab_size", "sliding_window")
        for name in (*optional, "n_kv_heads"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        self.block()  # the block's fields: head sizes, dropouts, norm, activation, eps
        if self.positional not in _POSITIONAL:
            raise ValueError(f"positional must be one of {_POSITIONAL}, got {self.positional!r}")
        self._check_rope()
        self._check_moe()
        self._check_mla()
        if self.sinusoidal_layout not in _SINUSOIDAL_LAYOUTS:
            raise ValueError(
                f"sinusoidal_layout must be one of {_SINUSOIDAL_LAYOUTS}, "
                f"got {self.sinusoidal_layout!r}"
            )
        if isinstance(self.hf, Mapping):  # as dataclasses.asdict writes it (checkpoints, YAML)
            object.__setattr__(self, "hf", HFOptions.from_mapping(self.hf))
        if not isinstance(self.hf, HFOptions):
            raise ValueError(f"hf must be an HFOptions, got {type(self.hf).__name__}")
        if self.pad_id is not None and not (0 <= self.pad_id < self.vocab_size):
            raise ValueError(
                f"pad_id must be a token id in [0, vocab_size={self.vocab_size}), got {self.pad_id}"
            )
        if self.share_embeddings and self.separate_vocabularies:
            raise ValueError(
                "share_embeddings=True needs one vocabulary for source and target, but "
                f"src_vocab_size={self.src_vocab_size} != vocab_size={self.vocab_size}; "
                "set share_embeddings=False"
            )

    def _check_rope(self) -> None:
        # RoPE's fields mean something only with positional="rope", and a table's only without.
        if self.rope_pairs not in _ROPE_PAIRS:
            raise ValueError(f"rope_pairs must be one of {_ROPE_PAIRS}, got {self.rope_pairs!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
        if self.positional != "rope":
            for name, default in (("rope_theta", 10000.0), ("rope_pairs", "halves")):
                if getattr(self, name) != default:
                    raise ValueError(
                        f"{name}={getattr(self, name)!r} needs positional='rope', "
                        f"got positional={self.positional!r}"
                    )
            return
        if self.kv_rank is None and self.head_dim_k % 2 != 0:
            raise ValueError(
                f"positional='rope' turns pairs of query/key columns: the per-head width Dk "
                f"must be even, got Dk={self.head_dim_k}"
            )
        if self.sinusoidal_layout != "interleaved":
            raise ValueError(
                f"sinusoidal_layout={self.sinusoidal_layout!r} describes a sinusoidal table, "
                "which positional='rope' does not have; use rope_pairs to choose the pairing"
            )

    def _check_moe(self) -> None:
        # The MoE fields mean something only with experts; k chooses among them.
        n = self.n_experts
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n_experts must be an integer >= 0 (0: dense), got {n!r}")
        for name in ("moe_top_k", "moe_every"):
            _positive_int(name, getattr(self, name))
        if self.moe_d_ff is not None:
            _positive_int("moe_d_ff", self.moe_d_ff)
        shared = self.moe_shared_experts
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            raise ValueError(f"moe_shared_experts must be an integer >= 0, got {shared!r}")
        if not isinstance(self.moe_renormalize, bool):
            raise ValueError(f"moe_renormalize must be True or False, got {self.moe_renormalize!r}")
        first = self.moe_first_dense
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"moe_first_dense must be an integer >= 0, got {first!r}")
        if n == 0:
            defaults = dict(
                moe_top_k=2, moe_d_ff=None, moe_renormalize=True, moe_shared_experts=0,
                moe_every=1, moe_first_dense=0, moe_router="softmax", moe_groups=1,
                moe_top_groups=1, moe_scale=1.0, moe_bias_update_rate=0.0,
            )  # fmt: skip
            for name, default in defaults.items():
                if getattr(self, name) != default:
                    raise ValueError(
                        f"{name}={getattr(self, name)!r} needs experts: set n_experts > 0 "
                        "(got n_experts=0, a dense model)"
                    )
            return
        if self.moe_top_k > n:
            raise ValueError(
                f"moe_top_k must be at most n_experts (a token picks k of the E experts): "
                f"got moe_top_k={self.moe_top_k}, n_experts={n}"
            )
        if self.moe_every > self.n_layers:
            raise ValueError(
                f"moe_every must be at most n_layers={self.n_layers} (or no layer is MoE), "
                f"got moe_every={self.moe_every}"
            )
        if not any(self.is_moe_layer(i) for i in range(self.n_layers)):
            raise ValueError(
                f"moe_first_dense={self.moe_first_dense} leaves no MoE layer among "
                f"n_layers={self.n_layers} (with moe_every={self.moe_every}); use fewer"
            )
        self._check_router()

    def _check_router(self) -> None:
        # DeepSeek-V3's router: sigmoid scores, groups of experts, a scale on the weights.
        if self.moe_router not in _ROUTERS:
            raise ValueError(f"moe_router must be one of {_ROUTERS}, got {self.moe_router!r}")
        scale = self.moe_scale
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0:
            raise ValueError(f"moe_scale must be a number > 0, got {scale!r}")
        rate = self.moe_bias_update_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate >= 0:
            raise ValueError(f"moe_bias_update_rate must be a number >= 0, got {rate!r}")
        if rate and self.moe_router != "sigmoid":
            raise ValueError(
                f"moe_bias_update_rate={rate} moves the sigmoid router's choice bias, which needs "
                f"moe_router='sigmoid', got {self.moe_router!r}"
            )
        for name in ("moe_groups", "moe_top_groups"):
            _positive_int(name, getattr(self, name))
        g, top = self.moe_groups, self.moe_top_groups
        if g == 1 and top == 1:
            return
        if self.moe_router != "sigmoid":
            raise ValueError(
                f"moe_groups={g} and moe_top_groups={top} are DeepSeek-V3's group-limited "
                f"routing, which needs moe_router='sigmoid', got {self.moe_router!r}"
            )
        if self.n_experts % g or self.n_experts // g < 2:
            raise ValueError(
                f"moe_groups must split n_experts={self.n_experts} into equal groups of at "
                f"least 2 (a group's score is its best two experts'), got moe_groups={g}"
            )
        if top > g:
            raise ValueError(f"moe_top_groups must be at most moe_groups={g}, got {top}")
        if self.moe_top_k > top * (self.n_experts // g):
            raise ValueError(
                f"moe_top_k={self.moe_top_k} experts cannot be chosen from moe_top_groups={top} "
                f"groups of {self.n_experts // g}: raise moe_top_groups or lower moe_top_k"
            )

    def _check_mla(self) -> None:
        # MLA's latents compress the width; its rotated part needs RoPE and is what RoPE turns.
        for name in ("kv_rank", "q_rank"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        r = self.d_rope
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"d_rope must be an integer >= 0, got {r!r}")
        if self.kv_rank is None:
            for name, default in (("q_rank", None), ("d_rope", 0)):
                if getattr(self, name) != default:
                    raise ValueError(
                        f"{name}={getattr(self, name)!r} is multi-head latent attention's: "
                        "set kv_rank too (got kv_rank=None)"
                    )
            return
        for name in ("kv_rank", "q_rank"):
            rank = getattr(self, name)
            if rank is not None and rank > self.d_model:
                raise ValueError(
                    f"{name} must be at most d_model={self.d_model} (a compression of the "
                    f"width), got {name}={rank}"
                )
        if self.positional != "rope" or r == 0 or r % 2:
            raise ValueError(
                "kv_rank (multi-head latent attention) needs positional='rope' and an even "
                f"d_rope > 0 (the rotated part), got positional={self.positional!r}, d_rope={r}"
            )
        unsupported = dict(
            n_kv_heads=self.n_kv_heads not in (None, self.n_heads),  # the heads share the latent
            sliding_window=self.sliding_window is not None,  # its cache is no ring
            qk_norm=self.qk_norm,
        )
        for name, present in unsupported.items():
            if present:
                raise ValueError(
                    f"kv_rank (multi-head latent attention) does not support "
                    f"{name}={getattr(self, name)!r}"
                )

    @property
    def rope_dim(self) -> int:
        """The width RoPE turns in each head: Dr with latent attention, else Dk."""
        return self.d_rope if self.kv_rank is not None else self.head_dim_k

    def reject_decoder_only_options(self, model: str) -> None:
        """Fail for an option only :class:`~coursepkg.DecoderOnlyLM` implements: a
        ``sliding_window``, rotary positions (which need the positions of one sequence),
        QK-norm (a cross-attention cache would hold keys normalised once already), latent
        attention (``kv_rank``) or experts (``n_experts``)."""
        if self.kv_rank is not None:
            raise ValueError(
                f"{model} does not support kv_rank={self.kv_rank} (only DecoderOnlyLM has "
                "multi-head latent attention)"
            )
        if self.sliding_window is not None:
            raise ValueError(
                f"{model} does not support sliding_window={self.sliding_window!r} "
                "(only DecoderOnlyLM has a sliding window)"
            )
        if self.positional == "rope":
            raise ValueError(
                f"{model} does not support positional='rope' (only DecoderOnlyLM rotates its "
                "queries and keys); use 'sinusoidal' or 'learned'"
            )
        if self.qk_norm:
            raise ValueError(
                f"{model} does not support qk_norm=True (only DecoderOnlyLM normalises its "
                "queries and keys)"
            )
        if self.n_experts:
            raise ValueError(
                f"{model} does not support n_experts={self.n_experts} (only DecoderOnlyLM has "
                "mixture-of-experts layers); use n_experts=0"
            )

    # ----- derived sizes -------------------------------------------------------------------
    @property
    def head_dim_k(self) -> int:
        """Dk, the per-head query/key width."""
        return head_sizes(self.d_model, self.n_heads, self.d_k, self.d_v, self.n_kv_heads)[0]

    @property
    def head_dim_v(self) -> int:
        """Dv, the per-head value width."""
        return head_sizes(self.d_model, self.n_heads, self.d_k, self.d_v, self.n_kv_heads)[1]

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads (``n_kv_heads``, or H without grouping)."""
        return head_sizes(self.d_model, self.n_heads, self.d_k, self.d_v, self.n_kv_heads)[2]

    def block(self) -> BlockConfig:
        """What each layer of this model is built from: the block's fields, every default
        resolved (Dk, Dv, Hkv are numbers, never None)."""
        d_k, d_v, n_kv_heads = head_sizes(
            self.d_model, self.n_heads, self.d_k, self.d_v, self.n_kv_heads
        )
        return BlockConfig(
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            n_kv_heads=n_kv_heads,
            d_k=d_k,
            d_v=d_v,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            norm_first=self.norm_first,
            norm=self.norm,
            layer_norm_eps=self.layer_norm_eps,
            activation=self.activation,
            bias=self.bias,
            qk_norm=self.qk_norm,
        )

    @property
    def expert_d_ff(self) -> int:
        """The hidden width of each expert (``moe_d_ff``, or ``d_ff``)."""
        return self.moe_d_ff if self.moe_d_ff is not None else self.d_ff

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (counted from 0) has a mixture of experts as its feed-forward."""
        if self.n_experts == 0 or i < self.moe_first_dense:
            return False
        return (i + 1) % self.moe_every == 0

    @property
    def decoder_layers(self) -> int:
        """Number of decoder layers."""
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def source_vocab_size(self) -> int:
        """Size of the source vocabulary (equal to ``vocab_size`` when shared)."""
        return self.src_vocab_size if self.src_vocab_size is not None else self.vocab_size

    @property
    def separate_vocabularies(self) -> bool:
        """True when source and target vocabularies differ in size."""
        return self.src_vocab_size is not None and self.src_vocab_size != self.vocab_size

    @property
    def use_final_norm(self) -> bool:
        """Whether each stack ends with a LayerNorm (pre-LN needs one; the paper has none)."""
        return self.norm_first if self.final_norm is None else self.final_norm

    def replace(self, **changes) -> TransformerConfig:
        """Return a copy with some fields changed (the config itself is frozen)."""
        return dataclasses.replace(self, **changes)

    # ----- presets ---------------------------------------------------------------------------
    @classmethod
    def base(cls, vocab_size: int = 37000, **overrides) -> TransformerConfig:
        """The paper's base model: N=6, D=512, F=2048, H=8, P_drop=0.1 (about 63M parameters)."""
        fields = dict(d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1)
        fields.update(overrides)
        return cls(vocab_size=vocab_size, **fields)

    @classmethod
    def big(cls, vocab_size: int = 37000, **overrides) -> TransformerConfig:
        """The paper's big model: N=6, D=1024, F=4096, H=16, P_drop=0.3 (about 214M)."""
        fields = dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3)
        fields.update(overrides)
        return cls(vocab_size=vocab_size, **fields)


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def head_sizes(
    d_model: int, n_heads: int, d_k: int | None, d_v: int | None, n_kv_heads: int | None
) -> tuple[int, int, int]:
    """The attention's head sizes with their defaults resolved: the one place that says what
    None means for ``d_k``, ``d_v`` (D // H) and ``n_kv_heads`` (H, no grouping).

    Args:
        d_model: width D.
        n_heads: query heads H.
        d_k, d_v: per-head query/key and value sizes, or None for D // H.
        n_kv_heads: key/value heads Hkv, or None for H.

    Returns:
        ``(d_k, d_v, n_kv_heads)``, all numbers.

    Raises:
        ValueError: if D // H is needed and H does not divide D, or Hkv does not divide H.
    """
    if (d_k is None or d_v is None) and d_model % n_heads != 0:
        raise ValueError(
            f"d_model must be divisible by n_heads when d_k/d_v are not given: "
            f"got d_model={d_model}, n_heads={n_heads} "
            f"(remainder {d_model % n_heads}); set d_k and d_v explicitly "
            f"or pick n_heads dividing {d_model}"
        )
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if n_kv_heads < 1 or n_heads % n_kv_heads != 0:
        raise ValueError(
            f"n_kv_heads must divide n_heads={n_heads} (each key/value head serves a whole "
            f"group of query heads), got n_kv_heads={n_kv_heads}"
        )
    d_k = d_model // n_heads if d_k is None else d_k
    d_v = d_model // n_heads if d_v is None else d_v
    return d_k, d_v, n_kv_heads
