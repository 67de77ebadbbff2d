"""ex13's optimiser mistakes: AdamW written in steps (:class:`AdamWSteps`), each mistake a
subclass overriding the one step it gets wrong; and its parameter groups, each mistake a wrong
function with the stub's signature.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ...framework import BugVariant

__all__ = [
    "ADAMW_BUGS",
    "ADAMW_ITEM",
    "PARAM_GROUPS_BUGS",
    "PARAM_GROUPS_ITEM",
    "TORCH_ADAM_STEP",
    "AdamWSteps",
    "correct_param_groups",
]

ADAMW_ITEM = "AdamW"
PARAM_GROUPS_ITEM = "param_groups"

#: PyTorch's AdamW.step (AdamW inherits Adam's), undecorated: calling it is the evidence of
#: ``adamw.builtin``.
TORCH_ADAM_STEP = inspect.unwrap(torch.optim.Adam.step)


# ---------------------------------------------------------------------------------------------
# AdamW
# ---------------------------------------------------------------------------------------------


class AdamWSteps(torch.optim.Optimizer):
    """The correct AdamW (the stub's constructor), in the steps its mistakes override."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            settings = self.settings(group)
            beta1, beta2 = settings["betas"]
            for w in group["params"]:
                if w.grad is None:
                    continue
                state = self.state[w]
                if not state:
                    state.update(
                        step=0, exp_avg=torch.zeros_like(w), exp_avg_sq=torch.zeros_like(w)
                    )
                state["step"] += 1
                g = self.gradient(w, settings)
                self.decay(w, settings)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                c1, c2 = self.corrections(state["step"], beta1, beta2)
                w.sub_(settings["lr"] * (m / c1) / self.denominator(v / c2, settings["eps"]))
                self.decay_after(w, settings)
        return None

    def settings(self, group: dict) -> dict:
        """The hyper-parameters of a group, read at every step."""
        return group

    def gradient(self, w, settings: dict):
        """The gradient the moments see."""
        return w.grad

    def decay(self, w, settings: dict) -> None:
        """Decoupled decay: the weight shrinks by lr * weight_decay of itself."""
        w.mul_(1.0 - settings["lr"] * settings["weight_decay"])

    def decay_after(self, w, settings: dict) -> None:
        """Nothing: the decay comes before the update, from the weight the gradient saw."""

    def corrections(self, t: int, beta1: float, beta2: float) -> tuple[float, float]:
        """The bias corrections of update t (from 1)."""
        return 1.0 - beta1**t, 1.0 - beta2**t

    def denominator(self, v_hat, eps: float):
        return v_hat.sqrt() + eps


class AdamW_l2_decay(AdamWSteps):  # noqa: N801 - the variant's name shows in messages
    def gradient(self, w, settings):
        return w.grad + settings["weight_decay"] * w  # L2: the decay goes through m and v

    def decay(self, w, settings):
        pass


class AdamW_no_bias_correction(AdamWSteps):  # noqa: N801
    def corrections(self, t, beta1, beta2):
        return 1.0, 1.0


class AdamW_bias_correction_off_by_one(AdamWSteps):  # noqa: N801
    def corrections(self, t, beta1, beta2):
        return 1.0 - beta1 ** (t + 1), 1.0 - beta2 ** (t + 1)  # the count one ahead


class AdamW_decay_every_group(AdamWSteps):  # noqa: N801
    def settings(self, group):
        return {**group, "weight_decay": self.defaults["weight_decay"]}


class AdamW_lr_read_once(AdamWSteps):  # noqa: N801
    def settings(self, group):
        return {**group, "lr": self.defaults["lr"]}


class AdamW_decay_without_lr(AdamWSteps):  # noqa: N801
    def decay(self, w, settings):
        w.mul_(1.0 - settings["weight_decay"])


class AdamW_decay_after_update(AdamWSteps):  # noqa: N801
    def decay(self, w, settings):
        pass

    def decay_after(self, w, settings):
        w.mul_(1.0 - settings["lr"] * settings["weight_decay"])  # the updated weight decayed


class AdamW_eps_inside_sqrt(AdamWSteps):  # noqa: N801
    def denominator(self, v_hat, eps):
        return (v_hat + eps).sqrt()


class AdamW_builtin(torch.optim.AdamW):  # noqa: N801
    def step(self, closure=None):
        return torch.optim.AdamW.step(self, closure)


ADAMW_BUGS = [
    BugVariant(
        "adamw.l2_decay",
        ADAMW_ITEM,
        "the weight decay is added to the gradient (L2, Adam's way) instead of shrinking the "
        "weights directly, so Adam's scaling by 1 / sqrt(v) weakens it where gradients are large",
        "Leave the gradient alone and decay the weight itself first: w <- w - lr * weight_decay "
        "* w, then the Adam update from m and v.",
        AdamW_l2_decay,
    ),
    BugVariant(
        "adamw.no_bias_correction",
        ADAMW_ITEM,
        "m and v are used without bias correction: both start at 0 and lag by different factors "
        "(1 - beta1 ** t and 1 - beta2 ** t), so the early updates are the wrong size (about 3 "
        "times too large at the first step with betas (0.9, 0.999))",
        "Divide m by (1 - beta1 ** t) and v by (1 - beta2 ** t), t the parameter's update count "
        "(1 at its first update).",
        AdamW_no_bias_correction,
    ),
    BugVariant(
        "adamw.bias_correction_off_by_one",
        ADAMW_ITEM,
        "the bias corrections use the update count one step ahead (t + 1: the count starts at 1 "
        "and is incremented before use, or incremented twice)",
        "Count the updates of each parameter from 0, add 1 at the start of each update and use "
        "that t: the first update divides m by 1 - beta1.",
        AdamW_bias_correction_off_by_one,
    ),
    BugVariant(
        "adamw.decay_every_group",
        ADAMW_ITEM,
        "the constructor's weight_decay is applied to every group, so the group of norms and "
        "biases (weight_decay=0) decays too",
        "Read weight_decay from each parameter's group (group['weight_decay']) at every step.",
        AdamW_decay_every_group,
    ),
    BugVariant(
        "adamw.lr_read_once",
        ADAMW_ITEM,
        "the learning rate is the one given to the constructor, so a schedule that sets "
        "group['lr'] between steps changes nothing",
        "Read lr from each parameter's group (group['lr']) at every step.",
        AdamW_lr_read_once,
    ),
    BugVariant(
        "adamw.decay_without_lr",
        ADAMW_ITEM,
        "the decoupled decay shrinks the weights by weight_decay instead of lr * weight_decay",
        "Multiply the weight by (1 - lr * weight_decay), as torch.optim.AdamW does.",
        AdamW_decay_without_lr,
    ),
    BugVariant(
        "adamw.decay_after_update",
        ADAMW_ITEM,
        "the weight decay is applied after the Adam update, to the updated weight, instead of "
        "to the weight the gradient was computed at",
        "Decay first, w -= lr * weight_decay * w, then the Adam update (as torch.optim.AdamW "
        "and the docstring do).",
        AdamW_decay_after_update,
    ),
    BugVariant(
        "adamw.eps_inside_sqrt",
        ADAMW_ITEM,
        "eps is added under the square root, sqrt(v_hat + eps), instead of after it",
        "Divide by sqrt(v_hat) + eps.",
        AdamW_eps_inside_sqrt,
    ),
    BugVariant(
        "adamw.builtin",
        ADAMW_ITEM,
        "your AdamW calls PyTorch's torch.optim.AdamW instead of computing the update",
        "Write the moments, the bias corrections and the decoupled decay yourself.",
        AdamW_builtin,
        calls=(TORCH_ADAM_STEP,),
    ),
]


# ---------------------------------------------------------------------------------------------
# Parameter groups
# ---------------------------------------------------------------------------------------------


def correct_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Matrices (two or more dimensions) decayed, vectors not; each trainable parameter once."""
    trainable = [p for p in model.parameters() if p.requires_grad]  # shared weights once
    return [
        {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
    ]


def param_groups_decays_vectors(model, weight_decay):
    return [
        {"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": weight_decay}
    ]


def param_groups_bias_by_name(model, weight_decay):
    decayed, kept = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (kept if name.endswith("bias") else decayed).append(p)  # a norm's gain is decayed
    return [
        {"params": decayed, "weight_decay": weight_decay},
        {"params": kept, "weight_decay": 0.0},
    ]


def param_groups_vectors_left_out(model, weight_decay):
    return [
        {
            "params": [p for p in model.parameters() if p.requires_grad and p.dim() >= 2],
            "weight_decay": weight_decay,
        }
    ]


PARAM_GROUPS_BUGS = [
    BugVariant(
        "param_groups.decays_vectors",
        PARAM_GROUPS_ITEM,
        "every parameter is decayed, the biases and the norms' gains too, which pulls them "
        "towards 0 (a norm's gain towards switching its output off)",
        "Put the parameters with fewer than two dimensions in a group of their own with "
        "weight_decay=0.0.",
        param_groups_decays_vectors,
    ),
    BugVariant(
        "param_groups.norm_gains_decayed",
        PARAM_GROUPS_ITEM,
        "only the parameters named '...bias' escape the decay: the LayerNorm and RMSNorm gains "
        "(named 'weight' or otherwise) are decayed",
        "Decide by the number of dimensions (p.dim() < 2: not decayed), not by the name.",
        param_groups_bias_by_name,
    ),
    BugVariant(
        "param_groups.vectors_left_out",
        PARAM_GROUPS_ITEM,
        "the biases and the norms' gains are in no group at all, so the optimizer never trains "
        "them",
        "Give them a second group with weight_decay=0.0: every trainable parameter belongs to "
        "exactly one group.",
        param_groups_vectors_left_out,
    ),
]
