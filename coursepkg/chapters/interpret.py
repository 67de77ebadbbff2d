"""What a trained decoder-only model computes, read off its residual stream (no hooks).

A pre-LN GPT keeps one vector per position, the *residual stream*. It starts as the token's
embedding plus its position's, and every sublayer reads a normalised copy of it and adds its
output back: ``x = x + attn(norm1(x))``, then ``x = x + ffn(norm2(x))`` (Elhage et al., 2021).
:func:`residual_stream` replays a :class:`~coursepkg.DecoderOnlyLM` sublayer by sublayer and
keeps every write, so the final logits are the embedding plus a sum of writes, read through
the final LayerNorm and the tied output embedding. :func:`logit_lens` reads the stream the
same way after every sublayer; :func:`ffn_unit_activations` and :func:`ffn_unit_promotes`
treat each feed-forward unit as a key (a pattern of its input) and a value (a direction it
adds to the stream; Geva et al., 2021).

Dimension legend: B batch, L length, D d_model, F d_ff, V vocabulary, K states.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .._validation import check_tokens
from ..decoder_only import DecoderOnlyLM
from ..masks import causal_mask

__all__ = [
    "ResidualStream",
    "ffn_unit_activations",
    "ffn_unit_promotes",
    "logit_lens",
    "mean_pairwise_cosine",
    "residual_stream",
]


@dataclass
class ResidualStream:
    """Every state of the residual stream of one forward pass.

    Attributes:
        names: ``"embedding"``, then ``"layer{i}.attn"`` and ``"layer{i}.ffn"`` for each layer:
            the name of each entry of ``states`` (the state *after* that write).
        states: (K, B, L, D); ``states[0]`` is token + position embedding, ``states[k]`` the
            stream after the k-th write.
        writes: (K - 1, B, L, D); ``writes[k - 1] = states[k] - states[k - 1]``, what the k-th
            sublayer added.
        logits: (B, L, V), the model's output, computed from ``states[-1]``.
    """

    names: list[str]
    states: Tensor
    writes: Tensor
    logits: Tensor


def _check_model(model: DecoderOnlyLM) -> None:
    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be a coursepkg.DecoderOnlyLM, got {type(model).__name__}")
    if not model.config.norm_first:
        raise ValueError(
            "the residual stream is a running sum only in a pre-LN model (norm_first=True); "
            "a post-LN layer renormalises the stream after every write"
        )


def _read_out(model: DecoderOnlyLM, states: Tensor) -> Tensor:
    """The final norm and the output head applied to any state(s) of the stream.

    Shape: (..., D) -> (..., V).
    """
    h = states if model.norm is None else model.norm(states)
    logits = model.lm_head(h)  # (..., V)
    return logits if model.logits_bias is None else logits + model.logits_bias


@torch.no_grad()
def residual_stream(
    model: DecoderOnlyLM, tokens: Tensor, skip: tuple[str, ...] = ()
) -> ResidualStream:
    """Replay a pre-LN decoder-only model sublayer by sublayer and keep every state.

    Each sublayer reads a LayerNorm of the stream and adds its output: attention (under the
    causal mask) is the only step that mixes positions; the feed-forward network and the norms
    act on each position alone. With ``skip`` empty the logits equal ``model(tokens)`` (in eval
    mode).

    Args:
        model: a :class:`~coursepkg.DecoderOnlyLM` with ``norm_first=True``.
        tokens: ids (no padding).
        skip: sublayer names (``"layer0.attn"``, ``"layer1.ffn"``, ...) whose writes are
            replaced by zeros, to see what the stream is without them.

    Shape:
        tokens (B, L) -> states (K, B, L, D), writes (K - 1, B, L, D), logits (B, L, V), with
        K = 1 + 2 N.

    Returns:
        A :class:`ResidualStream`.
    """
    _check_model(model)
    check_tokens("tokens", tokens, model.config.vocab_size)
    known = {f"layer{i}.{part}" for i in range(len(model.layers)) for part in ("attn", "ffn")}
    unknown = sorted(set(skip) - known)
    if unknown:
        raise ValueError(f"skip names unknown sublayers {unknown}; known: {sorted(known)}")
    mask = causal_mask(tokens.size(1), device=tokens.device)  # (L, L)
    x = model.positions(model.embed(tokens))  # (B, L, D)
    names, states = ["embedding"], [x]
    for i, layer in enumerate(model.layers):
        h = layer.norm1(x)  # (B, L, D)
        for part in ("attn", "ffn"):
            if part == "attn":
                write = layer.self_attn(h, h, h, mask)  # (B, L, D)
            else:
                write = layer.ffn(layer.norm2(x))  # (B, L, D)
            if f"layer{i}.{part}" in skip:
                write = torch.zeros_like(write)
            x = x + write  # (B, L, D)
            names.append(f"layer{i}.{part}")
            states.append(x)
    stacked = torch.stack(states)  # (K, B, L, D)
    return ResidualStream(names, stacked, stacked.diff(dim=0), _read_out(model, x))


@torch.no_grad()
def logit_lens(model: DecoderOnlyLM, stream: ResidualStream) -> Tensor:
    """Read every state of the stream as if it were the last one (nostalgebraist's logit lens).

    The final LayerNorm and the (tied) output head are applied to each state, so entry k shows
    which tokens the stream already points at after k writes. The last entry is the model's
    own logits.

    Shape:
        -> (K, B, L, V).
    """
    _check_model(model)
    return _read_out(model, stream.states)


@torch.no_grad()
def ffn_unit_activations(model: DecoderOnlyLM, stream: ResidualStream, layer: int) -> Tensor:
    """The feed-forward units of one layer, as they fired at every position.

    Unit u's *key* k_u is row u of ``ffn.linear1.weight`` (F, D): its activation is
    act(k_u . norm2(x) + b_u), large where the normalised stream matches the key.

    Args:
        model: the model ``stream`` came from.
        stream: from :func:`residual_stream`.
        layer: which layer (0-based).

    Shape:
        -> (B, L, F).
    """
    _check_model(model)
    if not 0 <= layer < len(model.layers):
        raise ValueError(f"layer must be in [0, {len(model.layers)}), got {layer}")
    block = model.layers[layer]
    x = stream.states[stream.names.index(f"layer{layer}.attn")]  # (B, L, D): ffn's input
    return block.ffn.activation(block.ffn.linear1(block.norm2(x)))  # (B, L, F)


@torch.no_grad()
def ffn_unit_promotes(model: DecoderOnlyLM, layer: int) -> Tensor:
    """What each feed-forward unit's *value* promotes: its column of W2 read by the output head.

    Unit u adds activation_u times column u of ``ffn.linear2.weight`` (D, F) to the stream.
    Read through the final LayerNorm's gain and the output embedding (ignoring the norm's
    centring and scale, which depend on the whole stream), that direction raises some tokens'
    logits and lowers others'.

    Args:
        model: a pre-LN :class:`~coursepkg.DecoderOnlyLM`.
        layer: which layer (0-based).

    Shape:
        -> (F, V): row u is unit u's effect on every token's logit per unit of activation.
    """
    _check_model(model)
    if not 0 <= layer < len(model.layers):
        raise ValueError(f"layer must be in [0, {len(model.layers)}), got {layer}")
    values = model.layers[layer].ffn.linear2.weight.T  # (F, D): one value vector per unit
    if model.norm is not None:
        values = values * model.norm.weight  # (F, D)
    return values @ model.lm_head.weight.T  # (F, V)


def mean_pairwise_cosine(vectors: Tensor) -> float:
    """Mean cosine similarity over all pairs of distinct rows.

    Shape:
        vectors (n, D), n >= 2.
    """
    if vectors.dim() != 2 or vectors.size(0) < 2:
        raise ValueError(f"vectors must be (n, D) with n >= 2, got {tuple(vectors.shape)}")
    unit = torch.nn.functional.normalize(vectors.double(), dim=-1)  # (n, D)
    sims = unit @ unit.T  # (n, n)
    n = vectors.size(0)
    return float((sims.sum() - sims.diagonal().sum()) / (n * (n - 1)))
