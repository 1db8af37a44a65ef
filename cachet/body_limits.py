"""How large a request body Cachet takes, refused before it is read: ``CACHET_MAX_BODY_BYTES`` at every address,
and, for a request that shows a login (:mod:`cachet.login_mark`), at the import's the file
(``CACHET_IMPORT_MAX_BYTES``, which the import view checks too) plus a form's worth, and where files are attached
(Attach, New chat) ``CACHET_UPLOAD_MAX_BYTES`` plus a form's worth. Anyone else is refused past the ordinary limit
there too, with a line that asks them to log in: no client makes the server read a large body before its login.

Daphne reads a whole body before the application sees any of it, so under ``manage.py serve`` Daphne itself refuses
(:mod:`chat.web.daphne_bodies`); :class:`BodyLimit` refuses the same in the ASGI stack, for servers that stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.urls import Resolver404, resolve

from cachet.asgi_types import Message, Receive, Scope, Send
from cachet.login_mark import header_shows_login

IMPORT_URL_NAME = "session_import"
UPLOAD_URL_NAMES = ("session_attach", "session_new")
DISCONNECT: Message = {"type": "http.disconnect"}
LOG_IN_FIRST = "Log in to attach files or import sessions."


@dataclass(frozen=True)
class Limit:
    """The most a request's body may hold at one address, and the line that refuses more."""

    size: int
    message: str

    def answer(self) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """The refusal's headers and body."""
        body = f"{self.message}\n".encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        return headers, body


def size_text(size: int) -> str:
    """``1 MB``, ``1.5 MB``, ``1,000 bytes``: a size as the refusals name it (a megabyte is 1,048,576 bytes)."""
    if size < 1_048_576:
        return f"{size:,} bytes"
    return f"{size // 1_048_576} MB" if size % 1_048_576 == 0 else f"{size / 1_048_576:.1f} MB"


def _url_name(path: str) -> str:
    try:
        return resolve(path).url_name or ""
    except Resolver404:
        return ""


def body_limit(path: str, headers: Iterable[tuple[bytes, bytes]]) -> Limit:
    """The limit of a request to ``path`` (decoded, without its query) with these headers (names and values as
    ASGI gives them), decided without the database."""
    name = _url_name(path)
    if name in (*UPLOAD_URL_NAMES, IMPORT_URL_NAME) and not header_shows_login(cookie_header(headers)):
        return Limit(settings.CACHET_MAX_BODY_BYTES, LOG_IN_FIRST)
    if name in UPLOAD_URL_NAMES:
        return Limit(
            settings.CACHET_UPLOAD_MAX_BYTES + settings.CACHET_MAX_BODY_BYTES,
            f"Too large: attachments are at most {size_text(settings.CACHET_UPLOAD_MAX_BYTES)} at once.",
        )
    if name == IMPORT_URL_NAME:
        return Limit(
            settings.CACHET_IMPORT_MAX_BYTES + settings.CACHET_MAX_BODY_BYTES,
            f"Too large: an import is at most {size_text(settings.CACHET_IMPORT_MAX_BYTES)}.",
        )
    return Limit(
        settings.CACHET_MAX_BODY_BYTES,
        f"Too large: Cachet takes at most {size_text(settings.CACHET_MAX_BODY_BYTES)} in one request here.",
    )


def cookie_header(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """A request's ``Cookie`` headers as one, joined as Django joins them (so both read the same cookies)."""
    return ",".join(value.decode("latin-1") for name, value in headers if name.lower() == b"cookie")


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The request's ``Content-Length``, where it gives one that is a number."""
    for name, value in headers:
        if name.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


class BodyLimit:
    """ASGI middleware for HTTP: a body over its :func:`body_limit` is answered 413, by its ``Content-Length``
    before any of it is read, or as soon as the chunks read pass the limit; the application is told the client
    left (``http.disconnect``) and is never given the rest."""

    def __init__(self, app: Callable[..., Awaitable[Any]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        limit = body_limit(scope["path"], headers)
        length = declared_length(headers)
        if length is not None and length > limit.size:
            await _refuse(send, limit)
            return
        received = 0
        over = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, over
            if over:
                return DISCONNECT
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit.size:
                    over = True
                    return DISCONNECT
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, limited_receive, watched_send)
        if over and not started:
            await _refuse(send, limit)


async def _refuse(send: Send, limit: Limit) -> None:
    headers, body = limit.answer()
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
