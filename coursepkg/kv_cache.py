"""The key/value cache of incremental decoding, one per attention block and one per decoder.

It sits below :mod:`coursepkg.attention` (which writes into it) and knows nothing of models or
search algorithms, so the import order is one way: kv_cache <- attention <- fast_attention
<- layers <- model <- decoding.

Dimension legend: B batch, H heads (the key/value heads Hkv under grouped-query attention: the
cache holds only those), S cached positions, Dk/Dv per-head sizes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

__all__ = [
    "AttentionCache",
    "KVCache",
    "LayerCache",
    "SlidingWindowCache",
    "check_room",
    "preallocate",
]


def check_room(capacity: int, length: int, n_new: int) -> None:
    """Raise a ValueError when a preallocated cache holding ``length`` of its ``capacity``
    positions cannot take ``n_new`` more (every fixed-capacity cache checks this first)."""
    if length + n_new > capacity:
        raise ValueError(
            f"the cache holds at most capacity={capacity} positions; "
            f"{length} are cached and {n_new} more were given"
        )


def preallocate(k: Tensor, v: Tensor, capacity: int) -> tuple[Tensor, Tensor]:
    """Empty key and value storage for ``capacity`` positions, like ``k`` and ``v``.

    Shape:
        k (B, H, n, Dk), v (B, H, n, Dv) -> (B, H, capacity, Dk), (B, H, capacity, Dv).
    """
    b, h = k.shape[:2]
    return (
        k.new_empty(b, h, capacity, k.size(3)),  # (B, H, capacity, Dk)
        v.new_empty(b, h, capacity, v.size(3)),  # (B, H, capacity, Dv)
    )


class LayerCache(ABC):
    """The protocol of the cache of one attention block: all attention reads or writes of a
    cache, whatever its storage (every cache in :mod:`coursepkg` implements it: this module's,
    :class:`~coursepkg.mla.LatentCache`, :mod:`coursepkg.serving`'s cropped, quantized and
    paged ones). Attention never asks a cache's type.

    A new cache implements :meth:`update` and keeps ``length``; the defaults of
    :meth:`keys_after` and :meth:`fixed_kv` are a growing cache's.

    Attributes:
        length: positions already held (what a model counts new positions from).
    """

    length: int

    @abstractmethod
    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Take this call's keys and values; return the keys and values its queries attend
        over (for a growing cache: every one held, the new ones last).

        Shape:
            k (B, H, n, Dk), v (B, H, n, Dv) -> (B, H, S, Dk), (B, H, S, Dv).
        """

    def keys_after(self, n_new: int) -> int:
        """S, the keys :meth:`update` returns for ``n_new`` new positions (masks are S wide)."""
        return self.length + n_new

    def fixed_kv(self) -> tuple[Tensor, Tensor] | None:
        """The keys and values held when a call cannot change them (cross-attention's, once
        filled), so attention need not project this call's key and value inputs; None for a
        cache that takes each call's keys."""
        return None

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search reshuffles its hypotheses each step)."""
        raise NotImplementedError(f"{type(self).__name__} cannot reorder its batch rows")


class AttentionCache(LayerCache):
    """Keys and values one attention block has already computed.

    A growing cache (self-attention) appends each step's keys/values; a static cache
    (cross-attention) is filled once from the encoder output and then only read.

    Given a ``capacity`` (the longest sequence that will be decoded), a growing cache allocates
    its storage once, on the first call, and each step writes into it; without one it
    concatenates, which copies the whole cache at every step.

    Attributes:
        k: (B, H, S, Dk) or None before the first call.
        v: (B, H, S, Dv) or None before the first call.
        static: whether the cache is filled once and reused.
        capacity: most positions a growing cache holds, or None to grow without limit.
    """

    def __init__(self, static: bool = False, capacity: int | None = None) -> None:
        self.static = static
        self.capacity = capacity
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0  # number of cached key positions
        self._storage: tuple[Tensor, Tensor] | None = None  # preallocated (B, H, capacity, *)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this call's keys/values and return everything cached so far.

        Shape:
            k (B, H, n, Dk), v (B, H, n, Dv) -> (B, H, S, Dk), (B, H, S, Dv).
        """
        if self.static or (self.k is None and self.capacity is None):
            self.k, self.v = k, v
        elif self.capacity is None:
            self.k = torch.cat([self.k, k], dim=2)  # (B, H, S + n, Dk)
            self.v = torch.cat([self.v, v], dim=2)  # (B, H, S + n, Dv)
        else:
            self._write(k, v)
        self.length = self.k.size(2)
        return self.k, self.v

    def keys_after(self, n_new: int) -> int:
        """S after a call with ``n_new`` keys: a static cache's once filled, else all held."""
        if self.static:
            return n_new if self.k is None else self.length
        return self.length + n_new

    def fixed_kv(self) -> tuple[Tensor, Tensor] | None:
        """A static cache's keys and values once filled (see :class:`LayerCache`)."""
        return (self.k, self.v) if self.static and self.k is not None else None

    def _write(self, k: Tensor, v: Tensor) -> None:
        # Copy the new positions into the preallocated storage; k and v become views of it.
        start, end = self.length, self.length + k.size(2)
        check_room(self.capacity, start, k.size(2))
        if self._storage is None:
            self._storage = preallocate(k, v, self.capacity)
        k_all, v_all = self._storage
        k_all.narrow(2, start, end - start).copy_(k)
        v_all.narrow(2, start, end - start).copy_(v)
        self.k, self.v = k_all.narrow(2, 0, end), v_all.narrow(2, 0, end)  # (B, H, S + n, D*)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search reshuffles its hypotheses each step)."""
        if self.k is None:
            return
        if self._storage is not None:
            self._storage = tuple(t.index_select(0, index) for t in self._storage)
            self.k, self.v = (t[:, :, : self.length] for t in self._storage)
        else:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


class KVCache:
    """Per-layer caches of a decoder: ``self_attn[i]`` grows, ``cross_attn[i]`` is static.

    Args:
        n_layers: number of decoder layers.
        cross: whether the layers also have cross-attention (encoder-decoder models).
        capacity: longest target the growing caches will hold; given, they preallocate it.
        window: a sliding window of W positions: the growing caches are then
            :class:`SlidingWindowCache` rings of W slots (``capacity`` is not needed).
    """

    def __init__(
        self,
        n_layers: int,
        cross: bool = True,
        capacity: int | None = None,
        window: int | None = None,
    ) -> None:
        if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be None or a positive integer, got {capacity!r}")
        self.self_attn = [
            # a ring of W slots needs no capacity: it never holds more
            AttentionCache(capacity=capacity) if window is None else SlidingWindowCache(window)
            for _ in range(n_layers)
        ]
        self.cross_attn = [AttentionCache(static=True) for _ in range(n_layers)] if cross else None

    def keys_after(self, n_new: int) -> int:
        """How many keys self-attention sees once the caches take ``n_new`` more positions
        (a sliding window's ring returns only the newest ones)."""
        return self.self_attn[0].keys_after(n_new) if self.self_attn else n_new

    @property
    def length(self) -> int:
        """Number of target positions already processed."""
        return self.self_attn[0].length if self.self_attn else 0

    def reorder(self, index: Tensor) -> None:
        """Reorder the growing caches' batch rows (the static ones are identical per beam)."""
        for cache in self.self_attn:
            cache.reorder(index)


class SlidingWindowCache(LayerCache):
    """The self-attention cache of a sliding window of W positions (Mistral's rolling buffer):
    a ring of W slots, position p stored in slot p mod W, so memory stays bounded by W however
    long the generation runs.

    A query at absolute position t sees t - W + 1 ... t (``causal_mask(..., window=W)``), so the
    new positions of a step need only the W - 1 newest cached ones besides themselves.
    :meth:`update` returns those, oldest first, followed by the new ones: attending over them
    with ``causal_mask(n, S, window=W)`` equals the full cache with the window mask.

    Args:
        window: W, how many positions (itself included) a query sees.

    Attributes:
        length: number of positions seen so far (may exceed W).
        k: (B, H, W, Dk) ring of keys, or None before the first call.
        v: (B, H, W, Dv) ring of values, or None before the first call.
    """

    def __init__(self, window: int) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive integer, got {window!r}")
        self.window = window
        self.length = 0
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def keys_after(self, n_new: int) -> int:
        """How many keys :meth:`update` returns for ``n_new`` new positions."""
        return min(self.length, self.window - 1) + n_new

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this call's keys/values in the ring; return the keys/values its queries need.

        Shape:
            k (B, H, n, Dk), v (B, H, n, Dv) -> (B, H, S, Dk), (B, H, S, Dv) with
            S = min(length, W - 1) + n.
        """
        if self.k is None:
            b, h = k.shape[:2]
            self.k = k.new_zeros(b, h, self.window, k.size(3))  # (B, H, W, Dk)
            self.v = v.new_zeros(b, h, self.window, v.size(3))  # (B, H, W, Dv)
        kept = self.keys_after(0)
        slots = torch.arange(self.length - kept, self.length, device=k.device) % self.window
        keys = torch.cat([self.k.index_select(2, slots), k], dim=2)  # (B, H, kept + n, Dk)
        values = torch.cat([self.v.index_select(2, slots), v], dim=2)  # (B, H, kept + n, Dv)
        # Only the last W new positions survive in the ring; earlier ones would be overwritten.
        n = k.size(2)
        first = max(0, n - self.window)
        slots = torch.arange(self.length + first, self.length + n, device=k.device) % self.window
        self.k.index_copy_(2, slots, k[:, :, first:])
        self.v.index_copy_(2, slots, v[:, :, first:])
        self.length += n
        return keys, values

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search reshuffles its hypotheses each step)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
