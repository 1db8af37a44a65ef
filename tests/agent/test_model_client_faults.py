"""Each way a model server can fail maps to one exception with a clear message."""

from __future__ import annotations

import asyncio
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


def ask(server: ScriptedServer, timeouts: Timeouts = FAST, *, seen: list[str] | None = None, **kwargs: object) -> None:
    stream = stream_chat(
        base_url=server.base_url,
        api_key=None,
        body=chat_body(first_turn()),
        timeouts=timeouts,
        **kwargs,  # type: ignore[arg-type]
    )
    for piece in stream:
        if seen is not None and isinstance(piece, TextPiece):
            seen.append(piece.text)


def url_of(server: ScriptedServer) -> str:
    return server.base_url + "/chat/completions"


def one_line(error: ModelError) -> str:
    message = str(error)
    assert "\n" not in message
    return message


def test_refused_answer(server: ScriptedServer) -> None:
    server.push(Step(text=TEXT, fault="refuse"))
    with pytest.raises(ModelUnavailable) as caught:
        ask(server)
    assert url_of(server) in one_line(caught.value)
    assert "without answering" in str(caught.value)
    assert caught.value.url == url_of(server)
    assert len(server.requests) == 1


def big_body() -> bytes:
    """A request larger than what the loopback buffers hold: it is still being written when the server resets."""
    return chat_body(first_turn(), padding="x" * (32 << 20))


def test_a_request_that_did_not_get_out_is_sent_again_on_a_new_connection(server: ScriptedServer) -> None:
    server.push(Step(fault="reset"), Step(text=TEXT))
    stream = stream_chat(base_url=server.base_url, api_key=None, body=big_body(), timeouts=FAST)
    assert stream.complete().text == TEXT
    assert len(server.requests) == 1, "the reset request was never read whole, so the server never had it"


def test_a_request_that_twice_did_not_get_out_says_so(server: ScriptedServer) -> None:
    server.push(Step(fault="reset"), Step(fault="reset"), Step(text=TEXT))
    with pytest.raises(ModelUnavailable) as caught:
        stream_chat(base_url=server.base_url, api_key=None, body=big_body(), timeouts=FAST).complete()
    assert one_line(caught.value) == f"The model server at {url_of(server)} closed the connection without answering."
    assert server.requests == [] and server.remaining == 1


def test_a_request_the_server_read_is_not_sent_again(server: ScriptedServer) -> None:
    server.push(Step(text=TEXT, fault="refuse"), Step(text=TEXT))
    with pytest.raises(ModelUnavailable):
        ask(server)
    assert len(server.requests) == 1 and server.remaining == 1


def test_http_500_names_status_and_server_message(server: ScriptedServer) -> None:
    server.push(Step(text="the slot crashed: out of memory", fault="http500"))
    with pytest.raises(ModelHTTPError) as caught:
        ask(server)
    assert caught.value.status == 500
    assert caught.value.excerpt == "the slot crashed: out of memory"
    assert one_line(caught.value) == (
        f"The model server at {url_of(server)} answered HTTP 500: the slot crashed: out of memory"
    )


def test_malformed_event_keeps_partial_text(server: ScriptedServer) -> None:
    server.push(Step(text=TEXT, fault="malformed"))
    with pytest.raises(ModelProtocolError) as caught:
        ask(server)
    assert "not JSON" in one_line(caught.value)
    assert url_of(server) in str(caught.value)
    assert caught.value.partial is not None
    assert caught.value.partial.text == TEXT[:3]


def test_cut_stream_keeps_partial_text(server: ScriptedServer) -> None:
    server.push(Step(text=TEXT, fault="cut", chunk_size=5))
    with pytest.raises(ModelStreamCut) as caught:
        ask(server)
    partial = caught.value.partial
    assert partial is not None
    assert partial.text and TEXT.startswith(partial.text) and partial.text != TEXT
    assert partial.finish_reason is None
    assert f"{len(partial.text)} characters" in one_line(caught.value)


def test_cut_during_tool_calls_keeps_them(server: ScriptedServer) -> None:
    server.push(Step(tool_calls=[("read", {"path": "a.txt"}), ("read", {"path": "b.txt"})], fault="cut"))
    with pytest.raises(ModelStreamCut) as caught:
        ask(server)
    assert caught.value.partial is not None
    assert [c.name for c in caught.value.partial.tool_calls][:1] == ["read"]


def test_html_answer_is_a_protocol_error(server: ScriptedServer) -> None:
    server.push(Step(fault="garbage"))
    with pytest.raises(ModelProtocolError) as caught:
        ask(server)
    message = one_line(caught.value)
    assert "text/html instead of an event stream" in message
    assert "Bad Gateway" in message


def test_closed_port_is_unavailable() -> None:
    with ScriptedServer() as gone:
        url = gone.base_url
    with pytest.raises(ModelUnavailable) as caught:
        stream_chat(base_url=url, api_key=None, body=b"{}", timeouts=FAST).complete()
    assert one_line(caught.value) == f"Cannot reach the model server at {url}/chat/completions: connection refused."


def test_connect_timeout_is_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    client = ModelClient(httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(ModelUnavailable, match="connection timed out"):
        stream_chat(
            base_url="http://model.lan:8080/v1", api_key=None, body=b"{}", timeouts=FAST, client=client
        ).complete()


def test_unknown_host_is_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        try:
            raise socket.gaierror(-2, "Name or service not known")
        except socket.gaierror as error:
            raise httpx.ConnectError(str(error), request=request) from error

    client = ModelClient(httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(ModelUnavailable) as caught:
        stream_chat(
            base_url="http://model.lan:8080/v1", api_key=None, body=b"{}", timeouts=FAST, client=client
        ).complete()
    assert str(caught.value) == (
        "Cannot reach the model server at http://model.lan:8080/v1/chat/completions: host name not found."
    )


def test_first_token_timeout_on_stall(server: ScriptedServer) -> None:
    server.push(Step(fault="stall"))  # the role delta, then silence for a minute
    with pytest.raises(ModelTimeout) as caught:
        ask(server, Timeouts(connect=2.0, first_token=0.4, between_chunks=30.0))
    assert caught.value.__cause__ is None, "the client's own deadline, not the socket's read timeout (35 s)"
    assert caught.value.partial is not None and caught.value.partial.total_time >= 0.4, "not before the deadline"
    assert caught.value.which == "first_token"
    assert caught.value.seconds == 0.4
    assert one_line(caught.value) == f"The model server at {url_of(server)} sent no first token within 0.4 s."
    assert caught.value.partial is not None and caught.value.partial.text == ""


def test_keep_alive_comments_do_not_extend_the_first_token_wait(server: ScriptedServer) -> None:
    server.push(Step(fault="keepalive", delay=0.1))  # a comment every 0.1 s for a minute, and no token
    with pytest.raises(ModelTimeout) as caught:
        ask(server, Timeouts(connect=2.0, first_token=0.6, between_chunks=0.3))
    assert caught.value.which == "first_token", "not the 0.3 s between chunks, nor a cut after the minute"
    assert caught.value.__cause__ is None, "the client's own deadline, while the comments still came"
    assert caught.value.partial is not None and caught.value.partial.total_time >= 0.6


def test_between_chunks_timeout_keeps_partial_text(server: ScriptedServer) -> None:
    server.push(Step(text="abcdefghijkl", chunk_size=3, delay=0.7))
    with pytest.raises(ModelTimeout) as caught:
        ask(server, Timeouts(connect=2.0, first_token=5.0, between_chunks=0.3))
    assert caught.value.which == "between_chunks"
    assert caught.value.__cause__ is None, "the client's own deadline, not the socket's read timeout"
    assert "went silent for 0.3 s" in one_line(caught.value)
    assert caught.value.partial is not None
    assert caught.value.partial.text == "abc", "given up after the first chunk, before the next one came"
    assert caught.value.partial.time_to_first_token is not None


def cancel_when(condition: Callable[[], object], *, plain: bool = False) -> threading.Event:
    """A ``Cancel`` (or, with ``plain``, a plain event) set from another thread once ``condition`` holds (looked
    at every few milliseconds, for a minute at most)."""
    event = threading.Event() if plain else Cancel()
    deadline = time.monotonic() + 60

    def watch() -> None:
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.005)
        event.set()

    threading.Thread(target=watch, daemon=True).start()
    return event


@pytest.mark.parametrize("plain", [False, True], ids=["cancel", "plain-event"])
def test_cancel_interrupts_a_stalled_read(server: ScriptedServer, plain: bool) -> None:
    """A ``Cancel`` wakes the read at once; a plain event is looked at while the read waits."""
    server.push(Step(fault="stall"))  # the role delta, then silence for a minute: a cut, were it not cancelled
    cancel = cancel_when(lambda: server.requests, plain=plain)
    with pytest.raises(ModelCancelled) as caught:
        ask(server, Timeouts(), cancel=cancel)
    assert one_line(caught.value) == f"The request to {url_of(server)} was cancelled."
    assert caught.value.partial is not None and caught.value.partial.text == ""


def test_cancel_mid_answer_keeps_partial_text(server: ScriptedServer) -> None:
    text = "one two three four five six seven"
    server.push(Step(text=text, chunk_size=4, delay=0.15))
    seen: list[str] = []
    cancel = cancel_when(lambda: seen)  # as soon as the first piece is out
    with pytest.raises(ModelCancelled) as caught:
        ask(server, Timeouts(), cancel=cancel, seen=seen)
    assert caught.value.partial is not None
    assert caught.value.partial.text == "".join(seen)
    assert caught.value.partial.text and caught.value.partial.text != text, "stopped in the middle of the answer"


def test_cancel_before_start(server: ScriptedServer) -> None:
    server.push(Step(text=TEXT))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ModelCancelled) as caught:
        ask(server, cancel=cancel)
    assert caught.value.partial is not None and caught.value.partial.text == "", "nothing of the answer was read"


def test_cancel_while_the_server_holds_back_its_headers() -> None:
    asked = threading.Event()
    answered: list[bool] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        asked.set()
        await asyncio.Event().wait()  # the headers never come while the client waits
        answered.append(True)
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=b"")

    client = ModelClient(httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(ModelCancelled):
        stream_chat(
            base_url="http://m/v1",
            api_key=None,
            body=b"{}",
            timeouts=Timeouts(),
            cancel=cancel_when(asked.is_set),
            client=client,
        ).complete()
    assert answered == [], "cancelled while the headers were still held back"


def test_cancel_while_a_real_server_reads_the_prompt() -> None:
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
            stream_chat(
                base_url=url, api_key=None, body=b"{}", timeouts=Timeouts(), cancel=cancel_when(lambda: received)
            ).complete()
        assert closed.wait(10), "the client closed its connection"
    finally:
        listener.close()


def test_http_error_with_plain_text_body() -> None:
    client = mock_client([b"upstream   connect\n error"], status=502, content_type="text/plain")
    with pytest.raises(ModelHTTPError) as caught:
        stream_chat(base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, client=client).complete()
    assert caught.value.status == 502
    assert (
        str(caught.value)
        == "The model server at http://m/v1/chat/completions answered HTTP 502: upstream connect error"
    )


def test_http_error_excerpt_is_short() -> None:
    client = mock_client([b"x" * 5000], status=503, content_type="text/plain")
    with pytest.raises(ModelHTTPError) as caught:
        stream_chat(base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, client=client).complete()
    assert len(caught.value.excerpt) <= 300


def test_a_request_past_the_context_is_a_clear_error() -> None:
    from chat.agent.model import ModelContextExceeded

    with ScriptedServer(n_ctx=5) as small, pytest.raises(ModelContextExceeded) as raised:
        ask(small)
    error = raised.value
    assert (error.status, error.n_ctx) == (400, 5)
    assert error.n_prompt_tokens is not None and error.n_prompt_tokens > 5
    assert str(error) == (
        f"The model server at {url_of(small)} refused the request: it is "
        f"{error.n_prompt_tokens:,} tokens; the model's context window is 5. "
        "Compact now, start a new session, or use a model with a larger window."
    )
