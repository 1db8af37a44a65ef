"""How a request to a model server fails: the ``ModelError`` family, each with one line for a person, and the
helpers that word those lines (excerpts of an error body, a transport error in a few words)."""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from chat.agent.model.assembly import Completion

EXCERPT_CHARS = 300


class ModelError(Exception):
    """A request to the model server failed; `str(error)` is one line for a person."""

    def __init__(self, message: str, *, url: str, partial: Completion | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.partial = partial


class ModelUnavailable(ModelError):
    """The server could not be reached, or closed the connection before answering."""


class ModelHTTPError(ModelError):
    """The server answered with an HTTP error status (or an error event in the middle of its stream)."""

    def __init__(self, message: str, *, url: str, status: int, excerpt: str, partial: Completion | None = None) -> None:
        super().__init__(message, url=url, partial=partial)
        self.status = status
        self.excerpt = excerpt


class ModelContextExceeded(ModelHTTPError):
    """The server refused the request as larger than its context (llama.cpp's ``exceed_context_size_error``)."""

    def __init__(self, *, url: str, status: int, excerpt: str, n_prompt_tokens: int | None, n_ctx: int | None) -> None:
        size = f"{n_prompt_tokens:,} tokens" if n_prompt_tokens else "larger than the model's context window"
        window = f"; the model's context window is {n_ctx:,}" if n_ctx else ""
        message = (
            f"The model server at {url} refused the request: it is {size}{window}. "
            "Compact now, start a new session, or use a model with a larger window."
        )
        super().__init__(message, url=url, status=status, excerpt=excerpt)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class ModelProtocolError(ModelError):
    """The server answered something that is not what the API says (not JSON, not an event stream)."""


class ModelStreamCut(ModelError):
    """The server closed a started stream before the answer was finished."""


class ModelTimeout(ModelError):
    """The server said nothing for too long; ``which`` names the deadline (``first_token``, ``between_chunks``)."""

    def __init__(
        self, message: str, *, url: str, which: str, seconds: float, partial: Completion | None = None
    ) -> None:
        super().__init__(message, url=url, partial=partial)
        self.which = which
        self.seconds = seconds


class ModelCancelled(ModelError):
    """The caller stopped the request."""


def int_or_none(value: object) -> int | None:
    """``value`` as an int where it is one (a whole float included, a bool not)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def context_exceeded(body: bytes, *, url: str, status: int) -> ModelContextExceeded | None:
    """The error for a server's answer that says the request does not fit its context, else ``None``."""
    try:
        data = json.loads(body.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None
    message = error.get("message")
    said = error.get("type") == "exceed_context_size_error" or (
        isinstance(message, str) and "exceeds the available context size" in message
    )
    if not said:
        return None
    return ModelContextExceeded(
        url=url,
        status=status,
        excerpt=error_excerpt(body),
        n_prompt_tokens=int_or_none(error.get("n_prompt_tokens")),
        n_ctx=int_or_none(error.get("n_ctx")),
    )


def http_error(body: bytes, *, url: str, status: int) -> ModelHTTPError:
    """The error for an answer with HTTP status ``status`` and ``body``."""
    exceeded = context_exceeded(body, url=url, status=status)
    if exceeded is not None:
        return exceeded
    excerpt = error_excerpt(body)
    message = f"The model server at {url} answered HTTP {status}: {excerpt}"
    return ModelHTTPError(message, url=url, status=status, excerpt=excerpt)


def one_line(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` on one line, its blanks folded, cut to ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def error_excerpt(body: bytes) -> str:
    """The message of an error body (a JSON error's message where there is one), on one short line."""
    text = body.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        return one_line(text) or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return one_line(error["message"])
        if isinstance(error, str):
            return one_line(error)
        if isinstance(data.get("message"), str):
            return one_line(data["message"])
        if isinstance(data.get("detail"), str):
            return one_line(data["detail"])
    return one_line(text)


def describe(error: Exception) -> str:
    """A transport error in a few words: "connection refused", "host name not found", else its own text."""
    if isinstance(error, httpx.ConnectTimeout):
        return "connection timed out"
    cause: BaseException | None = error
    for _ in range(10):
        if cause is None:
            break
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return "host name not found"
        cause = cause.__cause__ or cause.__context__
    return one_line(str(error)) or type(error).__name__


def failure_reason(error: ModelError) -> str:
    """A few words on why a request to the server failed, for a line that already names the server."""
    if isinstance(error, ModelTimeout):
        return f"no answer within {error.seconds:g} s"
    if isinstance(error, ModelHTTPError):
        return one_line(f"HTTP {error.status}: {error.excerpt}", 120)
    if isinstance(error, ModelProtocolError):
        return "its answer is not a model list"
    if isinstance(error.__cause__, Exception):
        return describe(error.__cause__)
    return str(error)
