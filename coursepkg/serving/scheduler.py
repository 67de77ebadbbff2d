"""Continuous batching (Yu et al. 2022, Orca's iteration-level scheduling) over the paged cache
of :mod:`.paged`, and the two ways it is measured against: static batches and one request at a
time.

Static batching pads a batch of requests together and runs it until its longest request is done:
a request that finishes early holds its row idle, and a waiting request cannot start. The
scheduler instead decides at every step: a finished request leaves the batch and returns its
blocks, and the next waiting request (first come, first served: never reordered) is admitted as
soon as a row and enough blocks for its whole length are free, so it can never run out of cache
halfway. The requests admitted in one step are prefilled in one pass, their prompts left padded
together (:meth:`~.paged.PagedKVCache.begin` with a count per row: the padding is written to the
pool's spare slot), instead of one pass each. Each request's tokens equal what it gets served alone
(``tests/serving/test_scheduler.py``).

Dimension legend: B running requests, L prompt length, V vocabulary.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .generate import generate
from .paged import BlockTable, PagedKVCache
from .sampling import SamplingParams, sample_token

__all__ = ["ContinuousBatcher", "Request", "serve_one_at_a_time", "serve_static_batches"]


@dataclass
class Request:
    """A prompt and how many tokens to generate for it.

    Attributes:
        prompt: (L,) token ids.
        max_new_tokens: tokens to generate (at least 1).
    """

    prompt: Tensor
    max_new_tokens: int


@dataclass
class Running:
    """A request being served: its place in the input, its block table, its tokens so far."""

    index: int
    request: Request
    table: BlockTable
    tokens: list[int] = field(default_factory=list)  # generated so far


class ContinuousBatcher:
    """Serve requests with at most ``max_batch`` running at once over a pool of blocks.

    Args:
        model: a :class:`~coursepkg.DecoderOnlyLM` with rotary positions (rows of different
            lengths share a step; a position table would count from the padded width).
        n_blocks: blocks in the paged cache.
        block_size: positions per block.
        max_batch: most requests decoded together.
        params: sampling settings (default greedy).
        generator: for sampling.

    Attributes:
        steps: decode steps of the last :meth:`run` (prefills not counted).
        prefills: prefill passes of the last :meth:`run`: the requests admitted in one step
            share one (their prompts left padded together).
        peak_running: most requests running together in the last :meth:`run`.
    """

    pool_class = PagedKVCache  # the cache it builds (a subclass may serve another)

    def __init__(
        self,
        model: nn.Module,
        n_blocks: int,
        block_size: int = 16,
        max_batch: int = 8,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if model.config.positional != "rope":
            raise ValueError(
                "model must use positional='rope' for continuous batching (positions counted "
                f"per sequence), got positional={model.config.positional!r}"
            )
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.model = model
        # the prompts and the cache's indices go to the model's device
        self.device = next(model.parameters()).device
        self.cache = self.pool_class(model.config.n_layers, n_blocks, block_size)
        self.max_batch = max_batch
        self.params = SamplingParams() if params is None else params
        self.generator = generator
        self.steps = self.peak_running = self.prefills = 0

    def _check(self, requests: list[Request]) -> None:
        for i, r in enumerate(requests):
            n, new = r.prompt.numel(), r.max_new_tokens
            if r.prompt.dim() != 1 or n == 0 or not isinstance(new, int) or new < 1:
                raise ValueError(
                    f"request {i}: prompt must be non-empty (L,) ids and max_new_tokens >= 1, "
                    f"got shape {tuple(r.prompt.shape)} and {new!r}"
                )
            need = self.cache.blocks_for(n + new)
            if need > self.cache.n_blocks:
                raise ValueError(
                    f"request {i} is longer than the cache can hold: prompt {n} + "
                    f"max_new_tokens {new} needs {need} blocks of {self.cache.block_size}, "
                    f"the cache has n_blocks={self.cache.n_blocks}"
                )

    def run(self, requests: list[Request]) -> list[Tensor]:
        """Serve ``requests``; return each one's prompt and generated tokens, in their order.

        Shape:
            request i's prompt (L_i,) -> output i (L_i + max_new_tokens_i,).
        """
        self._check(requests)
        with torch.inference_mode():
            outputs = self._serve(requests)
        return [out.clone() for out in outputs]  # plain tensors again, usable with autograd

    def _serve(self, requests: list[Request]) -> list[Tensor]:
        waiting = deque(enumerate(requests))
        running: list[Running] = []
        outputs: list[Tensor | None] = [None] * len(requests)
        self.steps = self.peak_running = self.prefills = 0
        while waiting or running:
            admitted = self._admit(waiting, running)
            if admitted:
                self._prefill(admitted)
                running += admitted
            self.peak_running = max(self.peak_running, len(running))
            running = self._leave(running, outputs)  # a last token from the prefill: done now
            if running:
                self._decode(running)
                running = self._leave(running, outputs)  # a freed row is offered at once
        return outputs

    def _admit(self, waiting: deque, running: list[Running]) -> list[Running]:
        # The waiting requests that take a free row now: in arrival order (never reordered),
        # each only when the pool can still give it blocks for its whole length.
        admitted: list[Running] = []
        while waiting and len(running) + len(admitted) < self.max_batch:
            index, request = waiting[0]
            free = len(self.cache.free) - self._promised(running + admitted)
            if self._blocks(request) > free:
                break
            waiting.popleft()
            admitted.append(Running(index, request, BlockTable()))
        return admitted

    def _leave(self, running: list[Running], outputs: list) -> list[Running]:
        # The requests with all their tokens leave (their blocks back to the pool); the rest.
        still = []
        for seq in running:
            if len(seq.tokens) < seq.request.max_new_tokens:
                still.append(seq)
            else:
                self._finish(seq, outputs)
        return still

    def _prefill(self, seqs: list[Running]) -> None:
        # The prompts admitted in one step, left padded into one pass; each row's padding is
        # masked and written to the pool's spare slot, so its cache holds its prompt only.
        lengths = [s.request.prompt.numel() for s in seqs]
        prompts = torch.zeros(
            len(seqs), max(lengths), dtype=torch.long, device=self.device
        )  # (B, L) padding id 0
        for row, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
            prompts[row, prompts.size(1) - n :] = s.request.prompt
        self.cache.begin([s.table for s in seqs], lengths, self.device)
        logits = self.model(prompts, token_mask=self.cache.token_mask(), cache=self.cache)
        for seq, token in zip(seqs, self._pick(logits[:, -1], seqs).tolist(), strict=True):
            seq.tokens.append(token)
        self.prefills += 1

    def _decode(self, running: list[Running]) -> None:
        last = torch.tensor([[s.tokens[-1]] for s in running], device=self.device)  # (B, 1)
        self.cache.begin([s.table for s in running], 1, self.device)
        logits = self.model(last, token_mask=self.cache.token_mask(), cache=self.cache)
        for seq, token in zip(running, self._pick(logits[:, -1], running).tolist(), strict=True):
            seq.tokens.append(token)
        self.steps += 1

    def _pick(self, logits: Tensor, seqs: list[Running]) -> Tensor:
        # (B, V) -> (B,); the repetition penalty needs each row's own history
        if self.params.repetition_penalty is None:
            return sample_token(logits, None, self.params, self.generator)
        picks = []
        for row, s in zip(logits, seqs, strict=True):
            done = torch.tensor(s.tokens, dtype=torch.long)  # (T,)
            seen = torch.cat([s.request.prompt, done.to(s.request.prompt.device)]).to(row.device)
            picks.append(sample_token(row[None], seen[None], self.params, self.generator))
        return torch.cat(picks)  # (B,)

    def _blocks(self, request: Request) -> int:
        # blocks a request needs for its whole length, reserved when it is admitted
        return self.cache.blocks_for(request.prompt.numel() + request.max_new_tokens)

    def _promised(self, running: list[Running]) -> int:
        # blocks reserved by running requests and not yet taken from the free list
        return sum(self._blocks(s.request) - len(s.table.blocks) for s in running)

    def _finish(self, seq: Running, outputs: list) -> None:
        prompt = seq.request.prompt  # the output lives where its prompt does
        outputs[seq.index] = torch.cat([prompt, torch.tensor(seq.tokens, device=prompt.device)])
        self.cache.release(seq.table)


def serve_static_batches(
    model: nn.Module, requests: list[Request], batch_size: int
) -> list[Tensor]:
    """The baseline: requests in order, ``batch_size`` at a time, left padded together and run
    until the batch's longest request is done; each output is cut to its own length.

    Returns:
        each request's prompt and generated tokens, greedy, in the requests' order.
    """
    outputs = []
    for start in range(0, len(requests), batch_size):
        group = requests[start : start + batch_size]
        width = max(r.prompt.numel() for r in group)
        device = group[0].prompt.device
        tokens = torch.zeros(len(group), width, dtype=torch.long, device=device)  # (B, L) pad 0
        mask = torch.zeros(len(group), width, dtype=torch.bool, device=device)  # (B, L)
        for row, r in enumerate(group):
            tokens[row, width - r.prompt.numel() :] = r.prompt
            mask[row, width - r.prompt.numel() :] = True
        longest = max(r.max_new_tokens for r in group)
        out = generate(model, tokens, longest, token_mask=mask)  # (B, L + longest)
        for row, r in enumerate(group):
            n = r.prompt.numel()
            outputs.append(out[row, width - n : width + r.max_new_tokens])
    return outputs


def serve_one_at_a_time(model: nn.Module, requests: list[Request]) -> list[Tensor]:
    """The other baseline: each request alone, greedy, in order."""
    return [generate(model, r.prompt[None], r.max_new_tokens)[0] for r in requests]
