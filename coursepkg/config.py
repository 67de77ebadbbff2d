"""Model configuration: one frozen dataclass shared by every model in the package, and its
optional groups, each a small frozen dataclass that checks itself: :class:`MoEConfig` (a
mixture of experts), :class:`LatentConfig` (multi-head latent attention) and
:class:`HFOptions` (what only Hugging Face's models need). Configs saved before the groups
load through :meth:`TransformerConfig.from_dict`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from .config_groups import LatentConfig, MoEConfig, RopeConfig, positive_int

_POSITIONAL = ("sinusoidal", "learned", "rope", "alibi")
_ACTIVATIONS = ("relu", "relu2", "gelu", "gelu_tanh", "silu", "swiglu", "geglu")
_SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
_NORMS = ("layernorm", "rmsnorm")


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


# The groups of TransformerConfig, and the flat names a config saved before them used
# (old name -> group, field); read by :func:`upgrade_options`.
_GROUPS = {"hf": HFOptions, "rope": RopeConfig, "moe": MoEConfig, "latent": LatentConfig}
_FLAT_NAMES = {
    **{f"moe_{f.name}": ("moe", f.name) for f in dataclasses.fields(MoEConfig)},
    "n_experts": ("moe", "n_experts"),
    "moe_shared_experts": ("moe", "shared_experts"),
    **{f.name: ("latent", f.name) for f in dataclasses.fields(LatentConfig)},
    **{f.name: ("hf", f.name) for f in dataclasses.fields(HFOptions)},
    **{f"rope_{f.name}": ("rope", f.name) for f in dataclasses.fields(RopeConfig)},
}
_FLAT_NAMES.pop("moe_n_experts")
# The flat values that meant "no such group" (the first one of each names it).
_ABSENT = {"moe": {"n_experts": 0}, "latent": {"kv_rank": None, "d_rope": 0}}


def upgrade_options(options: Mapping) -> dict:
    """``TransformerConfig`` options in today's form, from any form a run or a checkpoint
    wrote: the flat names of configs saved before the groups (``n_experts``, ``moe_top_k``,
    ``kv_rank``, ``pooler``), dotted names (``moe.top_k``, as ``--model`` takes them), or a
    group's mapping (``moe: {n_experts: 4}``). A group whose flat options are all at their
    "absent" values (``n_experts=0``, ``kv_rank=None``) is no group (None).

    Args:
        options: field names to values.

    Returns:
        The same options with each group's options gathered in one mapping (or None).

    Raises:
        ValueError: for an option given both flat and inside its group.
    """
    out: dict = {}
    gathered: dict[str, dict] = {}
    for key, value in options.items():
        group, _, name = key.partition(".")
        if name:  # moe.top_k
            gathered.setdefault(group, {})[name] = value
        elif key in _FLAT_NAMES:  # moe_top_k, kv_rank, pooler
            group, name = _FLAT_NAMES[key]
            gathered.setdefault(group, {})[name] = value
        else:
            out[key] = value
    for group, flat in gathered.items():
        nested = out.get(group)
        if dataclasses.is_dataclass(nested):
            nested = dataclasses.asdict(nested)
        both = sorted(set(flat) & set(nested or {}))
        if both:
            raise ValueError(f"{group} options {both} are given twice: flat and in {group!r}")
        key = next(iter(_ABSENT.get(group, {})), None)  # n_experts, kv_rank
        absent = None if key is None else _ABSENT[group][key]
        if key is not None and nested is None and flat.get(key, absent) == absent:
            _check_absent(group, key, flat)  # no experts, no latent
            out[group] = nested
        else:
            out[group] = {**(nested or {}), **flat}
    return out


def _check_absent(group: str, key: str, flat: dict) -> None:
    # The options of a group that ``key`` leaves out must be at their defaults.
    defaults = {f.name: f.default for f in dataclasses.fields(_GROUPS[group])} | _ABSENT[group]
    for name, value in flat.items():
        if value != defaults[name]:
            raise ValueError(
                f"{group}.{name}={value!r} needs the {group} group, which "
                f"{key}={_ABSENT[group][key]!r} leaves out"
            )


# The options of one block besides its sizes D, H, F and dropout (BlockConfig.of takes these);
# a list of names, read as a paragraph (one a line would be ten lines of nothing else).
_BLOCK_OPTIONS = (
    "norm_first", "d_k", "d_v", "attention_dropout", "activation", "bias", "layer_norm_eps",
    "norm", "n_kv_heads", "qk_norm",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BlockConfig:
    """What one layer (block) is built from, every default resolved: no size is None (a
    group, ``latent`` or ``moe``, is None where the layer does not have it).

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
    alibi: bool = False  # ALiBi's distance penalty on the self-attention scores
    latent: LatentConfig | None = None  # multi-head latent attention in place of self-attention
    moe: MoEConfig | None = None  # experts in place of the feed-forward (its d_ff resolved)

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "d_ff", "n_kv_heads", "d_k", "d_v"):
            positive_int(name, getattr(self, name))
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
    # both added to the embeddings; or no table: "rope" (queries and keys rotated in attention)
    # or "alibi" (a penalty on the scores growing with the distance, Press et al. 2022)
    src_vocab_size: int | None = None  # source vocabulary when it differs; None means shared
    share_embeddings: bool = True  # one embedding matrix for source and target (shared vocab)
    tie_embeddings: bool = True  # output projection reuses the target embedding matrix
    pad_id: int | None = None  # padding id; when set, models derive token masks from it
    activation: str = "relu"  # FFN non-linearity: "relu" (paper), "relu2" (ReLU squared, So et
    # al. 2021's Primer; nanochat), "gelu" (exact, BERT), "gelu_tanh" (GPT-2's tanh
    # approximation) or "silu" (swish, Marian/OPUS-MT)
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
    rope: RopeConfig = field(default_factory=RopeConfig)  # positional="rope": its base and pairs
    n_kv_heads: int | None = None  # key/value heads (grouped-query attention; 1 = multi-query):
    # each serves n_heads / n_kv_heads query heads, and the KV cache holds only these; None: H
    qk_norm: bool = False  # QK-norm (Qwen3): an RMSNorm over each head's Dk on queries and
    # keys, before RoPE (gain only, eps = layer_norm_eps)
    sliding_window: int | None = None  # W: decoder-only models attend to the last W positions
    # only, themselves included (Mistral; its KV cache is a ring of W); None: the whole past
    # ----- the groups: each None (absent) or its own frozen config -----------------------------
    moe: MoEConfig | None = None  # a mixture of experts in place of the dense feed-forward
    # (Mixtral, Qwen3-MoE, DeepSeek; decoder-only models)
    latent: LatentConfig | None = None  # multi-head latent attention (DeepSeek-V2/V3;
    # decoder-only, positional="rope"); d_k is then each head's unrotated query/key part Dn

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            positive_int(name, getattr(self, name))
        optional = ("n_decoder_layers", "d_k", "d_v", "src_vocab_size", "sliding_window")
        for name in (*optional, "n_kv_heads"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        self._coerce_groups()
        self.block()  # the block's fields: head sizes, dropouts, norm, activation, eps
        if self.positional not in _POSITIONAL:
            raise ValueError(f"positional must be one of {_POSITIONAL}, got {self.positional!r}")
        self._check_rope()
        self._check_table()
        if self.moe is not None:
            self.moe.check_layers(self.n_layers)
        self._check_latent()
        if self.sinusoidal_layout not in _SINUSOIDAL_LAYOUTS:
            raise ValueError(
                f"sinusoidal_layout must be one of {_SINUSOIDAL_LAYOUTS}, "
                f"got {self.sinusoidal_layout!r}"
            )
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
        # RoPE's group means something only with positional="rope", and a table's only without.
        if self.positional != "rope":
            for f in dataclasses.fields(RopeConfig):
                if getattr(self.rope, f.name) != f.default:
                    raise ValueError(
                        f"rope.{f.name}={getattr(self.rope, f.name)!r} needs positional='rope', "
                        f"got positional={self.positional!r}"
                    )
            return
        if self.latent is None and self.head_dim_k % 2 != 0:
            raise ValueError(
                f"positional='rope' turns pairs of query/key columns: the per-head width Dk "
                f"must be even, got Dk={self.head_dim_k}"
            )

    def _check_table(self) -> None:
        if self.positional in ("rope", "alibi") and self.sinusoidal_layout != "interleaved":
            raise ValueError(
                f"sinusoidal_layout={self.sinusoidal_layout!r} describes a sinusoidal table, "
                f"which positional={self.positional!r} does not have"
            )

    def _coerce_groups(self) -> None:
        # A group given as a mapping (as dataclasses.asdict writes it: checkpoints, YAML).
        for name, group in _GROUPS.items():
            value = getattr(self, name)
            if isinstance(value, Mapping):
                known = {f.name for f in dataclasses.fields(group)}
                unknown = sorted(set(value) - known)
                if unknown:
                    raise ValueError(
                        f"{name} has no options {unknown}; expected some of {sorted(known)}"
                    )
                object.__setattr__(self, name, value := group(**value))
            always = name in ("hf", "rope")  # never None
            if not isinstance(value, group) and not (value is None and not always):
                article = "an" if name == "hf" else "a"
                expected = f"{article} {group.__name__}" + ("" if always else " or None")
                raise ValueError(f"{name} must be {expected}, got {type(value).__name__}")

    def _check_latent(self) -> None:
        # MLA's latents compress the width; its rotated part needs RoPE and is what RoPE turns.
        if self.latent is None:
            return
        for name in ("kv_rank", "q_rank"):
            rank = getattr(self.latent, name)
            if rank is not None and rank > self.d_model:
                raise ValueError(
                    f"latent.{name} must be at most d_model={self.d_model} (a compression of "
                    f"the width), got {rank}"
                )
        if self.positional != "rope":
            raise ValueError(
                "latent (multi-head latent attention) needs positional='rope' (its d_rope part "
                f"is rotated), got positional={self.positional!r}"
            )
        unsupported = dict(
            n_kv_heads=self.n_kv_heads not in (None, self.n_heads),  # the heads share the latent
            sliding_window=self.sliding_window is not None,  # its cache is no ring
            qk_norm=self.qk_norm,
        )
        for name, present in unsupported.items():
            if present:
                raise ValueError(
                    f"latent (multi-head latent attention) does not support "
                    f"{name}={getattr(self, name)!r}"
                )

    @property
    def rope_dim(self) -> int:
        """The width RoPE turns in each head: Dr with latent attention, else Dk."""
        return self.latent.d_rope if self.latent is not None else self.head_dim_k

    def reject_decoder_only_options(self, model: str) -> None:
        """Fail for an option only :class:`~coursepkg.DecoderOnlyLM` implements: a
        ``sliding_window``, rotary positions (which need the positions of one sequence),
        QK-norm (a cross-attention cache would hold keys normalised once already), latent
        attention (``latent``) or experts (``moe``)."""
        if self.latent is not None:
            raise ValueError(
                f"{model} does not support latent={self.latent} (only DecoderOnlyLM has "
                "multi-head latent attention)"
            )
        if self.sliding_window is not None:
            raise ValueError(
                f"{model} does not support sliding_window={self.sliding_window!r} "
                "(only DecoderOnlyLM has a sliding window)"
            )
        if self.positional in ("rope", "alibi"):
            raise ValueError(
                f"{model} does not support positional={self.positional!r} (only DecoderOnlyLM "
                "has positions inside its attention); use 'sinusoidal' or 'learned'"
            )
        if self.qk_norm:
            raise ValueError(
                f"{model} does not support qk_norm=True (only DecoderOnlyLM normalises its "
                "queries and keys)"
            )
        if self.moe is not None:
            raise ValueError(
                f"{model} does not support moe={self.moe} (only DecoderOnlyLM has "
                "mixture-of-experts layers); use moe=None"
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

    def block(self, layer: int | None = None) -> BlockConfig:
        """What a layer of this model is built from: the block's fields, every default
        resolved (Dk, Dv, Hkv are numbers, never None), with its groups.

        Args:
            layer: the layer's index (from 0): its block carries the ``moe`` group when that
                layer is a MoE layer (with the experts' width resolved); None: a dense block.
        """
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
            alibi=self.positional == "alibi",
            latent=self.latent,
            moe=self._layer_moe(layer),
        )

    def _layer_moe(self, layer: int | None) -> MoEConfig | None:
        if layer is None or not self.is_moe_layer(layer):
            return None
        return dataclasses.replace(self.moe, d_ff=self.expert_d_ff)

    @property
    def expert_d_ff(self) -> int:
        """The hidden width of each expert (``moe.d_ff``, or ``d_ff``)."""
        return self.moe.d_ff if self.moe is not None and self.moe.d_ff is not None else self.d_ff

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (counted from 0) has a mixture of experts as its feed-forward."""
        return self.moe is not None and self.moe.is_moe_layer(i)

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

    @classmethod
    def from_dict(cls, options: Mapping) -> TransformerConfig:
        """The config a mapping describes, in any form a run or checkpoint wrote: today's
        (``dataclasses.asdict``), a config saved before the groups (flat ``n_experts``,
        ``moe_top_k``, ``kv_rank``, ``pooler``), or dotted names (``moe.top_k``); see
        :func:`upgrade_options`.

        Raises:
            ValueError: naming the options that are no field of the config.
        """
        options = upgrade_options(options)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"options {unknown} are not TransformerConfig fields; expected some of "
                f"{sorted(known)}"
            )
        return cls(**options)

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


def config_value(config: TransformerConfig, name: str) -> object:
    """A field or property of ``config`` by name; ``"moe.top_k"`` reads a group's field (None
    when the group is absent)."""
    group, _, field_name = name.partition(".")
    if not field_name:
        return getattr(config, name)
    value = getattr(config, group)
    return None if value is None else getattr(value, field_name)


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
