"""HTTP to model servers: the clients.

A chat request streams its answer through an ``httpx.AsyncClient`` over aiohttp's HTTP/1.1 (``ModelClient``,
:mod:`chat.agent.model.aio`), read on the event loop of whoever awaits it: a worker's, or that of a command run with
``asyncio.run``. One client serves the requests of one action, so its connection is kept between them; the body is
sent as the exact bytes given, without a Nagle delay.

The short calls beside the chat API (``/props``, ``/tokenize``, ``/apply-template``, ``/models``) share the
process's one ``httpx.Client`` (``shared_client``): made on first use, its connections kept alive, closed as the
process exits. They are made from synchronous code (a store thread, a command).
"""

from __future__ import annotations

import atexit
import functools
import os
import socket
import ssl
import threading

import httpx

NO_DELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """One for every client: making one reads the whole CA bundle, about 20 ms of CPU."""
    return httpx.create_ssl_context()


class ModelClient:
    """The asynchronous client of a run of chat requests (one action's): its connection is kept open between
    them. Use it on one event loop; ``aclose`` it when the action ends."""

    def __init__(self, http: httpx.AsyncClient | None = None) -> None:
        self._http = http
        self.closed = False

    @property
    def http(self) -> httpx.AsyncClient:
        """The HTTP client; made on first use."""
        if self._http is None:
            # aiohttp is imported by the processes that stream chats only: its import costs 0.3 s of CPU.
            from chat.agent.model.aio import AiohttpTransport

            context = ssl_context()
            self._http = httpx.AsyncClient(verify=context, transport=AiohttpTransport(ssl_context=context))
        return self._http

    async def aclose(self) -> None:
        """Close the connections."""
        if self.closed:
            return
        self.closed = True
        if self._http is not None:
            await self._http.aclose()


def new_client() -> ModelClient:
    """A client for the chat requests of one action; ``aclose`` it when the action ends."""
    return ModelClient()


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
