"""Generation: the key/value cache, batched greedy decoding and beam search.

Dimension legend: B batch, K beam size, H heads, T generated length, S source length,
V vocabulary. Token masks are bool, True = real token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ._validation import check_tokens

if TYPE_CHECKING:
    from .model import Transformer


class AttentionCache:
    """Keys and values one attention block has already computed.

    A growing cache (self-attention) appends each step's keys/values; a static cache
    (cross-attention) is filled once from the encoder output and then only read.

    Given a ``capacity`` (the longest sequence that will be decoded), a growing cache allocates
    its storage once, on the first call, and each step writes into it; without one it
    concatenates, which copies the whole cache at every step.

    Attributes:
        k: (B, H, S, Dk) or None before the first call.
        v: (B, H, S, Dv) or None before the first call.
        static: whether the cache is filled once and reused.
        capacity: most positions a growing cache holds, or None to grow without limit.
        stacked_qkv: the owning self-attention's W^Q, W^K, W^V stacked into one matrix (and
            bias) on the first step, so that each step projects with one matmul.
    """

    def __init__(self, static: bool = False, capacity: int | None = None) -> None:
        self.static = static
        self.capacity = capacity
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self._storage: tuple[Tensor, Tensor] | None = None  # preallocated (B, H, capacity, *)
        self.stacked_qkv: tuple[Tensor, Tensor | None] | None = None

    @property
    def length(self) -> int:
        """Number of cached key positions."""
        return 0 if self.k is None else self.k.size(2)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this call's keys/values and return everything cached so far.

        Shape:
            k (B, H, n, Dk), v (B, H, n, Dv) -> (B, H, S, Dk), (B, H, S, Dv).
        """
        if self.static or (self.k is None and self.capacity is None):
            self.k, self.v = k, v
            return self.k, self.v
        start, end = self.length, self.length + k.size(2)
        if self.capacity is None:
            self.k = torch.cat([self.k, k], dim=2)  # (B, H, S + n, Dk)
            self.v = torch.cat([self.v, v], dim=2)  # (B, H, S + n, Dv)
            return self.k, self.v
        if end > self.capacity:
            raise ValueError(
                f"the cache holds at most capacity={self.capacity} positions; "
                f"{start} are cached and {k.size(2)} more were given"
            )
        if self._storage is None:
            b, h = k.shape[:2]
            self._storage = (
                k.new_empty(b, h, self.capacity, k.size(3)),  # (B, H, capacity, Dk)
                v.new_empty(b, h, self.capacity, v.size(3)),  # (B, H, capacity, Dv)
            )
        k_all, v_all = self._storage
        k_all.narrow(2, start, end - start).copy_(k)  # write positions start..end-1
        v_all.narrow(2, start, end - start).copy_(v)
        self.k, self.v = k_all.narrow(2, 0, end), v_all.narrow(2, 0, end)  # (B, H, S + n, D*)
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search reshuffles its hypotheses each step)."""
        if self.k is None:
            return
        if self._storage is not None:
            n = self.length
            self._storage = tuple(t.index_select(0, index) for t in self._storage)
            self.k, self.v = (t[:, :, :n] for t in self._storage)
        else:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


class KVCache:
    """Per-layer caches of a decoder: ``self_attn[i]`` grows, ``cross_attn[i]`` is static.

    Args:
        n_layers: number of decoder layers.
        cross: whether the layers also have cross-attention (encoder-decoder models).
        capacity: longest target the growing caches will hold; given, they preallocate it.
    """

    def __init__(self, n_layers: int, cross: bool = True, capacity: int | None = None) -> None:
        if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be None or a positive integer, got {capacity!r}")
        self.self_attn = [AttentionCache(capacity=capacity) for _ in range(n_layers)]
        self.cross_attn = [AttentionCache(static=True) for _ in range(n_layers)] if cross else None

    @property
    def length(self) -> int:
        """Number of target positions already processed."""
        return self.self_attn[0].length if self.self_attn else 0

    def reorder(self, index: Tensor) -> None:
        """Reorder the growing caches' batch rows (the static ones are identical per beam)."""
        for cache in self.self_attn:
            cache.reorder(index)


LENGTH_NORMS = ("power", "gnmt")


def length_penalty(length: int | Tensor, alpha: float, form: str = "power") -> float | Tensor:
    """The divisor that length-normalises a hypothesis's summed log-probability.

    ``"power"`` is ``length ** alpha``; ``"gnmt"`` is Wu et al. (2016)'s
    ``((5 + length) / 6) ** alpha``, the form behind the Transformer paper's ``alpha = 0.6``.
    Both are 1 when ``alpha = 0`` (raw log-probability) and grow with the length; the GNMT form
    is 1 for a one-token output and grows more slowly for short ones.

    Args:
        length: generated tokens of the hypothesis, EOS included (>= 1).
        alpha: the exponent, >= 0.
        form: ``"power"`` or ``"gnmt"``.

    Returns:
        The divisor (a tensor when ``length`` is one).
    """
    if form not in LENGTH_NORMS:
        raise ValueError(f"form must be one of {LENGTH_NORMS}, got {form!r}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if form == "gnmt":
        return ((5 + length) / 6) ** alpha
    return length**alpha


_length_divisor = length_penalty  # beam_search's keyword of that name shadows the function


def _check_decode_args(model: Transformer, src: Tensor, max_len: int, bos_id: int, eos_id: int):
    vocab = model.config.vocab_size
    check_tokens("src", src, model.config.source_vocab_size)
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not (0 <= value < vocab):
            raise ValueError(f"{name} must be a token id in [0, {vocab}), got {value}")
    if 1 + max_len > model.config.max_len:
        raise ValueError(
            f"max_len={max_len} new tokens after BOS need {1 + max_len} target positions, more "
            f"than the model's max_len={model.config.max_len}"
        )


def _next_logits(
    model: Transformer,
    tokens: Tensor,
    memory: Tensor,
    src_mask: Tensor | None,
    cache: KVCache | None,
) -> Tensor:
    """Logits of the next token after ``tokens`` (B, t) -> (B, V).

    Every generated token is real, even one that happens to equal the pad id, so the target
    mask is all True rather than derived from ``pad_id``.
    """
    if cache is not None:
        return model.decode(tokens[:, -1:], memory, src_mask, cache=cache)[:, -1]
    real = torch.ones_like(tokens, dtype=torch.bool)  # (B, t)
    return model.decode(tokens, memory, src_mask, tgt_mask=real)[:, -1]


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    src_mask: Tensor | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Batched greedy decoding: at every step take the most probable next token.

    A sequence stops at its first ``eos_id``; later positions hold the pad id (the config's
    ``pad_id``, else ``eos_id``). Decoding ends when every sequence has stopped or after
    ``max_len`` new tokens.

    Args:
        model: an encoder-decoder :class:`~coursepkg.Transformer` (put it in eval mode).
        src: source ids.
        max_len: the most tokens to generate after BOS.
        bos_id: start-of-sequence id, the first decoder input.
        eos_id: end-of-sequence id.
        src_mask: bool (B, S), True = real token (derived from ``pad_id`` when omitted).
        use_cache: reuse keys/values of earlier steps (same tokens, fewer FLOPs).

    Shape:
        src (B, S) -> (B, 1 + T) with T <= max_len.

    Returns:
        Generated ids starting with ``bos_id``.
    """
    _check_decode_args(model, src, max_len, bos_id, eos_id)
    pad = model.config.pad_id if model.config.pad_id is not None else eos_id
    src_mask = model.source_mask(src, src_mask)
    memory = model.encode(src, src_mask)  # (B, S, D)
    b = src.size(0)
    tokens = torch.full((b, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(b, dtype=torch.bool, device=src.device)  # (B,)
    cache = model.new_cache(capacity=1 + max_len) if use_cache else None
    for _ in range(max_len):
        logits = _next_logits(model, tokens, memory, src_mask, cache)  # (B, V)
        nxt = logits.argmax(dim=-1)  # (B,)
        nxt = torch.where(finished, torch.full_like(nxt, pad), nxt)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (B, t + 1)
        finished |= nxt == eos_id
        if bool(finished.all()):
            break
    return tokens


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int,
    max_len: int,
    bos_id: int,
    eos_id: int,
    length_penalty: float = 1.0,
    src_mask: Tensor | None = None,
    use_cache: bool = True,
    length_norm: str = "power",
) -> tuple[Tensor, Tensor]:
    """Beam search with length normalisation.

    Keeps the ``beam_size`` best partial hypotheses by total log-probability. A hypothesis
    that emits ``eos_id`` is finished and ranked by ``log p / length ** length_penalty``
    (length counts generated tokens including EOS; ``length_penalty=0`` ranks by raw
    log-probability, which favours short outputs). A source is done once it has
    ``beam_size`` finished hypotheses; hypotheses still open after ``max_len`` tokens are
    ranked the same way. With ``beam_size=1`` this is exactly greedy decoding. With
    ``length_norm="gnmt"`` the divisor is ``((5 + length) / 6) ** length_penalty`` instead
    (see :func:`length_penalty`).

    Args:
        model: an encoder-decoder :class:`~coursepkg.Transformer` (eval mode).
        src: source ids.
        beam_size: hypotheses kept per source, >= 1.
        max_len: the most tokens to generate after BOS.
        bos_id: start id.
        eos_id: end id.
        length_penalty: exponent alpha of the length normalisation.
        src_mask: bool (B, S), True = real token.
        use_cache: reuse keys/values across steps.
        length_norm: ``"power"`` (``length ** alpha``) or ``"gnmt"``.

    Shape:
        src (B, S) -> tokens (B, 1 + T), scores (B,).

    Returns:
        ``(tokens, scores)``: the best hypothesis per source (starting with BOS, padded with
        the pad id) and its normalised score.
    """
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}")
    if length_penalty < 0:
        raise ValueError(f"length_penalty must be >= 0, got {length_penalty}")
    if length_norm not in LENGTH_NORMS:
        raise ValueError(f"length_norm must be one of {LENGTH_NORMS}, got {length_norm!r}")
    _check_decode_args(model, src, max_len, bos_id, eos_id)
    pad = model.config.pad_id if model.config.pad_id is not None else eos_id
    k, device = beam_size, src.device
    src_mask = model.source_mask(src, src_mask)
    b = src.size(0)
    memory = model.encode(src, src_mask).repeat_interleave(k, dim=0)  # (B*K, S, D)
    src_mask = None if src_mask is None else src_mask.repeat_interleave(k, dim=0)  # (B*K, S)
    tokens = torch.full((b * k, 1), bos_id, dtype=torch.long, device=device)  # (B*K, 1)
    # Start from one live beam per source; the other K-1 copies are placeholders.
    scores = torch.full((b, k), float("-inf"), device=device)  # (B, K)
    scores[:, 0] = 0.0
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    done = [False] * b
    cache = model.new_cache(capacity=1 + max_len) if use_cache else None

    def normalise(logp: float, length: int) -> float:
        return logp / _length_divisor(length, length_penalty, length_norm)

    for step in range(1, max_len + 1):
        logits = _next_logits(model, tokens, memory, src_mask, cache)  # (B*K, V)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B*K, V)
        vocab = logp.size(-1)
        total = (scores.view(b * k, 1) + logp).view(b, k * vocab)  # (B, K*V)
        top_val, top_idx = total.topk(min(2 * k, k * vocab), dim=-1)  # (B, 2K)
        top_val, top_idx = top_val.tolist(), top_idx.tolist()
        rows, next_tok, next_scores = [], [], []
        for i in range(b):
            kept: list[tuple[int, int, float]] = []
            if not done[i]:
                for val, idx in zip(top_val[i], top_idx[i], strict=True):
                    beam, tok = divmod(idx, vocab)
                    if val == float("-inf"):
                        break
                    if tok == eos_id:
                        hyp = tokens[i * k + beam].tolist() + [eos_id]
                        finished[i].append((normalise(val, step), hyp))
                        # Stop early with k finished hypotheses, except at the last step, where
                        # the open ones are still ranked below.
                        if len(finished[i]) >= k and step < max_len:
                            done[i] = True
                            break
                    else:
                        kept.append((beam, tok, val))
                        if len(kept) == k:
                            break
            if done[i] or not kept:
                done[i] = True
                kept = [(0, pad, float("-inf"))] * k
            kept += [(kept[0][0], kept[0][1], float("-inf"))] * (k - len(kept))
            for beam, tok, val in kept:
                rows.append(i * k + beam)
                next_tok.append(tok)
                next_scores.append(val)
        index = torch.tensor(rows, device=device)
        tokens = torch.cat(
            [tokens.index_select(0, index), torch.tensor(next_tok, device=device)[:, None]], dim=1
        )  # (B*K, step + 1)
        scores = torch.tensor(next_scores, device=device).view(b, k)  # (B, K)
        if cache is not None:
            cache.reorder(index)
        if all(done):
            break
    # Hypotheses still open at max_len compete with the finished ones.
    for i in range(b):
        if not done[i]:
            for j in range(k):
                val = float(scores[i, j])
                if val > float("-inf"):
                    hyp = tokens[i * k + j].tolist()
                    finished[i].append((normalise(val, _hyp_len(hyp)), hyp))
    best = [max(f, key=lambda t: t[0]) for f in finished]
    width = max(len(hyp) for _, hyp in best)
    out = torch.full((b, width), pad, dtype=torch.long, device=device)  # (B, 1 + T)
    for i, (_, hyp) in enumerate(best):
        out[i, : len(hyp)] = torch.tensor(hyp, device=device)
    return out, torch.tensor([s for s, _ in best], device=device)


def _hyp_len(hyp: list[int]) -> int:
    """Generated length of a hypothesis that starts with BOS."""
    return max(len(hyp) - 1, 1)


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


__all__ = [
    "AttentionCache",
    "KVCache",
    "beam_search",
    "greedy_decode",
    "length_penalty",
    "sample_next",
]
