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
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_float, check_tokens

__all__ = ["NORMALISATIONS", "sft_loss", "sft_step", "token_losses"]

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
    check_float("logits", logits, 3)
    check_tokens("tokens", tokens, logits.size(-1))
    if logits.shape[:2] != tokens.shape:
        raise ValueError(
            f"logits (B, L, V) and tokens (B, L) must agree on (B, L), got "
            f"{tuple(logits.shape)} and {tuple(tokens.shape)}"
        )
    predicted = logits[:, :-1]  # (B, L-1, V)
    targets = tokens[:, 1:]  # (B, L-1)
    if predicted.dtype in (torch.float16, torch.bfloat16):  # a softmax over V needs float32
        predicted = predicted.float()
    losses = F.cross_entropy(predicted.flatten(0, 1), targets.flatten(), reduction="none")
    return losses.view_as(targets)  # (B, L-1)


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
    # where(), not a product: a masked position's loss may be inf or NaN and must not leak.
    masked = torch.where(mask, losses, torch.zeros_like(losses))  # (B, L-1)
    if normalise == "token":
        return masked.sum() / counts.sum()
    rows = counts > 0  # a sequence without a response token has no mean: it is left out
    return (masked.sum(dim=1)[rows] / counts[rows]).mean()


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
