"""ex14's SFT mistakes: wrong versions of the masked next-token loss, each with the stub's
signature.

Dimension legend: B batch, L length, V vocabulary, P prompts, G answers per prompt, T targets.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ....posttrain.sft import sft_loss as _sft_loss
from ....posttrain.sft import token_losses
from . import mistakes

__all__ = [
    "SFT_BUGS",
    "SFT_ITEM",
]

SFT_ITEM = "sft_loss"


# ---------------------------------------------------------------------------------------------
# SFT
# ---------------------------------------------------------------------------------------------


def _masked_mean(losses: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, losses, torch.zeros_like(losses)).sum() / mask.sum()


def sft_loss_prompt_in_loss(logits, tokens, loss_mask, token_mask):
    return _masked_mean(token_losses(logits, tokens), token_mask[:, 1:])  # every real token


def sft_loss_padding_in_loss(logits, tokens, loss_mask, token_mask):
    return token_losses(logits, tokens).mean()  # every position, padding included


def sft_loss_per_sequence_mean(logits, tokens, loss_mask, token_mask):
    return _sft_loss(logits, tokens, loss_mask, "sequence")


def sft_loss_divided_by_positions(logits, tokens, loss_mask, token_mask):
    losses = token_losses(logits, tokens)  # (B, L-1)
    mask = loss_mask[:, 1:]  # (B, L-1)
    return torch.where(mask, losses, torch.zeros_like(losses)).sum() / mask.numel()


def sft_loss_divided_by_batch(logits, tokens, loss_mask, token_mask):
    losses = token_losses(logits, tokens)  # (B, L-1)
    mask = loss_mask[:, 1:]  # (B, L-1)
    return torch.where(mask, losses, torch.zeros_like(losses)).sum() / logits.size(0)


def sft_loss_not_shifted(logits, tokens, loss_mask, token_mask):
    losses = F.cross_entropy(logits.flatten(0, 1), tokens.flatten(), reduction="none")
    return _masked_mean(losses.view_as(tokens), loss_mask)  # logits at t against token t


def sft_loss_mask_not_shifted(logits, tokens, loss_mask, token_mask):
    losses = token_losses(logits, tokens)  # (B, L-1): target t + 1 at entry t
    return _masked_mean(losses, loss_mask[:, :-1])  # the mask of the inputs, not the targets


SFT_BUGS = mistakes(
    SFT_ITEM,
    (
        "sft.prompt_in_loss",
        "the prompt's tokens are in the loss: the mean runs over every real token (the token "
        "mask) instead of the response's (the loss mask)",
        "Mask the targets with loss_mask[:, 1:] (True on the assistant's tokens only).",
        sft_loss_prompt_in_loss,
    ),
    (
        "sft.padding_in_loss",
        "padding and prompt are in the loss: the mean runs over every position of the batch",
        "Keep only the targets loss_mask[:, 1:] marks, in the sum and in the count.",
        sft_loss_padding_in_loss,
    ),
    (
        "sft.per_sequence_mean",
        "the length normalisation is per sequence: each answer's mean, then the mean over "
        "answers, so a short answer's tokens weigh more than a long one's",
        "Sum the masked losses over the whole batch and divide by the number of response "
        "targets in the batch.",
        sft_loss_per_sequence_mean,
    ),
    (
        "sft.divided_by_positions",
        "the masked sum is divided by the number of positions (padding and prompt counted) "
        "instead of the number of response targets",
        "Divide by loss_mask[:, 1:].sum(), the count of response targets.",
        sft_loss_divided_by_positions,
    ),
    (
        "sft.not_shifted",
        "the logits at position t are scored against token t instead of token t + 1",
        "Compare logits[:, :-1] with tokens[:, 1:] and mask with loss_mask[:, 1:].",
        sft_loss_not_shifted,
    ),
    (
        "sft.mask_not_shifted",
        "the logits are shifted but the mask is not: entry t of the losses scores token t + 1, "
        "and it is kept where loss_mask marks token t, so the answer's first token is left out "
        "and the token after it (end of turn or padding) is counted",
        "Shift the mask with the targets: loss_mask[:, 1:].",
        sft_loss_mask_not_shifted,
    ),
    (
        "sft.divided_by_batch",
        "the response tokens' losses are summed and divided by the batch size B instead of by "
        "the number of response tokens, so the loss grows with the answers' length",
        "Divide the sum by the number of targets loss_mask[:, 1:] keeps (mask.sum()).",
        sft_loss_divided_by_batch,
    ),
)
