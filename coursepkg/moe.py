"""A mixture of experts in place of the feed-forward network (Shazeer et al., 2017; Switch,
Fedus et al., 2021; Mixtral, Jiang et al., 2024; Qwen3-MoE; DeepSeek-V3, 2024).

A router scores every token against E experts, each a feed-forward network of its own; the
token goes through its k best experts only, and their outputs are summed, weighted by the
router's probabilities. The model holds E experts' parameters but spends k experts' arithmetic
per token: more parameters at the same cost per token. Nothing keeps the router from sending
every token to the same few experts, so training adds a load-balancing loss
(:func:`load_balancing_loss`) that is smallest when tokens and probability spread evenly.

Two routers: Mixtral's and Qwen3-MoE's softmax over the experts, then the k most probable
(:func:`route_top_k`); and DeepSeek-V3's (:func:`route_sigmoid`), which scores each expert with
a sigmoid of its own, chooses the k by those scores plus a per-expert bias that steers the
choice only (DeepSeek balances the load by moving that bias, without an auxiliary loss), may
first keep only a token's best groups of experts, and weights the chosen ones by their scores.
:func:`update_choice_bias` is that balancing, one step of it.

Dimension legend: B batch, L length, D d_model, F an expert's hidden width, E experts, k the
experts chosen per token, T = B * L tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .config import BlockConfig
from .layers import PositionwiseFeedForward

__all__ = [
    "MoEFeedForward",
    "Routing",
    "expert_load",
    "load_balancing_loss",
    "route_sigmoid",
    "route_top_k",
    "update_choice_bias",
]


@dataclass(frozen=True)
class Routing:
    """What the router decided for a batch, kept by :class:`MoEFeedForward` after each call.

    Attributes:
        probs: every token's distribution over the experts, (T, E): the softmax, or for the
            sigmoid router the scores divided by their sum (what DeepSeek-V3's balance loss
            averages); gradients flow through it.
        experts: the k experts each token went to, best first, (T, k) integer ids.
        weights: the weight of each chosen expert's output, (T, k).
    """

    probs: Tensor
    experts: Tensor
    weights: Tensor


def _check_k(k: int, logits: Tensor) -> None:
    # A token chooses k of the E experts the logits score.
    n = logits.size(-1)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(
            f"k must be an integer in [1, E={n}] (the experts logits scores), got {k!r}"
        )


def route_top_k(logits: Tensor, k: int, renormalize: bool = True) -> Routing:
    """Softmax over the experts, then the k most probable (Mixtral, Qwen3-MoE).

    Args:
        logits: the router's scores.
        k: experts per token.
        renormalize: divide the k chosen probabilities by their sum, so that the weights of a
            token sum to 1 (Mixtral; Qwen3-MoE's ``norm_topk_prob``); False keeps them as the
            softmax gave them (Switch with k = 1, OLMoE), so that they sum to at most 1.

    Shape:
        logits (T, E) -> probs (T, E), experts (T, k), weights (T, k).
    """
    _check_k(k, logits)
    probs = torch.softmax(logits.float(), dim=-1)  # (T, E): over every expert, before top-k
    weights, experts = probs.topk(k, dim=-1)  # (T, k), (T, k)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)  # (T, k)
    return Routing(probs, experts, weights.to(logits.dtype))


def route_sigmoid(
    logits: Tensor,
    k: int,
    choice_bias: Tensor,
    groups: int = 1,
    top_groups: int = 1,
    renormalize: bool = True,
) -> Routing:
    """DeepSeek-V3's router: a sigmoid score per expert, the k best of score + bias, within the
    token's ``top_groups`` best groups of experts (DeepSeek-V3 report, Sec. 2.1.2).

    The bias is added for the choice only: the weights are the chosen experts' scores
    themselves, so moving the bias shifts the load without touching what an expert's output
    counts for. A group's score is the sum of its two best (biased) scores.

    Args:
        logits: the router's scores before the sigmoid.
        k: experts per token.
        choice_bias: (E,) added to the scores before the choice (``e_score_correction_bias``).
        groups: G, the experts split into G equal groups, in order.
        top_groups: the groups each token may choose from.
        renormalize: divide the k weights by their sum (DeepSeek-V3's ``norm_topk_prob``).

    Shape:
        logits (T, E) -> probs (T, E), experts (T, k), weights (T, k).
    """
    _check_k(k, logits)
    scores = torch.sigmoid(logits.float())  # (T, E): each expert's affinity on its own
    choice = scores + choice_bias.float()  # (T, E): steers which experts, not how much
    if groups > 1:
        t, e = choice.shape
        by_group = choice.view(t, groups, e // groups)  # (T, G, E/G)
        group_scores = by_group.topk(2, dim=-1).values.sum(dim=-1)  # (T, G): best two each
        best = group_scores.topk(top_groups, dim=-1).indices  # (T, top_groups)
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, best, True)  # (T, G)
        keep = keep[:, :, None].expand_as(by_group).reshape(t, e)  # (T, E): experts allowed
        choice = choice.masked_fill(~keep, float("-inf"))  # (T, E)
    experts = choice.topk(k, dim=-1).indices  # (T, k)
    weights = scores.gather(1, experts)  # (T, k): the scores, without the bias
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)  # (T, k)
    probs = scores / scores.sum(dim=-1, keepdim=True)  # (T, E)
    return Routing(probs, experts, weights.to(logits.dtype))


@torch.no_grad()
def update_choice_bias(choice_bias: Tensor, load: Tensor, rate: float) -> None:
    """DeepSeek-V3's balancing without an auxiliary loss (report, Sec. 2.1.2): after a training
    step, every expert that got more than the mean load has its choice bias lowered by
    ``rate``, every one that got less has it raised, so that the next steps send fewer tokens to
    the busy experts and more to the idle ones. The bias takes no gradient: it moves only here.

    bias_i += rate * sign(mean(load) - load_i)

    Args:
        choice_bias: a layer's :attr:`MoEFeedForward.choice_bias`, updated in place.
        load: the step's :func:`expert_load` of that layer, over every micro-batch and rank (all
            ranks must pass the same counts, so that their biases stay equal).
        rate: gamma (DeepSeek-V3: 0.001 for most of training, then 0).

    Shape:
        choice_bias (E,), load (E,).
    """
    if load.shape != choice_bias.shape:
        raise ValueError(
            f"load must have the choice bias's shape {tuple(choice_bias.shape)}, "
            f"got {tuple(load.shape)}"
        )
    step = torch.sign(load.mean() - load.float())  # (E,): +1 below the mean, -1 above
    choice_bias.add_(rate * step.to(choice_bias))


class MoEFeedForward(nn.Module):
    """E expert feed-forward networks and a router sending each token to k of them.

    y = sum over the k chosen experts e of w_e * FFN_e(x), plus the shared experts' FFN(x),
    which every token goes through (DeepSeek-MoE). Every expert is a
    :class:`~coursepkg.layers.PositionwiseFeedForward` (SwiGLU with ``activation="swiglu"``).
    No token is dropped: an expert takes however many tokens are sent to it, as Hugging Face's
    models do. After each call, :attr:`routing` holds the router's decision for the batch.
    The router is Mixtral's softmax (:func:`route_top_k`) or DeepSeek-V3's sigmoid
    (:func:`route_sigmoid`); the routed experts' weights are then multiplied by ``scale``.

    Args:
        d_model: width D.
        d_ff: hidden width F of each expert.
        n_experts: E.
        top_k: k, experts per token.
        renormalize: see :func:`route_top_k`.
        n_shared: shared experts; they are stored as one feed-forward of width
            ``n_shared * d_ff`` (the same function as that many summed experts).
        dropout, activation, bias: of each expert, as in ``PositionwiseFeedForward``.
        router: ``"softmax"`` or ``"sigmoid"``.
        groups, top_groups: the sigmoid router's groups (see :func:`route_sigmoid`).
        scale: the routed experts' weights times this (DeepSeek's ``routed_scaling_factor``).

    Submodules ``router`` (D -> E, no bias: Hugging Face's ``gate``), ``experts`` (E
    feed-forwards) and ``shared`` (None without shared experts); buffer ``choice_bias`` (E,),
    the sigmoid router's bias for the choice (zeros until set; None for softmax).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int,
        top_k: int,
        renormalize: bool = True,
        n_shared: int = 0,
        dropout: float = 0.0,
        activation: str = "swiglu",
        bias: bool = False,
        router: str = "softmax",
        groups: int = 1,
        top_groups: int = 1,
        scale: float = 1.0,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        if router not in ("softmax", "sigmoid"):
            raise ValueError(f"router must be 'softmax' or 'sigmoid', got {router!r}")
        self.top_k, self.renormalize = top_k, renormalize
        self.groups, self.top_groups, self.scale = groups, top_groups, scale
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(
            PositionwiseFeedForward(d_model, d_ff, dropout, activation, bias)
            for _ in range(n_experts)
        )
        shared = n_shared * d_ff
        self.shared = (
            PositionwiseFeedForward(d_model, shared, dropout, activation, bias) if shared else None
        )
        sigmoid = router == "sigmoid"
        self.register_buffer("choice_bias", torch.zeros(n_experts) if sigmoid else None)
        self.routing: Routing | None = None

    @classmethod
    def from_block(cls, config: BlockConfig) -> MoEFeedForward:
        """The mixture of experts a block's ``moe`` group describes (with its sizes, dropout,
        activation and bias): ``MoEFeedForward.from_block(model_config.block(i))``."""
        if config.moe is None:
            raise ValueError("MoEFeedForward.from_block needs a block with a moe group, got None")
        m = config.moe
        return cls(
            config.d_model,
            m.d_ff if m.d_ff is not None else config.d_ff,
            m.n_experts,
            m.top_k,
            m.renormalize,
            m.shared_experts,
            config.dropout,
            config.activation,
            config.bias,
            m.router,
            m.groups,
            m.top_groups,
            m.scale,
        )

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module's hook
        # A dtype change (model.to(torch.bfloat16)) leaves the choice bias in float32, as
        # Hugging Face keeps e_score_correction_bias: steps of gamma = 0.001 on a bias near 1
        # would round away in bfloat16, whose spacing there is 0.0078.
        super()._apply(fn, recurse)
        if self.choice_bias is not None and self.choice_bias.dtype != torch.float32:
            self.choice_bias = self.choice_bias.float()
        return self

    def route(self, tokens: Tensor) -> Routing:
        """The router's decision for each token, with the weights the outputs are summed by.

        Shape:
            tokens (T, D) -> probs (T, E), experts (T, k), weights (T, k).
        """
        logits = self.router(tokens)  # (T, E)
        if self.choice_bias is None:
            routing = route_top_k(logits, self.top_k, self.renormalize)
        else:
            routing = route_sigmoid(
                logits,
                self.top_k,
                self.choice_bias,
                self.groups,
                self.top_groups,
                self.renormalize,
            )
        if self.scale == 1.0:
            return routing
        return Routing(routing.probs, routing.experts, routing.weights * self.scale)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: (B, L, D) -> (B, L, D)."""
        b, n, d = x.shape
        tokens = x.reshape(b * n, d)  # (T, D)
        routing = self.route(tokens)
        self.routing = routing
        out = torch.zeros_like(tokens)  # (T, D)
        for e, expert in enumerate(self.experts):
            # Which tokens chose expert e, and in which of their k slots.
            token_ids, slot = torch.where(routing.experts == e)  # (n_e,), (n_e,)
            if token_ids.numel() == 0:
                continue  # no token chose it: it costs nothing in this batch
            y = expert(tokens[token_ids])  # (n_e, D)
            w = routing.weights[token_ids, slot]  # (n_e,)
            out = out.index_add(0, token_ids, y * w[:, None])  # (T, D)
        if self.shared is not None:
            out = out + self.shared(tokens)  # (T, D)
        return out.reshape(b, n, d)  # (B, L, D)


def expert_load(routing: Routing, n_experts: int, token_mask: Tensor | None = None) -> Tensor:
    """How many (token, slot) assignments each expert got in one layer: the load to plot.

    Args:
        routing: a layer's :attr:`MoEFeedForward.routing`.
        n_experts: E.
        token_mask: bool (B, L), True = real token; padding is not counted.

    Shape:
        -> (E,) float counts summing to k times the number of real tokens.
    """
    experts = routing.experts  # (T, k)
    ones = torch.ones_like(experts, dtype=torch.float32)  # (T, k)
    if token_mask is not None:
        ones = ones * token_mask.reshape(-1, 1).to(ones)  # (T, k)
    counts = torch.zeros(n_experts, device=experts.device)  # (E,)
    return counts.index_add(0, experts.reshape(-1), ones.reshape(-1))  # (E,)


def load_balancing_loss(
    routings: list[Routing], n_experts: int, token_mask: Tensor | None = None
) -> Tensor:
    """The auxiliary loss that pushes the router to spread tokens evenly (Switch, Eq. 4-6).

    loss = E * sum_i f_i * P_i, where f_i is the fraction of the tokens sent to expert i
    (counting each of a token's k choices: the f_i sum to k) and P_i the router's mean
    probability for expert i. Only P carries a gradient (the top-k choice has none); the loss
    is smallest, k, when both are uniform. The tokens of every MoE layer are pooled before the
    averages, as Mixtral's and Qwen3-MoE's ``load_balancing_loss_func`` does; multiply by a
    small coefficient (theirs: ``router_aux_loss_coef`` = 0.001 or 0.02) and add it to the
    language-modelling loss.

    Args:
        routings: one :class:`Routing` per MoE layer, from the same forward pass.
        n_experts: E.
        token_mask: bool (B, L), True = real token; padding takes no part.

    Returns:
        A scalar tensor.
    """
    if not routings:
        raise ValueError("routings must hold at least one layer's Routing, got none")
    widths = {r.probs.size(-1) for r in routings}
    if widths != {n_experts}:
        raise ValueError(
            f"n_experts must be the routers' number of experts, {sorted(widths)}, got {n_experts}"
        )
    counts = sum(expert_load(r, n_experts, token_mask) for r in routings)  # (E,)
    probs = torch.cat([r.probs for r in routings])  # (layers * T, E)
    if token_mask is None:
        rows = float(probs.size(0))
        prob_sum = probs.sum(dim=0)  # (E,)
    else:
        real = token_mask.reshape(-1).to(probs).repeat(len(routings))  # (layers * T,)
        rows = real.sum()
        prob_sum = (probs * real[:, None]).sum(dim=0)  # (E,)
    f, p = counts / rows, prob_sum / rows  # (E,), (E,)
    return n_experts * (f * p).sum()
