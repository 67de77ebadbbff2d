"""The HTTP side of ``coursepkg serve``: OpenAI's chat and completion endpoints on FastAPI, with
:class:`~.engine.OnlineBatcher` underneath, and a chat page at ``/``.

``POST /v1/chat/completions`` and ``POST /v1/completions`` answer at once or, with
``"stream": true``, as server-sent events (``data: {chunk}`` lines, then ``data: [DONE]``), the
shapes OpenAI's clients read. ``GET /v1/models`` lists the one model; ``GET /health`` says what
the engine holds. Every error is OpenAI's error object naming what was wrong; a full server
answers 429 with ``Retry-After``; a client that goes away has its request cancelled, so its row
and blocks go to the next one.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from ...posttrain.chat import render_chat
from ..sampling import SamplingParams
from .engine import Busy, OnlineBatcher, ServedModel, Ticket
from .protocol import ApiError, ChatRequest, CompletionRequest, error_body

__all__ = ["create_app"]

#: Seconds a client told "too many requests" is asked to wait before trying again.
RETRY_AFTER = 1


def create_app(served: ServedModel, engine: OnlineBatcher) -> FastAPI:
    """The FastAPI application serving ``served`` through ``engine`` (started with the app).

    Args:
        served: the model, its tokenizer and name.
        engine: the scheduler built on ``served.model``.

    Returns:
        The application (run it with uvicorn).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        engine.close()

    app = FastAPI(title="coursepkg serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    _errors(app)
    page = resources.files(__package__).joinpath("chat.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> str:
        return page

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": served.name, "object": "model", "created": 0, "owned_by": "coursepkg"}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "in_flight": engine.in_flight(),
            "free_blocks": len(engine.cache.free),
            "n_blocks": engine.cache.n_blocks,
            "completed": engine.completed,
            "cancelled": engine.cancelled,
        }

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        if not body.messages:
            raise ApiError(400, "messages is empty: send at least one message", "messages")
        turns = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in body.messages
        ]
        prompt = served.tokenizer.encode(render_chat(turns, add_generation_prompt=True))
        return await _answer(served, engine, body, prompt, request, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        if not body.prompt:
            raise ApiError(400, "prompt is empty: send at least one character", "prompt")
        prompt = served.tokenizer.encode(body.prompt)
        return await _answer(served, engine, body, prompt, request, chat=False)

    return app


def _errors(app: FastAPI) -> None:
    """Every error as OpenAI's error object."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        body = error_body(err.message, err.kind, err.param, err.code)
        return JSONResponse(body, status_code=err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        if first["type"] == "json_invalid":
            reason = first.get("ctx", {}).get("error", first.get("msg"))
            at = first["loc"][-1] if first.get("loc") else "?"
            message = f"the request body is not valid JSON: {reason} at character {at}"
            return JSONResponse(
                error_body(message, "invalid_request_error", None, "invalid_json"), 400
            )
        where = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
        message = f"{where}: {first['msg']}"
        if "input" in first and first["type"] != "missing":
            message += f" (got {json.dumps(first['input'], default=str)[:80]})"
        return JSONResponse(error_body(message, "invalid_request_error", where, None), 400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {err.detail}"
        return JSONResponse(
            error_body(message, "invalid_request_error", None, None), err.status_code
        )


def _ticket(
    served: ServedModel, engine: OnlineBatcher, body: Any, prompt: list[int], emit
) -> Ticket:
    """The request as the engine takes it, or the error naming why it cannot be served."""
    if body.model != served.name:
        raise ApiError(
            404,
            f"the model {body.model!r} does not exist; this server serves {served.name!r}",
            "model",
            "model_not_found",
        )
    if body.stop:
        raise ApiError(
            400,
            f"stop sequences are not supported (got stop={body.stop!r}); an answer ends at the "
            "model's end-of-turn token or at max_tokens",
            "stop",
        )
    n, context = len(prompt), served.context
    if n >= context:
        raise ApiError(
            400,
            f"the prompt has {n} tokens; the model's context is {context} tokens, which must "
            "hold the prompt and at least one token of answer",
            "messages" if hasattr(body, "messages") else "prompt",
            "context_length_exceeded",
        )
    if n >= engine.capacity:
        raise ApiError(
            400,
            f"the prompt has {n} tokens, more than the server's cache holds "
            f"({engine.capacity} tokens)",
            "messages" if hasattr(body, "messages") else "prompt",
            "cache_capacity_exceeded",
        )
    limit = body.token_limit()
    if limit is None:
        limit = min(context, engine.capacity) - n
    elif n + limit > context:
        raise ApiError(
            400,
            f"max_tokens={limit} with the prompt's {n} tokens is {n + limit} tokens, beyond "
            f"the model's context of {context} (at most {context - n} here)",
            "max_tokens",
            "context_length_exceeded",
        )
    elif n + limit > engine.capacity:
        raise ApiError(
            400,
            f"max_tokens={limit} with the prompt's {n} tokens is {n + limit} tokens, more than "
            f"the server's cache holds ({engine.capacity} tokens)",
            "max_tokens",
            "cache_capacity_exceeded",
        )
    top_p = body.top_p if body.top_p < 1 else None
    params = SamplingParams(temperature=body.temperature, top_p=top_p)
    return Ticket(prompt, limit, params, emit, ignore_eos=body.ignore_eos)


async def _answer(
    served: ServedModel,
    engine: OnlineBatcher,
    body: ChatRequest | CompletionRequest,
    prompt: list[int],
    request: Request,
    chat: bool,
) -> Any:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int | None, str | None]] = asyncio.Queue()

    def emit(token: int | None, reason: str | None) -> None:  # from the engine's thread
        if not loop.is_closed():
            loop.call_soon_threadsafe(queue.put_nowait, (token, reason))

    ticket = _ticket(served, engine, body, prompt, emit)
    try:
        engine.submit(ticket)
    except Busy as err:
        raise ApiError(
            429,
            f"the server is busy: {err}; retry after {RETRY_AFTER} s",
            None,
            "rate_limit_exceeded",
            "rate_limit_error",
            {"Retry-After": str(RETRY_AFTER)},
        ) from None
    reply = _Reply(served, body.model, chat, len(prompt))
    if body.stream:
        return StreamingResponse(
            _stream(engine, ticket, queue, reply),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    try:
        while ticket.finish is None:
            try:
                await asyncio.wait_for(queue.get(), timeout=0.5)
            except TimeoutError:
                if await request.is_disconnected():
                    break
        if ticket.finish not in ("stop", "length"):
            raise ApiError(
                500, f"the request ended with {ticket.finish!r}", None, None, "server_error"
            )
    finally:
        if ticket.finish is None:
            engine.cancel(ticket)
    return reply.whole(ticket)


async def _stream(
    engine: OnlineBatcher, ticket: Ticket, queue: asyncio.Queue, reply: _Reply
) -> AsyncIterator[str]:
    """Server-sent events: a first chunk (the role), one per piece of text, the finish, [DONE]."""
    try:
        yield _event(reply.chunk("", None, first=True))
        while True:
            token, reason = await queue.get()
            if token is not None:
                delta = reply.text.add(token)
                if delta:
                    yield _event(reply.chunk(delta, None))
            if reason is not None:
                break
        if reason not in ("stop", "length"):
            body = error_body(f"the request ended with {reason!r}", "server_error", None, None)
            yield _event(body)
        else:
            rest = reply.text.flush()
            if rest:
                yield _event(reply.chunk(rest, None))
            yield _event(reply.chunk("", reason))
        yield "data: [DONE]\n\n"
    finally:  # the client went away (the task is cancelled) or the stream ended
        if ticket.finish is None:
            engine.cancel(ticket)


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class _Text:
    """Text from tokens as they come: byte-level BPE can split a character across tokens, so a
    piece ending in an incomplete character waits for the next token."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.ids, self.sent = tokenizer, [], ""

    def add(self, token: int) -> str:
        self.ids.append(token)
        full = self.tokenizer.decode(self.ids)
        if full.endswith("\ufffd"):
            return ""
        delta, self.sent = full[len(self.sent) :], full
        return delta

    def flush(self) -> str:
        full = self.tokenizer.decode(self.ids)
        delta, self.sent = full[len(self.sent) :], full
        return delta


class _Reply:
    """The response objects of one request, chat or completion, whole or in chunks."""

    def __init__(self, served: ServedModel, model: str, chat: bool, prompt_tokens: int) -> None:
        self.served, self.model, self.chat, self.prompt_tokens = served, model, chat, prompt_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.text = _Text(served.tokenizer)

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, ticket: Ticket) -> dict[str, Any]:
        text = self.served.tokenizer.decode(ticket.tokens)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice |= {"finish_reason": ticket.finish, "logprobs": None}
        n = len(ticket.tokens)
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": n}
        usage["total_tokens"] = self.prompt_tokens + n
        kind = "chat.completion" if self.chat else "text_completion"
        return self._head(kind) | {"choices": [choice], "usage": usage}

    def chunk(self, text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            if finish is not None:
                delta = {}
            choice = {"index": 0, "delta": delta}
            kind = "chat.completion.chunk"
        else:
            choice, kind = {"index": 0, "text": text}, "text_completion"
        choice |= {"finish_reason": finish, "logprobs": None}
        return self._head(kind) | {"choices": [choice]}
