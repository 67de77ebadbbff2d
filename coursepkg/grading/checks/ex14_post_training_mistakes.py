"""The catalogue of ex14_post_training: the known mistakes of the SFT loss, the LoRA layer, the
DPO loss, the per-token pieces (entropy, masked mean, the clipped policy-gradient loss) and
GRPO's advantages and loss, gathered from their concept modules in :mod:`.ex14_mistakes`
(``sft``, ``lora``, ``dpo``, ``grpo``), where each is written and named: a runnable variant
with the stub's signature (a wrong function, or for LoRA a subclass of the correct layer named
``LoRALinear_<mistake>`` overriding the step it gets wrong), built on
:mod:`..framework.post_training`'s references. The check reruns a variant on the student's
inputs and names it only when the numbers match.
"""

from __future__ import annotations

from ..framework import BugVariant
from .ex14_mistakes.dpo import DPO_BUGS, DPO_ITEM
from .ex14_mistakes.grpo import (
    ADVANTAGES_BUGS,
    ADVANTAGES_ITEM,
    ENTROPY_BUGS,
    ENTROPY_ITEM,
    GRPO_BUGS,
    GRPO_ITEM,
    MASKED_MEAN_BUGS,
    MASKED_MEAN_ITEM,
    PG_BUGS,
    PG_ITEM,
)
from .ex14_mistakes.lora import LORA_BUGS, LORA_ITEM
from .ex14_mistakes.sft import SFT_BUGS, SFT_ITEM

__all__ = ["BUGS", "ITEMS"]

#: Each item the checks grade (what the student writes), with its mistakes.
ITEMS: dict[str, list[BugVariant]] = {
    SFT_ITEM: SFT_BUGS,
    LORA_ITEM: LORA_BUGS,
    DPO_ITEM: DPO_BUGS,
    ENTROPY_ITEM: ENTROPY_BUGS,
    MASKED_MEAN_ITEM: MASKED_MEAN_BUGS,
    ADVANTAGES_ITEM: ADVANTAGES_BUGS,
    PG_ITEM: PG_BUGS,
    GRPO_ITEM: GRPO_BUGS,
}

BUGS: list[BugVariant] = [bug for bugs in ITEMS.values() for bug in bugs]
