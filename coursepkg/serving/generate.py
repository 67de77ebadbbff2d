"""Generation with every sampling filter and batched prompts of different lengths, over a
decoder-only model's public ``forward`` and a key/value cache.

Prompts of different lengths share a batch by left padding: each row's real tokens end at the
right edge, so every row's next token is appended at the same column. A ``token_mask`` (True =
real token) hides the padding from attention, and rotary positions count real tokens only
(``forward`` derives them from the mask), which is what ``transformers``' batched ``generate``
does: the tokens are equal (``tests/serving/test_generate.py``).

Dimension legend: B batch, L prompt length, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._validation import check_token_mask, check_tokens
from .cache import CroppableCache
from .quant import Int8Cache
from .sampling import SamplingParams, sample_token

__all__ = ["check_left_padded", "generate"]


def check_left_padded(token_mask: Tensor, model: nn.Module) -> None:
    """Raise unless every row of ``token_mask`` is padding then real tokens (at least one), and
    the model can place padded rows (rotary positions, counted from the mask).

    Shape:
        token_mask (B, L).
    """
    if token_mask.all():
        return
    if getattr(model, "rope_freqs", None) is None:
        raise ValueError(
            "token_mask with padding needs positional='rope' (positions counted from the "
            f"mask); this model adds a {model.config.positional!r} table"
        )
    rows = token_mask.long()
    if bool((rows.diff(dim=-1) < 0).any()):
        raise ValueError("token_mask must be left padded: False (padding) before True in each row")
    if not bool(token_mask[:, -1].all()):
        raise ValueError("token_mask has a row without any real token")


def generate(
    model: nn.Module,
    tokens: Tensor,
    max_new_tokens: int,
    params: SamplingParams | None = None,
    token_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    int8_cache: bool = False,
) -> Tensor:
    """Continue ``tokens`` by ``max_new_tokens`` tokens, greedy or sampled.

    Args:
        model: a :class:`~coursepkg.DecoderOnlyLM` (any module with its ``forward`` signature).
        tokens: prompt ids, left padded when rows differ in length.
        max_new_tokens: how many tokens to append to every row.
        params: the sampling settings (default: greedy).
        token_mask: True = real token; None = every token is real.
        generator: a ``torch.Generator``: the same seed gives the same tokens.
        int8_cache: hold keys and values as int8 (:class:`~coursepkg.serving.quant.Int8Cache`).

    Shape:
        tokens (B, L), token_mask (B, L) -> (B, L + max_new_tokens).
    """
    params = SamplingParams() if params is None else params
    check_tokens("tokens", tokens, model.config.vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if max_new_tokens < 0 or tokens.size(1) == 0:
        raise ValueError(
            f"max_new_tokens must be >= 0 and the prompt non-empty, got {max_new_tokens} "
            f"and a prompt of length {tokens.size(1)}"
        )
    b, n = tokens.shape
    if token_mask is not None:
        check_token_mask("token_mask", token_mask, (b, n))
        check_left_padded(token_mask, model)
    mask = token_mask
    kind = Int8Cache if int8_cache else CroppableCache
    cache = kind(model.config.n_layers, n + max(max_new_tokens, 1))
    seq, step_in = tokens, tokens
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model(step_in, token_mask=mask, cache=cache)[:, -1]  # (B, V)
            step_in = sample_token(logits, seq, params, generator)[:, None]  # (B, 1)
            seq = torch.cat([seq, step_in], dim=1)  # (B, L + t)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)  # (B, L + t)
    return seq.clone()  # a plain tensor again: an inference-mode one cannot enter autograd
