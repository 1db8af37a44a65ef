"""httpx's async client over aiohttp's HTTP/1.1, for the chat requests: the same client API, with the answer read
by aiohttp's parser (in C). Reading a streamed answer costs about 85 µs of CPU a piece this way against about 200 µs
through httpcore and h11 (``bench/model_stream_bench.py``), and a worker reads every piece of every reply.

The OpenAI Python library offers the same pairing (``DefaultAioHttpClient``). This transport says what went wrong
as httpcore would, so the caller's handling is the same with either: a connection that cannot be made is
``ConnectError``, a server that closed it before answering or in the middle of the body ``RemoteProtocolError``,
a socket error ``ReadError`` (the ``OSError`` kept as its cause), a timeout ``ConnectTimeout`` or ``ReadTimeout``;
and the request's ``trace`` extension hears ``connection.connect_tcp.started`` when a new connection is made.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx

Trace = Callable[[str, dict[str, Any]], Awaitable[None]]
DROPPED_HEADERS = frozenset({b"content-length", b"transfer-encoding"})  # aiohttp writes its own for the body


def http_error(error: Exception) -> httpx.TransportError:
    """The httpx error that httpcore would have raised for aiohttp's ``error``."""
    message = str(error) or type(error).__name__
    if isinstance(error, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message)
    if isinstance(error, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(error, TimeoutError):  # aiohttp's socket read timeout, asyncio's
        return httpx.ReadTimeout(message)
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError("Server disconnected without sending a response.")
    if isinstance(error, aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(f"peer closed connection without sending complete message body ({message})")
    if isinstance(error, aiohttp.ClientOSError | OSError):
        return httpx.ReadError(message)
    return httpx.RemoteProtocolError(message)


async def _connecting(_session: aiohttp.ClientSession, context: SimpleNamespace, _params: object) -> None:
    asked = context.trace_request_ctx
    trace: Trace | None = getattr(asked, "trace", None)
    if trace is not None:
        await trace("connection.connect_tcp.started", {})


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        while True:
            try:
                chunk = await content.readany()
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                raise http_error(error) from error
            if not chunk:
                return
            yield chunk

    async def aclose(self) -> None:
        response = self._response
        if response.content.at_eof():
            response.release()  # read to its end: the connection is kept for the next request
        else:
            connection = response.connection  # an answer left unread: its server sees the connection end (a stop)
            if connection is not None and connection.protocol is not None:
                connection.protocol.abort()
            response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncClient``'s transport that sends with aiohttp, on the event loop of its first request."""

    def __init__(self, *, ssl_context: ssl.SSLContext) -> None:
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    def _opened(self) -> aiohttp.ClientSession:
        if self._session is None:
            tracing = aiohttp.TraceConfig()
            tracing.on_connection_create_start.append(_connecting)
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=0)
            self._session = aiohttp.ClientSession(
                connector=connector, trace_configs=[tracing], auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._opened()
        timeout = request.extensions.get("timeout", {})
        headers = [(name, value) for name, value in request.headers.raw if name.lower() not in DROPPED_HEADERS]
        try:
            response = await session.request(
                request.method,
                str(request.url),
                headers=[(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers],
                data=await request.aread() or None,
                allow_redirects=False,
                compress=None,
                skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
                trace_request_ctx=SimpleNamespace(trace=request.extensions.get("trace")),
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise http_error(error) from error
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode("latin-1", errors="replace")
        return httpx.Response(
            status_code=response.status, headers=response.raw_headers, stream=_Body(response), extensions=extensions
        )

    async def aclose(self) -> None:
        session = self._session
        if session is None:
            return
        # A connection still in use carries a request or an answer cut short: aborted, not closed, since closing
        # would wait for a server that reads nothing more to take the rest of the request.
        for protocol in list(getattr(session.connector, "_acquired", ())):
            protocol.abort()
        await session.close()
