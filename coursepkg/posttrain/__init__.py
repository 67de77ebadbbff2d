"""Post-training: from a language model to an assistant.

One module per idea, in the order they are applied:

- :mod:`~coursepkg.posttrain.chat`: the chat template, its ``transformers`` twin, tokenising a
  conversation with its response mask, reading conversations from JSONL;
- :mod:`~coursepkg.posttrain.packing`: padded batches, packing with a document mask;
- :mod:`~coursepkg.posttrain.sft`: supervised fine-tuning's masked next-token loss;
- :mod:`~coursepkg.posttrain.lora`: low-rank adapters around the reference's linear layers;
- :mod:`~coursepkg.posttrain.dpo`: direct preference optimisation from chosen/rejected pairs;
- :mod:`~coursepkg.posttrain.grpo`: reinforcement learning with a checkable reward, the group as
  the baseline.
"""

from coursepkg.posttrain.chat import encode_chat, render_chat, with_chat_tokens
from coursepkg.posttrain.dpo import dpo_loss, frozen_copy
from coursepkg.posttrain.grpo import group_advantages, grpo_loss, grpo_step
from coursepkg.posttrain.lora import LoRALinear, add_lora, merge_lora, unmerge_lora
from coursepkg.posttrain.packing import pack_examples, pad_batch
from coursepkg.posttrain.sft import sft_loss

__all__ = [
    "LoRALinear",
    "add_lora",
    "dpo_loss",
    "encode_chat",
    "frozen_copy",
    "group_advantages",
    "grpo_loss",
    "grpo_step",
    "merge_lora",
    "pack_examples",
    "pad_batch",
    "render_chat",
    "sft_loss",
    "unmerge_lora",
    "with_chat_tokens",
]
