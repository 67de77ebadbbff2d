"""Argument checks shared by the package: each raises an error naming the argument, the
expected and the actual value, so a reader sees at once what to fix."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def check_tensor(name: str, x: object) -> Tensor:
    """Raise ``TypeError`` unless ``x`` is a tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(name: str, x: object, ndim: int | Sequence[int] | None = None) -> Tensor:
    """Raise unless ``x`` is a floating-point tensor (of one of the given ranks)."""
    check_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if ndim is not None:
        ranks = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in ranks:
            raise ValueError(
                f"{name} must have {' or '.join(map(str, ranks))} dimensions, "
                f"got shape {tuple(x.shape)}"
            )
    return x


def check_tokens(name: str, tokens: object, vocab_size: int | None = None) -> Tensor:
    """Raise unless ``tokens`` is an integer tensor of shape (B, L) with ids in [0, V)."""
    check_tensor(name, tokens)
    if tokens.dtype not in (torch.long, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise TypeError(
            f"{name} must hold integer token ids (torch.long), got dtype {tokens.dtype}"
        )
    if tokens.dim() != 2:
        raise ValueError(
            f"{name} must have shape (B, L) (batch first), got shape {tuple(tokens.shape)}"
        )
    if vocab_size is not None and tokens.numel() > 0:
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} holds id {bad}, outside the vocabulary [0, {vocab_size})")
    return tokens


def check_token_mask(name: str, mask: object, shape: tuple[int, int]) -> Tensor:
    """Raise unless ``mask`` is a bool tensor of exactly ``shape`` (True = real token)."""
    check_tensor(name, mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = real token), got dtype {mask.dtype}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have shape {tuple(shape)} (B, length), got {tuple(mask.shape)}"
        )
    return mask


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` broadcasts to exactly ``target`` (no wider).

    The rule of ``torch.broadcast_shapes(shape, target) == target``, in plain Python: that call
    goes through symbolic-shape guards and cost about a tenth of a cached decoding step of a
    small model, once per layer (issue 50's profile).
    """
    if len(shape) > len(target):
        return False
    tail = target[len(target) - len(shape) :]  # the dimensions ``shape`` lines up with
    return all(s in (1, t) for s, t in zip(shape, tail, strict=True))


def broadcast_shape(name_a: str, a: tuple[int, ...], name_b: str, b: tuple[int, ...]) -> tuple:
    """The shape ``a`` and ``b`` broadcast to, as ``torch.broadcast_shapes(a, b)``, in plain
    Python: that call's first use imports sympy for its symbolic-shape guards (about a second,
    the largest part of the first attention call in ``coursepkg check``).

    Raises:
        ValueError: the shapes do not broadcast (the message names both).
    """
    rank = max(len(a), len(b))
    a_full, b_full = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    if any(x != y and 1 not in (x, y) for x, y in zip(a_full, b_full, strict=True)):
        raise ValueError(
            f"{name_a} of shape {tuple(a)} and {name_b} of shape {tuple(b)} do not broadcast"
        )
    return tuple(y if x == 1 else x for x, y in zip(a_full, b_full, strict=True))


def check_attention_mask(name: str, mask: object, target: tuple[int, ...]) -> Tensor:
    """Raise unless ``mask`` is a bool tensor broadcastable to ``target`` (True = may attend)."""
    check_tensor(name, mask)
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a bool tensor (True = may attend), got dtype {mask.dtype}; "
            "an additive float mask or a 0/1 integer mask is not accepted"
        )
    if not broadcasts_to(tuple(mask.shape), tuple(target)):
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores' shape {tuple(target)} (..., L, S)"
        )
    return mask
