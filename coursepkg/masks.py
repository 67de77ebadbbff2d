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


def segment_positions(segments: Tensor) -> Tensor:
    """Each token's position within its segment (0 at every segment's first token).

    Shape:
        segments (B, W) -> (B, W) long.
    """
    index = torch.arange(segments.size(1), device=segments.device).expand_as(segments)  # (B, W)
    changed = torch.ones_like(segments, dtype=torch.bool)  # (B, W)
    changed[:, 1:] = segments[:, 1:] != segments[:, :-1]
    starts = torch.where(changed, index, torch.zeros_like(index)).cummax(dim=1).values  # (B, W)
    return index - starts  # (B, W)


class PackedMask:
    """The mask of requests packed end to end in one row, as a serving step that prefills some
    requests while it decodes others lays them out: a small structure a model takes as its
    ``attn_mask`` (:meth:`coursepkg.DecoderOnlyLM.forward`) and passes to every attention.

    ``dense`` is the bool (T, S) mask, True = may attend, in which each request's new tokens
    see its own keys up to their own position and nothing of the other requests': any
    attention may use it as its mask (:func:`as_mask` gives it). The rest says where each
    request's tokens and keys lie, which the models' attention reads to score each request
    against its own keys only (:class:`~coursepkg.fast_attention.FastMultiHeadAttention`: the
    dense mask spends most of its scores between tokens and keys of two different requests).

    Args:
        n_new: each request's new tokens, in order (its run of T: 1 for a request being
            decoded, a prompt's length for one being prefilled).
        n_keys: each request's keys, past and new, in order (its run of S); at least its
            ``n_new``.
        device: where the mask and its indices live.

    Attributes:
        dense: bool (T, S) with T = sum(n_new), S = sum(n_keys).
        query_request, query_position: (T,) which request each new token belongs to and its
            position in it.
        key_request, key_position: (S,) the same for each key.
    """

    def __init__(
        self,
        n_new: list[int],
        n_keys: list[int],
        device: torch.device | str | None = None,
    ) -> None:
        n_new, n_keys = list(n_new), list(n_keys)
        if len(n_new) != len(n_keys) or not n_new or min(n_new) < 1:
            raise ValueError(
                f"n_new must be one positive count per request, as many as n_keys "
                f"({len(n_keys)}), got {n_new!r}"
            )
        if any(k < n for n, k in zip(n_new, n_keys, strict=True)):
            raise ValueError(f"each of n_keys must be at least its n_new, got {n_keys!r}")
        new = torch.tensor(n_new, device=device)  # (B,)
        keys = torch.tensor(n_keys, device=device)  # (B,)
        rows = torch.arange(len(n_new), device=device)  # (B,)
        # which request each new token and each key belongs to, and its position in it: the
        # requests end to end are segments, as in packed training windows
        q_req = torch.repeat_interleave(rows, new)  # (T,)
        k_req = torch.repeat_interleave(rows, keys)  # (S,)
        q_pos = (keys - new)[q_req] + segment_positions(q_req[None])[0]  # (T,): after the past
        k_pos = segment_positions(k_req[None])[0]  # (S,)
        self.dense = (q_req[:, None] == k_req) & (k_pos <= q_pos[:, None])  # (T, S)
        self.n_new, self.n_keys = n_new, n_keys
        self.query_request, self.query_position = q_req, q_pos
        self.key_request, self.key_position = k_req, k_pos
        self._one_token: tuple[Tensor, Tensor, Tensor] | None = None

    def runs(self) -> list[tuple[int, int, int, int]]:
        """Each request's run of new tokens and of keys: ``(q_start, q_end, k_start, k_end)``,
        so that its tokens are ``[q_start, q_end)`` of T and see ``[k_start, k_end)`` of S, the
        last ``q_end - q_start`` of them being their own keys (a causal mask aligned
        bottom-right, :func:`causal_mask`)."""
        q = k = 0
        spans = []
        for n, s in zip(self.n_new, self.n_keys, strict=True):
            spans.append((q, q + n, k, k + s))
            q, k = q + n, k + s
        return spans

    def one_token_rows(self) -> tuple[Tensor, Tensor, Tensor]:
        """The requests with one new token (those being decoded) as a left-padded batch, what a
        decode step attends over: where each one's token lies in T, where its keys lie in S
        (left padded with its first key) and which of them are real. Worked out once per mask.

        Shape:
            -> (Bd,), (Bd, W), (Bd, 1, 1, W), with Bd such requests and W the most keys one
            of them has.
        """
        if self._one_token is None:
            device = self.query_request.device
            spans = [r for r in self.runs() if r[1] - r[0] == 1]
            width = max((k1 - k0 for _, _, k0, k1 in spans), default=0)
            start = torch.tensor([k1 - width for *_, k1 in spans], device=device, dtype=torch.long)
            first = torch.tensor([k0 for _, _, k0, _ in spans], device=device, dtype=torch.long)
            keys = start[:, None] + torch.arange(width, device=device)  # (Bd, W)
            real = keys >= first[:, None]  # (Bd, W): left padding is False
            self._one_token = (
                torch.tensor([q0 for q0, _, _, _ in spans], device=device, dtype=torch.long),
                torch.where(real, keys, first[:, None]),  # (Bd, W): padding reads its first key
                real[:, None, None, :],  # (Bd, 1, 1, W)
            )
        return self._one_token


def as_mask(mask: Tensor | PackedMask | None) -> Tensor | None:
    """The boolean mask tensor of ``mask``: a :class:`PackedMask`'s ``dense``, else ``mask``."""
    return mask.dense if isinstance(mask, PackedMask) else mask
