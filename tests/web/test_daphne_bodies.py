"""Daphne's requests with body limits, on a Twisted HTTP channel over an in-memory transport: refused after the
headers or as the chunks arrive, never handed to the application, the import's address with its own limit;
tests/management/test_serve_body_limits.py serves them for real."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings
from twisted.internet.testing import StringTransport
from twisted.web.http import HTTPChannel

from cachet.login_mark import login_mark
from chat.web.daphne_bodies import LimitedRequest

MB = 1024 * 1024
REFUSED = b"HTTP/1.1 413 Content Too Large\r\n"


@dataclass
class FakeServer:
    """What Daphne's request asks of its server, recording the applications it would start."""

    scopes: list[dict[str, Any]] = field(default_factory=list)
    queued: list[dict[str, Any]] = field(default_factory=list)
    proxy_forwarded_address_header = None
    root_path = ""
    request_buffer_size = 8192
    server_name = "daphne"

    def protocol_connected(self, protocol: Any) -> None:
        pass

    def protocol_disconnected(self, protocol: Any) -> None:
        pass

    def create_application(self, protocol: Any, scope: dict[str, Any]) -> Any:
        self.scopes.append(scope)
        return self

    def put_nowait(self, message: dict[str, Any]) -> None:
        self.queued.append(message)


@dataclass
class Connection:
    channel: HTTPChannel
    transport: StringTransport
    server: FakeServer

    def send(self, data: bytes) -> None:
        self.channel.dataReceived(data)

    @property
    def body(self) -> bytes:
        return b"".join(message["body"] for message in self.server.queued)


@pytest.fixture
def connection() -> Connection:
    server = FakeServer()
    channel = HTTPChannel()
    channel.requestFactory = LimitedRequest
    channel.factory = type("Factory", (), {"server": server})()
    transport = StringTransport()
    channel.makeConnection(transport)
    return Connection(channel, transport, server)


@pytest.fixture(autouse=True)
def limits(settings: Any) -> None:
    settings.CACHET_MAX_BODY_BYTES, settings.CACHET_IMPORT_MAX_BYTES = MB, 4 * MB


def test_a_declared_length_over_the_limit_is_answered_413_and_the_connection_closed(connection: Connection) -> None:
    connection.send(
        b"POST /login/ HTTP/1.1\r\nHost: cachet\r\nContent-Length: 1073741824\r\nExpect: 100-continue\r\n\r\n"
        + b"x" * 1000
    )
    answer = connection.transport.value()
    assert answer.startswith(REFUSED), answer
    assert answer.endswith(b"\r\n\r\nToo large: Cachet takes at most 1 MB in one request here.\n")
    assert b"100 Continue" not in answer, "the client that asked is told not to send"
    assert connection.transport.disconnecting
    connection.send(b"x" * 100_000)  # what was on its way is dropped
    assert connection.server.scopes == []


def test_chunks_past_the_limit_are_answered_413_as_they_pass_it(connection: Connection) -> None:
    connection.send(b"POST /sessions/3/rename HTTP/1.1\r\nHost: cachet\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%b\r\n" % (256 * 1024, b"x" * 256 * 1024)
    for _ in range(4):
        connection.send(chunk)
    assert connection.transport.value() == b"", "1 MB is within the limit"
    connection.send(chunk + b"0\r\n\r\n")  # past it, and the body ends in the same read
    assert connection.transport.value().startswith(REFUSED)
    assert connection.transport.disconnecting
    assert connection.server.scopes == [], "a refused request never reaches the application"


def login_cookie(session_key: str = "k" * 32) -> bytes:
    """A ``Cookie`` header line of a login: its session cookie and its mark (:mod:`cachet.login_mark`)."""
    mark = login_mark(session_key)
    cookies = f"{settings.SESSION_COOKIE_NAME}={session_key}; {settings.CACHET_LOGIN_COOKIE_NAME}={mark}"
    return f"Cookie: {cookies}\r\n".encode()


def test_the_import_takes_its_own_limit_by_the_request_line_from_a_login(connection: Connection) -> None:
    body = b"x" * (2 * MB)
    connection.send(
        b"POST /sessions/%%69mport?next=/ HTTP/1.1\r\nHost: cachet\r\n%bContent-Length: %d\r\n\r\n"
        % (login_cookie(), len(body))
    )
    connection.send(body)
    assert connection.transport.value() == b""
    assert [scope["path"] for scope in connection.server.scopes] == ["/sessions/import"]
    assert connection.body == body


@pytest.mark.parametrize("cookies", ["none", "others", "a cut mark"])
@pytest.mark.parametrize("path", [b"/sessions/import", b"/sessions/3/attach"])
def test_without_a_login_the_import_and_attach_take_the_ordinary_limit(
    connection: Connection, cookies: str, path: bytes
) -> None:
    cookie = {"none": b"", "others": b"Cookie: a=1\r\n", "a cut mark": login_cookie()[:-20] + b"\r\n"}[cookies]
    connection.send(b"POST %b HTTP/1.1\r\nHost: cachet\r\n%bContent-Length: %d\r\n\r\n" % (path, cookie, 60 * MB))
    answer = connection.transport.value()
    assert answer.startswith(REFUSED), answer
    assert answer.endswith(b"\r\n\r\nLog in to attach files or import sessions.\n")
    assert connection.transport.disconnecting
    assert connection.server.scopes == []


def test_a_body_within_the_limit_reaches_the_application_whole_and_unparsed(connection: Connection) -> None:
    body = b"username=ada&password=" + b"p" * 5000
    connection.send(
        b"POST /login/ HTTP/1.1\r\nHost: cachet\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    assert connection.transport.value() == b""
    assert connection.body == body
    request = connection.channel.requests[0]
    assert request.args == {}, "Twisted leaves the form to Django"
