"""ex14's DPO mistakes: wrong versions of the loss, each with the stub's signature.

Dimension legend: B batch, L length, V vocabulary, P prompts, G answers per prompt, T targets.
"""

from __future__ import annotations

import torch.nn.functional as F

from ...framework.post_training import (
    dpo_reference,
)
from . import mistakes

__all__ = [
    "DPO_BUGS",
    "DPO_ITEM",
]

DPO_ITEM = "dpo_loss"


# ---------------------------------------------------------------------------------------------
# DPO
# ---------------------------------------------------------------------------------------------


def dpo_loss_sign_flipped(pc, pr, rc, rr, beta):
    return dpo_reference(pr, pc, rr, rc, beta)  # the rejected answer is preferred


def dpo_loss_beta_left_out(pc, pr, rc, rr, beta):
    return dpo_reference(pc, pr, rc, rr, 1.0)


def dpo_loss_beta_on_chosen_only(pc, pr, rc, rr, beta):
    margin = beta * (pc - rc.detach()) - (pr - rr.detach())  # (B,): beta on one side only
    return -F.logsigmoid(margin).mean()


def dpo_loss_beta_outside(pc, pr, rc, rr, beta):
    margin = (pc - rc.detach()) - (pr - rr.detach())  # (B,)
    return -(beta * F.logsigmoid(margin)).mean()


def dpo_loss_reference_gradient(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()  # nothing detached


def dpo_loss_no_reference(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * (pc - pr)).mean()  # the reference's log-ratio left out


DPO_BUGS = mistakes(
    DPO_ITEM,
    (
        "dpo.sign_flipped",
        "the margin is rejected minus chosen, so the loss teaches the rejected answer",
        "Use (pi_w - ref_w) - (pi_l - ref_l): chosen minus rejected.",
        dpo_loss_sign_flipped,
    ),
    (
        "dpo.beta_left_out",
        "beta is left out: the margin enters the sigmoid unscaled",
        "Multiply the margin by beta inside the log-sigmoid.",
        dpo_loss_beta_left_out,
    ),
    (
        "dpo.beta_outside",
        "beta multiplies the log-sigmoid instead of the margin inside it",
        "Compute -log sigmoid(beta * margin), beta inside.",
        dpo_loss_beta_outside,
    ),
    (
        "dpo.reference_gradient",
        "the gradient flows into the reference model's log-probabilities, which must stay frozen",
        "Detach the reference's log-probabilities (or compute them under torch.no_grad()).",
        dpo_loss_reference_gradient,
    ),
    (
        "dpo.no_reference",
        "the reference model is left out: the margin is the policy's log-ratio alone, so "
        "nothing holds the policy near where it started",
        "Subtract the reference's log-ratio: beta * ((pi_w - ref_w) - (pi_l - ref_l)).",
        dpo_loss_no_reference,
    ),
    (
        "dpo.beta_on_chosen_only",
        "beta multiplies only the chosen answer's log-ratio, not the difference of the two "
        "log-ratios, so the rejected answer is held to the reference with weight 1",
        "Put the whole margin in the parentheses: beta * ((pi_w - ref_w) - (pi_l - ref_l)).",
        dpo_loss_beta_on_chosen_only,
    ),
)
