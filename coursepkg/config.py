"""Model configuration: one frozen dataclass shared by every model in the package."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

_POSITIONAL = ("sinusoidal", "learned", "rope")
_ROPE_PAIRS = ("halves", "interleaved")
_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu")
_SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
_NORMS = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the Transformer (Vaswani et al., 2017, Table 3 names).

    The defaults are the paper's *base* model. ``d_k`` and ``d_v`` default to
    ``d_model // n_heads``; set them explicitly to explore the rows of Table 3 that vary them
    (then ``d_model`` need not be divisible by ``n_heads``).

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
    n_token_types: int = 0  # segment (token type) embeddings added to the input (BERT: 2)
    embed_norm: bool = False  # LayerNorm on the summed input embeddings (BERT)
    logits_bias: bool = False  # a fixed bias buffer added to the output logits (Marian)
    pooler: bool = False  # encoder-only models: tanh-dense "pooler" on the first token (BERT)
    mlm_head: bool = True  # encoder-only models: the masked-LM head (dense, act, norm, output)
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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            _positive_int(name, getattr(self, name))
        optional = ("n_decoder_layers", "d_k", "d_v", "src_vocab_size", "sliding_window")
        for name in (*optional, "n_kv_heads"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if self.d_k is None or self.d_v is None:
            if self.d_model % self.n_heads != 0:
                raise ValueError(
                    f"d_model must be divisible by n_heads when d_k/d_v are not given: "
                    f"got d_model={self.d_model}, n_heads={self.n_heads} "
                    f"(remainder {self.d_model % self.n_heads}); set d_k and d_v explicitly "
                    f"or pick n_heads dividing {self.d_model}"
                )
        if self.n_heads % self.kv_heads != 0:
            raise ValueError(
                f"n_kv_heads must divide n_heads (each key/value head serves a whole group of "
                f"query heads): got n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}"
            )
        for name in ("dropout", "attention_dropout"):
            p = getattr(self, name)
            if not (0.0 <= p < 1.0):
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        if self.positional not in _POSITIONAL:
            raise ValueError(f"positional must be one of {_POSITIONAL}, got {self.positional!r}")
        self._check_rope()
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        if self.norm not in _NORMS:
            raise ValueError(f"norm must be one of {_NORMS}, got {self.norm!r}")
        if self.sinusoidal_layout not in _SINUSOIDAL_LAYOUTS:
            raise ValueError(
                f"sinusoidal_layout must be one of {_SINUSOIDAL_LAYOUTS}, "
                f"got {self.sinusoidal_layout!r}"
            )
        if (
            isinstance(self.n_token_types, bool)
            or not isinstance(self.n_token_types, int)
            or self.n_token_types < 0
        ):
            raise ValueError(f"n_token_types must be an integer >= 0, got {self.n_token_types!r}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")
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
        if self.head_dim_k % 2 != 0:
            raise ValueError(
                f"positional='rope' turns pairs of query/key columns: the per-head width Dk "
                f"must be even, got Dk={self.head_dim_k}"
            )
        if self.sinusoidal_layout != "interleaved":
            raise ValueError(
                f"sinusoidal_layout={self.sinusoidal_layout!r} describes a sinusoidal table, "
                "which positional='rope' does not have; use rope_pairs to choose the pairing"
            )

    def reject_decoder_only_options(self, model: str) -> None:
        """Fail for an option only :class:`~coursepkg.DecoderOnlyLM` implements: a
        ``sliding_window``, or rotary positions (which need the positions of one sequence)."""
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

    # ----- derived sizes -------------------------------------------------------------------
    @property
    def head_dim_k(self) -> int:
        """Dk, the per-head query/key width."""
        return self.d_k if self.d_k is not None else self.d_model // self.n_heads

    @property
    def head_dim_v(self) -> int:
        """Dv, the per-head value width."""
        return self.d_v if self.d_v is not None else self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads (``n_kv_heads``, or H without grouping)."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

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
