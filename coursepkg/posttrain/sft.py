"""Supervised fine-tuning (SFT): next-token prediction on the assistant's tokens only.

The model reads the whole conversation, but the loss counts a position only when the token it
predicts was written by the assistant (the response mask of
:func:`~coursepkg.posttrain.chat.encode_chat`). The prompt is given, not learned, and padding is
never a target.

Two ways to average the masked token losses, which differ once responses differ in length:

- ``"token"``: sum over every response token of the batch, divided by their count. Every token
  weighs the same, so a long response weighs more than a short one.
- ``"sequence"``: each sequence's mean over its response tokens, then the mean over sequences.
  Every example weighs the same, whatever its length.

Dimension legend: B batch, L length, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .per_token import masked_mean, masked_normalize, token_log_probs

__all__ = ["NORMALISATIONS", "sft_loss", "sft_microbatch_step", "sft_step", "token_losses"]

#: The ways :func:`sft_loss` averages.
NORMALISATIONS = ("token", "sequence")


def token_losses(logits: Tensor, tokens: Tensor) -> Tensor:
    """The cross-entropy of each next token: position t's logits against token t + 1.

    Args:
        logits: the model's next-token scores at every position.
        tokens: the ids the model read.

    Shape:
        logits (B, L, V), tokens (B, L) -> (B, L - 1): entry t is -log p(tokens[t+1] | <= t).
    """
    return -token_log_probs(logits, tokens)  # (B, L-1)


def sft_loss(logits: Tensor, tokens: Tensor, loss_mask: Tensor, normalise: str = "token") -> Tensor:
    """The masked next-token loss of supervised fine-tuning.

    Args:
        logits: the model's next-token scores.
        tokens: the ids the model read.
        loss_mask: bool, True on the tokens to learn (the response); False on the prompt and on
            padding. Position 0 is never a target (nothing precedes it).
        normalise: ``"token"`` or ``"sequence"`` (see the module's docstring).

    Shape:
        logits (B, L, V), tokens (B, L), loss_mask (B, L) -> a scalar.

    Returns:
        The mean loss, in nats per token.
    """
    if normalise not in NORMALISATIONS:
        raise ValueError(f"normalise must be one of {NORMALISATIONS}, got {normalise!r}")
    if loss_mask.shape != tokens.shape or loss_mask.dtype != torch.bool:
        raise ValueError(
            f"loss_mask must be a bool tensor of the tokens' shape {tuple(tokens.shape)}, got "
            f"{loss_mask.dtype} of shape {tuple(loss_mask.shape)}"
        )
    losses = token_losses(logits, tokens)  # (B, L-1)
    mask = loss_mask[:, 1:]  # (B, L-1): the targets' mask
    counts = mask.sum(dim=1)  # (B,)
    if int(counts.sum()) == 0:
        raise ValueError("loss_mask marks no target token (position 0 never is one)")
    if normalise == "token":
        return masked_mean(losses, mask)
    rows = counts > 0  # a sequence without a response token has no mean: it is left out
    return masked_mean(losses, mask, dim=1)[rows].mean()


def sft_microbatch_step(
    log_probs: Tensor, response_mask: Tensor, grad_accum_steps: int, normalize_constant: float
) -> Tensor:
    """Backpropagate one microbatch's share of the SFT loss, for gradient accumulation.

    The loss is ``sum over response targets of -log p / normalize_constant / grad_accum_steps``:
    with ``normalize_constant`` the number of response targets of the microbatch, the gradients
    of ``grad_accum_steps`` microbatches add up to the mean of their per-microbatch means; with
    it the number of response targets of the *whole* batch divided by ``grad_accum_steps``,
    they add up to the token mean over the whole batch, however it is split.

    Args:
        log_probs: each target's log-probability, with a gradient (from
            :func:`~coursepkg.posttrain.per_token.token_log_probs`).
        response_mask: bool, True on the targets to learn (the loss mask shifted to the targets,
            ``loss_mask[:, 1:]``).
        grad_accum_steps: the number of microbatches whose gradients are summed before one
            optimiser step, >= 1.
        normalize_constant: the divisor of the masked sum, > 0.

    Shape:
        log_probs, response_mask (B, T) -> a scalar.

    Returns:
        The microbatch's loss (detached), after ``backward()`` has added its gradient.
    """
    if not isinstance(grad_accum_steps, int) or grad_accum_steps < 1:
        raise ValueError(f"grad_accum_steps must be an integer >= 1, got {grad_accum_steps!r}")
    loss = masked_normalize(-log_probs, response_mask, normalize_constant) / grad_accum_steps
    loss.backward()
    return loss.detach()


def sft_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: Tensor,
    loss_mask: Tensor,
    token_mask: Tensor | None = None,
    normalise: str = "token",
) -> float:
    """One optimiser step of SFT on a padded batch (:func:`~coursepkg.posttrain.packing.pad_batch`).

    Args:
        model: a decoder-only LM (``model(tokens, token_mask)`` -> logits).
        optimizer: over the parameters to train (all, or only LoRA's).
        tokens: ids.
        loss_mask: bool, True on the response tokens.
        token_mask: bool, True on real tokens (padding masked out of attention).
        normalise: ``"token"`` or ``"sequence"``.

    Shape:
        tokens, loss_mask, token_mask (B, L).

    Returns:
        The loss before the step.
    """
    model.train()
    logits = model(tokens, token_mask)  # (B, L, V)
    loss = sft_loss(logits, tokens, loss_mask, normalise)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())
