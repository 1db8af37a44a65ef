"""Each way a model server can fail maps to one exception with a clear message."""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from chat.agent.model import (
    Cancel,
    ModelCancelled,
    ModelClient,
    ModelError,
    ModelHTTPError,
    ModelProtocolError,
    ModelStreamCut,
    ModelTimeout,
    ModelUnavailable,
    TextPiece,
    Timeouts,
    stream_chat,
)
from testing.scripted_server import ScriptedServer, Step
from tests.agent.mc_helpers import chat_body, first_turn, mock_client

FAST = Timeouts(connect=2.0, first_token=10.0, between_chunks=10.0)
TEXT = "This answer will not arrive in one piece, sadly."


async def ask(
    server: ScriptedServer, timeouts: Timeouts = FAST, *, seen: list[str] | None = None, **kwargs: object
) -> None:
    stream = stream_chat(
        base_url=server.base_url,
        api_key=None,
        body=chat_body(first_turn()),
        timeouts=timeouts,
        **kwargs,  # type: ignore[arg-type]
    )
    async for piece in stream:
        if seen is not None and isinstance(piece, TextPiece):
            seen.append(piece.text)


def url_of(server: ScriptedServer) -> str:
    return server.base_url + "/chat/completions"


def one_line(error: ModelError) -> str:
    message = str(error)
    assert "\n" not in message
    return message


@pytest.mark.asyncio
async def test_refused_answer(server: ScriptedServer) -> None:
    server.push(Step(text=TEXT, fault="refuse"))
    with pytest.raises(ModelUnavailable) as caught:
        await ask(server)
    assert url_of(server) in one_line(caught.value)
    assert "without answering" in str(caught.value)
    assert caught.value.url == url_of(server)
    assert len(server.requests) == 1


def big_body() -> bytes:
    """A request larger than what the loopback buffers hold: it is still being written when the server resets."""
    return chat_body(first_turn(), padding="x" * (32 << 20))


@pytest.mark.asyncio
async def test_a_request_that_did_not_get_out_is_sent_again_on_a_new_connection(server: ScriptedServer) -> None:
    server.push(Step(fault="reset"), Step(text=TEXT))
    stream = stream_chat(base_url=server.base_url, api_key=None, body=big_body(), timeouts=FAST)
    assert (await stream.complete()).text == TEXT
    assert len(server.requests) == 1, "the reset request was never read whole, so the server never had it"


@pytest.mark.asyncio
async def test_a_request_that_twice_did_not_get_out_says_so(server: ScriptedServer) -> None:
    server.push(Step(fault="reset"), Step(fault="reset"), Step(text=TEXT))
    with pytest.raises(ModelUnavailable) as caught:
        await stream_chat(base_url=server.base_url, api_key=None, body=big_body(), timeouts=FAST).complete()
    assert one_line(caught.value) == f"The model server at {url_of(server)} closed the connection without answering."
    assert server.requests == [] and server.remaining == 1


@pytest.mark.asyncio
async def test_a_request_the_server_read_is_not_sent_again(server: ScriptedServer) -> None:
    server.push(Step(text=TEXT, fault="refuse"), Step(text=TEXT))
    with pytest.raises(ModelUnavailable):
        await ask(server)
    assert len(server.requests) == 1 and server.remaining == 1


@pytest.mark.asyncio
async def test_a_kept_connection_closed_without_an_answer_is_left_for_a_new_one(server: ScriptedServer) -> None:
    """A server may close a connection it holds idle just as the next request goes out on it (llama-server does,
    now and then, right after an answer): the client cannot tell that from a server that read the request, so
    on a connection kept from an earlier request, a close before any answer sends the request once more, on a
    new connection. (On a new connection it is not sent again: ``test_a_request_the_server_read_is_not_sent_again``.)"""
    server.push(Step(text="first"), Step(fault="refuse"), Step(text=TEXT), Step(fault="refuse"), Step(fault="refuse"))
    accepted: list[bool] = []
    track = server._track

    def counting(connection: socket.socket, *, add: bool) -> None:
        if add:
            accepted.append(True)
        track(connection, add=add)

    server._track = counting  # type: ignore[method-assign]
    client = ModelClient()
    try:
        await ask(server, client=client)
        seen: list[str] = []
        await ask(server, client=client, seen=seen)
        assert "".join(seen) == TEXT
        assert len(accepted) == 2, "the second request went again, on a new connection"
        with pytest.raises(ModelUnavailable, match="without answering"):
            await ask(server, client=client)
        assert len(server.requests) == 5 and server.remaining == 0, "sent once more, not twice"
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_http_500_names_status_and_server_message(server: ScriptedServer) -> None:
    server.push(Step(text="the slot crashed: out of memory", fault="http500"))
    with pytest.raises(ModelHTTPError) as caught:
        await ask(server)
    assert caught.value.status == 500
    assert caught.value.excerpt == "the slot crashed: out of memory"
    assert one_line(caught.value) == (
        f"The model server at {url_of(server)} answered HTTP 500: the slot crashed: out of memory"
    )


@pytest.mark.asyncio
async def test_malformed_event_keeps_partial_text(server: ScriptedServer) -> None:
    server.push(Step(text=TEXT, fault="malformed"))
    with pytest.raises(ModelProtocolError) as caught:
        await ask(server)
    assert "not JSON" in one_line(caught.value)
    assert url_of(server) in str(caught.value)
    assert caught.value.partial is not None
    assert caught.value.partial.text == TEXT[:3]


@pytest.mark.asyncio
async def test_cut_stream_keeps_partial_text(server: ScriptedServer) -> None:
    server.push(Step(text=TEXT, fault="cut", chunk_size=5))
    with pytest.raises(ModelStreamCut) as caught:
        await ask(server)
    partial = caught.value.partial
    assert partial is not None
    assert partial.text and TEXT.startswith(partial.text) and partial.text != TEXT
    assert partial.finish_reason is None
    assert f"{len(partial.text)} characters" in one_line(caught.value)


@pytest.mark.asyncio
async def test_cut_during_tool_calls_keeps_them(server: ScriptedServer) -> None:
    server.push(Step(tool_calls=[("read", {"path": "a.txt"}), ("read", {"path": "b.txt"})], fault="cut"))
    with pytest.raises(ModelStreamCut) as caught:
        await ask(server)
    assert caught.value.partial is not None
    assert [c.name for c in caught.value.partial.tool_calls][:1] == ["read"]


@pytest.mark.asyncio
async def test_html_answer_is_a_protocol_error(server: ScriptedServer) -> None:
    server.push(Step(fault="garbage"))
    with pytest.raises(ModelProtocolError) as caught:
        await ask(server)
    message = one_line(caught.value)
    assert "text/html instead of an event stream" in message
    assert "Bad Gateway" in message


@pytest.mark.asyncio
async def test_closed_port_is_unavailable() -> None:
    with ScriptedServer() as gone:
        url = gone.base_url
    with pytest.raises(ModelUnavailable) as caught:
        await stream_chat(base_url=url, api_key=None, body=b"{}", timeouts=FAST).complete()
    assert one_line(caught.value) == f"Cannot reach the model server at {url}/chat/completions: connection refused."


@pytest.mark.asyncio
async def test_connect_timeout_is_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    client = ModelClient(httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(ModelUnavailable, match="connection timed out"):
        await stream_chat(
            base_url="http://model.lan:8080/v1", api_key=None, body=b"{}", timeouts=FAST, client=client
        ).complete()


@pytest.mark.asyncio
async def test_unknown_host_is_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        try:
            raise socket.gaierror(-2, "Name or service not known")
        except socket.gaierror as error:
            raise httpx.ConnectError(str(error), request=request) from error

    client = ModelClient(httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(ModelUnavailable) as caught:
        await stream_chat(
            base_url="http://model.lan:8080/v1", api_key=None, body=b"{}", timeouts=FAST, client=client
        ).complete()
    assert str(caught.value) == (
        "Cannot reach the model server at http://model.lan:8080/v1/chat/completions: host name not found."
    )


@pytest.mark.asyncio
async def test_first_token_timeout_on_stall(server: ScriptedServer) -> None:
    server.push(Step(fault="stall"))  # the role delta, then silence for a minute
    with pytest.raises(ModelTimeout) as caught:
        await ask(server, Timeouts(connect=2.0, first_token=0.4, between_chunks=30.0))
    assert caught.value.__cause__ is None, "the client's own deadline, not the socket's read timeout (35 s)"
    assert caught.value.partial is not None and caught.value.partial.total_time >= 0.4, "not before the deadline"
    assert caught.value.which == "first_token"
    assert caught.value.seconds == 0.4
    assert one_line(caught.value) == f"The model server at {url_of(server)} sent no first token within 0.4 s."
    assert caught.value.partial is not None and caught.value.partial.text == ""


@pytest.mark.asyncio
async def test_keep_alive_comments_do_not_extend_the_first_token_wait(server: ScriptedServer) -> None:
    server.push(Step(fault="keepalive", delay=0.1))  # a comment every 0.1 s for a minute, and no token
    with pytest.raises(ModelTimeout) as caught:
        await ask(server, Timeouts(connect=2.0, first_token=0.6, between_chunks=0.3))
    assert caught.value.which == "first_token", "not the 0.3 s between chunks, nor a cut after the minute"
    assert caught.value.__cause__ is None, "the client's own deadline, while the comments still came"
    assert caught.value.partial is not None and caught.value.partial.total_time >= 0.6


@pytest.mark.asyncio
async def test_between_chunks_timeout_keeps_partial_text(server: ScriptedServer) -> None:
    server.push(Step(text="abcdefghijkl", chunk_size=3, delay=0.7))
    with pytest.raises(ModelTimeout) as caught:
        await ask(server, Timeouts(connect=2.0, first_token=5.0, between_chunks=0.3))
    assert caught.value.which == "between_chunks"
    assert caught.value.__cause__ is None, "the client's own deadline, not the socket's read timeout"
    assert "went silent for 0.3 s" in one_line(caught.value)
    assert caught.value.partial is not None
    assert caught.value.partial.text == "abc", "given up after the first chunk, before the next one came"
    assert caught.value.partial.time_to_first_token is not None


_watchers: set[asyncio.Task[None]] = set()


def cancel_when(condition: Callable[[], object], *, from_thread: bool = False) -> Cancel:
    """A ``Cancel`` set by another task once ``condition`` holds (looked at every few milliseconds, for a minute
    at most); with ``from_thread``, set from a thread of the default executor, as Stop may come from any thread."""
    cancel = Cancel()
    deadline = time.monotonic() + 60

    async def watch() -> None:
        while not condition() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if from_thread:
            await asyncio.to_thread(cancel.set)
        else:
            cancel.set()

    task = asyncio.get_running_loop().create_task(watch())
    _watchers.add(task)
    task.add_done_callback(_watchers.discard)
    return cancel


@pytest.mark.asyncio
@pytest.mark.parametrize("from_thread", [False, True], ids=["from-a-task", "from-a-thread"])
async def test_cancel_interrupts_a_stalled_read(server: ScriptedServer, from_thread: bool) -> None:
    """A ``Cancel`` set by another task, or from another thread, wakes the read at once."""
    server.push(Step(fault="stall"))  # the role delta, then silence for a minute: a cut, were it not cancelled
    cancel = cancel_when(lambda: server.requests, from_thread=from_thread)
    began = time.monotonic()
    with pytest.raises(ModelCancelled) as caught:
        await ask(server, Timeouts(), cancel=cancel)
    assert time.monotonic() - began < 10, "at once, not at the end of the server's minute of silence"
    assert one_line(caught.value) == f"The request to {url_of(server)} was cancelled."
    assert caught.value.partial is not None and caught.value.partial.text == ""


@pytest.mark.asyncio
async def test_cancel_mid_answer_keeps_partial_text(server: ScriptedServer) -> None:
    text = "one two three four five six seven"
    server.push(Step(text=text, chunk_size=4, delay=0.15))
    seen: list[str] = []
    cancel = cancel_when(lambda: seen)  # as soon as the first piece is out
    with pytest.raises(ModelCancelled) as caught:
        await ask(server, Timeouts(), cancel=cancel, seen=seen)
    assert caught.value.partial is not None
    assert caught.value.partial.text == "".join(seen)
    assert caught.value.partial.text and caught.value.partial.text != text, "stopped in the middle of the answer"


@pytest.mark.asyncio
async def test_cancel_before_start(server: ScriptedServer) -> None:
    server.push(Step(text=TEXT))
    cancel = Cancel()
    cancel.set()
    with pytest.raises(ModelCancelled) as caught:
        await ask(server, cancel=cancel)
    assert caught.value.partial is not None and caught.value.partial.text == "", "nothing of the answer was read"


@pytest.mark.asyncio
async def test_cancel_while_the_server_holds_back_its_headers() -> None:
    asked = threading.Event()
    answered: list[bool] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        asked.set()
        await asyncio.Event().wait()  # the headers never come while the client waits
        answered.append(True)
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=b"")

    client = ModelClient(httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(ModelCancelled):
        await stream_chat(
            base_url="http://m/v1",
            api_key=None,
            body=b"{}",
            timeouts=Timeouts(),
            cancel=cancel_when(asked.is_set),
            client=client,
        ).complete()
    assert answered == [], "cancelled while the headers were still held back"


@pytest.mark.asyncio
async def test_cancel_while_a_real_server_reads_the_prompt() -> None:
    """llama-server sends its headers with the first token: a Stop during a long prompt's reading meets a
    socket that has sent nothing, and still ends the request, closing the connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []
    closed = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            while chunk := connection.recv(1 << 16):  # the request, then nothing back until the client goes
                received.append(chunk)
        closed.set()

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    try:
        with pytest.raises(ModelCancelled):
            await stream_chat(
                base_url=url, api_key=None, body=b"{}", timeouts=Timeouts(), cancel=cancel_when(lambda: received)
            ).complete()
        deadline = time.monotonic() + 10
        while not closed.is_set():
            assert time.monotonic() < deadline, "the client closed its connection"
            await asyncio.sleep(0.01)
    finally:
        listener.close()


@pytest.mark.asyncio
async def test_http_error_with_plain_text_body() -> None:
    client = mock_client([b"upstream   connect\n error"], status=502, content_type="text/plain")
    with pytest.raises(ModelHTTPError) as caught:
        await stream_chat(base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, client=client).complete()
    assert caught.value.status == 502
    assert (
        str(caught.value)
        == "The model server at http://m/v1/chat/completions answered HTTP 502: upstream connect error"
    )


@pytest.mark.asyncio
async def test_http_error_excerpt_is_short() -> None:
    client = mock_client([b"x" * 5000], status=503, content_type="text/plain")
    with pytest.raises(ModelHTTPError) as caught:
        await stream_chat(base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, client=client).complete()
    assert len(caught.value.excerpt) <= 300


@pytest.mark.asyncio
async def test_a_request_past_the_context_is_a_clear_error() -> None:
    from chat.agent.model import ModelContextExceeded

    with ScriptedServer(n_ctx=5) as small, pytest.raises(ModelContextExceeded) as raised:
        await ask(small)
    error = raised.value
    assert (error.status, error.n_ctx) == (400, 5)
    assert error.n_prompt_tokens is not None and error.n_prompt_tokens > 5
    assert str(error) == (
        f"The model server at {url_of(small)} refused the request: it is "
        f"{error.n_prompt_tokens:,} tokens; the model's context window is 5. "
        "Compact now, start a new session, or use a model with a larger window."
    )


@pytest.mark.asyncio
async def test_a_wait_a_set_cancel_ends_before_it_begins_lets_go_of_what_it_was_given() -> None:
    """Stop between an error's head and its body: the body's reading, never begun, is closed (no "coroutine
    was never awaited" warning)."""
    cancel = Cancel()
    cancel.set()
    stream = stream_chat(base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, cancel=cancel)

    async def reading() -> bytes:
        return b""

    never = reading()
    with pytest.raises(asyncio.CancelledError):
        await stream.wait(never, time.monotonic() + 10)
    assert inspect.getcoroutinestate(never) == inspect.CORO_CLOSED
