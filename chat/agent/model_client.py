"""Streaming client for OpenAI-compatible `/v1/chat/completions` servers.

Built on httpx rather than the openai SDK, for three reasons:

- the request body is sent as the exact bytes the caller serialized, so the prompt prefix the
  server sees is byte-stable from one request to the next (the SDK re-serializes);
- the raw `usage` and llama-server `timings` objects are kept as sent, including fields the SDK
  drops or types away (`timings.cache_n`, `prompt_eval_cached_count`, `reasoning_content`);
- the connect, first-token and between-chunk timeouts are enforced separately.

The HTTP exchange runs in a worker thread that hands raw bytes to the caller's thread through a
queue; the caller's thread parses the event stream, yields the pieces as they come, and wakes every few
hundredths of a second to check the deadlines and the cancel event, so cancelling or timing
out never waits on a blocked read. The worker's socket is then shut down, which ends its read
at once and tells the server the client has gone.

A request whose writing fails (the connection closed or reset under it) is sent once more, on a new
connection: the server cannot have read it whole. A server that closes the connection before any response
is otherwise `ModelUnavailable`; one that closes a started stream before `[DONE]` or a finish reason is
`ModelStreamCut`.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import json
import logging
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05
SEND_WAIT_SECONDS = 0.5  # ``start`` waits at most this long for the request to be written
WORKER_IDLE_SECONDS = 60.0  # an idle exchange thread waits this long for the next exchange
UNSENT_RETRIES = 1  # a request whose writing failed is sent again this often, on a new connection
ERROR_BODY_LIMIT = 64 * 1024
EXCERPT_CHARS = 300


@dataclass(frozen=True)
class Timeouts:
    """Seconds allowed to connect, to the first generated token, and between two chunks."""

    connect: float = 10.0
    first_token: float = 600.0
    between_chunks: float = 120.0


@dataclass
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str


@dataclass
class Completion:
    text: str
    reasoning: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    usage: dict[str, Any] | None
    timings: dict[str, Any] | None
    time_to_first_token: float | None
    total_time: float
    model: str | None


class ModelError(Exception):
    """A request to the model server failed; `str(error)` is one line for a person."""

    def __init__(self, message: str, *, url: str, partial: Completion | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.partial = partial


class ModelUnavailable(ModelError):
    pass


class ModelHTTPError(ModelError):
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
        excerpt=_error_excerpt(body),
        n_prompt_tokens=_int_or_none(error.get("n_prompt_tokens")),
        n_ctx=_int_or_none(error.get("n_ctx")),
    )


class ModelProtocolError(ModelError):
    pass


class ModelStreamCut(ModelError):
    pass


class ModelTimeout(ModelError):
    def __init__(
        self, message: str, *, url: str, which: str, seconds: float, partial: Completion | None = None
    ) -> None:
        super().__init__(message, url=url, partial=partial)
        self.which = which
        self.seconds = seconds


class ModelCancelled(ModelError):
    pass


# --- event stream parsing -------------------------------------------------------------------


@dataclass(frozen=True)
class SSEEvent:
    event: str
    data: str


class SSEDecoder:
    """Incremental decoder of a `text/event-stream` body.

    Accepts LF, CRLF and CR line ends, lines and UTF-8 sequences split across chunks, comments,
    multi-line data, and servers that omit the blank line between two complete `data:` lines.
    """

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._buffer = ""
        self._data: list[str] = []
        self._event = ""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode `chunk` and return the events it completes."""
        self._buffer += self._utf8.decode(chunk)
        return self._drain(final=False)

    def close(self) -> list[SSEEvent]:
        """Flush what is left at the end of the body, a last unterminated event included."""
        self._buffer += self._utf8.decode(b"", final=True)
        events = self._drain(final=True)
        if self._buffer:
            events.extend(self._line(self._buffer))
            self._buffer = ""
        events.extend(self._dispatch())
        return events

    def _drain(self, *, final: bool) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        start = 0
        buf = self._buffer
        while True:
            cr = buf.find("\r", start)
            lf = buf.find("\n", start)
            if cr < 0 and lf < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                if cr == len(buf) - 1 and not final:
                    break
                end = cr + 2 if buf.startswith("\n", cr + 1) else cr + 1
                line = buf[start:cr]
            else:
                end = lf + 1
                line = buf[start:lf]
            events.extend(self._line(line))
            start = end
        self._buffer = buf[start:]
        return events

    def _line(self, line: str) -> list[SSEEvent]:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return []
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            events = self._dispatch() if self._data and _complete_payload("\n".join(self._data)) else []
            self._data.append(value)
            return events
        if name == "event":
            self._event = value
        return []

    def _dispatch(self) -> list[SSEEvent]:
        if not self._data:
            self._event = ""
            return []
        event = SSEEvent(self._event or "message", "\n".join(self._data))
        self._data = []
        self._event = ""
        return [event]


def _complete_payload(data: str) -> bool:
    if data.strip() == "[DONE]":
        return True
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


# --- assembling the answer ------------------------------------------------------------------


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


@dataclass(frozen=True)
class TextPiece:
    """Text the model generated, as it came."""

    text: str


@dataclass(frozen=True)
class ReasoningPiece:
    """Reasoning the model generated (`reasoning_content`), as it came."""

    text: str


@dataclass(frozen=True)
class ToolCallPiece:
    """The model began a tool call: its name is known, its arguments are still coming."""

    index: int
    name: str


@dataclass(frozen=True)
class Idle:
    """Nothing came for a while; the caller may do what it does between pieces (save what it has)."""


StreamPiece = TextPiece | ReasoningPiece | ToolCallPiece | Idle
IDLE_SECONDS = 0.5


class StreamAssembler:
    """Folds parsed chunks of a chat completion stream into a `Completion`; `pieces` holds what each
    chunk added, for the caller to take."""

    def __init__(self) -> None:
        self.pieces: list[StreamPiece] = []
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, ToolCall] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.ollama_cached: int | None = None
        self.model: str | None = None
        self.got_token = False

    def add(self, chunk: dict[str, Any]) -> bool:
        """Take one chunk; True when it carried generated content (text, reasoning or a call)."""
        if self.model is None and isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            cached = _int_or_none(usage.get("prompt_eval_cached_count"))
            if cached is not None:
                self.ollama_cached = cached
        timings = chunk.get("timings")
        if isinstance(timings, dict):
            self.timings = timings
        cached = _int_or_none(chunk.get("prompt_eval_cached_count"))
        if cached is not None:
            self.ollama_cached = cached
        produced = False
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict) or choice.get("index", 0) not in (0, None):
                    continue
                delta = choice.get("delta")
                if not isinstance(delta, dict):
                    delta = choice.get("message")
                if isinstance(delta, dict):
                    produced = self._delta(delta) or produced
                reason = choice.get("finish_reason")
                if isinstance(reason, str) and reason:
                    self.finish_reason = reason
        if produced:
            self.got_token = True
        return produced

    def _delta(self, delta: dict[str, Any]) -> bool:
        produced = False
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.text.append(content)
            produced = True
            self.pieces.append(TextPiece(content))
        reasoning = delta.get("reasoning_content")
        if not isinstance(reasoning, str) or not reasoning:
            reasoning = delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning.append(reasoning)
            produced = True
            self.pieces.append(ReasoningPiece(reasoning))
        calls = delta.get("tool_calls")
        if isinstance(calls, list) and calls:
            for position, fragment in enumerate(calls):
                if isinstance(fragment, dict):
                    self._tool_fragment(position, fragment)
            produced = True
        return produced

    def _tool_fragment(self, position: int, fragment: dict[str, Any]) -> None:
        function = fragment.get("function")
        if not isinstance(function, dict):
            function = {}
        raw_id = fragment.get("id")
        call_id = raw_id if isinstance(raw_id, str) else ""
        raw_name = function.get("name")
        name = raw_name if isinstance(raw_name, str) else ""
        arguments = function.get("arguments")
        if isinstance(arguments, (dict, list)):
            arguments = json.dumps(arguments, ensure_ascii=False)
        elif not isinstance(arguments, str):
            arguments = ""
        index = _int_or_none(fragment.get("index"))
        if index is None:
            index = self._index_without_index(position, call_id, name)
        call = self.calls.get(index)
        if call is None:
            call = ToolCall(index=index, id="", name="", arguments="")
            self.calls[index] = call
        if call_id and not call.id:
            call.id = call_id
        call.arguments += arguments
        if name and not call.name:
            call.name = name
            self.pieces.append(ToolCallPiece(call.index, name))

    def _index_without_index(self, position: int, call_id: str, name: str) -> int:
        if call_id:
            for existing in self.calls.values():
                if existing.id == call_id:
                    return existing.index
        if name or not self.calls:
            taken = max(self.calls, default=-1)
            return position if position > taken else taken + 1
        return max(self.calls)

    def take_pieces(self) -> list[StreamPiece]:
        """The pieces added since the last call."""
        pieces, self.pieces = self.pieces, []
        return pieces

    def completion(self, *, time_to_first_token: float | None, total_time: float) -> Completion:
        """The answer as assembled so far."""
        usage = self.usage or {}
        timings = self.timings or {}
        cached: int | None = None
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached = _int_or_none(details.get("cached_tokens"))
        if cached is None:
            cached = _int_or_none(timings.get("cache_n"))
        if cached is None:
            cached = self.ollama_cached
        prompt = _int_or_none(usage.get("prompt_tokens"))
        if prompt is None:
            prompt_n = _int_or_none(timings.get("prompt_n"))
            cache_n = _int_or_none(timings.get("cache_n"))
            if prompt_n is not None:
                prompt = prompt_n + (cache_n or 0)
        generated = _int_or_none(usage.get("completion_tokens"))
        if generated is None:
            generated = _int_or_none(timings.get("predicted_n"))
        return Completion(
            text="".join(self.text),
            reasoning="".join(self.reasoning),
            tool_calls=[self.calls[i] for i in sorted(self.calls)],
            finish_reason=self.finish_reason,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=generated,
            usage=self.usage,
            timings=self.timings,
            time_to_first_token=time_to_first_token,
            total_time=total_time,
            model=self.model,
        )


# --- the HTTP exchange ----------------------------------------------------------------------


@dataclass
class _Head:
    status: int
    content_type: str
    body: bytes = b""


@dataclass
class _Failed:
    error: Exception
    after_head: bool


class _Eof:
    pass


_Item = _Head | bytes | _Failed | _Eof


@dataclass
class _Exchange:
    """The worker thread's side: the request, its response, and how to stop it."""

    url: str
    body: bytes
    headers: dict[str, str]
    timeout: httpx.Timeout
    client: httpx.Client | None
    items: queue.Queue[_Item] = field(default_factory=queue.Queue)
    stop: threading.Event = field(default_factory=threading.Event)
    sent: threading.Event = field(default_factory=threading.Event)  # the request is written, or never will be
    ended: threading.Event = field(default_factory=threading.Event)
    sock: socket.socket | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    unsent: bool = False  # writing the request failed: the server cannot have read it whole

    def run(self) -> None:
        own = self.client is None
        client = self.client or new_client()
        try:
            for attempt in range(1 + UNSENT_RETRIES):
                self.unsent = False
                try:
                    self._once(client)
                    return
                except Exception as error:
                    if self.stop.is_set():
                        return
                    if self.unsent and attempt < UNSENT_RETRIES:
                        logger.info("the request to %s did not get out (%s); sending it again", self.url, error)
                        continue
                    self.items.put(_Failed(error, after_head=False))
                    return
        finally:
            self.sent.set()
            if own:
                client.close()
            self.ended.set()

    def _once(self, client: httpx.Client) -> None:
        """One try at the exchange. A failure before the answer's head raises; after it, it is put."""
        head_sent = False
        try:
            with client.stream(
                "POST",
                self.url,
                content=self.body,
                headers=self.headers,
                timeout=self.timeout,
                extensions={"trace": self._trace},
            ) as response:
                self.sent.set()  # where no trace said so (a transport of another kind): an answer came
                stream = response.extensions.get("network_stream")
                if stream is not None:
                    self._remember(stream.get_extra_info("socket"))
                content_type = response.headers.get("content-type", "")
                if response.status_code != 200 or not _is_event_stream(content_type):
                    body = _read_limited(response.iter_bytes(), ERROR_BODY_LIMIT, self.stop)
                    self.items.put(_Head(response.status_code, content_type, body))
                    return
                self.items.put(_Head(response.status_code, content_type))
                head_sent = True
                for chunk in response.iter_bytes():
                    if self.stop.is_set():
                        return
                    if chunk:
                        self.items.put(chunk)
                self.items.put(_Eof())
        except Exception as error:
            if not head_sent:
                raise
            if not self.stop.is_set():
                self.items.put(_Failed(error, after_head=True))

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith(("send_request_headers.failed", "send_request_body.failed")):
            self.unsent = True
        if event.endswith("send_request_body.complete"):
            self.sent.set()
        elif event.endswith("connect_tcp.complete"):
            stream = info.get("return_value")
            if stream is not None:
                self._remember(stream.get_extra_info("socket"))

    def _remember(self, sock: object) -> None:
        if not isinstance(sock, socket.socket):
            return
        with self.lock:
            self.sock = sock
            if self.stop.is_set():
                self._shutdown()

    def abort(self, *, hard: bool) -> None:
        """Tell the worker to stop; `hard` also wakes a read blocked on the socket."""
        with self.lock:
            self.stop.set()
            if hard:
                self._shutdown()

    def _shutdown(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)


class _Workers:
    """The threads that run exchanges, each kept a while once idle for the next one: handing an exchange to a
    waiting thread takes a few microseconds, starting a thread for it most of a millisecond."""

    def __init__(self, *, idle_seconds: float) -> None:
        self.idle_seconds = idle_seconds
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._lock = threading.Lock()

    def run(self, work: Callable[[], None]) -> None:
        """Run ``work`` in an idle worker, or in a new one."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="model-stream", daemon=True).start()
        inbox.put(work)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            try:
                work = inbox.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if inbox not in self._idle:
                        continue  # handed work as the wait ended: it is in the inbox
                    self._idle.remove(inbox)
                return
            try:
                work()
            except Exception:
                logger.exception("a model exchange failed outside its own handling")
            del work  # an idle worker keeps nothing of the request it sent (its body may be megabytes)
            with self._lock:
                self._idle.append(inbox)

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)


WORKERS = _Workers(idle_seconds=WORKER_IDLE_SECONDS)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


NO_DELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def new_client() -> httpx.Client:
    """A client for model requests; one shared by several requests keeps its connection to the server open.
    A request's head and body go out at once, not after the server acknowledges the head (Nagle)."""
    context = _ssl_context()
    return httpx.Client(verify=context, transport=httpx.HTTPTransport(verify=context, socket_options=NO_DELAY))


def _is_event_stream(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() in ("text/event-stream", "")


def _read_limited(chunks: Iterator[bytes], limit: int, stop: threading.Event) -> bytes:
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) >= limit or stop.is_set():
            break
    return bytes(data[:limit])


def _one_line(text: str, limit: int = EXCERPT_CHARS) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _error_excerpt(body: bytes) -> str:
    text = body.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        return _one_line(text) or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return _one_line(error["message"])
        if isinstance(error, str):
            return _one_line(error)
        if isinstance(data.get("message"), str):
            return _one_line(data["message"])
        if isinstance(data.get("detail"), str):
            return _one_line(data["detail"])
    return _one_line(text)


def _describe(error: Exception) -> str:
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
    return _one_line(str(error)) or type(error).__name__


def _headers(api_key: str | None, accept: str) -> dict[str, str]:
    headers = {"Accept": accept}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


class ModelStream:
    """One streamed answer of the model: iterate it for the pieces as they come; once the iteration ends,
    `completion` is the whole answer. A failure raises a `ModelError` subclass from the iteration; cut,
    timed-out and cancelled streams carry what arrived as `.partial`.

    The request is sent, as the exact bytes given, by `start()` or else when the iteration starts.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        body: bytes,
        timeouts: Timeouts,
        cancel: threading.Event | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.body = body
        self.timeouts = timeouts
        self.cancel = cancel
        self.client = client
        self.completion: Completion | None = None
        self._exchange: _Exchange | None = None
        self._started = 0.0
        self._finished = False
        self.closed = False  # close() was called

    def start(self, *, wait: bool = True) -> None:
        """Send the request now, before the iteration (which sends it where this was not called). With ``wait``,
        return once it is written (or after ``SEND_WAIT_SECONDS``, or on a cancel), so the caller's work
        meanwhile does not hold up the worker that writes it; without, return once a worker has it."""
        if self._exchange is None:
            headers = _headers(self.api_key, "text/event-stream")
            headers["Content-Type"] = "application/json"
            headers["Accept-Encoding"] = "identity"
            timeouts = self.timeouts
            read_limit = max(timeouts.first_token, timeouts.between_chunks) + 5.0
            self._exchange = _Exchange(
                url=self.url,
                body=self.body,
                headers=headers,
                timeout=httpx.Timeout(
                    connect=timeouts.connect, read=read_limit, write=timeouts.between_chunks, pool=timeouts.connect
                ),
                client=self.client,
            )
            self._started = time.monotonic()
            WORKERS.run(self._exchange.run)
        if not wait:
            return
        deadline = self._started + SEND_WAIT_SECONDS
        while not self._exchange.sent.wait(max(0.0, min(POLL_SECONDS, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or (self.cancel is not None and self.cancel.is_set()):
                break

    def close(self) -> None:
        """Stop an answer that is not finished (a started one that is never iterated included)."""
        self.closed = True
        if self._exchange is not None:
            self._exchange.abort(hard=not self._finished)
            if not self._finished:
                self._exchange.ended.wait(timeout=0.2)

    def complete(self) -> Completion:
        """Read the whole answer, dropping the pieces."""
        for _ in self:
            pass
        assert self.completion is not None
        return self.completion

    def __iter__(self) -> Iterator[StreamPiece]:
        url, timeouts, cancel = self.url, self.timeouts, self.cancel
        self.start()
        exchange = self._exchange
        assert exchange is not None
        assembler = StreamAssembler()
        decoder = SSEDecoder()
        started = self._started
        first_token_at: float | None = None
        last_bytes_at = last_yield_at = started
        head: _Head | None = None

        def partial() -> Completion:
            ttft = None if first_token_at is None else first_token_at - started
            return assembler.completion(time_to_first_token=ttft, total_time=time.monotonic() - started)

        def timed_out() -> ModelTimeout:
            if first_token_at is None:
                seconds = timeouts.first_token
                message = f"The model server at {url} sent no first token within {seconds:g} s."
                return ModelTimeout(message, url=url, which="first_token", seconds=seconds, partial=partial())
            seconds = timeouts.between_chunks
            message = f"The model server at {url} went silent for {seconds:g} s in the middle of its answer."
            return ModelTimeout(message, url=url, which="between_chunks", seconds=seconds, partial=partial())

        def cut(detail: str) -> ModelStreamCut:
            got = partial()
            received = f"{len(got.text)} characters of text"
            if got.tool_calls:
                received += f", {len(got.tool_calls)} tool call(s)"
            message = f"The model server at {url} closed the stream before the answer was finished "
            message += f"({received} received; {detail})." if detail else f"({received} received)."
            return ModelStreamCut(message, url=url, partial=got)

        def protocol(detail: str) -> ModelProtocolError:
            return ModelProtocolError(
                f"The model server at {url} sent a malformed event stream: {detail}", url=url, partial=partial()
            )

        def handle(events: list[SSEEvent]) -> bool:
            nonlocal first_token_at
            for event in events:
                data = event.data.strip()
                if data == "[DONE]":
                    return True
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise protocol(f"data is not JSON: {_one_line(data, 80)}") from None
                if not isinstance(chunk, dict):
                    raise protocol(f"data is not a JSON object: {_one_line(data, 80)}")
                error = chunk.get("error")
                if event.event == "error" or (error is not None and "choices" not in chunk):
                    status = _int_or_none(error.get("code")) if isinstance(error, dict) else None
                    exceeded = context_exceeded(data.encode(), url=url, status=status or 200)
                    if exceeded is not None:
                        exceeded.partial = partial()
                        raise exceeded
                    excerpt = _error_excerpt(data.encode())
                    raise ModelHTTPError(
                        f"The model server at {url} reported an error mid-stream: {excerpt}",
                        url=url,
                        status=status or 200,
                        excerpt=excerpt,
                        partial=partial(),
                    )
                if assembler.add(chunk) and first_token_at is None:
                    first_token_at = time.monotonic()
            return False

        try:
            while True:
                if cancel is not None and cancel.is_set():
                    raise ModelCancelled(f"The request to {url} was cancelled.", url=url, partial=partial())
                now = time.monotonic()
                if first_token_at is None:
                    deadline = started + timeouts.first_token
                else:
                    deadline = last_bytes_at + timeouts.between_chunks
                if now >= deadline:
                    raise timed_out()
                try:
                    item = exchange.items.get(timeout=min(POLL_SECONDS, deadline - now))
                except queue.Empty:
                    if now - last_yield_at >= IDLE_SECONDS:
                        last_yield_at = now
                        yield Idle()
                    continue
                if isinstance(item, bytes):
                    last_bytes_at = time.monotonic()
                    try:
                        events = decoder.feed(item)
                    except UnicodeDecodeError:
                        raise protocol("the body is not valid UTF-8") from None
                    done = handle(events)
                    pieces = assembler.take_pieces()
                    if pieces:
                        last_yield_at = time.monotonic()
                        yield from pieces
                    if done:
                        self._finished = True
                        self.completion = partial()
                        return
                elif isinstance(item, _Head):
                    head = item
                    if item.status != 200:
                        exceeded = context_exceeded(item.body, url=url, status=item.status)
                        if exceeded is not None:
                            raise exceeded
                        excerpt = _error_excerpt(item.body)
                        raise ModelHTTPError(
                            f"The model server at {url} answered HTTP {item.status}: {excerpt}",
                            url=url,
                            status=item.status,
                            excerpt=excerpt,
                        )
                    if not _is_event_stream(item.content_type):
                        excerpt = _one_line(item.body.decode("utf-8", errors="replace"), 120)
                        raise ModelProtocolError(
                            f"The model server at {url} answered {item.content_type or 'no content type'} "
                            f"instead of an event stream: {excerpt or '(empty body)'}",
                            url=url,
                        )
                elif isinstance(item, _Eof):
                    try:
                        done = handle(decoder.close())
                    except UnicodeDecodeError:
                        raise protocol("the body is not valid UTF-8") from None
                    yield from assembler.take_pieces()
                    self._finished = True
                    if done or assembler.finish_reason is not None:
                        self.completion = partial()
                        return
                    raise cut("")
                else:
                    error = item.error
                    if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
                        raise ModelUnavailable(
                            f"Cannot reach the model server at {url}: {_describe(error)}.", url=url
                        ) from error
                    if isinstance(error, httpx.TimeoutException) and item.after_head:
                        raise timed_out() from error
                    if head is None:
                        if isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
                            raise ModelUnavailable(
                                f"The model server at {url} closed the connection without answering.", url=url
                            ) from error
                        if isinstance(error, httpx.TimeoutException):
                            raise timed_out() from error
                        raise ModelUnavailable(
                            f"Cannot talk to the model server at {url}: {_describe(error)}.", url=url
                        ) from error
                    if isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError)):
                        raise cut(_describe(error)) from error
                    raise ModelProtocolError(
                        f"The model server at {url} broke the exchange: {_describe(error)}",
                        url=url,
                        partial=partial(),
                    ) from error
        finally:
            self.close()


def list_models(*, base_url: str, api_key: str | None, timeout: float = 5.0) -> list[str]:
    """The model ids `{base_url}/models` lists."""
    url = base_url.rstrip("/") + "/models"
    try:
        response = httpx.get(url, headers=_headers(api_key, "application/json"), timeout=timeout, verify=_ssl_context())
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:
        message = f"Cannot reach the model server at {url}: {_describe(error)}."
        raise ModelUnavailable(message, url=url) from error
    except httpx.TimeoutException as error:
        message = f"The model server at {url} did not answer within {timeout:g} s."
        raise ModelTimeout(message, url=url, which="read", seconds=timeout) from error
    except httpx.HTTPError as error:
        message = f"Cannot talk to the model server at {url}: {_describe(error)}."
        raise ModelUnavailable(message, url=url) from error
    if response.status_code != 200:
        excerpt = _error_excerpt(response.content)
        raise ModelHTTPError(
            f"The model server at {url} answered HTTP {response.status_code}: {excerpt}",
            url=url,
            status=response.status_code,
            excerpt=excerpt,
        )
    try:
        data = response.json()
    except ValueError:
        raise ModelProtocolError(
            f"The model server at {url} answered something that is not JSON: {_one_line(response.text, 120)}",
            url=url,
        ) from None
    ids: list[str] = []
    if isinstance(data, dict):
        entries = data.get("data")
        if isinstance(entries, list):
            ids = [e["id"] for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]
        if not ids and isinstance(data.get("models"), list):
            for entry in data["models"]:
                if isinstance(entry, dict):
                    name = entry.get("model") or entry.get("name")
                    if isinstance(name, str):
                        ids.append(name)
        if ids or "data" in data or "models" in data:
            return ids
    excerpt = _one_line(response.text, 120)
    raise ModelProtocolError(f"The model server at {url} answered JSON without a model list: {excerpt}", url=url)


def failure_reason(error: ModelError) -> str:
    """A few words on why a request to the server failed, for a line that already names the server."""
    if isinstance(error, ModelTimeout):
        return f"no answer within {error.seconds:g} s"
    if isinstance(error, ModelHTTPError):
        return _one_line(f"HTTP {error.status}: {error.excerpt}", 120)
    if isinstance(error, ModelProtocolError):
        return "its answer is not a model list"
    if isinstance(error.__cause__, Exception):
        return _describe(error.__cause__)
    return str(error)


def stream_chat(
    *,
    base_url: str,
    api_key: str | None,
    body: bytes,
    timeouts: Timeouts,
    cancel: threading.Event | None = None,
    client: httpx.Client | None = None,
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
    client: httpx.Client | None = None  # shared by the requests of one action: its connection is kept open

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
