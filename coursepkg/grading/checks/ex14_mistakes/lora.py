"""ex14's LoRA mistakes: subclasses of the correct layer named ``LoRALinear_<mistake>``, each
overriding the step it gets wrong.

Dimension legend: B batch, L length, V vocabulary, P prompts, G answers per prompt, T targets.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from ...framework.post_training import (
    LoRAReference,
)
from . import mistakes

__all__ = [
    "LORA_BUGS",
    "LORA_ITEM",
]

LORA_ITEM = "LoRALinear"


# ---------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------


class LoRALinear_b_not_zero(LoRAReference):
    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__(base, r, alpha)
        nn.init.kaiming_uniform_(self.lora_B, a=math.sqrt(5))  # the change is not 0 at step 0


class LoRALinear_both_zero(LoRAReference):
    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__(base, r, alpha)
        nn.init.zeros_(self.lora_A)  # with B = 0 too, neither adapter ever gets a gradient


class LoRALinear_no_scaling(LoRAReference):
    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T  # alpha / r left out


class LoRALinear_scaled_by_alpha(LoRAReference):
    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + self.alpha * ((x @ self.lora_A.T) @ self.lora_B.T)


class LoRALinear_scale_inverted(LoRAReference):
    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + (self.r / self.alpha) * ((x @ self.lora_A.T) @ self.lora_B.T)


class LoRALinear_base_not_frozen(LoRAReference):
    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__(base, r, alpha)
        for parameter in base.parameters():
            parameter.requires_grad_(True)  # the pre-trained weight trains too


LORA_BUGS = mistakes(
    LORA_ITEM,
    (
        "lora.b_not_zero",
        "lora_B does not start at zero, so the adapted layer changes the model before any training",
        "Initialise lora_B with zeros (lora_A random, like nn.Linear's weight).",
        LoRALinear_b_not_zero,
    ),
    (
        "lora.both_zero",
        "lora_A and lora_B both start at zero: each one's gradient is a product with the other, "
        "so neither ever gets one and the adapter never trains",
        "Initialise lora_A at random (kaiming_uniform_, a=sqrt(5), like nn.Linear's weight) and "
        "lora_B with zeros.",
        LoRALinear_both_zero,
    ),
    (
        "lora.no_scaling",
        "the low-rank change is added without its alpha / r scale",
        "Multiply x A^T B^T by alpha / r.",
        LoRALinear_no_scaling,
    ),
    (
        "lora.scaled_by_alpha",
        "the low-rank change is scaled by alpha instead of alpha / r",
        "Divide alpha by the rank r: the scale is alpha / r.",
        LoRALinear_scaled_by_alpha,
    ),
    (
        "lora.base_not_frozen",
        "the base layer's weight still takes gradients, so fine-tuning changes it too",
        "Set requires_grad_(False) on every parameter of base.",
        LoRALinear_base_not_frozen,
    ),
    (
        "lora.scale_inverted",
        "the change is scaled by r / alpha instead of alpha / r",
        "Multiply the low-rank change by alpha / r: y = base(x) + (alpha / r) * x A^T B^T.",
        LoRALinear_scale_inverted,
    ),
)
