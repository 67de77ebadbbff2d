"""Masks. One convention throughout: boolean, **True = may attend** (or, for token masks,
True = real token). ``torch.nn.MultiheadAttention`` uses the opposite (True = blocked); convert
with ``~mask`` when talking to it."""

from __future__ import annotations

import torch
from torch import Tensor

from ._validation import check_tokens


def causal_mask(
    query_len: int,
    key_len: int | None = None,
    device: torch.device | str | None = None,
    window: int | None = None,
) -> Tensor:
    """Causal (look-ahead) mask of the decoder's self-attention (Vaswani et al., Sec. 3.2.3).

    Aligned bottom-right: query ``i`` sits at absolute position ``i + key_len - query_len``, so
    with a KV cache (``key_len`` > ``query_len``) new queries still see the whole past. With a
    ``window`` W (Longformer's and Mistral's sliding window), a query sees only itself and the
    W - 1 positions before it.

    Args:
        query_len: number of queries L.
        key_len: number of keys S (default ``query_len``); must be >= ``query_len``.
        device: where to build the mask.
        window: how many positions (itself included) a query may see; None for all of them.

    Shape:
        Returns (L, S), broadcastable to (B, H, L, S).

    Returns:
        Bool tensor, True where query ``i`` may attend key ``j`` (``j <= i + S - L``, and
        ``j > i + S - L - W`` with a window).
    """
    key_len = query_len if key_len is None else key_len
    if query_len < 0 or key_len < query_len:
        raise ValueError(
            f"causal_mask needs 0 <= query_len <= key_len, got query_len={query_len}, "
            f"key_len={key_len}"
        )
    queries = torch.arange(key_len - query_len, key_len, device=device)  # (L,) absolute
    return causal_visibility(queries, torch.arange(key_len, device=device), window)  # (L, S)


def causal_visibility(
    query_positions: Tensor, key_positions: Tensor, window: int | None = None
) -> Tensor:
    """Which keys each query may see, from absolute positions: the rule of :func:`causal_mask`.

    Kernels that never build the whole (L, S) mask (``tiled_attention``) ask it for one tile.

    Args:
        query_positions: absolute positions of the queries.
        key_positions: absolute positions of the keys.
        window: how many positions (itself included) a query may see; None for all of them.

    Shape:
        query_positions (L,), key_positions (S,) -> (L, S).

    Returns:
        Bool tensor, True where ``key <= query`` (and ``key > query - window``).
    """
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window < 1
    ):
        raise ValueError(f"window must be None or a positive integer, got {window!r}")
    offset = query_positions[:, None] - key_positions[None, :]  # (L, S)
    visible = offset >= 0  # (L, S)
    if window is not None:
        visible &= offset < window
    return visible


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Token mask from padded ids: True for real tokens, False for padding.

    Args:
        tokens: integer ids.
        pad_id: the padding id.

    Shape:
        tokens (B, S) -> (B, S).

    Returns:
        Bool tensor, True = real token.
    """
    check_tokens("tokens", tokens)
    return tokens != pad_id  # (B, S)


def key_mask(token_mask: Tensor) -> Tensor:
    """Turn a token mask (B, S) into an attention mask over keys, (B, 1, 1, S).

    Every query may attend every real key; padded keys are hidden from all queries.
    """
    return token_mask[:, None, None, :]  # (B, 1, 1, S)
