"""``coursepkg finetune``: the command line of :mod:`coursepkg.posttrain.trainer`.

Every setting of :class:`~coursepkg.posttrain.trainer.FinetuneSettings` is a flag
(``--lora-rank 8``); the same command runs under ``torchrun``.
"""

from __future__ import annotations

import argparse
import sys

from .train import add_settings_flags

__all__ = ["ARGUMENTS", "COMMANDS"]

#: The commands of this home and their line in ``coursepkg --help``.
COMMANDS = {
    "finetune": "supervised fine-tuning (optionally LoRA), DPO or GRPO of a trained model",
}


_HELP = {
    "out": "the run's folder: checkpoint.pt, log.csv and, at the end, model.pt",
    "dpo": "DPO on prompt/chosen/rejected pairs instead of SFT on conversations",
    "beta": "DPO's beta: how strongly the policy is held to the base",
    "grpo": "GRPO on prompts ({'prompt': ..., 'answer': ...} a line) scored by --reward",
    "reward": "GRPO's reward: 'exact' or 'number' (against the line's 'answer'), or "
    "module:function, called as function(completion, record) -> float",
    "group_size": "GRPO: answers sampled per prompt, compared with one another",
    "max_new_tokens": "GRPO: the longest answer sampled",
    "temperature": "GRPO: the sampling temperature",
    "kl_coef": "GRPO: the weight of the KL penalty towards the base (0: none)",
    "lora_rank": "0 trains every weight; r >= 1 trains rank-r LoRA adapters only",
    "lora_alpha": "LoRA's alpha: the adapters' change is scaled by alpha / r",
    "lora_targets": "the layers LoRA adapts, comma-separated",
    "batch_size": "examples (or pairs) per optimiser step, over all ranks",
    "clip_norm": "clip the global gradient norm to this (0: no clipping)",
    "stop_after": "end this job after that step, with a checkpoint (0: run to the end)",
    "device": "cpu, cuda or auto (CUDA when there is one)",
    "parallel": "how torchrun's ranks share the work, as coursepkg train's --parallel "
    "(no fsdp with LoRA or GRPO)",
    "compile": "wrap the model in torch.compile",
    "aux_loss_coef": "SFT of a mixture of experts: the load-balancing loss's weight (0: none)",
}


def _add_finetune(p: argparse.ArgumentParser) -> None:
    """The ``coursepkg finetune`` subcommand."""
    from coursepkg.posttrain.trainer import FinetuneSettings

    p.description = (
        "Fine-tune BASE (a `coursepkg train --tokenizer bpe` run, an earlier "
        "`coursepkg finetune` run, or a Hugging Face Llama/Qwen3 folder) on DATA, a JSONL "
        'file: {"messages": [...]} a line for SFT, {"prompt", "chosen", "rejected"} a line '
        'for --dpo, {"prompt", "answer"} a line for --grpo. Checkpoints to OUT/checkpoint.pt '
        "(--resume continues exactly) and writes OUT/model.pt at the end; the base is never "
        "written. Runs under torchrun too."
    )
    p.add_argument("base", help="the model to start from: a run folder, checkpoint or HF folder")
    p.add_argument("data", help="the JSONL file of conversations (or of preference pairs)")
    add_settings_flags(p, FinetuneSettings, _HELP, skip=("base", "data"))
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_finetune)


def _finetune(args: argparse.Namespace) -> int:
    import logging

    from coursepkg.posttrain.trainer import FinetuneSettings, finetune
    from coursepkg.training import CheckpointError

    logging.basicConfig(level=logging.INFO, format="coursepkg finetune: %(message)s")
    skip = ("command", "func", "resume", "no_progress")
    given = {k: v for k, v in vars(args).items() if k not in skip and v is not None}
    settings = FinetuneSettings(**given)
    try:
        result = finetune(settings, resume=args.resume, progress=not args.no_progress)
    except CheckpointError as err:
        sys.stderr.write(f"coursepkg finetune: error: {err}\n")
        return 2
    if result.rows and result.rows[-1]["step"] == settings.steps:
        last = result.rows[-1]
        extra = f", margin {last['margin']:.4f}" if settings.dpo else ""
        extra = f", reward {last['reward']:.4f}" if settings.grpo else extra
        sys.stdout.write(
            f"step {last['step']}: loss {last['loss']:.4f}{extra}; "
            f"the model is {result.out / 'model.pt'}\n"
        )
    elif result.rows:
        sys.stdout.write(f"stopped after step {result.rows[-1]['step']}; continue with --resume\n")
    return 0


#: How each command of this home declares its arguments, on the subparser ``coursepkg``
#: makes for it (its :data:`COMMANDS` line as help).
ARGUMENTS = {"finetune": _add_finetune}
