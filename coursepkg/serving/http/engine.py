"""The model behind ``coursepkg serve``: a checkpoint loaded with its tokenizer, and the
continuous-batching scheduler of :mod:`coursepkg.serving.scheduler` run online.

:class:`~coursepkg.serving.scheduler.ContinuousBatcher` serves a list known in advance;
:class:`OnlineBatcher` serves requests that arrive while others run. One thread owns the model
and the cache: at each step it takes in the requests that arrived (first come, first served),
admits those that fit (the scheduler's own rule: a free row and blocks for the whole length),
prefills them together, decodes one token for every running request and hands each new token to
its request's callback. A request leaves at its stop token, at ``max_new_tokens`` or when it is
cancelled (its client went away), and its blocks go back to the pool at once.

Dimension legend: B running requests, V vocabulary.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ...posttrain.chat import recorded_chat_tokenizer
from ...posttrain.trainer import base_file, load_base
from ...tokenizer import Tokenizer
from ...training.checkpoint import load_checkpoint
from ...training.data import recorded_tokenizer
from ..sampling import SamplingParams, sample_token
from ..scheduler import ContinuousBatcher, Request, Running

__all__ = ["Busy", "OnlineBatcher", "ServedModel", "Ticket", "load_served_model"]

log = logging.getLogger(__name__)

#: What a request's callback receives: a new token id (None when there is none), and the
#: reason it finished ("stop", "length", "cancelled") or None while it runs.
Emit = Callable[[int | None, str | None], None]


class Busy(RuntimeError):
    """Too many requests are in flight; the caller may retry later."""


@dataclass
class ServedModel:
    """A model ready to serve.

    Attributes:
        name: the id clients ask for (``model`` in a request).
        model: a :class:`~coursepkg.DecoderOnlyLM` with rotary positions, in eval mode.
        tokenizer: the course BPE tokenizer it was trained with (GPT-2's or a learned one).
        chat: whether the tokenizer has the chat template's special tokens (a fine-tuned model).
        stop_ids: the ids that end an answer (``<|end|>`` and ``<|endoftext|>``).
    """

    name: str
    model: nn.Module
    tokenizer: Tokenizer
    chat: bool
    stop_ids: frozenset[int]

    @property
    def context(self) -> int:
        """The model's context length (``max_len``): prompt and answer together."""
        return self.model.config.max_len


def load_served_model(path: str | Path, name: str | None = None) -> ServedModel:
    """Load a ``coursepkg train --tokenizer bpe`` (or ``--tokenizer FOLDER``: a learned BPE) or
    ``coursepkg finetune`` checkpoint, with the tokenizer its run recorded (a learned one is
    read from the run's ``tokens/`` folder, where the run keeps a copy).

    Args:
        path: the run's folder or its ``model.pt``/``checkpoint.pt``.
        name: the model's id in the API (default: the run folder's name).

    Returns:
        The :class:`ServedModel`.

    Raises:
        ValueError: a missing file, a character-level model (its vocabulary is not saved) or a
            model without rotary positions (continuous batching counts positions per request).
    """
    if not Path(path).exists():
        raise ValueError(
            f"checkpoint {str(path)!r} not found: expected a coursepkg train or finetune run "
            "folder, or its model.pt or checkpoint.pt"
        )
    file = base_file(path)
    if file.is_dir():
        raise ValueError(f"{str(path)!r} is a Hugging Face folder; serve a coursepkg checkpoint")
    tokenizer, _, chat = recorded_chat_tokenizer(file)
    if not chat:  # a pretrained model is served with its run's tokenizer alone
        tokenizer = recorded_tokenizer(load_checkpoint(file)["identity"]["tokenizer"], file)
    model, _ = load_base(file, tokenizer)
    if model.config.positional != "rope":
        raise ValueError(
            f"{str(file)!r} has positional={model.config.positional!r}; the server batches "
            "requests of different lengths, which needs rotary positions: train with "
            "--model positional=rope"
        )
    stops = [t for t in ("<|end|>", "<|endoftext|>") if t in tokenizer.special_tokens]
    label = name or (file.parent.name if file.parent.name else file.stem)
    return ServedModel(
        label,
        model.eval(),
        tokenizer,
        chat,
        frozenset(tokenizer.encode(t)[0] for t in stops),
    )


@dataclass
class Ticket:
    """One request in flight: what it asked for and where its tokens go.

    Attributes:
        prompt: the prompt's ids.
        max_new_tokens: the most tokens to generate.
        params: its sampling settings.
        emit: called from the engine's thread with each token and, last, the finish reason.
        tokens: generated so far (a stop token is not included).
        finish: why it ended, once it has.
        ignore_eos: a stop token does not end it (it is handed out like any other token).
    """

    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams
    emit: Emit
    ignore_eos: bool = False
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None
    cancelled: bool = False


class OnlineBatcher(ContinuousBatcher):
    """Continuous batching of requests that arrive while others are served (one thread).

    Args:
        model: a :class:`~coursepkg.DecoderOnlyLM` with rotary positions.
        n_blocks, block_size, max_batch: as :class:`ContinuousBatcher`.
        stop_ids: tokens that end a request (not passed to its callback).
        max_waiting: requests that may wait for a row; more get :class:`Busy`.
        generator: for sampling.

    Attributes:
        cancelled: requests cancelled before their end, since the start.
        completed: requests finished (stop or length), since the start.
    """

    def __init__(
        self,
        model: nn.Module,
        n_blocks: int,
        block_size: int = 16,
        max_batch: int = 8,
        stop_ids: frozenset[int] = frozenset(),
        max_waiting: int = 64,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(model, n_blocks, block_size, max_batch, None, generator)
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 0:
            raise ValueError(f"max_waiting must be an integer >= 0, got {max_waiting!r}")
        self.stop_ids = stop_ids
        self.max_waiting = max_waiting
        self.cancelled = self.completed = 0
        self._tickets: dict[int, Ticket] = {}
        self._arrived: deque[tuple[int, Request]] = deque()
        self._count = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="coursepkg-serve", daemon=True)

    @property
    def capacity(self) -> int:
        """Tokens (prompt and answer) one request may hold: the whole pool."""
        return self.cache.n_blocks * self.cache.block_size

    def start(self) -> None:
        """Start the engine's thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (the requests still in flight are cancelled)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    def in_flight(self) -> int:
        """Requests waiting or running."""
        with self._cond:
            return len(self._tickets)

    def submit(self, ticket: Ticket) -> None:
        """Queue ``ticket``; its callback is called from the engine's thread from now on.

        Raises:
            Busy: ``max_batch + max_waiting`` requests are in flight already.
            ValueError: the request cannot fit in the pool.
        """
        request = Request(torch.tensor(ticket.prompt, dtype=torch.long), ticket.max_new_tokens)
        self._check([request])
        with self._cond:
            if len(self._tickets) >= self.max_batch + self.max_waiting:
                raise Busy(
                    f"{len(self._tickets)} requests are in flight, the most this server takes "
                    f"(max_batch={self.max_batch} running + max_waiting={self.max_waiting})"
                )
            index, self._count = self._count, self._count + 1
            self._tickets[index] = ticket
            self._arrived.append((index, request))
            self._cond.notify()

    def cancel(self, ticket: Ticket) -> None:
        """Cancel ``ticket`` (its client went away): it leaves at the next step, blocks freed."""
        with self._cond:
            ticket.cancelled = True
            self._cond.notify()

    def _loop(self) -> None:
        waiting: deque[tuple[int, Request]] = deque()
        running: list[Running] = []
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not (self._closing or self._arrived or waiting or running):
                        self._cond.wait()
                    if self._closing:
                        break
                    waiting.extend(self._arrived)
                    self._arrived.clear()
                waiting = deque(w for w in waiting if not self._dropped(w[0]))
                try:
                    running = self._step(waiting, running)
                except Exception:  # a bug must not hang every client: end them all
                    log.exception("the serving step failed; ending the requests in flight")
                    for index, _ in waiting:
                        self._end(index, "error")
                    for seq in running:
                        self.cache.release(seq.table)
                        self._end(seq.index, "error")
                    waiting, running = deque(), []
        for index, _ in waiting:
            self._end(index, "cancelled")
        for seq in running:
            self._end(seq.index, "cancelled")

    def _step(self, waiting: deque, running: list[Running]) -> list[Running]:
        # One step: the requests admitted now are prefilled (their first token), then every
        # running request decodes one token; each new token is handed out exactly once.
        admitted = self._admit(waiting, running)
        if admitted:
            self._prefill(admitted)
            self.peak_running = max(self.peak_running, len(running) + len(admitted))
            running = running + self._hand_out(admitted)
        if running:
            self._decode(running)
            running = self._hand_out(running)
        return running

    def _dropped(self, index: int) -> bool:
        # a waiting request whose client left: it never takes a row
        if self._tickets[index].cancelled:
            self._end(index, "cancelled")
            return True
        return False

    def _hand_out(self, running: list[Running]) -> list[Running]:
        # Each running request's newest token goes to its callback; those done leave.
        still = []
        for seq in running:
            ticket = self._tickets[seq.index]
            token = seq.tokens[-1]
            reason = None
            if ticket.cancelled:
                reason = "cancelled"
            elif token in self.stop_ids and not ticket.ignore_eos:
                reason = "stop"
            else:
                ticket.tokens.append(token)
                ticket.emit(token, None)
                if len(seq.tokens) >= seq.request.max_new_tokens:
                    reason = "length"
            if reason is None:
                still.append(seq)
            else:
                self.cache.release(seq.table)
                self._end(seq.index, reason)
        return still

    def _end(self, index: int, reason: str) -> None:
        with self._cond:
            ticket = self._tickets.pop(index)
        ticket.finish = reason
        if reason == "cancelled":
            self.cancelled += 1
        elif reason in ("stop", "length"):
            self.completed += 1
        ticket.emit(None, reason)

    def _pick(self, logits: Tensor, seqs: list[Running]) -> Tensor:
        # (B, V) -> (B,): each request with its own sampling settings
        params = [self._tickets[s.index].params for s in seqs]
        if all(p.greedy and p.repetition_penalty is None for p in params):
            return logits.argmax(dim=-1)  # (B,)
        picks = []
        for row, seq, p in zip(logits, seqs, params, strict=True):
            seen = None
            if p.repetition_penalty is not None:
                done = torch.tensor(seq.tokens, dtype=torch.long)  # (T,)
                seen = torch.cat([seq.request.prompt, done])[None].to(row.device)  # (1, T')
            picks.append(sample_token(row[None], seen, p, self.generator))
        return torch.cat(picks)  # (B,)
