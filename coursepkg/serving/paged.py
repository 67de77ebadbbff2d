"""A paged key/value cache (Kwon et al. 2023, vLLM's PagedAttention): one pool of fixed-size
blocks shared by every sequence, and a block table per sequence listing its blocks in order.

A sequence that grows past its last block gets one more block from the free list; nothing it
already holds moves (no copy when a sequence grows, unlike a contiguous cache that must be
reallocated), and a finished sequence returns its blocks for the next request. Memory is then
used by what sequences hold, not by the longest one they might reach.

For one step over a batch of sequences, :meth:`PagedKVCache.begin` fixes who takes part; the
pool then serves as the model's cache: each layer's ``update`` writes the new keys/values into
the sequences' blocks and returns them gathered into a left-padded (B, H, W, Dk) batch, with
:meth:`PagedKVCache.token_mask` hiding the padding. (A paged attention kernel reads the blocks in
place; the reference gathers them, which is the same attention and easier to read.) Rotary
positions count real tokens only, so rows of different lengths share a step.

Dimension legend: B sequences in the step, H key/value heads, W the step's widest sequence,
N blocks in the pool, Bs block size, Dk/Dv per-head sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..kv_cache import LayerCache

__all__ = ["BlockTable", "PagedKVCache"]


@dataclass
class BlockTable:
    """One sequence's place in the pool.

    Attributes:
        blocks: the pool's block ids holding positions 0..Bs-1, Bs..2Bs-1, ... in order.
        length: positions written so far.
    """

    blocks: list[int] = field(default_factory=list)
    length: int = 0


class _PagedLayer(LayerCache):
    """One layer's view of the pool, what attention calls ``update`` on."""

    def __init__(self, pool: PagedKVCache, index: int) -> None:
        self.pool, self.index = pool, index

    @property
    def length(self) -> int:
        return self.pool.length

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return self.pool.write_and_gather(self.index, k, v)


class PagedKVCache:
    """A pool of ``n_blocks`` blocks of ``block_size`` positions, for every layer.

    Args:
        n_layers: the model's layers.
        n_blocks: blocks in the pool.
        block_size: positions per block.

    Attributes:
        storage: per layer, keys and values side by side, (N * Bs + 1, H, Dk + Dv): position p
            of block b is row b * Bs + p (a "slot"), so a step writes its new rows with one
            ``index_copy_`` and reads every row's past with one ``index_select``; the last row
            is a spare slot where the padding of a batched prefill is written and never read;
            allocated once on the first write and never reallocated.
        free: ids of the blocks no sequence holds.
    """

    def __init__(self, n_layers: int, n_blocks: int, block_size: int) -> None:
        for name, x in (("n_blocks", n_blocks), ("block_size", block_size)):
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"{name} must be a positive integer, got {x!r}")
        self.n_blocks, self.block_size = n_blocks, block_size
        self.storage: list[Tensor | None] = [None] * n_layers
        self.free = list(range(n_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self.self_attn = [_PagedLayer(self, i) for i in range(n_layers)]
        self.cross_attn = None
        self.length = 0  # the step's padded past: widest sequence before the step
        self._step: PagedStep | None = None

    def blocks_for(self, positions: int) -> int:
        """Blocks needed to hold ``positions`` positions."""
        return -(-positions // self.block_size)

    def grow(self, table: BlockTable, length: int) -> None:
        """Give ``table`` blocks enough for ``length`` positions, from the free list."""
        need = self.blocks_for(length) - len(table.blocks)
        if need > len(self.free):
            raise RuntimeError(f"the pool has {len(self.free)} free blocks, {need} more are needed")
        table.blocks.extend(self.free.pop() for _ in range(max(need, 0)))

    def release(self, table: BlockTable) -> None:
        """Return a finished sequence's blocks to the free list."""
        self.free.extend(reversed(table.blocks))
        table.blocks, table.length = [], 0

    def begin(
        self,
        tables: list[BlockTable],
        n_new: int | list[int],
        device: torch.device | str | None = None,
    ) -> None:
        """Prepare a step in which each sequence of ``tables`` takes ``n_new`` more positions
        (one count for all, or one per sequence: prompts of different lengths prefilled in one
        pass, each left padded to the longest): take the blocks they need and work out, once
        for every layer, where the new positions are written (padding: to the spare slot) and
        where each row's positions are read from.

        Args:
            tables: the step's sequences.
            n_new: positions each one takes in this step (one count, or one per sequence).
            device: where the step's slots and token mask live: the model's device (default
                CPU).
        """
        counts = self._grow_all(tables, n_new)
        n = max(counts)
        self.length = max(t.length for t in tables)
        width = self.length + n
        new = torch.tensor(counts, device=device)[:, None]  # (B, 1)
        lengths = torch.tensor([t.length for t in tables], device=device)[:, None] + new  # (B, 1)
        new_pos = (
            lengths - n + torch.arange(n, device=device)
        )  # (B, n): left padding < lengths - new
        read_pos = (torch.arange(width, device=device) - (width - lengths)).clamp(
            min=0
        )  # (B, W): padding -> 0
        table = self._block_table(tables, device)  # (B, blocks)
        write = self._slots(table, new_pos.clamp(min=0))  # (B, n)
        spare = self.n_blocks * self.block_size  # the pool's one extra row, never read
        write = write.masked_fill(new_pos < lengths - new, spare)  # (B, n)
        self._step = PagedStep(
            tables,
            counts,
            write.flatten(),  # (B*n,)
            self._slots(table, read_pos).flatten(),  # (B*W,)
            torch.arange(width, device=device) >= width - lengths,  # (B, W)
        )

    def token_mask(self) -> Tensor:
        """The step's token mask, True = real position (left padded to the widest row).

        Shape:
            (B, W) with W = the widest past + n_new.
        """
        return self._step.mask

    def write_and_gather(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the step's new keys/values into the blocks; return every row's keys/values,
        left padded (padding is masked by :meth:`token_mask`); the last layer ends the step.

        Shape:
            k (B, H, n, Dk), v (B, H, n, Dv) -> (B, H, W, Dk), (B, H, W, Dv).
        """
        step, dk = self._step, k.size(3)
        if self.storage[layer] is None:
            slots, h = self.n_blocks * self.block_size + 1, k.size(1)  # + the spare row
            self.storage[layer] = k.new_zeros(slots, h, dk + v.size(3))  # (N*Bs+1, H, Dk+Dv)
        pool = self.storage[layer]
        new = torch.cat([k, v], dim=-1).transpose(1, 2).flatten(0, 1)  # (B*n, H, Dk+Dv)
        pool.index_copy_(0, step.write_slot, new)  # into the blocks
        b, width = step.mask.shape
        rows = pool.index_select(0, step.read_slot).view(b, width, -1, pool.size(-1))
        rows = rows.transpose(1, 2)  # (B, H, W, Dk+Dv): every row's past, left padded
        if layer == len(self.storage) - 1:  # every layer has written: the step is done
            for table, n in zip(step.tables, step.n_new, strict=True):
                table.length += n
        return rows[..., :dk], rows[..., dk:]  # (B, H, W, Dk), (B, H, W, Dv)

    def keys_after(self, n_new: int) -> int:
        """How many keys self-attention sees in this step (the padded width)."""
        return self.length + n_new

    def _grow_all(self, tables: list[BlockTable], n_new: int | list[int]) -> list[int]:
        # Each sequence's count (one for all, or one each; every one >= 1), its table grown by it.
        counts = [n_new] * len(tables) if isinstance(n_new, int) else list(n_new)
        if len(counts) != len(tables) or min(counts, default=0) < 1:
            raise ValueError(
                f"n_new must be one positive count per sequence ({len(tables)}), got {n_new!r}"
            )
        for table, n in zip(tables, counts, strict=True):
            self.grow(table, table.length + n)
        return counts

    def _block_table(self, tables: list[BlockTable], device: torch.device | str | None) -> Tensor:
        # The sequences' block ids as one tensor (B, blocks), the shorter rows padded with block 0.
        blocks = max(len(t.blocks) for t in tables)
        return torch.tensor(
            [t.blocks + [0] * (blocks - len(t.blocks)) for t in tables], device=device
        )  # (B, blocks)

    def _slots(self, table: Tensor, pos: Tensor) -> Tensor:
        # positions (B, *) -> their pool rows, block id * Bs + offset, via the block tables
        block = table.gather(1, pos // self.block_size)  # (B, *)
        return block * self.block_size + pos % self.block_size  # (B, *)


@dataclass
class PagedStep:
    """One step's batch: who takes part, the pool rows it writes (B*n,) and reads (B*W,),
    and its token mask (B, W)."""

    tables: list[BlockTable]
    n_new: list[int]
    write_slot: Tensor
    read_slot: Tensor
    mask: Tensor
