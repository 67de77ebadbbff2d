"""A key/value cache that can be cut back: what speculative decoding needs when the target
rejects some of the draft's tokens (their keys and values must be forgotten).

It offers what :class:`~coursepkg.DecoderOnlyLM`'s ``forward`` reads from a cache (``length``,
``keys_after``, one growing layer cache per layer in ``self_attn``), so the model runs on it
unchanged. Storage is allocated once for ``capacity`` positions; :meth:`CroppableCache.crop`
only moves the end marker back, nothing is copied.

Dimension legend: B batch, H key/value heads, S cached positions, Dk/Dv per-head sizes.
"""

from __future__ import annotations

from torch import Tensor

from ..kv_cache import LayerCache, check_room, preallocate

__all__ = ["CroppableCache", "CroppableLayerCache"]


class CroppableLayerCache(LayerCache):
    """One attention block's keys and values in preallocated storage of ``capacity`` positions.

    Args:
        capacity: the most positions it will hold.

    Attributes:
        length: positions held.
        k: (B, H, length, Dk) view of the storage, or None before the first call.
        v: (B, H, length, Dv) view of the storage, or None before the first call.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.length = 0
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.storage: tuple[Tensor, Tensor] | None = None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this call's keys/values; return all held so far.

        Shape:
            k (B, H, n, Dk), v (B, H, n, Dv) -> (B, H, S, Dk), (B, H, S, Dv).
        """
        check_room(self.capacity, self.length, k.size(2))
        if self.storage is None:
            self.storage = self._allocate(k, v)
        self._store(self.length, k, v)
        self.length += k.size(2)
        self._views()
        return self.k, self.v

    def _allocate(self, k: Tensor, v: Tensor) -> tuple:
        # the storage for ``capacity`` positions (a subclass may store another way)
        return preallocate(k, v, self.capacity)

    def _store(self, start: int, k: Tensor, v: Tensor) -> None:
        # this call's keys/values into the storage from position ``start`` on
        for store, new in zip(self.storage, (k, v), strict=True):
            store.narrow(2, start, new.size(2)).copy_(new)

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on."""
        self.length = min(self.length, length)
        if self.storage is not None:
            self._views()

    def _views(self) -> None:
        self.k, self.v = (t.narrow(2, 0, self.length) for t in self.storage)  # (B, H, S, D*)

    def bytes_held(self) -> int:
        """Bytes of the storage (allocated for ``capacity`` positions)."""
        if self.storage is None:
            return 0
        return sum(t.numel() * t.element_size() for t in _flat(self.storage))


def _flat(items) -> list[Tensor]:
    # the tensors of a (possibly nested) tuple
    if isinstance(items, Tensor):
        return [items]
    return [t for item in items for t in _flat(item)]


class CroppableCache:
    """A decoder's per-layer :class:`CroppableLayerCache` s, all of one length.

    Args:
        n_layers: the model's number of layers.
        capacity: the most positions any layer will hold.
    """

    layer_cache = CroppableLayerCache  # what each layer holds (a subclass may quantize)

    def __init__(self, n_layers: int, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self.self_attn = [self.layer_cache(capacity) for _ in range(n_layers)]
        self.cross_attn = None

    @property
    def length(self) -> int:
        """Positions already processed."""
        return self.self_attn[0].length if self.self_attn else 0

    def keys_after(self, n_new: int) -> int:
        """How many keys self-attention sees once the cache takes ``n_new`` more."""
        return self.length + n_new

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on, in every layer (no copy)."""
        for layer in self.self_attn:
            layer.crop(length)
