"""The OpenAI API's request bodies and error object, as far as ``coursepkg serve`` speaks them.

The fields are OpenAI's (``model``, ``messages``/``prompt``, ``max_tokens``, ``temperature``,
``top_p``, ``stream``, ``seed``...); fields this server does not use are accepted and ignored, as
OpenAI-compatible servers (vLLM, llama.cpp) do, so that clients written for OpenAI work.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ApiError", "ChatRequest", "CompletionRequest", "Message", "error_body"]


class ApiError(Exception):
    """An error answered with OpenAI's error object.

    Args:
        status: the HTTP status.
        message: what was wrong, for a person.
        param: the request field at fault, if one is.
        code: OpenAI's machine-readable code (``model_not_found``, ``context_length_exceeded``).
        kind: OpenAI's ``type`` (``invalid_request_error``, ``rate_limit_error``...).
        headers: extra response headers (``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind, self.headers = kind, headers or {}


def error_body(message: str, kind: str, param: str | None, code: str | None) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stream: bool = False
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)  # one answer per request
    stop: str | list[str] | None = None  # rejected when given (see app._ticket)
    # vLLM's extra parameter (the openai client's extra_body): generate past the end-of-turn
    # token, always max_tokens tokens (load tests, and a test that must keep a row busy)
    ignore_eos: bool = False

    def token_limit(self) -> int | None:
        """``max_completion_tokens`` (the newer name) or ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


class Message(BaseModel):
    """One chat message; ``content`` is text or OpenAI's list of ``{"type": "text"}`` parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]]

    def text(self) -> str:
        """The content as one string (the text parts joined)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", "")) for part in self.content)


class ChatRequest(_Body):
    """``POST /v1/chat/completions``."""

    messages: list[Message]


class CompletionRequest(_Body):
    """``POST /v1/completions`` (one prompt string)."""

    prompt: str
