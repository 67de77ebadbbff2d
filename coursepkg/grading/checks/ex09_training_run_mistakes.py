"""The catalogue of ex09_training_run: the classic training mistakes that
:func:`~.ex09_training_run.check_training_run` recognises, each with its id and the story and
advice a student reads. A whole training run cannot be rerun with a mistake, so the evidence is
gathered by the check from the trained model and the training record (its ``_diagnose_*``
functions: a causal-invariance probe, a loss probe, the learning rates of the recorded steps,
the model's mode while decoding); :func:`named` writes the sentence with that evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUGS", "MISTAKES", "TrainingMistake", "named"]


@dataclass(frozen=True)
class TrainingMistake:
    """A classic training mistake that :func:`check_training_run` recognises.

    Attributes:
        id: stable identifier, e.g. ``"ex09.no_causal_mask"``.
        item: what the student wrote it in.
        description: what the mistake is, as a clause.
        advice: what to change.
    """

    id: str
    item: str
    description: str
    advice: str


MISTAKES = [
    TrainingMistake(
        "ex09.target_not_shifted",
        "sequence_loss",
        "the decoder is fed the target it must predict (tgt_out), not the target shifted right "
        "(tgt_in), so it learns to copy its input: near-zero training loss, useless decoding",
        "Feed batch.tgt_in (BOS + target) to the decoder and compare its logits with "
        "batch.tgt_out (target + EOS).",
    ),
    TrainingMistake(
        "ex09.no_causal_mask",
        "DateTransformer",
        "the decoder's self-attention has no causal mask: changing a later target token changes "
        "the predictions at earlier positions, so in training each position reads the answer",
        "Pass causal_mask(T) (combined with the target's padding mask) as the decoder layers' "
        "self_mask.",
    ),
    TrainingMistake(
        "ex09.schedule_not_stepped",
        "train_model",
        "the learning rate never changed during training: the warm-up schedule was never stepped",
        "Call scheduler.step() after every optimizer.step().",
    ),
    TrainingMistake(
        "ex09.padding_in_loss",
        "sequence_loss",
        "padding positions count in the loss: the loss changes when only the logits at padded "
        "target positions change",
        "Leave out the positions where the target is the pad id (ignore_index=PAD_ID).",
    ),
    TrainingMistake(
        "ex09.dropout_at_evaluation",
        "greedy_decode",
        "the model decodes in training mode, with dropout on, so its answers are noisy",
        "Call model.eval() before decoding (and model.train() before training again).",
    ),
]
_BY_ID = {bug.id: bug for bug in MISTAKES}


def named(bug_id: str, evidence: str) -> str:
    """The sentence a failure adds for the mistake ``bug_id``, with the evidence found."""
    bug = _BY_ID[bug_id]
    return f"Known mistake ({bug.id}): {bug.description} ({evidence}). {bug.advice}"


#: The whole catalogue, under the name every assignment's catalogue has.
BUGS = MISTAKES
