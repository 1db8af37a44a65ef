"""A model's streamed answer to one chat request, read on the event loop of whoever awaits it.

Built on httpx rather than the openai SDK, for three reasons: the request body is sent as the exact bytes the
caller serialized, so the prompt prefix the server sees is byte-stable from one request to the next (the SDK
re-serializes); the raw ``usage`` and llama-server ``timings`` objects are kept as sent, including fields the
SDK drops or types away (``timings.cache_n``, ``prompt_eval_cached_count``, ``reasoning_content``); and the
connect, first-token and between-chunk timeouts are enforced separately.

``start`` sends the request as a task of the running loop, so what the caller does next (writing the request's
record) runs while it goes out; iterating the stream awaits the server's next bytes against the nearer deadline.
A ``Cancel`` set meanwhile (Stop, from any thread) cancels that wait at once, and the connection is then closed,
which tells the server the client has gone. A request whose writing failed (the connection closed or reset under
it) is sent once more, on a new connection: the server cannot have read it whole; so is one whose connection, kept
from an earlier request, the server closed without a word of answer (a server may close a connection it holds idle
just as the next request goes out on it). A server that closes the
connection before any response is ``ModelUnavailable``; one that closes a started stream before ``[DONE]`` or a
finish reason is ``ModelStreamCut``.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import httpx

from chat.agent.model.assembly import Completion, StreamAssembler, StreamPiece, joined
from chat.agent.model.cancel import Cancel, woken_by
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
from chat.agent.model.transport import ModelClient

logger = logging.getLogger(__name__)

UNSENT_RETRIES = 1  # a request whose writing failed is sent again this often, on a new connection
ERROR_BODY_LIMIT = 64 * 1024
DRAIN_SECONDS = 0.05  # a finished answer's last bytes (after [DONE]) may take this long, so its connection is kept
T = TypeVar("T")


@dataclass(frozen=True)
class Timeouts:
    """Seconds allowed to connect, to the first generated token, and between two chunks."""

    connect: float = 10.0
    first_token: float = 600.0
    between_chunks: float = 120.0

    def http(self) -> httpx.Timeout:
        """httpx's own timeouts: reading is timed by the stream's deadlines alone (one timer a stream, where httpx
        would set one a read)."""
        return httpx.Timeout(connect=self.connect, read=None, write=self.between_chunks, pool=self.connect)


def headers(api_key: str | None, accept: str) -> dict[str, str]:
    """The headers of a request to a model server."""
    out = {"Accept": accept}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def is_event_stream(content_type: str) -> bool:
    """Whether an answer of ``content_type`` is read as an event stream (a missing type is)."""
    return content_type.split(";")[0].strip().lower() in ("text/event-stream", "")


class ModelStream:
    """One streamed answer of the model: iterate it (``async for``) for the pieces as they come; once the
    iteration ends, ``completion`` is the whole answer. A failure raises a ``ModelError`` subclass from the
    iteration; cut, timed-out and cancelled streams carry what arrived as ``.partial``. The request is sent by
    ``start()``, or else when the iteration starts."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        body: bytes,
        timeouts: Timeouts,
        cancel: Cancel | None = None,
        client: ModelClient | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.body = body
        self.timeouts = timeouts
        self.cancel = cancel
        self.client = client
        self.completion: Completion | None = None
        self._own_client: ModelClient | None = None
        self._sending: asyncio.Future[httpx.Response] | None = None
        self._response: httpx.Response | None = None
        self._started = 0.0
        self._waiting = False  # within a wait a cancel may interrupt
        self._waiter: asyncio.Task[Any] | None = None  # the task iterating, its cancel hooked for the iteration
        self._deadline = math.inf  # of the wait going on
        self._timer: asyncio.TimerHandle | None = None  # at the deadline or before it: looks again when it fires
        self._expired = False  # the timer cancelled the wait
        self.closed = False

    def start(self) -> None:
        """Send the request now, as a task of the running loop (once)."""
        if self._sending is None:
            self._started = time.monotonic()
            self._sending = asyncio.ensure_future(self._send())

    async def aclose(self) -> None:
        """Stop an answer that is not finished (a started one that is never iterated included)."""
        self.closed = True
        self._stop_timer()
        sending, self._sending = self._sending, None
        if sending is not None and not sending.done():
            sending.cancel()  # the request's task ends on its own; nothing waits for it
        elif sending is not None and not sending.cancelled() and sending.exception() is None:
            response = sending.result()
            if response is not self._response:
                await response.aclose()
        if self._response is not None:
            await self._response.aclose()
            self._response = None
        if self._own_client is not None:
            await self._own_client.aclose()
            self._own_client = None

    async def complete(self) -> Completion:
        """Read the whole answer, dropping the pieces."""
        async for _ in self:
            pass
        assert self.completion is not None
        return self.completion

    async def __aiter__(self) -> AsyncGenerator[StreamPiece, None]:
        task = asyncio.current_task()
        assert task is not None
        try:
            with woken_by(self.cancel, self._waker(task)):  # once for the iteration, not once a chunk
                self._waiter = task
                self.start()
                assert self._sending is not None
                reading = _Reading(self)
                response = await reading.head(self._sending)
                self._response = response
                async for piece in reading.pieces(response):
                    yield piece
                await reading.drain(response)
                self.completion = reading.partial()
        finally:
            self._waiter = None
            await self.aclose()

    async def _send(self) -> httpx.Response:
        client = self.client
        if client is None:
            client = self._own_client = ModelClient()
        http = client.http
        request_headers = headers(self.api_key, "text/event-stream")
        request_headers["Content-Type"] = "application/json"
        request_headers["Accept-Encoding"] = "identity"
        for attempt in range(1 + UNSENT_RETRIES):
            unsent = False
            kept = True  # sent on a connection kept from an earlier request, not a new one

            async def trace(event: str, info: dict[str, Any]) -> None:
                nonlocal unsent, kept
                if event.endswith(("send_request_headers.failed", "send_request_body.failed")):
                    unsent = True
                elif event.startswith("connection.connect_"):
                    kept = False

            request = http.build_request(
                "POST",
                self.url,
                content=self.body,
                headers=request_headers,
                timeout=self.timeouts.http(),
                extensions={"trace": trace},
            )
            try:
                return await http.send(request, stream=True)
            except Exception as error:
                if (unsent or _reset(error) or (kept and _closed(error))) and attempt < UNSENT_RETRIES:
                    logger.info("the request to %s did not get out (%s); sending it again", self.url, error)
                    continue
                raise
        raise AssertionError("unreachable")

    def _waker(self, task: asyncio.Task[Any]) -> Callable[[], None]:
        """What the cancel calls (from any thread): ``task`` cancelled on its loop, where it is in a wait then."""
        loop = asyncio.get_running_loop()

        def cancel_now() -> None:
            if self._waiting:  # looked at on the loop: a cancel after the wait ended lands nowhere
                task.cancel()

        def wake() -> None:
            loop.call_soon_threadsafe(cancel_now)

        return wake

    async def wait(self, awaitable: Awaitable[T], deadline: float) -> T:
        """``awaitable``, ended at ``deadline`` (``time.monotonic``) with ``TimeoutError``, or by the cancel at
        once with ``asyncio.CancelledError`` turned into ``ModelCancelled`` by the caller."""
        task = asyncio.current_task()
        assert task is not None
        if self._waiter is not task:  # outside an iteration
            with woken_by(self.cancel, self._waker(task)):
                return await self._waited(awaitable, deadline, task)
        return await self._waited(awaitable, deadline, task)

    async def _waited(self, awaitable: Awaitable[T], deadline: float, task: asyncio.Task[Any]) -> T:
        """One timer serves a stream's waits: a wait moves the deadline, and the timer, firing, looks whether it
        passed (its deadline moves with each chunk; a timer a wait cost a heap push and a cancel a chunk)."""
        if self.cancel is not None and self.cancel.is_set():
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # never to be awaited: no "never awaited" warning
            raise asyncio.CancelledError
        self._deadline = deadline
        if self._timer is None or self._timer.when() > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(deadline, self._expire, task)
        self._waiting = True
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self._expired:
                self._expired = False
                task.uncancel()
                raise TimeoutError from None
            raise
        finally:
            self._waiting = False

    def _expire(self, task: asyncio.Task[Any]) -> None:
        """The timer: the wait going on ends where its deadline passed; else the timer waits on."""
        self._timer = None
        if not self._waiting or task.done():
            return  # the next wait sets it again
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._expire, task)
            return
        self._expired = True
        task.cancel()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Reading:
    """One iteration of a stream: the answer's bytes through the decoder and the assembler, against the
    deadlines and the cancel."""

    def __init__(self, stream: ModelStream) -> None:
        self.stream = stream
        self.url = stream.url
        self.timeouts = stream.timeouts
        self.assembler = StreamAssembler()
        self.decoder = SSEDecoder()
        self.started = stream._started
        self.first_token_at: float | None = None
        self.last_bytes_at = self.started
        self.chunks: AsyncIterator[bytes] | None = None  # the answer's body, read once: ``drain`` reads on

    async def head(self, sending: Awaitable[httpx.Response]) -> httpx.Response:
        """The answer's head, checked: an error status or another content type raises."""
        try:
            response = await self._waited(sending)
        except ModelError:
            raise
        except Exception as error:
            raise self._failed(error, answered=False) from error
        content_type = response.headers.get("content-type", "")
        if response.status_code != 200 or not is_event_stream(content_type):
            try:
                body = await self._waited(_read_limited(response, ERROR_BODY_LIMIT))
            except ModelError:
                raise
            except Exception:
                body = b""
            if response.status_code != 200:
                raise http_error(body, url=self.url, status=response.status_code)
            excerpt = one_line(body.decode("utf-8", errors="replace"), 120)
            raise ModelProtocolError(
                f"The model server at {self.url} answered {content_type or 'no content type'} "
                f"instead of an event stream: {excerpt or '(empty body)'}",
                url=self.url,
            )
        return response

    async def pieces(self, response: httpx.Response) -> AsyncIterator[StreamPiece]:
        """The answer's pieces as they come; ends at ``[DONE]`` or a finish reason, else raises."""
        chunks = self.chunks = response.aiter_bytes()
        while True:
            try:
                chunk: bytes | None = await self._waited(chunks.__anext__())
            except StopAsyncIteration:
                chunk = None
            except ModelError:
                raise
            except Exception as error:
                raise self._failed(error, answered=True) from error
            if chunk is not None:
                self.last_bytes_at = time.monotonic()
                finished = self._bytes(chunk)
            else:
                finished = self._end()
            for piece in joined(self.assembler.take_pieces()):  # a read's pieces go on as one
                yield piece
            if finished:
                return
            if chunk is None:
                raise self._cut("")

    async def drain(self, response: httpx.Response) -> None:
        """Read a finished answer's last bytes for a moment, so that its connection can be kept."""
        chunks = self.chunks if self.chunks is not None else response.aiter_bytes()
        try:
            async with asyncio.timeout(DRAIN_SECONDS):
                async for _ in chunks:  # the body's own iterator: a second ``aiter_bytes`` raises StreamConsumed
                    pass
        except Exception:  # what is left is not wanted
            return

    def partial(self) -> Completion:
        """The answer as assembled so far."""
        ttft = None if self.first_token_at is None else self.first_token_at - self.started
        return self.assembler.completion(time_to_first_token=ttft, total_time=time.monotonic() - self.started)

    async def _waited(self, awaitable: Awaitable[T]) -> T:
        try:
            return await self.stream.wait(awaitable, self._deadline())
        except TimeoutError:
            raise self._timed_out() from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            cancel = self.stream.cancel
            if cancel is not None and cancel.is_set() and task is not None and task.uncancel() == 0:
                raise ModelCancelled(
                    f"The request to {self.url} was cancelled.", url=self.url, partial=self.partial()
                ) from None
            raise

    def _deadline(self) -> float:
        if self.first_token_at is None:
            return self.started + self.timeouts.first_token
        return self.last_bytes_at + self.timeouts.between_chunks

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

    def _failed(self, error: Exception, *, answered: bool) -> ModelError:
        """The error for an exchange that broke."""
        url = self.url
        if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
            return ModelUnavailable(f"Cannot reach the model server at {url}: {describe(error)}.", url=url)
        if isinstance(error, httpx.TimeoutException):
            return self._timed_out()
        if not answered:
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
        if isinstance(cause, OSError) and cause.errno in (errno.ECONNRESET, errno.EPIPE):  # aiohttp's ClientOSError
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _closed(error: BaseException) -> bool:
    """Whether the server closed the connection before any answer. On a connection kept from an earlier request,
    that is a server closing a connection it held idle as the request went out (llama-server does, now and then,
    right after an answer): the request was not taken."""
    return isinstance(error, httpx.RemoteProtocolError | httpx.ReadError)


async def _read_limited(response: httpx.Response, limit: int) -> bytes:
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= limit:
            break
    return bytes(data[:limit])


def stream_chat(
    *,
    base_url: str,
    api_key: str | None,
    body: bytes,
    timeouts: Timeouts,
    cancel: Cancel | None = None,
    client: ModelClient | None = None,
) -> ModelStream:
    """The answer to ``body`` POSTed unchanged to ``{base_url}/chat/completions``, to iterate."""
    return ModelStream(base_url=base_url, api_key=api_key, body=body, timeouts=timeouts, cancel=cancel, client=client)


class Answer(Protocol):
    """A model's streamed answer: its pieces as they come, then the whole of it. ``start`` sends the request
    before the iteration; ``aclose`` stops an answer that is not finished."""

    completion: Completion | None

    def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def __aiter__(self) -> AsyncGenerator[StreamPiece, None]: ...


class Model(Protocol):
    """What the reply loop asks: a server over HTTP, or a scripted stand-in."""

    @property
    def url(self) -> str: ...

    def stream(self, body: bytes, *, cancel: Cancel) -> Answer: ...


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

    def stream(self, body: bytes, *, cancel: Cancel) -> ModelStream:
        return stream_chat(
            base_url=self.base_url,
            api_key=self.api_key,
            body=body,
            timeouts=self.timeouts,
            cancel=cancel,
            client=self.client,
        )
