"""The client against the scripted server: text, reasoning, tool calls, usage and caching."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import threading
import time
import weakref

import pytest

from chat.agent.model import (
    ModelClient,
    ModelUnavailable,
    ReasoningPiece,
    TextPiece,
    Timeouts,
    ToolCallPiece,
    list_models,
    stream_chat,
)
from testing.scripted_server import ScriptedServer, Step
from tests.agent.mc_helpers import chat_body, collect, first_turn
from tests.listeners import stop_listening

FAST = Timeouts(connect=2.0, first_token=10.0, between_chunks=10.0)


@pytest.mark.asyncio
async def test_text_streams_in_pieces(server: ScriptedServer) -> None:
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé ✓"
    server.push(Step(text=text, chunk_size=4, delay=0.02))
    done, got = await collect(
        stream_chat(base_url=server.base_url, api_key=None, body=chat_body(first_turn()), timeouts=FAST)
    )
    pieces = [piece.text for piece in got if isinstance(piece, TextPiece)]
    assert done.text == text
    assert "".join(pieces) == text
    assert len(pieces) > 1, "streamed as it came, not at the end"
    assert len(pieces) <= -(-len(text) // 4), "what one read brought goes on as one piece"
    assert all(len(piece) % 4 == 0 for piece in pieces[:-1]), "a piece is whole chunks of the server's"
    assert done.reasoning == ""
    assert done.tool_calls == []
    assert done.finish_reason == "stop"
    assert done.model == "scripted"
    assert done.time_to_first_token is not None
    assert 0 <= done.time_to_first_token <= done.total_time


@pytest.mark.asyncio
async def test_body_is_sent_byte_for_byte(server: ScriptedServer) -> None:
    body = b'{"stream":true,  "messages":[{"role":"user","content":"caf\\u00e9"}],"model":"m",' + (
        b'"stream_options":{"include_usage":true}}'
    )
    server.push(Step(text="ok"), Step(text="ok"))
    await stream_chat(base_url=server.base_url, api_key="secret", body=body, timeouts=FAST).complete()
    await stream_chat(base_url=server.base_url + "/", api_key=None, body=body, timeouts=FAST).complete()
    assert server.requests == [body, body]


@pytest.mark.asyncio
async def test_reasoning_then_text(server: ScriptedServer) -> None:
    server.push(Step(reasoning="Let me think about it.", text="Forty-two."))
    done, got = await collect(
        stream_chat(base_url=server.base_url, api_key=None, body=chat_body(first_turn()), timeouts=FAST)
    )
    thoughts = [piece.text for piece in got if isinstance(piece, ReasoningPiece)]
    assert done.reasoning == "Let me think about it."
    assert "".join(thoughts) == done.reasoning
    assert done.text == "Forty-two."


@pytest.mark.asyncio
async def test_several_tool_calls_split_across_chunks(server: ScriptedServer) -> None:
    raw = '{"pattern": "def \\\\w+", "glob": "*.py"}'
    server.push(
        Step(
            text="Looking.",
            tool_calls=[("read", {"path": "src/app.py", "offset": 10}), ("grep", raw), ("list", {})],
            chunk_size=2,
        )
    )
    done, got = await collect(
        stream_chat(base_url=server.base_url, api_key=None, body=chat_body(first_turn()), timeouts=FAST)
    )
    announced = [(piece.index, piece.name) for piece in got if isinstance(piece, ToolCallPiece)]
    assert done.finish_reason == "tool_calls"
    assert done.text == "Looking."
    assert [(c.index, c.name) for c in done.tool_calls] == [(0, "read"), (1, "grep"), (2, "list")]
    assert json.loads(done.tool_calls[0].arguments) == {"path": "src/app.py", "offset": 10}
    assert done.tool_calls[1].arguments == raw
    assert done.tool_calls[2].arguments == "{}"
    assert len({c.id for c in done.tool_calls}) == 3
    assert all(c.id for c in done.tool_calls)
    assert announced == [(c.index, c.name) for c in done.tool_calls]


@pytest.mark.asyncio
async def test_usage_timings_and_cached_tokens(server: ScriptedServer) -> None:
    server.push(Step(text="Hi there."))
    done = await stream_chat(
        base_url=server.base_url, api_key=None, body=chat_body(first_turn()), timeouts=FAST
    ).complete()
    assert done.usage is not None and done.timings is not None
    assert done.prompt_tokens == done.usage["prompt_tokens"] > 50
    assert done.completion_tokens == done.usage["completion_tokens"] > 0
    assert done.cached_tokens == done.usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert done.timings["prompt_n"] == done.prompt_tokens
    assert done.timings["cache_n"] == 0


@pytest.mark.asyncio
async def test_cached_tokens_grow_across_requests_sharing_a_prefix(server: ScriptedServer) -> None:
    messages = first_turn("What is in the workspace?")
    results = []
    for answer in ("It holds three files.", "The largest is app.py.", "Done."):
        server.push(Step(text=answer))
        done = await stream_chat(
            base_url=server.base_url, api_key=None, body=chat_body(messages), timeouts=FAST
        ).complete()
        results.append(done)
        messages = [
            *messages,
            {"role": "assistant", "content": done.text},
            {"role": "user", "content": "And?"},
        ]
    prompts = [r.prompt_tokens or 0 for r in results]
    cached = [r.cached_tokens or 0 for r in results]
    assert cached[0] == 0
    assert prompts[0] < prompts[1] < prompts[2]
    assert 0 < cached[1] < cached[2]
    assert cached[1] >= prompts[0] - 2
    assert cached[2] >= prompts[1] - 2

    server.push(Step(text="Fresh."))
    other = [{"role": "system", "content": "A different system prompt."}, {"role": "user", "content": "Hi"}]
    fresh = await stream_chat(base_url=server.base_url, api_key=None, body=chat_body(other), timeouts=FAST).complete()
    assert fresh.cached_tokens is not None and fresh.cached_tokens < 5


@pytest.mark.asyncio
async def test_same_request_twice_caches_all_but_the_last_token(server: ScriptedServer) -> None:
    body = chat_body(first_turn())
    server.push(Step(text="a"), Step(text="b"))
    first = await stream_chat(base_url=server.base_url, api_key=None, body=body, timeouts=FAST).complete()
    second = await stream_chat(base_url=server.base_url, api_key=None, body=body, timeouts=FAST).complete()
    assert first.prompt_tokens == second.prompt_tokens
    assert second.cached_tokens == (second.prompt_tokens or 0) - 1


@pytest.mark.asyncio
async def test_tools_count_in_the_prompt(server: ScriptedServer) -> None:
    tools = [{"type": "function", "function": {"name": "read", "description": "Read a file. " * 10}}]
    server.push(Step(text="a"), Step(text="b"))
    bare = await stream_chat(
        base_url=server.base_url, api_key=None, body=chat_body(first_turn()), timeouts=FAST
    ).complete()
    with_tools = await stream_chat(
        base_url=server.base_url, api_key=None, body=chat_body(first_turn(), tools=tools), timeouts=FAST
    ).complete()
    assert (with_tools.prompt_tokens or 0) > (bare.prompt_tokens or 0) + 20


def test_list_models(server: ScriptedServer) -> None:
    assert list_models(base_url=server.base_url, api_key="k") == ["scripted"]


def test_list_models_unreachable() -> None:
    with ScriptedServer() as gone:
        url = gone.base_url
    with pytest.raises(ModelUnavailable, match="connection refused"):
        list_models(base_url=url, api_key=None, timeout=2.0)


class _Receiver:
    """A TCP server that takes one connection and reads the request from it only once ``reading`` is set."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.reading = threading.Event()
        self.received = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def _serve(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except OSError:
            return
        with connection:
            self.reading.wait(10)
            connection.settimeout(5)
            with contextlib.suppress(OSError):
                while chunk := connection.recv(1 << 16):
                    self.received += len(chunk)

    def close(self) -> None:
        self.reading.set()
        stop_listening(self.listener, self.thread)


BIG_BODY = b'{"messages": [], "padding": "' + b"x" * (16 << 20) + b'"}'  # more than the socket buffers hold


@pytest.mark.asyncio
async def test_start_sends_the_request_while_the_caller_does_something_else() -> None:
    """What the caller does after ``start`` (storing, rendering) must not wait for the request to be written,
    nor the request for the caller: ``start`` returns at once, even to a server that reads nothing yet, and the
    request goes out while the caller awaits something else, before it iterates the answer."""
    receiver = _Receiver()
    answer = stream_chat(base_url=receiver.base_url, api_key=None, body=BIG_BODY, timeouts=FAST)
    try:
        began = time.monotonic()
        answer.start()
        assert time.monotonic() - began < 0.1, "start returned at once"
        await asyncio.sleep(0.2)
        assert receiver.received == 0, "the server reads nothing yet"
        receiver.reading.set()  # the server reads from now on
        deadline = time.monotonic() + 10
        while receiver.received <= len(BIG_BODY) // 2:  # what is not read yet is at most what the buffers hold
            assert time.monotonic() < deadline, "the request went out without the answer being iterated"
            await asyncio.sleep(0.01)
    finally:
        await answer.aclose()
        receiver.close()
    assert answer.completion is None


@pytest.mark.asyncio
async def test_aclose_stops_a_request_still_being_written() -> None:
    """A started answer that is never iterated (the reply stopped before it) is closed at once, the request's
    writing included, and leaves no task behind."""
    receiver = _Receiver()  # reads nothing: the writing waits for the socket buffers
    answer = stream_chat(base_url=receiver.base_url, api_key=None, body=BIG_BODY, timeouts=FAST)
    try:
        answer.start()
        await asyncio.sleep(0.1)
        began = time.monotonic()
        await answer.aclose()
        assert time.monotonic() - began < 1.0
        deadline = time.monotonic() + 2
        while [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:  # the request's task unwinds
            assert time.monotonic() < deadline, "the request's task ended"
            await asyncio.sleep(0.01)
    finally:
        receiver.close()


def _counting_connections(server: ScriptedServer) -> list[socket.socket]:
    """The connections ``server`` accepts from now on, each once, open or closed since."""
    accepted: list[socket.socket] = []
    track = server._track

    def counting(connection: socket.socket, *, add: bool) -> None:
        if add:
            accepted.append(connection)
        track(connection, add=add)

    server._track = counting  # type: ignore[method-assign]
    return accepted


@pytest.mark.asyncio
async def test_requests_of_one_client_share_its_connection_and_start_no_thread(server: ScriptedServer) -> None:
    """The requests of one action go out on its client's one connection, kept open from one answer to the next
    (the answer's last bytes, after ``[DONE]``, are read so that it can be); and no thread is started: the
    stream is read on the caller's own event loop."""
    count = 20
    server.push(*[Step(text=f"answer {n}") for n in range(count)])
    accepted = _counting_connections(server)
    before = set(threading.enumerate())
    client = ModelClient()
    try:
        for _ in range(count):
            done, _pieces = await collect(
                stream_chat(
                    base_url=server.base_url, api_key=None, body=chat_body(first_turn()), timeouts=FAST, client=client
                )
            )
            assert done.text.startswith("answer")
            started = [t for t in set(threading.enumerate()) - before if "process_request" not in t.name]
            assert started == [], "no thread was started (but the server's own)"
        assert len(accepted) == 1, "every request on the one kept connection"
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_an_answer_left_midway_does_not_spoil_the_client(server: ScriptedServer) -> None:
    """An answer the caller stops reading (``aclose`` after a piece) closes its connection; the client's next
    request goes out on a new one and is answered whole."""
    server.push(Step(text="one two three four five", chunk_size=3, delay=0.05), Step(text="whole"))
    client = ModelClient()
    try:
        left = stream_chat(
            base_url=server.base_url, api_key=None, body=chat_body(first_turn()), timeouts=FAST, client=client
        )
        async for piece in left:
            assert isinstance(piece, TextPiece)
            break
        await left.aclose()
        assert left.completion is None
        done = await stream_chat(
            base_url=server.base_url, api_key=None, body=chat_body(first_turn()), timeouts=FAST, client=client
        ).complete()
        assert done.text == "whole"
    finally:
        await client.aclose()


class _Body:
    """A request body that can be watched for being let go (``bytes`` cannot be referenced weakly)."""

    def __init__(self, data: bytes) -> None:
        self.data = data


@pytest.mark.asyncio
async def test_a_client_keeps_nothing_of_a_finished_request(server: ScriptedServer) -> None:
    """A client lives as long as its action; the requests it sent (their bodies may be megabytes) do not, nor
    any task of theirs."""
    server.push(Step(text="ok"))
    client = ModelClient()
    try:
        body = _Body(chat_body(first_turn()))
        stream = stream_chat(base_url=server.base_url, api_key=None, body=body.data, timeouts=FAST, client=client)
        kept = weakref.ref(stream)
        await stream.complete()
        del stream, body
        gc.collect()
        assert kept() is None, "the finished stream is let go"
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    finally:
        await client.aclose()
