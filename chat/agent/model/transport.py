"""HTTP to model servers: the clients, and one streamed exchange driven on the caller's own thread.

A chat request is one ``Exchange`` of a ``ModelClient``: an ``httpx.AsyncClient`` with an asyncio event loop of
its own that runs only inside its caller's calls, on the caller's thread (no thread is started, nothing polls).
That is what lets ``start`` return once the request is written while the server has not answered yet
(llama-server sends its headers only with the first token), and lets the caller wait for the next bytes with
a deadline, or be woken at once by a ``Cancel`` from another thread. The body is sent as the exact bytes
given. A request whose writing fails (the connection closed or reset under it) is sent once more, on a new
connection: the server cannot have read it whole.

The short calls beside the chat API (``/props``, ``/tokenize``, ``/apply-template``, ``/models``) share the
process's one ``httpx.Client`` (``shared_client``): made on first use, its connections kept alive, closed as the
process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

logger = logging.getLogger(__name__)

UNSENT_RETRIES = 1  # a request whose writing failed is sent again this often, on a new connection
ERROR_BODY_LIMIT = 64 * 1024
CLOSE_SECONDS = 1.0  # closing an exchange waits at most this long for its connection to be let go
NO_DELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """One for every client: making one reads the whole CA bundle, about 20 ms of CPU."""
    return httpx.create_ssl_context()


_shared: httpx.Client | None = None
_shared_lock = threading.Lock()


def shared_client() -> httpx.Client:
    """The process's client for short calls to model servers, thread-safe; made on first use. A request's head
    and body go out at once, not after the server acknowledges the head (Nagle)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            context = ssl_context()
            transport = httpx.HTTPTransport(verify=context, socket_options=NO_DELAY)
            _shared = httpx.Client(verify=context, transport=transport)
            atexit.register(close_shared_client)
        return _shared


def close_shared_client() -> None:
    """Close the shared client's connections; the next call makes a new one."""
    global _shared
    with _shared_lock:
        client, _shared = _shared, None
    if client is not None:
        client.close()


def _forget_shared_client() -> None:
    global _shared
    _shared = None  # a forked child must not use its parent's sockets


os.register_at_fork(after_in_child=_forget_shared_client)


class ModelClient:
    """The client of a run of chat requests (one action's): its connection is kept open between them.

    Its event loop runs only while a caller drives one of its exchanges; use it from one thread at a time, and
    from synchronous code (a worker's thread, not inside a running event loop)."""

    def __init__(self, http: httpx.AsyncClient | None = None) -> None:
        self._http = http
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop that runs this client's exchanges; made on first use."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    @property
    def http(self) -> httpx.AsyncClient:
        """The HTTP client; made on first use."""
        if self._http is None:
            context = ssl_context()
            transport = httpx.AsyncHTTPTransport(verify=context, socket_options=NO_DELAY)
            self._http = httpx.AsyncClient(verify=context, transport=transport)
        return self._http

    def close(self) -> None:
        """Stop what still runs and close the connections."""
        if self.closed:
            return
        self.closed = True
        if self._http is None and self._loop is None:
            return
        loop = self.loop
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=CLOSE_SECONDS))
            if self._http is not None:
                loop.run_until_complete(self._http.aclose())
            loop.run_until_complete(loop.shutdown_default_executor())  # where a host name was looked up
        finally:
            loop.close()


def new_client() -> ModelClient:
    """A client for the chat requests of one action; ``close`` it when the action ends."""
    return ModelClient()


@dataclass(frozen=True)
class Head:
    """The answer's status and content type; ``body`` the start of an answer that is no event stream."""

    status: int
    content_type: str
    body: bytes = b""


class End:
    """The answer's body ended."""


END = End()
Item = Head | bytes | End


class ExchangeFailed(Exception):
    """The exchange broke with ``error``: before the answer's head came, or (``answered``) after it."""

    def __init__(self, error: Exception, *, answered: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.answered = answered


def is_event_stream(content_type: str) -> bool:
    """Whether an answer of ``content_type`` is read as an event stream (a missing type is)."""
    return content_type.split(";")[0].strip().lower() in ("text/event-stream", "")


class Exchange:
    """One POST whose answer streams back, run by a ``ModelClient``'s loop while the caller drives it."""

    def __init__(
        self, client: ModelClient, *, url: str, body: bytes, headers: dict[str, str], timeout: httpx.Timeout
    ) -> None:
        self._client = client
        self._loop = client.loop
        self.url = url
        self._body = body
        self._headers = headers
        self._timeout = timeout
        self.sent = False  # the request is written, or never will be
        self._items: deque[Item] = deque()
        self._failure: ExchangeFailed | None = None
        self._task: asyncio.Task[None] | None = None
        self._unsent = False  # writing the request failed: the server cannot have read it whole
        self._woken = False
        self._driving = False

    def start(self, *, wait: float) -> None:
        """Begin the exchange (once) and run it until the request is written, ``wait`` seconds at most; with 0,
        as far as it goes without waiting."""
        if self._task is None:
            self._task = self._loop.create_task(self._run())
        self._drive(lambda: self.sent, wait)

    def next(self, wait: float) -> Item | None:
        """What the server sent next, or ``None`` where nothing came within ``wait`` seconds or ``wake`` was
        called. Raises ``ExchangeFailed``."""
        if self._task is None:
            raise RuntimeError("the exchange was not started")
        if not self._items and self._failure is None:
            self._drive(lambda: bool(self._items) or self._failure is not None, wait)
        if self._items:
            return self._items.popleft()
        if self._failure is not None:
            raise self._failure
        if self._task.done():
            raise ExchangeFailed(RuntimeError("the exchange ended without an answer"), answered=False)
        return None

    def wake(self) -> None:
        """Make the caller's wait return now; safe from any thread."""
        self._woken = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._progress)

    def close(self, *, drain: float = 0.0) -> None:
        """Stop the exchange where it is not over, closing its connection (the server sees the client gone).
        ``drain`` seconds are first given to a finished answer's last bytes, so its connection is kept."""
        task = self._task
        if task is None or task.done() or self._loop.is_closed():
            return
        if drain > 0:
            self._drive(lambda: False, drain, wakeable=False)
        if not task.done():
            task.cancel()
            self._drive(lambda: False, CLOSE_SECONDS, wakeable=False)

    def _drive(self, ready: Callable[[], bool], wait: float, *, wakeable: bool = True) -> None:
        assert self._task is not None
        loop = self._loop
        deadline = time.monotonic() + wait
        while not ready() and not self._task.done():
            if wakeable and self._woken:
                self._woken = False
                return
            remaining = deadline - time.monotonic()
            timer = loop.call_later(max(remaining, 0.0), loop.stop)
            self._driving = True
            try:
                loop.run_forever()
            finally:
                self._driving = False
                timer.cancel()
            if remaining <= 0 or time.monotonic() >= deadline:
                return

    def _progress(self) -> None:
        if self._driving:
            self._loop.stop()  # the caller's drive looks at what changed

    def _push(self, item: Item) -> None:
        self._items.append(item)
        self._progress()

    def _fail(self, error: Exception, *, answered: bool) -> None:
        self._failure = ExchangeFailed(error, answered=answered)
        self._progress()

    def _mark_sent(self) -> None:
        self.sent = True
        self._progress()

    async def _run(self) -> None:
        try:
            for attempt in range(1 + UNSENT_RETRIES):
                self._unsent = False
                try:
                    await self._once()
                    return
                except Exception as error:
                    if (self._unsent or _reset(error)) and attempt < UNSENT_RETRIES:
                        logger.info("the request to %s did not get out (%s); sending it again", self.url, error)
                        continue
                    self._fail(error, answered=False)
                    return
        finally:
            self._mark_sent()

    async def _once(self) -> None:
        """One try. A failure before the answer's head raises; after it, it is kept for ``next``."""
        http = self._client.http
        request = http.build_request(
            "POST",
            self.url,
            content=self._body,
            headers=self._headers,
            timeout=self._timeout,
            extensions={"trace": self._trace},
        )
        response = await http.send(request, stream=True)
        try:
            self._mark_sent()  # where no trace said so (a transport of another kind): an answer came
            content_type = response.headers.get("content-type", "")
            if response.status_code != 200 or not is_event_stream(content_type):
                body = await _read_limited(response, ERROR_BODY_LIMIT)
                self._push(Head(response.status_code, content_type, body))
                return
            self._push(Head(response.status_code, content_type))
            await self._read_body(response)
        finally:
            await response.aclose()

    async def _read_body(self, response: httpx.Response) -> None:
        try:
            async for chunk in response.aiter_bytes():
                if chunk:
                    self._push(chunk)
        except Exception as error:
            self._fail(error, answered=True)
            return
        self._push(END)

    async def _trace(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith(("send_request_headers.failed", "send_request_body.failed")):
            self._unsent = True
        elif event.endswith("send_request_body.complete"):
            self._mark_sent()


def _reset(error: BaseException) -> bool:
    """Whether the server reset the connection: it closed it with part of the request unread. (Where the reset
    came while the request was still being written, the event loop may report the writing done and the reset
    only on the read that follows.)"""
    cause: BaseException | None = error
    for _ in range(10):
        if cause is None:
            return False
        if isinstance(cause, ConnectionResetError | BrokenPipeError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


async def _read_limited(response: httpx.Response, limit: int) -> bytes:
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= limit:
            break
    return bytes(data[:limit])
