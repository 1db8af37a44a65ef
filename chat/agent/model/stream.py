"""A model's streamed answer to one chat request, read on the caller's own thread.

Built on httpx rather than the openai SDK, for three reasons: the request body is sent as the exact bytes the
caller serialized, so the prompt prefix the server sees is byte-stable from one request to the next (the SDK
re-serializes); the raw ``usage`` and llama-server ``timings`` objects are kept as sent, including fields the
SDK drops or types away (``timings.cache_n``, ``prompt_eval_cached_count``, ``reasoning_content``); and the
connect, first-token and between-chunk timeouts are enforced separately.

The caller's thread waits for the server's next bytes with the nearer of the stream's deadline and the next idle
tick as its timeout (an event loop timer, not a poll); a ``Cancel`` set from another thread wakes that wait at
once (a plain ``threading.Event`` is looked at every 50 ms), and the connection is then closed, which tells the
server the client has gone. A server that closes the
connection before any response is ``ModelUnavailable``; one that closes a started stream before ``[DONE]`` or a
finish reason is ``ModelStreamCut``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from chat.agent.model.assembly import Completion, Idle, StreamAssembler, StreamPiece
from chat.agent.model.cancel import longest_wait, woken_by
from chat.agent.model.errors import (
    ModelCancelled,
    ModelError,
    ModelHTTPError,
    ModelProtocolError,
    ModelStreamCut,
    ModelTimeout,
    ModelUnavailable,
    context_exceeded,
    describe,
    error_excerpt,
    http_error,
    int_or_none,
    one_line,
)
from chat.agent.model.sse import SSEDecoder, SSEEvent
from chat.agent.model.transport import End, Exchange, ExchangeFailed, Head, Item, ModelClient, is_event_stream

SEND_WAIT_SECONDS = 0.5  # ``start`` waits at most this long for the request to be written
SEND_AHEAD_SECONDS = 0.05  # ``start(wait=False)`` at most this long
IDLE_SECONDS = 0.5  # nothing came for this long: an ``Idle`` piece
DRAIN_SECONDS = 0.05  # a finished answer's last bytes (after [DONE]) may take this long, so its connection is kept


@dataclass(frozen=True)
class Timeouts:
    """Seconds allowed to connect, to the first generated token, and between two chunks."""

    connect: float = 10.0
    first_token: float = 600.0
    between_chunks: float = 120.0

    def http(self) -> httpx.Timeout:
        """httpx's own timeouts, a backstop behind the stream's deadlines."""
        read = max(self.first_token, self.between_chunks) + 5.0
        return httpx.Timeout(connect=self.connect, read=read, write=self.between_chunks, pool=self.connect)


def headers(api_key: str | None, accept: str) -> dict[str, str]:
    """The headers of a request to a model server."""
    out = {"Accept": accept}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


class ModelStream:
    """One streamed answer of the model: iterate it for the pieces as they come; once the iteration ends,
    `completion` is the whole answer. A failure raises a `ModelError` subclass from the iteration; cut,
    timed-out and cancelled streams carry what arrived as `.partial`.

    The request is sent, as the exact bytes given, by `start()` or else when the iteration starts. Start and
    iterate it on one thread.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        body: bytes,
        timeouts: Timeouts,
        cancel: threading.Event | None = None,
        client: ModelClient | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.body = body
        self.timeouts = timeouts
        self.cancel = cancel
        self.client = client
        self.completion: Completion | None = None
        self._exchange: Exchange | None = None
        self._own_client: ModelClient | None = None
        self._started = 0.0
        self._finished = False
        self.closed = False  # close() was called

    @property
    def sent(self) -> bool:
        """Whether the request is written (or never will be)."""
        return self._exchange is not None and self._exchange.sent

    def start(self, *, wait: bool = True) -> None:
        """Send the request now, before the iteration (which sends it where this was not called). With ``wait``,
        return once it is written (or after ``SEND_WAIT_SECONDS``, or on a cancel); without, after
        ``SEND_AHEAD_SECONDS`` at most, so that what the caller does next (writing the request's record) is not
        held up long by a server that reads slowly: a later ``start()`` or the iteration writes the rest."""
        cancelled = self.cancel is not None and self.cancel.is_set()
        if self._exchange is None:
            client = self.client
            if client is None:
                client = self._own_client = ModelClient()
            request_headers = headers(self.api_key, "text/event-stream")
            request_headers["Content-Type"] = "application/json"
            request_headers["Accept-Encoding"] = "identity"
            self._exchange = Exchange(
                client, url=self.url, body=self.body, headers=request_headers, timeout=self.timeouts.http()
            )
            self._started = time.monotonic()
        if cancelled:
            return
        with woken_by(self.cancel, self._exchange.wake):
            self._exchange.start(wait=SEND_WAIT_SECONDS if wait else SEND_AHEAD_SECONDS)

    def close(self) -> None:
        """Stop an answer that is not finished (a started one that is never iterated included)."""
        self.closed = True
        if self._exchange is not None:
            self._exchange.close(drain=DRAIN_SECONDS if self._finished else 0.0)
        if self._own_client is not None:
            self._own_client.close()
            self._own_client = None

    def complete(self) -> Completion:
        """Read the whole answer, dropping the pieces."""
        for _ in self:
            pass
        assert self.completion is not None
        return self.completion

    def __iter__(self) -> Iterator[StreamPiece]:
        try:
            self.start()
            assert self._exchange is not None
            reading = _Reading(self, self._exchange)
            with woken_by(self.cancel, self._exchange.wake):
                yield from reading.pieces()
            self._finished = True
            self.completion = reading.partial()
        finally:
            self.close()


class _Reading:
    """One iteration of a stream: the exchange's items through the decoder and the assembler, against the
    deadlines and the cancel."""

    def __init__(self, stream: ModelStream, exchange: Exchange) -> None:
        self.url = stream.url
        self.timeouts = stream.timeouts
        self.cancel = stream.cancel
        self.exchange = exchange
        self.assembler = StreamAssembler()
        self.decoder = SSEDecoder()
        self.started = stream._started
        self.first_token_at: float | None = None
        self.last_bytes_at = self.last_yield_at = self.started
        self.longest_wait = longest_wait(stream.cancel)

    def pieces(self) -> Iterator[StreamPiece]:
        """The answer's pieces as they come, an ``Idle`` after each quiet ``IDLE_SECONDS``; ends at ``[DONE]`` or
        a finish reason, else raises."""
        while True:
            item = self._next()
            if item is None:
                yield Idle()
                continue
            if isinstance(item, Head):
                self._head(item)
                continue
            ended = isinstance(item, End)
            finished = self._end() if isinstance(item, End) else self._bytes(item)
            pieces = self.assembler.take_pieces()
            if pieces:
                self.last_yield_at = time.monotonic()
                yield from pieces
            if finished:
                return
            if ended:
                raise self._cut("")

    def partial(self) -> Completion:
        """The answer as assembled so far."""
        ttft = None if self.first_token_at is None else self.first_token_at - self.started
        return self.assembler.completion(time_to_first_token=ttft, total_time=time.monotonic() - self.started)

    def _next(self) -> Item | None:
        """The exchange's next item, or ``None`` for an idle tick; raises on a cancel and at the deadline."""
        while True:
            if self.cancel is not None and self.cancel.is_set():
                raise ModelCancelled(f"The request to {self.url} was cancelled.", url=self.url, partial=self.partial())
            now = time.monotonic()
            deadline = self._deadline()
            if now >= deadline:
                raise self._timed_out()
            tick = self.last_yield_at + IDLE_SECONDS
            if now >= tick:
                self.last_yield_at = now
                return None
            try:
                item = self.exchange.next(min(deadline - now, tick - now, self.longest_wait))
            except ExchangeFailed as failure:
                raise self._failed(failure) from failure.error
            if isinstance(item, bytes):
                self.last_bytes_at = time.monotonic()
            if item is not None:
                return item

    def _deadline(self) -> float:
        if self.first_token_at is None:
            return self.started + self.timeouts.first_token
        return self.last_bytes_at + self.timeouts.between_chunks

    def _head(self, head: Head) -> None:
        if head.status != 200:
            raise http_error(head.body, url=self.url, status=head.status)
        if not is_event_stream(head.content_type):
            excerpt = one_line(head.body.decode("utf-8", errors="replace"), 120)
            raise ModelProtocolError(
                f"The model server at {self.url} answered {head.content_type or 'no content type'} "
                f"instead of an event stream: {excerpt or '(empty body)'}",
                url=self.url,
            )

    def _bytes(self, chunk: bytes) -> bool:
        try:
            events = self.decoder.feed(chunk)
        except UnicodeDecodeError:
            raise self._protocol("the body is not valid UTF-8") from None
        return self._events(events)

    def _end(self) -> bool:
        try:
            events = self.decoder.close()
        except UnicodeDecodeError:
            raise self._protocol("the body is not valid UTF-8") from None
        return self._events(events) or self.assembler.finish_reason is not None

    def _events(self, events: list[SSEEvent]) -> bool:
        """Take decoded events; True at ``[DONE]``."""
        for event in events:
            data = event.data.strip()
            if data == "[DONE]":
                return True
            chunk = self._chunk(event, data)
            if self.assembler.add(chunk) and self.first_token_at is None:
                self.first_token_at = time.monotonic()
        return False

    def _chunk(self, event: SSEEvent, data: str) -> dict[str, Any]:
        try:
            chunk = json.loads(data)
        except ValueError:
            raise self._protocol(f"data is not JSON: {one_line(data, 80)}") from None
        if not isinstance(chunk, dict):
            raise self._protocol(f"data is not a JSON object: {one_line(data, 80)}")
        error = chunk.get("error")
        if event.event == "error" or (error is not None and "choices" not in chunk):
            raise self._reported(error, data)
        return chunk

    def _reported(self, error: object, data: str) -> ModelHTTPError:
        """The error a server reported in the middle of its stream."""
        status = (int_or_none(error.get("code")) if isinstance(error, dict) else None) or 200
        exceeded = context_exceeded(data.encode(), url=self.url, status=status)
        if exceeded is not None:
            exceeded.partial = self.partial()
            return exceeded
        excerpt = error_excerpt(data.encode())
        message = f"The model server at {self.url} reported an error mid-stream: {excerpt}"
        return ModelHTTPError(message, url=self.url, status=status, excerpt=excerpt, partial=self.partial())

    def _failed(self, failure: ExchangeFailed) -> ModelError:
        """The error for an exchange that broke."""
        error, url = failure.error, self.url
        if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
            return ModelUnavailable(f"Cannot reach the model server at {url}: {describe(error)}.", url=url)
        if isinstance(error, httpx.TimeoutException):
            return self._timed_out()
        if not failure.answered:
            if isinstance(error, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
                return ModelUnavailable(f"The model server at {url} closed the connection without answering.", url=url)
            return ModelUnavailable(f"Cannot talk to the model server at {url}: {describe(error)}.", url=url)
        if isinstance(error, httpx.RemoteProtocolError | httpx.ReadError):
            return self._cut(describe(error))
        message = f"The model server at {url} broke the exchange: {describe(error)}"
        return ModelProtocolError(message, url=url, partial=self.partial())

    def _timed_out(self) -> ModelTimeout:
        url = self.url
        if self.first_token_at is None:
            seconds = self.timeouts.first_token
            message = f"The model server at {url} sent no first token within {seconds:g} s."
            return ModelTimeout(message, url=url, which="first_token", seconds=seconds, partial=self.partial())
        seconds = self.timeouts.between_chunks
        message = f"The model server at {url} went silent for {seconds:g} s in the middle of its answer."
        return ModelTimeout(message, url=url, which="between_chunks", seconds=seconds, partial=self.partial())

    def _cut(self, detail: str) -> ModelStreamCut:
        got = self.partial()
        received = f"{len(got.text)} characters of text"
        if got.tool_calls:
            received += f", {len(got.tool_calls)} tool call(s)"
        message = f"The model server at {self.url} closed the stream before the answer was finished "
        message += f"({received} received; {detail})." if detail else f"({received} received)."
        return ModelStreamCut(message, url=self.url, partial=got)

    def _protocol(self, detail: str) -> ModelProtocolError:
        message = f"The model server at {self.url} sent a malformed event stream: {detail}"
        return ModelProtocolError(message, url=self.url, partial=self.partial())


def stream_chat(
    *,
    base_url: str,
    api_key: str | None,
    body: bytes,
    timeouts: Timeouts,
    cancel: threading.Event | None = None,
    client: ModelClient | None = None,
) -> ModelStream:
    """The answer to ``body`` POSTed unchanged to ``{base_url}/chat/completions``, to iterate."""
    return ModelStream(base_url=base_url, api_key=api_key, body=body, timeouts=timeouts, cancel=cancel, client=client)


class Answer(Protocol):
    """A model's streamed answer: its pieces as they come, then the whole of it. ``start`` sends the request
    before the iteration (with ``wait``, returning once it is written); ``close`` stops an answer that is not
    finished."""

    completion: Completion | None

    def start(self, *, wait: bool = True) -> None: ...

    def close(self) -> None: ...

    def __iter__(self) -> Iterator[StreamPiece]: ...


class Model(Protocol):
    """What the reply loop asks: a server over HTTP, or a scripted stand-in."""

    @property
    def url(self) -> str: ...

    def stream(self, body: bytes, *, cancel: threading.Event) -> Answer: ...


@dataclass(frozen=True)
class HttpModel:
    """A model behind an OpenAI-compatible server, asked over HTTP."""

    base_url: str
    api_key: str | None
    timeouts: Timeouts = field(default_factory=Timeouts)
    client: ModelClient | None = None  # shared by the requests of one action: its connection is kept open

    @property
    def url(self) -> str:
        return self.base_url

    def stream(self, body: bytes, *, cancel: threading.Event) -> ModelStream:
        return stream_chat(
            base_url=self.base_url,
            api_key=self.api_key,
            body=body,
            timeouts=self.timeouts,
            cancel=cancel,
            client=self.client,
        )
