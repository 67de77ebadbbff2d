"""The catalogue of ex09_training_run: the classic training mistakes that
:func:`~.ex09_training_run.check_training_run` recognises, each a :class:`BugVariant` with its
id and the story and advice a student reads.

A whole training run cannot be rerun with a mistake, so these variants have no ``impl``: the
evidence is gathered by the check from the trained model and the training record (its
``_diagnose_*`` functions: a causal-invariance probe, a loss probe, the learning rates of the
recorded steps, the model's mode while decoding), and :func:`named` writes the sentence with
that evidence. Their ids start with ``ex09.``, as students have read them since the first term.
"""

from __future__ import annotations

from ..framework import BugVariant

__all__ = ["BUGS", "named"]


#: Every training mistake the check recognises.
BUGS: list[BugVariant] = [
    BugVariant(
        id="ex09.target_not_shifted",
        item="sequence_loss",
        description="the decoder is fed the target it must predict (tgt_out), not the target "
        "shifted right (tgt_in), so it learns to copy its input: near-zero training loss, "
        "useless decoding",
        advice="Feed batch.tgt_in (BOS + target) to the decoder and compare its logits with "
        "batch.tgt_out (target + EOS).",
    ),
    BugVariant(
        id="ex09.no_causal_mask",
        item="DateTransformer",
        description="the decoder's self-attention has no causal mask: changing a later target "
        "token changes the predictions at earlier positions, so in training each position "
        "reads the answer",
        advice="Pass causal_mask(T) (combined with the target's padding mask) as the decoder "
        "layers' self_mask.",
    ),
    BugVariant(
        id="ex09.schedule_not_stepped",
        item="train_model",
        description="the learning rate never changed during training: the warm-up schedule was "
        "never stepped",
        advice="Call scheduler.step() after every optimizer.step().",
    ),
    BugVariant(
        id="ex09.padding_in_loss",
        item="sequence_loss",
        description="padding positions count in the loss: the loss changes when only the logits "
        "at padded target positions change",
        advice="Leave out the positions where the target is the pad id (ignore_index=PAD_ID).",
    ),
    BugVariant(
        id="ex09.dropout_at_evaluation",
        item="greedy_decode",
        description="the model decodes in training mode, with dropout on, so its answers are noisy",
        advice="Call model.eval() before decoding (and model.train() before training again).",
    ),
]
_BY_ID = {bug.id: bug for bug in BUGS}


def named(bug_id: str, evidence: str) -> str:
    """The sentence a failure adds for the mistake ``bug_id``, with the evidence found."""
    bug = _BY_ID[bug_id]
    return f"Known mistake ({bug.id}): {bug.description} ({evidence}). {bug.advice}"
