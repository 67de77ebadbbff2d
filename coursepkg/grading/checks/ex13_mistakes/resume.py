"""ex13's resume mistakes: the resumable training state written in steps (:class:`ResumeSteps`),
each mistake a subclass overriding the one step it gets wrong.
"""

from __future__ import annotations

import torch

from ...framework import BugVariant

__all__ = [
    "RESUME_BUGS",
    "RESUME_ITEM",
    "ResumeSteps",
]

RESUME_ITEM = "TrainingState"


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
