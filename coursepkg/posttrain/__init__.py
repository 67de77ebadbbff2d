"""Post-training: from a language model to an assistant.

One module per idea, in the order they are applied:

- :mod:`~coursepkg.posttrain.chat`: the chat template, its ``transformers`` twin, tokenising a
  conversation with its response mask, reading conversations from JSONL;
- :mod:`~coursepkg.posttrain.packing`: padded batches, packing with a document mask;
- :mod:`~coursepkg.posttrain.per_token`: the per-token pieces: entropy, each token's
  log-probability, the masked mean and the masked normalisation;
- :mod:`~coursepkg.posttrain.sft`: supervised fine-tuning's masked next-token loss;
- :mod:`~coursepkg.posttrain.lora`: low-rank adapters around the reference's linear layers;
- :mod:`~coursepkg.posttrain.dpo`: direct preference optimisation from chosen/rejected pairs;
- :mod:`~coursepkg.posttrain.policy_gradient`: the per-token policy-gradient losses (plain,
  with a baseline, clipped) and the k3 KL estimator;
- :mod:`~coursepkg.posttrain.grpo`: reinforcement learning with a checkable reward, the group as
  the baseline.
"""

from coursepkg.posttrain.chat import encode_chat, render_chat, with_chat_tokens
from coursepkg.posttrain.dpo import dpo_loss, dpo_pairs_loss, frozen_copy, pair_examples
from coursepkg.posttrain.grpo import group_advantages, grpo_loss, grpo_step
from coursepkg.posttrain.lora import LoRALinear, add_lora, merge_lora, unmerge_lora
from coursepkg.posttrain.packing import pack_examples, pad_batch
from coursepkg.posttrain.per_token import (
    masked_mean,
    masked_normalize,
    token_entropy,
    token_log_probs,
)
from coursepkg.posttrain.policy_gradient import (
    grpo_clip_loss,
    grpo_token_loss,
    k3_kl,
    policy_gradient_loss,
    reinforce_with_baseline_loss,
)
from coursepkg.posttrain.rewards import parse_choice, parse_number
from coursepkg.posttrain.sft import sft_loss, sft_microbatch_step

__all__ = [
    "LoRALinear",
    "add_lora",
    "dpo_loss",
    "dpo_pairs_loss",
    "encode_chat",
    "frozen_copy",
    "group_advantages",
    "grpo_clip_loss",
    "grpo_loss",
    "grpo_step",
    "grpo_token_loss",
    "k3_kl",
    "masked_mean",
    "masked_normalize",
    "merge_lora",
    "pack_examples",
    "pad_batch",
    "pair_examples",
    "parse_choice",
    "parse_number",
    "policy_gradient_loss",
    "reinforce_with_baseline_loss",
    "render_chat",
    "sft_loss",
    "sft_microbatch_step",
    "token_entropy",
    "token_log_probs",
    "unmerge_lora",
    "with_chat_tokens",
]
