"""Direct preference optimisation (DPO; Rafailov et al., 2023): learning from pairs of answers.

Each example is a prompt x with a preferred (chosen) answer y_w and a dispreferred (rejected)
answer y_l. DPO trains the policy pi directly, against a frozen copy of where it started (the
reference pi_ref, usually the SFT model), with

    loss = -log sigmoid( beta * [ (log pi(y_w|x) - log pi_ref(y_w|x))
                                - (log pi(y_l|x) - log pi_ref(y_l|x)) ] )

where log pi(y|x) is the **sum** of the response tokens' log-probabilities. The bracketed terms,
times beta, are the *implicit rewards* of the two answers; their difference is the *margin*.
The loss pushes the margin up; beta says how far the policy may move from the reference (a
small beta lets it drift far before the loss saturates).

Dimension legend: B pairs, L length, V vocabulary.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..tokenizer import Tokenizer
from .chat import ChatExample, encode_chat, jsonl_records, prompt_messages
from .packing import Batch, pad_batch
from .per_token import masked_normalize, token_log_probs

__all__ = [
    "DPOOutput",
    "PreferencePair",
    "dpo_loss",
    "dpo_pairs_loss",
    "dpo_step",
    "encode_preference",
    "frozen_copy",
    "pair_examples",
    "preference_records",
    "read_preference_jsonl",
    "response_logprobs",
    "sequence_logprobs",
]


class DPOOutput(NamedTuple):
    """What :func:`dpo_loss` returns.

    Attributes:
        loss: the mean DPO loss, a scalar with a gradient.
        chosen_rewards: (B,) beta (log pi(y_w) - log pi_ref(y_w)), detached.
        rejected_rewards: (B,) the same for y_l, detached.
        margins: (B,) chosen_rewards - rejected_rewards; > 0 where the policy prefers y_w more
            than the reference does.
    """

    loss: Tensor
    chosen_rewards: Tensor
    rejected_rewards: Tensor
    margins: Tensor


class PreferencePair(NamedTuple):
    """A prompt (a list of messages, ending with the user's) and two answers (str)."""

    prompt: list[Mapping[str, str]]
    chosen: str
    rejected: str


def response_logprobs(logits: Tensor, tokens: Tensor, loss_mask: Tensor) -> Tensor:
    """log pi(y|x): the sum of the response tokens' log-probabilities.

    Args:
        logits: next-token scores.
        tokens: the ids read.
        loss_mask: bool, True on the response tokens.

    Shape:
        logits (B, L, V), tokens (B, L), loss_mask (B, L) -> (B,).
    """
    logp = token_log_probs(logits, tokens)  # (B, L-1): log p(tokens[t+1] | <= t)
    return masked_normalize(logp, loss_mask[:, 1:], 1.0, dim=1)  # (B,): the sum


def sequence_logprobs(model: nn.Module, batch: Batch) -> Tensor:
    """log pi(y|x) of each padded example under ``model``.

    Args:
        model: a decoder-only LM (``model(tokens, token_mask)`` -> logits).
        batch: a :class:`~coursepkg.posttrain.packing.Batch` (tokens, loss mask, token mask).

    Shape:
        batch (B, L) -> (B,).
    """
    logits = model(batch.tokens, batch.token_mask)  # (B, L, V)
    return response_logprobs(logits, batch.tokens, batch.loss_mask)  # (B,)


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    reference_chosen: Tensor,
    reference_rejected: Tensor,
    beta: float = 0.1,
) -> DPOOutput:
    """The DPO loss from sequence log-probabilities.

    Args:
        policy_chosen: log pi(y_w|x).
        policy_rejected: log pi(y_l|x).
        reference_chosen: log pi_ref(y_w|x) (no gradient needed).
        reference_rejected: log pi_ref(y_l|x).
        beta: the strength of the pull towards the reference, > 0.

    Shape:
        each (B,) -> a :class:`DPOOutput` (loss scalar, the rest (B,)).
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    shape = policy_chosen.shape
    for name, x in (
        ("policy_rejected", policy_rejected),
        ("reference_chosen", reference_chosen),
        ("reference_rejected", reference_rejected),
    ):
        if x.shape != shape:
            raise ValueError(
                f"{name} must have policy_chosen's shape {tuple(shape)}, got {tuple(x.shape)}"
            )
    chosen = beta * (policy_chosen - reference_chosen.detach())  # (B,)
    rejected = beta * (policy_rejected - reference_rejected.detach())  # (B,)
    loss = -F.logsigmoid(chosen - rejected).mean()
    chosen, rejected = chosen.detach(), rejected.detach()
    return DPOOutput(loss, chosen, rejected, chosen - rejected)


def pair_examples(
    prompt: Sequence[int], chosen: Sequence[int], rejected: Sequence[int]
) -> tuple[ChatExample, ChatExample]:
    """A preference pair in any prompt format, from its ids: the prompt followed by each answer.

    The caller renders and tokenises the prompt in whatever format the model was tuned on (the
    course's chat template, Alpaca's ``### Instruction: ... ### Response:``, a bare question)
    and each answer as it should be learned (with its end-of-text id, say); the response mask
    is True on the answer's ids only.

    Args:
        prompt: the prompt's ids.
        chosen: the preferred answer's ids (not empty).
        rejected: the dispreferred answer's ids (not empty, different from ``chosen``).

    Returns:
        The chosen and the rejected :class:`~coursepkg.posttrain.chat.ChatExample`.
    """
    chosen, rejected = list(chosen), list(rejected)
    if not prompt or not chosen or not rejected:
        raise ValueError(
            f"prompt, chosen and rejected must each hold ids, got lengths {len(prompt)}, "
            f"{len(chosen)} and {len(rejected)}"
        )
    if chosen == rejected:
        raise ValueError("chosen and rejected are the same ids: a pair must differ")
    head = [False] * len(prompt)
    return (
        ChatExample([*prompt, *chosen], head + [True] * len(chosen)),
        ChatExample([*prompt, *rejected], head + [True] * len(rejected)),
    )


def dpo_pairs_loss(
    policy: nn.Module,
    reference: nn.Module,
    pairs: Sequence[tuple[ChatExample, ChatExample]],
    pad_id: int,
    beta: float = 0.1,
) -> DPOOutput:
    """The DPO loss of a list of pairs: chosen and rejected answers padded into one batch, each
    answer's log-probability summed over its own tokens under the policy and the reference.

    Args:
        policy: the model trained (``model(tokens, token_mask)`` -> logits).
        reference: its frozen starting point, run without gradients.
        pairs: (chosen, rejected) examples, from :func:`pair_examples` (any prompt format) or
            :func:`encode_preference` (the chat template).
        pad_id: the id filling the rows' ends.
        beta: DPO's beta.

    Shape:
        B pairs -> :class:`DPOOutput` (loss scalar, the rest (B,)).
    """
    b = len(pairs)
    batch = pad_batch([c for c, _ in pairs] + [r for _, r in pairs], pad_id)
    device = next(policy.parameters()).device
    batch = Batch(*(x.to(device) for x in batch))  # (2B, L) each
    with torch.no_grad():
        ref = sequence_logprobs(reference, batch)  # (2B,)
    logp = sequence_logprobs(policy, batch)  # (2B,)
    return dpo_loss(logp[:b], logp[b:], ref[:b], ref[b:], beta)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in eval mode whose parameters take no gradient: the reference."""
    reference = copy.deepcopy(model).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


def encode_preference(
    tokenizer: Tokenizer, pair: PreferencePair, max_len: int | None = None
) -> tuple[ChatExample, ChatExample]:
    """Tokenise a pair as two conversations, the prompt followed by each answer.

    Args:
        tokenizer: a tokenizer with the chat tokens.
        pair: the prompt and its two answers (they must differ).
        max_len: the model's context (see :func:`~coursepkg.posttrain.chat.encode_chat`).

    Returns:
        The chosen and the rejected :class:`~coursepkg.posttrain.chat.ChatExample`.
    """
    if pair.chosen == pair.rejected:
        raise ValueError(
            f"chosen and rejected are the same answer ({pair.chosen!r}): a pair must differ"
        )
    return tuple(
        encode_chat(tokenizer, [*pair.prompt, {"role": "assistant", "content": answer}], max_len)
        for answer in (pair.chosen, pair.rejected)
    )


def read_preference_jsonl(path: str | os.PathLike) -> list[PreferencePair]:
    """Read preference pairs, one JSON object a line: ``{"prompt": str or messages, "chosen":
    str, "rejected": str}``. Blank lines are skipped.

    Returns:
        The pairs; a bad line (missing key, not text, identical answers) raises ``ValueError``
        naming its number.
    """
    return [pair for pair, _ in preference_records(path)]


def preference_records(path: str | os.PathLike) -> Iterator[tuple[PreferencePair, str]]:
    """The pairs of :func:`read_preference_jsonl`, each with where it stands
    (``"FILE, line N"``)."""
    for record, where in jsonl_records(path):
        yield _pair_of_record(record, where), where


def _pair_of_record(record: object, where: str) -> PreferencePair:
    keys = ("prompt", "chosen", "rejected")
    if not isinstance(record, Mapping) or not set(keys) <= set(record):
        got = sorted(record) if isinstance(record, Mapping) else type(record).__name__
        raise ValueError(f"{where}: expected the keys {list(keys)}, got {got}")
    for key in ("chosen", "rejected"):
        if not isinstance(record[key], str):
            raise ValueError(f"{where}: {key!r} must be a str, got {type(record[key]).__name__}")
    if record["chosen"] == record["rejected"]:
        raise ValueError(f"{where}: 'chosen' and 'rejected' are the same answer")
    prompt = prompt_messages(record["prompt"], where)
    return PreferencePair(prompt, record["chosen"], record["rejected"])


def dpo_step(
    policy: nn.Module,
    reference: nn.Module,
    optimizer: torch.optim.Optimizer,
    chosen: Batch,
    rejected: Batch,
    beta: float = 0.1,
) -> dict[str, float]:
    """One optimiser step of DPO.

    Args:
        policy: the model being trained.
        reference: its frozen starting point (:func:`frozen_copy`); run without gradients.
        optimizer: over the policy's trainable parameters.
        chosen: the prompts with their chosen answers, padded.
        rejected: the same prompts, in the same order, with their rejected answers.
        beta: DPO's beta.

    Returns:
        ``loss``, ``margin`` (mean), ``accuracy`` (fraction of pairs with a positive margin).
    """
    if chosen.tokens.size(0) != rejected.tokens.size(0):
        raise ValueError(
            f"chosen and rejected must hold the same pairs, got {chosen.tokens.size(0)} and "
            f"{rejected.tokens.size(0)} rows"
        )
    with torch.no_grad():
        ref_chosen = sequence_logprobs(reference, chosen)  # (B,)
        ref_rejected = sequence_logprobs(reference, rejected)  # (B,)
    policy.train()
    out = dpo_loss(
        sequence_logprobs(policy, chosen),
        sequence_logprobs(policy, rejected),
        ref_chosen,
        ref_rejected,
        beta,
    )
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    optimizer.step()
    return {
        "loss": float(out.loss.detach()),
        "margin": float(out.margins.mean()),
        "accuracy": float((out.margins > 0).float().mean()),
    }
