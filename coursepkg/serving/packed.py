"""Continuous batching with one forward pass per step: the requests admitted in a step are
prefilled inside the decode step, their tokens packed beside the running requests' (Orca's
selective batching, Yu et al. 2022; vLLM and Sarathi-Serve's mixed prefill/decode batches).

:class:`~.scheduler.ContinuousBatcher` is the plain scheduler the book shows: a step that
admits requests runs one extra pass, their prefill, before the decode step. On a small model a
pass costs about the same whatever it holds (its time goes on calling the layers, not on
arithmetic), so on a mixed workload, where a finished request lets in about one new one at a
time, those extra passes are a large part of the work (``benchmarks/serve.py``). Here a step is
one pass over every running request's new tokens laid end to end, (1, T): one token for each
request already decoding, the whole prompt for each admitted one. No row is padded; the
projections and the MLP see T tokens; attention gathers each request's keys from the pool, end
to end too, (1, H, S, Dk), and a block-diagonal causal mask (T, S) keeps every token within its
own request. That mask is a :class:`~coursepkg.masks.PackedMask`, which also knows each
request's run, so the models' fast attention scores each request against its own keys only
(read densely, most of the T x S scores would be between two requests and thrown away). Each
request's tokens still equal what it gets served alone (``tests/serving/test_packed.py``).

Dimension legend: B running requests, T new tokens in the step (all of them, end to end),
S keys the step sees (every request's past and new positions, end to end), V vocabulary.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

from ..masks import PackedMask
from .paged import BlockTable, PagedKVCache, PagedStep
from .scheduler import ContinuousBatcher, Request, Running

__all__ = ["PackedBatcher", "PackedPagedKVCache"]


class PackedPagedKVCache(PagedKVCache):
    """The paged cache, with steps whose rows are packed end to end instead of left padded.

    :meth:`begin_packed` sets a step of one row of T new tokens; each layer's ``update`` then
    writes them into their requests' blocks and returns every request's keys/values end to end
    as one row of S; :meth:`attn_mask` and :meth:`positions` are what the model needs for it.
    """

    def begin_packed(
        self,
        tables: list[BlockTable],
        n_new: list[int],
        device: torch.device | str | None = None,
    ) -> None:
        """Prepare a packed step in which sequence i of ``tables`` takes ``n_new[i]`` more
        positions: take the blocks they need, and work out once for every layer where each new
        token is written, where each key is read from, who may attend to what and at which
        position each new token sits.

        Args:
            tables: the step's sequences.
            n_new: positions each one takes (1 for a decoding request, its prompt's length
                for one being prefilled).
            device: where the step's indices and mask live (default CPU).
        """
        counts = self._grow_all(tables, n_new)
        past = [t.length for t in tables]
        mask = PackedMask(counts, [p + n for p, n in zip(past, counts, strict=True)], device)
        seq_t, pos_t = mask.query_request, mask.query_position  # (T,): request, position
        seq_k, pos_k = mask.key_request, mask.key_position  # (S,)
        table = self._block_table(tables, device)  # (B, blocks)
        n_keys = seq_k.numel()
        self.length = n_keys - seq_t.numel()  # so that keys_after(T) = S
        self._packed = mask
        self._step = PagedStep(
            tables,
            counts,
            self._slots(table[seq_t], pos_t[:, None])[:, 0],  # (T,)
            self._slots(table[seq_k], pos_k[:, None])[:, 0],  # (S,)
            torch.ones(1, n_keys, dtype=torch.bool, device=device),  # (1, S): one row, no padding
        )

    def attn_mask(self) -> PackedMask:
        """The packed step's mask: its ``dense`` (T, S), True = may attend, lets a new token see
        its own request's keys up to its own position; it knows each request's run, so the
        models' fast attention scores each request against its own keys only."""
        return self._packed

    def positions(self) -> Tensor:
        """Each new token's position within its own request (what rotary positions turn by).

        Shape:
            (T,).
        """
        return self._packed.query_position


class PackedBatcher(ContinuousBatcher):
    """:class:`~.scheduler.ContinuousBatcher` with one forward pass per step: the prompts of
    the requests admitted in a step go into the decode step, packed with the running requests'
    last tokens (see the module's docstring for why this is faster on a small model).

    Same arguments and attributes; :attr:`prefills` stays 0 (no pass is a prefill alone).
    """

    pool_class = PackedPagedKVCache

    def _serve(self, requests: list[Request]) -> list[Tensor]:
        waiting = deque(enumerate(requests))
        running: list[Running] = []
        outputs: list[Tensor | None] = [None] * len(requests)
        self.steps = self.peak_running = self.prefills = 0
        while waiting or running:
            running += self._admit(waiting, running)  # their prompts join this step
            self.peak_running = max(self.peak_running, len(running))
            if any(not s.tokens for s in running):  # a prompt to prefill: pack the step
                self._packed_step(running)
            else:  # decoding only: the plain step, one token per row
                self._decode(running)
            running = self._leave(running, outputs)
        return outputs

    def _packed_step(self, running: list[Running]) -> None:
        # One pass: the prompt of each request not yet prefilled, the others' last token.
        news = [
            torch.tensor(s.tokens[-1:]) if s.tokens else s.request.prompt for s in running
        ]  # (n_i,) each: L_i or 1
        counts = [x.numel() for x in news]
        tokens = torch.cat([x.to(self.device) for x in news])[None]  # (1, T)
        self.cache.begin_packed([s.table for s in running], counts, self.device)
        logits = self.model(
            tokens,
            cache=self.cache,
            positions=self.cache.positions()[None],  # (1, T)
            attn_mask=self.cache.attn_mask(),  # (T, S)
        )  # (1, T, V)
        last = torch.cumsum(torch.tensor(counts, device=self.device), 0) - 1  # (B,)
        picks = self._pick(logits[0, last], running).tolist()  # (B, V) -> B ids
        for seq, token in zip(running, picks, strict=True):
            seq.tokens.append(token)
        self.steps += 1
