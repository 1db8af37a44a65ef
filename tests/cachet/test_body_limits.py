"""The request body limits in the ASGI stack, on their own: refused by ``Content-Length`` before a byte is read, or
as soon as the chunks read pass the limit; tests/management/test_serve_body_limits.py serves them under Daphne."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.conf import settings

from cachet.asgi_types import Message, Receive, Scope, Send
from cachet.body_limits import BodyLimit, body_limit
from cachet.login_mark import login_mark

MB = 1024 * 1024


class Recorded:
    """An ASGI exchange: the body chunks offered, how many were read, what the application saw and answered."""

    def __init__(self, chunks: list[bytes], headers: list[tuple[bytes, bytes]] | None = None, path: str = "/login/"):
        self.scope: Scope = {"type": "http", "path": path, "method": "POST", "headers": headers or []}
        self.chunks = chunks
        self.read = 0
        self.seen: list[Message] = []
        self.sent: list[Message] = []
        self.called = False

    async def receive(self) -> Message:
        self.read += 1
        if self.read > len(self.chunks):
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": self.chunks[self.read - 1], "more_body": self.read < len(self.chunks)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Reads the body as Django does, to its end or the client leaving, then answers 200."""
        self.called = True
        while True:
            message = await receive()
            self.seen.append(message)
            if message["type"] == "http.disconnect":
                return
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def run(self) -> Recorded:
        asyncio.run(BodyLimit(self.app)(self.scope, self.receive, self.send))
        return self

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(message.get("body", b"") for message in self.sent[1:])


def test_a_body_declared_over_the_limit_is_refused_before_it_is_read(settings: Any) -> None:
    settings.CACHET_MAX_BODY_BYTES = MB
    exchange = Recorded([b"x" * 10], headers=[(b"content-length", str(MB + 1).encode())]).run()
    assert (exchange.called, exchange.read) == (False, 0)
    assert exchange.status == 413
    assert exchange.body == b"Too large: Cachet takes at most 1 MB in one request here.\n"
    assert (b"content-type", b"text/plain; charset=utf-8") in exchange.sent[0]["headers"]


def test_chunks_past_the_limit_are_refused_and_the_rest_is_never_read(settings: Any) -> None:
    settings.CACHET_MAX_BODY_BYTES = 1000
    exchange = Recorded([b"x" * 400] * 10).run()
    assert exchange.read == 3, "the third chunk passes the limit; none after it is read"
    assert [message["type"] for message in exchange.seen] == ["http.request", "http.request", "http.disconnect"]
    assert exchange.status == 413 and len(exchange.sent) == 2
    assert exchange.body == b"Too large: Cachet takes at most 1,000 bytes in one request here.\n"


def test_a_body_within_the_limit_reaches_the_application_whole(settings: Any) -> None:
    settings.CACHET_MAX_BODY_BYTES = 1000
    exchange = Recorded([b"x" * 500, b"y" * 500], headers=[(b"content-length", b"1000")]).run()
    assert [message["body"] for message in exchange.seen] == [b"x" * 500, b"y" * 500]
    assert (exchange.status, exchange.body) == (200, b"ok")


def logged_in(session_key: str = "k" * 32, *, mark_of: str | None = None) -> list[tuple[bytes, bytes]]:
    """The cookie header of a login: its session cookie and the mark of ``mark_of`` (its own by default)."""
    mark = login_mark(session_key if mark_of is None else mark_of)
    cookies = f"other=1; {settings.SESSION_COOKIE_NAME}={session_key}; {settings.CACHET_LOGIN_COOKIE_NAME}={mark}"
    return [(b"cookie", cookies.encode())]


def test_the_import_takes_its_file_and_a_form_more_from_a_login(settings: Any) -> None:
    settings.CACHET_MAX_BODY_BYTES, settings.CACHET_IMPORT_MAX_BYTES = MB, 64 * MB
    assert body_limit("/sessions/import", logged_in()).size == 65 * MB
    assert body_limit("/sessions/import", logged_in()).message == "Too large: an import is at most 64 MB."
    for path in ("/login/", "/sessions/import/", "/sessions/3/rename", "/admin/", "/no/such/page"):
        assert body_limit(path, logged_in()).size == MB, path
    declared = [(b"Content-Length", str(2 * MB).encode()), *logged_in()]
    exchange = Recorded([b"x" * 2 * MB], headers=declared, path="/sessions/import").run()
    assert exchange.status == 200


@pytest.mark.parametrize("path", ["/sessions/import", "/sessions/3/attach", "/sessions/new"])
def test_without_a_login_the_larger_limits_are_refused_before_the_body_is_read(path: str, settings: Any) -> None:
    settings.CACHET_MAX_BODY_BYTES, settings.CACHET_IMPORT_MAX_BYTES = MB, 64 * MB
    settings.CACHET_UPLOAD_MAX_BYTES = 20 * MB
    assert body_limit(path, logged_in()).size > 20 * MB
    session = f"{settings.SESSION_COOKIE_NAME}={'k' * 32}"
    refused = {
        "no cookies": [],
        "a session cookie without its mark": [(b"cookie", session.encode())],
        "another session's mark": logged_in(mark_of="j" * 32),
        "a mark without its session": [(b"cookie", f"{settings.CACHET_LOGIN_COOKIE_NAME}={login_mark('')}".encode())],
        "a made-up mark": [(b"cookie", f"{session}; {settings.CACHET_LOGIN_COOKIE_NAME}=login:1:x".encode())],
    }
    for why, headers in refused.items():
        limit = body_limit(path, headers)
        assert (limit.size, limit.message) == (MB, "Log in to attach files or import sessions."), why
    settings.SESSION_COOKIE_AGE = 0
    assert body_limit(path, logged_in()).size == MB, "an expired mark"
    declared = [(b"content-length", str(20 * MB).encode())]
    exchange = Recorded([b"x" * MB] * 20, headers=declared, path=path).run()
    assert (exchange.called, exchange.read, exchange.status) == (False, 0, 413)
    assert exchange.body == b"Log in to attach files or import sessions.\n"


@pytest.mark.parametrize("kind", ["websocket", "lifespan"])
def test_other_connections_pass_untouched(kind: str) -> None:
    seen: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)

    async def never() -> Message:
        raise AssertionError("not read")

    async def ignore(message: Message) -> None:
        raise AssertionError("not answered")

    scope: Scope = {"type": kind, "path": "/ws/sessions/1/", "headers": [(b"content-length", b"999999999")]}
    asyncio.run(BodyLimit(app)(scope, never, ignore))
    assert seen == [scope]
