"""The catalogue of ex13_training_pieces: the known mistakes of AdamW, its parameter groups, the
warm-up + cosine schedule, clipping by global norm and a resumable training state.

Each item has a correct version written in steps (:class:`AdamWSteps`, :class:`ResumeSteps`) or
a plain correct function, and each mistake overrides the one step it gets wrong (a subclass
named ``<Item>_<mistake>``) or is a wrong function with the stub's signature. The evidence: the
check reruns a variant on the student's inputs (the same gradients, the same model, the same
interrupted run) and names the mistake only when its numbers match the student's.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from ...optim import clip_grad_norm_ as reference_clip
from ..framework import BugVariant

__all__ = [
    "ADAMW_BUGS",
    "ADAMW_ITEM",
    "BUGS",
    "CLIP_BUGS",
    "CLIP_ITEM",
    "PARAM_GROUPS_BUGS",
    "PARAM_GROUPS_ITEM",
    "RESUME_BUGS",
    "RESUME_ITEM",
    "WARMUP_COSINE_BUGS",
    "WARMUP_COSINE_ITEM",
    "AdamWSteps",
    "ResumeSteps",
    "correct_param_groups",
]

ADAMW_ITEM = "AdamW"
PARAM_GROUPS_ITEM = "param_groups"
WARMUP_COSINE_ITEM = "warmup_cosine_lr"
CLIP_ITEM = "clip_grad_norm_"
RESUME_ITEM = "TrainingState"

#: PyTorch's AdamW.step (AdamW inherits Adam's), undecorated: calling it is the evidence of
#: ``adamw.builtin``.
TORCH_ADAM_STEP = inspect.unwrap(torch.optim.Adam.step)
TORCH_CLIP = inspect.unwrap(torch.nn.utils.clip_grad_norm_)


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


# ---------------------------------------------------------------------------------------------
# Warm-up + cosine
# ---------------------------------------------------------------------------------------------


def _cosine(step, max_lr, warmup_steps, total_steps, min_lr):
    r = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * r))


def warmup_cosine_lr_warmup_off_by_one(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * step / warmup_steps  # 0 at the first update
    if step > total_steps:
        return min_lr
    return _cosine(step, max_lr, warmup_steps, total_steps, min_lr)


def warmup_cosine_lr_warmup_inclusive(step, max_lr, warmup_steps, total_steps, min_lr):
    if step <= warmup_steps:  # one step too many: step warmup_steps overshoots max_lr
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps:
        return min_lr
    return _cosine(step, max_lr, warmup_steps, total_steps, min_lr)


def warmup_cosine_lr_cosine_past_the_end(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    return _cosine(step, max_lr, warmup_steps, total_steps, min_lr)  # climbs again after the end


def warmup_cosine_lr_floor_ignored(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    r = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return max_lr * 0.5 * (1.0 + math.cos(math.pi * r))  # down to 0, not to min_lr


def warmup_cosine_lr_decay_from_zero(step, max_lr, warmup_steps, total_steps, min_lr):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps:
        return min_lr
    return _cosine(step, max_lr, 0, total_steps, min_lr)  # r counted from step 0


WARMUP_COSINE_BUGS = [
    BugVariant(
        "warmup_cosine.warmup_off_by_one",
        WARMUP_COSINE_ITEM,
        "the warm-up is max_lr * step / warmup_steps: the first update gets learning rate 0 "
        "and max_lr comes one step late",
        "Use max_lr * (step + 1) / warmup_steps while step < warmup_steps.",
        warmup_cosine_lr_warmup_off_by_one,
    ),
    BugVariant(
        "warmup_cosine.warmup_inclusive",
        WARMUP_COSINE_ITEM,
        "the warm-up includes step warmup_steps (step <= warmup_steps), so that step gets "
        "max_lr * (warmup_steps + 1) / warmup_steps, above the peak, before the cosine starts",
        "Warm up while step < warmup_steps; at step warmup_steps the cosine starts, at max_lr.",
        warmup_cosine_lr_warmup_inclusive,
    ),
    BugVariant(
        "warmup_cosine.cosine_past_the_end",
        WARMUP_COSINE_ITEM,
        "after total_steps the cosine goes on, so the learning rate climbs back up from min_lr "
        "instead of staying there",
        "Return min_lr for every step > total_steps.",
        warmup_cosine_lr_cosine_past_the_end,
    ),
    BugVariant(
        "warmup_cosine.floor_ignored",
        WARMUP_COSINE_ITEM,
        "the cosine decays to 0 instead of to the floor min_lr",
        "Decay from max_lr to min_lr: min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2.",
        warmup_cosine_lr_floor_ignored,
    ),
    BugVariant(
        "warmup_cosine.decay_from_zero",
        WARMUP_COSINE_ITEM,
        "the cosine's progress r is counted from step 0 instead of from the end of the warm-up, "
        "so the decay starts below max_lr",
        "Use r = (step - warmup_steps) / (total_steps - warmup_steps).",
        warmup_cosine_lr_decay_from_zero,
    ),
]


# ---------------------------------------------------------------------------------------------
# Clipping
# ---------------------------------------------------------------------------------------------


def clip_grad_norm_per_tensor(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.stack([g.norm() for g in grads]).norm()
    for g in grads:
        g.mul_((max_norm / (g.norm() + 1e-6)).clamp(max=1.0))  # each tensor on its own
    return total


def clip_grad_norm_norms_added(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.stack([g.norm() for g in grads]).sum()  # not sqrt(sum of squares)
    for g in grads:
        g.mul_((max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


def clip_grad_norm_always_scales(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.stack([g.norm() for g in grads]).norm()
    for g in grads:
        g.mul_(max_norm / (total + 1e-6))  # small gradients are scaled up
    return total


def clip_grad_norm_returns_clipped_norm(parameters, max_norm):
    params = list(parameters)
    reference_clip(params, max_norm)
    return torch.stack([p.grad.norm() for p in params if p.grad is not None]).norm()


def clip_grad_norm_builtin(parameters, max_norm):
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm)


CLIP_BUGS = [
    BugVariant(
        "clip.per_tensor",
        CLIP_ITEM,
        "each gradient is clipped to max_norm on its own, which changes the update's direction "
        "(and lets the whole update grow with the number of tensors)",
        "Compute one global norm over all the gradients and scale them all by the same factor "
        "max_norm / norm.",
        clip_grad_norm_per_tensor,
    ),
    BugVariant(
        "clip.norms_added",
        CLIP_ITEM,
        "the global norm is the sum of the tensors' norms instead of the square root of the sum "
        "of their squares",
        "total = sqrt(sum over tensors of (norm of the tensor) ** 2).",
        clip_grad_norm_norms_added,
    ),
    BugVariant(
        "clip.always_scales",
        CLIP_ITEM,
        "the gradients are scaled by max_norm / norm even when the norm is below max_norm, so "
        "small gradients are blown up to max_norm",
        "Scale only when the norm exceeds max_norm: factor min(1, max_norm / norm).",
        clip_grad_norm_always_scales,
    ),
    BugVariant(
        "clip.returns_clipped_norm",
        CLIP_ITEM,
        "the norm returned is the one after clipping, so a log of it never shows a spike",
        "Return the global norm computed before scaling the gradients.",
        clip_grad_norm_returns_clipped_norm,
    ),
    BugVariant(
        "clip.builtin",
        CLIP_ITEM,
        "your clip_grad_norm_ calls PyTorch's torch.nn.utils.clip_grad_norm_",
        "Compute the global norm and scale the gradients yourself.",
        clip_grad_norm_builtin,
        calls=(TORCH_CLIP,),
    ),
]


# ---------------------------------------------------------------------------------------------
# The resumable training state
# ---------------------------------------------------------------------------------------------


class ResumeSteps:
    """The correct training state: what ``capture`` writes, and ``restore`` in the steps its
    mistakes override."""

    @staticmethod
    def capture(model, optimizer, step, batches):
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "batches": batches.get_state(),
            "rng": torch.get_rng_state(),
        }

    @classmethod
    def restore(cls, state, model, optimizer, batches):
        model.load_state_dict(state["model"])
        cls.put_optimizer(state, optimizer)
        cls.put_data_position(state, batches)
        cls.put_rng(state)
        return cls.step_of(state)

    @staticmethod
    def put_optimizer(state, optimizer):
        optimizer.load_state_dict(state["optimizer"])

    @staticmethod
    def put_data_position(state, batches):
        batches.set_state(state["batches"])

    @staticmethod
    def put_rng(state):
        torch.set_rng_state(state["rng"])

    @staticmethod
    def step_of(state):
        return int(state["step"])


class TrainingState_no_rng_state(ResumeSteps):  # noqa: N801
    @staticmethod
    def put_rng(state):
        pass  # dropout continues from wherever torch's global generator stands


class TrainingState_no_data_position(ResumeSteps):  # noqa: N801
    @staticmethod
    def put_data_position(state, batches):
        pass  # the batches start over from the new generator's seed


class TrainingState_no_optimizer_state(ResumeSteps):  # noqa: N801
    @staticmethod
    def put_optimizer(state, optimizer):
        pass  # moments at 0, update counts at 0


class TrainingState_step_restarts(ResumeSteps):  # noqa: N801
    @staticmethod
    def step_of(state):
        return 0  # the schedule starts its warm-up again


RESUME_BUGS = [
    BugVariant(
        "resume.no_rng_state",
        RESUME_ITEM,
        "torch's global random number generator is not saved and restored, so after resuming "
        "the dropout masks differ from the uninterrupted run's",
        "Save torch.get_rng_state() in capture and call torch.set_rng_state(...) in restore "
        "(and torch.cuda's on a GPU).",
        TrainingState_no_rng_state,
    ),
    BugVariant(
        "resume.no_data_position",
        RESUME_ITEM,
        "the batch generator's state (where the data stands) is not saved and restored, so the "
        "resumed run reads other batches",
        "Save batches.get_state() in capture and call batches.set_state(...) in restore.",
        TrainingState_no_data_position,
    ),
    BugVariant(
        "resume.no_optimizer_state",
        RESUME_ITEM,
        "the optimizer's state (AdamW's moments and update counts) is not restored, so the "
        "resumed run starts Adam afresh",
        "Save optimizer.state_dict() and call optimizer.load_state_dict(...) in restore.",
        TrainingState_no_optimizer_state,
    ),
    BugVariant(
        "resume.step_restarts",
        RESUME_ITEM,
        "restore returns step 0, so the learning-rate schedule starts its warm-up again",
        "Save the step in capture and return it from restore.",
        TrainingState_step_restarts,
    ),
]

BUGS: list[BugVariant] = [
    *ADAMW_BUGS,
    *PARAM_GROUPS_BUGS,
    *WARMUP_COSINE_BUGS,
    *CLIP_BUGS,
    *RESUME_BUGS,
]
