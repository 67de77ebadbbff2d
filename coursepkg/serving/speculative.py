"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a small draft model proposes
k tokens one by one, the target scores all of them in one forward pass, and a rejection rule
keeps a prefix of them plus one token of the target's own.

Greedy: a draft token is kept while it equals the target's argmax; the first disagreement is
replaced by the target's argmax (or, when all k are kept, the target's next token is added), so
the output is token for token the target's alone. Sampling: draft token x, drawn from the
draft's q, is kept with probability min(1, p(x) / q(x)) under the target's p; the first
rejected one is replaced by a draw from the normalised max(0, p - q). Every emitted token is
then distributed exactly as the target's (both papers' theorem; ``tests/serving/`` checks it
with a chi-square test). Each round costs k draft steps and one target forward, and emits
between 1 and k + 1 tokens.

Dimension legend: B batch, K proposed tokens, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .._validation import check_tokens
from .cache import CroppableCache
from .sampling import SamplingParams, process_logits

__all__ = ["SpeculativeResult", "speculative_generate", "verify_drafts"]


@dataclass
class SpeculativeResult:
    """What :func:`speculative_generate` returns.

    Attributes:
        tokens: (1, L + max_new_tokens) the prompt and its continuation.
        proposed: draft tokens proposed over the run.
        accepted: of those, how many the target kept.
        target_forwards: forward passes of the target (one per round).
        trace: per round, (draft tokens proposed, of those kept): what the chapter draws.
    """

    tokens: Tensor
    proposed: int
    accepted: int
    target_forwards: int
    trace: list[tuple[int, int]] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """Fraction of proposed draft tokens the target kept."""
        return self.accepted / self.proposed if self.proposed else 0.0


def verify_drafts(
    p: Tensor,
    q: Tensor,
    drafts: Tensor,
    greedy: bool,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """The rejection rule: how many draft tokens each row keeps, and the token that follows.

    Args:
        p: the target's next-token probabilities after the context and after each draft token.
        q: the draft's probabilities each draft token was drawn from.
        drafts: the proposed tokens.
        greedy: keep a draft token iff it is the target's argmax (``p`` may then be any
            scores with that argmax, and ``q`` is unused).
        generator: for the acceptance draws and the resampling.

    Shape:
        p (B, K + 1, V), q (B, K, V), drafts (B, K) -> kept (B,), next token (B,).
    """
    b, k = drafts.shape
    rows = torch.arange(b, device=p.device)
    if greedy:
        ok = p[:, :k].argmax(-1) == drafts  # (B, K)
    else:
        p_x = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # (B, K)
        q_x = q.gather(-1, drafts[..., None]).squeeze(-1)  # (B, K)
        u = torch.rand(b, k, generator=generator, device=p.device)  # (B, K)
        ok = u * q_x < p_x  # probability min(1, p/q)
    kept = ok.long().cumprod(-1).sum(-1)  # (B,): the accepted prefix's length
    target = p[rows, kept]  # (B, V): the target's distribution where the prefix ends
    if greedy:
        return kept, target.argmax(-1)
    rejected = kept < k
    residual = target.clone()  # all k kept: a plain draw from the target's next distribution
    if bool(rejected.any()):
        q_at = q[rows[rejected], kept[rejected]]  # (R, V)
        left = (target[rejected] - q_at).clamp(min=0)  # (R, V)
        mass = left.sum(-1, keepdim=True)  # (R, 1); 0 only if p == q, then p itself
        residual[rejected] = torch.where(mass > 0, left / mass.clamp(min=1e-30), target[rejected])
    return kept, torch.multinomial(residual, 1, generator=generator).squeeze(-1)


def _probs(logits: Tensor, seen: Tensor, params: SamplingParams) -> Tensor:
    # (N, V) logits -> (N, V) the probabilities a token is drawn from; greedy: the processed
    # scores themselves (only their argmax is used)
    scores = process_logits(logits, seen, params)  # (N, V)
    return scores if params.greedy else scores.softmax(-1)


def _check(target: nn.Module, draft: nn.Module, tokens: Tensor, max_new: int, k: int) -> None:
    vt, vd = target.config.vocab_size, draft.config.vocab_size
    if vt != vd:
        raise ValueError(f"draft must share the target's vocabulary of {vt} tokens, got {vd}")
    check_tokens("tokens", tokens, vt)
    if tokens.size(0) != 1 or tokens.size(1) == 0:
        raise ValueError(f"tokens must be one non-empty prompt (1, L), got {tuple(tokens.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (draft tokens per round) must be an integer >= 1, got {k!r}")
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new!r}")
    total = tokens.size(1) + max_new
    for name, model in (("target", target), ("draft", draft)):
        if model.config.positional != "rope" and total > model.config.max_len:
            raise ValueError(
                f"prompt {tokens.size(1)} + max_new_tokens {max_new} = {total} exceeds the "
                f"{name}'s max_len={model.config.max_len}"
            )


def speculative_generate(
    target: nn.Module,
    draft: nn.Module,
    tokens: Tensor,
    max_new_tokens: int,
    k: int = 4,
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
) -> SpeculativeResult:
    """Continue one prompt by ``max_new_tokens`` tokens of the target, drafted ``k`` at a time.

    Args:
        target: the model whose output this is (a :class:`~coursepkg.DecoderOnlyLM`).
        draft: a cheaper model with the same vocabulary.
        tokens: the prompt.
        max_new_tokens: how many tokens to append.
        k: draft tokens proposed per round.
        params: sampling settings applied to both models (default greedy).
        generator: a ``torch.Generator`` for reproducible sampling.

    Shape:
        tokens (1, L) -> result.tokens (1, L + max_new_tokens).
    """
    params = SamplingParams() if params is None else params
    _check(target, draft, tokens, max_new_tokens, k)
    with torch.inference_mode():
        result = _speculate(target, draft, tokens, max_new_tokens, k, params, generator)
    result.tokens = result.tokens.clone()  # a plain tensor again, usable with autograd
    return result


def _speculate(target, draft, tokens, max_new_tokens, k, params, generator) -> SpeculativeResult:
    # speculative_generate after its checks, under inference mode
    capacity = tokens.size(1) + max_new_tokens + k + 1
    t_cache = CroppableCache(target.config.n_layers, capacity)
    d_cache = CroppableCache(draft.config.n_layers, capacity)
    seq = tokens
    end = tokens.size(1) + max_new_tokens
    proposed = accepted = rounds = 0
    trace = []
    while seq.size(1) < end:
        kk = min(k, end - seq.size(1) - 1)  # leave room for the target's own token
        drafts, qs = [], []
        for _ in range(kk):  # the draft reads what it has not seen yet, its proposals included
            context = torch.cat([seq, *drafts], dim=1)  # (1, L' + i)
            logits = draft(context[:, d_cache.length :], cache=d_cache)[:, -1]  # (1, V)
            q = _probs(logits, context, params)  # (1, V)
            nxt = q.argmax(-1) if params.greedy else torch.multinomial(q, 1, generator=generator)
            drafts.append(nxt.view(1, 1))
            qs.append(q)
        block = torch.cat([seq[:, t_cache.length :], *drafts], dim=1)  # (1, 1 + kk)
        logits = target(block, cache=t_cache)[0, -(kk + 1) :]  # (kk + 1, V)
        if params.repetition_penalty is None:  # no history needed: every row at once
            ps = [_probs(logits, seq, params)]  # [(kk + 1, V)]
        else:  # the penalty at row i knows the first i proposals
            ps = [
                _probs(logits[i : i + 1], torch.cat([seq, *drafts[:i]], dim=1), params)
                for i in range(kk + 1)
            ]
        p_all = torch.cat(ps)[None]  # (1, kk + 1, V)
        d = torch.cat(drafts, dim=1) if drafts else seq.new_zeros(1, 0)  # (1, kk)
        q_all = torch.stack(qs, 1) if qs else p_all.new_zeros(1, 0, p_all.size(-1))  # (1, kk, V)
        kept, nxt = verify_drafts(p_all, q_all, d, params.greedy, generator)
        n = int(kept)
        seq = torch.cat([seq, d[:, :n], nxt.view(1, 1)], dim=1)  # (1, L' + n + 1)
        t_cache.crop(seq.size(1) - 1)
        d_cache.crop(seq.size(1) - 1)
        proposed, accepted, rounds = proposed + kk, accepted + n, rounds + 1
        trace.append((kk, n))
    return SpeculativeResult(seq, proposed, accepted, rounds, trace)
