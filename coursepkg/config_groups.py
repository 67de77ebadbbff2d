"""The optional groups of :class:`~coursepkg.config.TransformerConfig`: each a small frozen
dataclass that checks itself, present (a model variant its layers build) or None (absent)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LatentConfig", "MoEConfig", "RopeConfig", "positive_int"]

_ROUTERS = ("softmax", "sigmoid")
_ROPE_PAIRS = ("halves", "interleaved")


@dataclass(frozen=True)
class MoEConfig:
    """A mixture of experts in place of the dense feed-forward (Mixtral, Qwen3-MoE, DeepSeek):
    ``TransformerConfig(..., moe=MoEConfig(n_experts=8, top_k=2))``. Decoder-only models.

    Raises:
        ValueError: for an impossible value, naming the field (``moe.top_k``), the expected and
            the actual.
    """

    n_experts: int  # E: feed-forward experts in each MoE layer
    top_k: int = 2  # k: experts each token is sent to (the router's top k of E)
    d_ff: int | None = None  # hidden width of each expert; None means the model's d_ff
    renormalize: bool = True  # rescale the k chosen probabilities to sum to 1 (Mixtral,
    # Qwen3-MoE's norm_topk_prob); False keeps the softmax's values (Switch, OLMoE)
    shared_experts: int = 0  # experts every token goes through as well (DeepSeek-MoE)
    every: int = 1  # layer i (from 0) is MoE when (i + 1) % every == 0, the others dense with
    # width d_ff (Qwen3-MoE's decoder_sparse_step)
    first_dense: int = 0  # the first layers stay dense whatever ``every`` says
    # (DeepSeek-V3's first_k_dense_replace: 3 of 61)
    router: str = "softmax"  # "softmax": probabilities over the experts, then top-k (Mixtral,
    # Qwen3-MoE); "sigmoid": each expert's score on its own, top-k chosen after adding a
    # per-expert bias that steers the choice but not the weights (DeepSeek-V3)
    groups: int = 1  # G: the experts split into G equal groups, and a token chooses among
    # those of its top_groups best groups only (DeepSeek-V3's n_group; sigmoid router)
    top_groups: int = 1  # the groups a token may use (DeepSeek-V3's topk_group)
    scale: float = 1.0  # the routed experts' weights times this (routed_scaling_factor)
    bias_update_rate: float = 0.0  # gamma: after each training step, each expert's choice
    # bias moves by gamma towards an even load, bias += gamma * sign(mean load - load)
    # (DeepSeek-V3's auxiliary-loss-free balancing; sigmoid router); 0: the bias stays put

    def __post_init__(self) -> None:
        for name in ("n_experts", "top_k", "every", "groups", "top_groups"):
            positive_int(f"moe.{name}", getattr(self, name))
        if self.d_ff is not None:
            positive_int("moe.d_ff", self.d_ff)
        for name in ("shared_experts", "first_dense"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"moe.{name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.renormalize, bool):
            raise ValueError(f"moe.renormalize must be True or False, got {self.renormalize!r}")
        if self.top_k > self.n_experts:
            raise ValueError(
                f"moe.top_k must be at most moe.n_experts (a token picks k of the E experts): "
                f"got top_k={self.top_k}, n_experts={self.n_experts}"
            )
        self._check_router()

    def _check_router(self) -> None:
        # DeepSeek-V3's router: sigmoid scores, groups of experts, a scale on the weights.
        if self.router not in _ROUTERS:
            raise ValueError(f"moe.router must be one of {_ROUTERS}, got {self.router!r}")
        scale, rate = self.scale, self.bias_update_rate
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0:
            raise ValueError(f"moe.scale must be a number > 0, got {scale!r}")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate >= 0:
            raise ValueError(f"moe.bias_update_rate must be a number >= 0, got {rate!r}")
        if rate and self.router != "sigmoid":
            raise ValueError(
                f"moe.bias_update_rate={rate} moves the sigmoid router's choice bias, which "
                f"needs moe.router='sigmoid', got {self.router!r}"
            )
        g, top = self.groups, self.top_groups
        if g == 1 and top == 1:
            return
        if self.router != "sigmoid":
            raise ValueError(
                f"moe.groups={g} and moe.top_groups={top} are DeepSeek-V3's group-limited "
                f"routing, which needs moe.router='sigmoid', got {self.router!r}"
            )
        if self.n_experts % g or self.n_experts // g < 2:
            raise ValueError(
                f"moe.groups must split n_experts={self.n_experts} into equal groups of at "
                f"least 2 (a group's score is its best two experts'), got groups={g}"
            )
        if top > g:
            raise ValueError(f"moe.top_groups must be at most moe.groups={g}, got {top}")
        if self.top_k > top * (self.n_experts // g):
            raise ValueError(
                f"moe.top_k={self.top_k} experts cannot be chosen from top_groups={top} "
                f"groups of {self.n_experts // g}: raise moe.top_groups or lower moe.top_k"
            )

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (counted from 0) has a mixture of experts as its feed-forward."""
        return i >= self.first_dense and (i + 1) % self.every == 0

    def check_layers(self, n_layers: int) -> None:
        """Fail unless some of ``n_layers`` layers is a MoE layer."""
        if self.every > n_layers:
            raise ValueError(
                f"moe.every must be at most n_layers={n_layers} (or no layer is MoE), "
                f"got every={self.every}"
            )
        if not any(self.is_moe_layer(i) for i in range(n_layers)):
            raise ValueError(
                f"moe.first_dense={self.first_dense} leaves no MoE layer among "
                f"n_layers={n_layers} (with every={self.every}); use fewer"
            )


@dataclass(frozen=True)
class LatentConfig:
    """Multi-head latent attention (DeepSeek-V2/V3) in place of every self-attention:
    ``TransformerConfig(..., positional="rope", latent=LatentConfig(kv_rank=512, d_rope=64))``.
    The model's ``d_k`` is then each head's unrotated query/key part Dn. Decoder-only models.

    Raises:
        ValueError: for an impossible value, naming the field (``latent.d_rope``).
    """

    kv_rank: int  # R: keys and values rebuilt from a latent of R numbers per token, all the
    # cache keeps (with the rotated key part)
    d_rope: int  # Dr: the rotated part of each head's query and of the key shared by heads
    q_rank: int | None = None  # Rq: the queries' own latent (DeepSeek's q_lora_rank); None: one
    # projection

    def __post_init__(self) -> None:
        positive_int("latent.kv_rank", self.kv_rank)
        if self.q_rank is not None:
            positive_int("latent.q_rank", self.q_rank)
        r = self.d_rope
        if isinstance(r, bool) or not isinstance(r, int) or r < 1 or r % 2:
            raise ValueError(
                f"latent.d_rope must be an even positive integer (RoPE turns pairs of "
                f"columns), got {r!r}"
            )


@dataclass(frozen=True)
class RopeConfig:
    """Rotary positions (Su et al., 2021), read with ``positional="rope"``: the base of the
    frequencies and which columns turn together. Always present (the defaults are Llama's);
    ``TransformerConfig(..., positional="rope", rope=RopeConfig(theta=5e5))`` is Llama 3's.

    Raises:
        ValueError: for an impossible value, naming the field (``rope.theta``).
    """

    theta: float = 10000.0  # the base of the frequencies theta^(-2i/Dk)
    pairs: str = "halves"  # the columns turned together: "halves" (i with i + Dk/2: Hugging
    # Face's Llama, Qwen) or "interleaved" (2i with 2i+1: the paper, DeepSeek)

    def __post_init__(self) -> None:
        t = self.theta
        if isinstance(t, bool) or not isinstance(t, int | float) or not t > 0:
            raise ValueError(f"rope.theta must be a number > 0, got {t!r}")
        if self.pairs not in _ROPE_PAIRS:
            raise ValueError(f"rope.pairs must be one of {_ROPE_PAIRS}, got {self.pairs!r}")


def positive_int(name: str, value: object) -> None:
    """Fail unless ``value`` is an integer >= 1 (a bool is not), naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
