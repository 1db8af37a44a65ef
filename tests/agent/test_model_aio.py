"""The chat client's transport (httpx over aiohttp) says what went wrong as httpcore would, and tells the request's
trace when it opens a connection: the client's retry of a request that a kept connection lost depends on both."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from chat.agent.model.aio import AiohttpTransport
from chat.agent.model.transport import ssl_context

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


@contextlib.contextmanager
def _server(answer: bytes, *, requests: int = 1) -> Iterator[str]:
    """A server that reads each request's head and writes ``answer`` as it is, then closes; ``requests`` of them."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(requests):
            connection, _ = listener.accept()
            with connection:
                connection.recv(1 << 16)
                connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/"
    finally:
        listener.close()
        thread.join(timeout=5)


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=AiohttpTransport(ssl_context=ssl_context()))


@pytest.mark.asyncio
async def test_a_port_nobody_listens_on_is_a_connect_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    async with _client() as client:
        with pytest.raises(httpx.ConnectError):
            await client.post(f"http://127.0.0.1:{port}/", content=b"{}")


@pytest.mark.asyncio
async def test_a_server_closing_without_an_answer_is_a_protocol_error() -> None:
    with _server(b"") as url:
        async with _client() as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post(url, content=b"{}")


@pytest.mark.asyncio
async def test_a_body_cut_in_the_middle_is_a_protocol_error_after_what_came() -> None:
    with _server(ANSWER + b"7\r\ndata: 1\r\n") as url:
        async with _client() as client:
            got = b""
            with pytest.raises(httpx.RemoteProtocolError):
                async with client.stream("POST", url, content=b"{}") as response:
                    async for chunk in response.aiter_bytes():
                        got += chunk
    assert got == b"data: 1"


@pytest.mark.asyncio
async def test_an_answer_is_read_in_pieces_as_they_come_with_its_head() -> None:
    body = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in (b"data: 1\n\n", b"data: 2\n\n")) + b"0\r\n\r\n"
    with _server(ANSWER + body) as url:
        async with _client() as client, client.stream("POST", url, content=b'{"a": 1}') as response:
            assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
            assert b"".join([chunk async for chunk in response.aiter_bytes()]) == b"data: 1\n\ndata: 2\n\n"


@pytest.mark.asyncio
async def test_the_trace_hears_a_new_connection_and_not_a_kept_one() -> None:
    kept = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    events: list[str] = []

    async def trace(event: str, info: dict[str, Any]) -> None:
        events.append(event)

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            for _ in range(2):
                connection.recv(1 << 16)
                connection.sendall(kept)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    try:
        async with _client() as client:
            for _ in range(2):
                response = await client.post(url, content=b"{}", extensions={"trace": trace})
                assert response.text == "ok"
                events.append("answered")
    finally:
        listener.close()
        thread.join(timeout=5)
    assert events == ["connection.connect_tcp.started", "answered", "answered"]


@pytest.mark.asyncio
async def test_closing_the_client_mid_answer_ends_the_connection_at_once() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    ended = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(1 << 16)
            connection.sendall(ANSWER + b"7\r\ndata: 1\r\n")
            connection.settimeout(5)
            with contextlib.suppress(OSError):
                while connection.recv(1 << 16):
                    pass
            ended.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = _client()
    response = await client.send(
        client.build_request("POST", f"http://127.0.0.1:{listener.getsockname()[1]}/", content=b"{}"), stream=True
    )
    await response.aclose()
    await client.aclose()
    try:
        assert await asyncio.to_thread(ended.wait, 2), "the server saw the connection end"
    finally:
        listener.close()
        thread.join(timeout=5)
