"""A worker's jobs: at most its concurrency of replies at once, each holding one database connection, the others
waiting in the queue with their tabs told so; a Stop reaches a reply whose listener lost the channel layer a
moment; the session is free for the next message as soon as its reply ends, its cache checks still to run."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection

from chat import wire
from chat.actions import Send
from chat.tools import tool_list
from chat.web import queueing
from chat.worker import jobs
from sessions_app.models import ChatSession, ModelEndpoint, ModelRequest, Turn, TurnStatus, Workspace
from sessions_app.services.locks import LOCK_NAMESPACE
from sessions_app.services.sessions import session_start
from testing.scripted_server import ScriptedServer, Step
from tests.web.test_consumers import connected, cookie_for, idle, until
from tests.worker_kit import running_worker

pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = 40  # over six times the worker's concurrency: most wait in the queue
LIMIT = 6


@pytest_asyncio.fixture
async def fresh_layer() -> AsyncIterator[None]:
    """An empty channel layer, and a worker that runs at most ``LIMIT`` jobs at once."""
    layer = get_channel_layer()
    assert layer is not None
    await layer.flush()
    async with running_worker(concurrency=LIMIT):
        yield


@pytest.fixture
def many_sessions(user: Any, workspace: Workspace, live_endpoint: ModelEndpoint) -> list[ChatSession]:
    tools = tool_list(allow_commands=False)
    return [
        session_start(owner=user, workspace=workspace, endpoint=live_endpoint, model_name="scripted", tools=tools)
        for _ in range(SESSIONS)
    ]


def _turns() -> list[tuple[int, str, str]]:
    """The stored turns, read in a thread whose connection is closed after (so none outlives the test)."""
    try:
        return list(Turn.objects.order_by("pk").values_list("session_id", "words", "status"))
    finally:
        connection.close()


@pytest.fixture
def cookie(user: Any) -> str:
    return cookie_for(user)


@dataclass
class Sampled:
    """Connections Postgres serves for the test database, and sessions whose reply lock is held, every 20 ms."""

    backends: list[int] = field(default_factory=list)
    replying: list[int] = field(default_factory=list)


@pytest.fixture
def sampled() -> Iterator[Sampled]:
    seen = Sampled()
    done = threading.Event()

    def sample() -> None:
        try:
            while not done.wait(0.02):
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
                    row = cursor.fetchone()
                    seen.backends.append(int(row[0]) if row else 0)
                    cursor.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s"
                        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                        [LOCK_NAMESPACE],
                    )
                    row = cursor.fetchone()
                    seen.replying.append(int(row[0]) if row else 0)
        finally:
            connection.close()

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    yield seen
    done.set()
    thread.join(5)


@pytest.mark.asyncio
async def test_forty_replies_at_once_wait_their_turn_and_all_finish(
    many_sessions: list[ChatSession], cookie: str, model: ScriptedServer, sampled: Sampled, fresh_layer: None
) -> None:
    model.push(*(Step(text="Short answer, streamed in pieces.", chunk_size=4, delay=0.005) for _ in many_sessions))
    tabs = [await connected(session.pk, cookie) for session in many_sessions]
    before = max(sampled.backends[-3:] or [0])
    for communicator, _ in tabs:
        await communicator.send_json_to({"type": "send", "text": "Go"})
    async with asyncio.timeout(120):
        await asyncio.gather(*(until(communicator, got, idle, timeout=110) for communicator, got in tabs))
    assert [status for _, _, status in await sync_to_async(_turns)()] == [TurnStatus.DONE] * SESSIONS
    assert len(model.requests) == SESSIONS
    assert max(sampled.replying) == LIMIT, "the worker runs its concurrency of replies at once, never more"
    pool = 4  # the queue's own connections (chat.worker.process.queue_connector)
    assert max(sampled.backends) <= before + LIMIT + pool + 2, "replies hold at most the limit's connections"
    everything = [json.loads(raw) for _, got in tabs for raw in got.raw]
    assert not any("notice error" in json.dumps(message) for message in everything)
    queued = sum(queueing.QUEUED in got.html() for _, got in tabs)
    assert queued >= SESSIONS - LIMIT, "every reply past the worker's concurrency was shown queued until it ran"
    for communicator, _ in tabs:
        await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_stop_reaches_a_reply_whose_listener_lost_the_channel_layer_for_a_moment(
    many_sessions: list[ChatSession], model: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = many_sessions[0]
    model.push(Step(text=" ".join(f"w{n}" for n in range(600)), chunk_size=3, delay=0.01))
    layer = get_channel_layer()
    assert layer is not None
    receive = type(layer).receive
    lost = asyncio.Event()

    async def once_lost(self: Any, channel: str) -> dict[str, Any]:
        if not lost.is_set():
            lost.set()
            raise ConnectionError("the channel layer went away")
        message: dict[str, Any] = await receive(self, channel)
        return message

    monkeypatch.setattr(type(layer), "receive", once_lost)
    job = asyncio.create_task(jobs.run(session.pk, 1, Send("Long one"), reply_to=None, check_later=None))
    async with asyncio.timeout(10):
        await lost.wait()
        await asyncio.sleep(2 * jobs.LISTEN_AGAIN_SECONDS)
    await layer.group_send(wire.reply_group(session.pk), {"type": wire.STOP})
    async with asyncio.timeout(10):
        await job
    turns = await sync_to_async(_turns)()
    assert [(session_id, status) for session_id, _, status in turns] == [(session.pk, TurnStatus.INTERRUPTED)]
    assert len(model.requests) == 1


def _checked_requests(session_id: int) -> list[int | None]:
    try:
        return list(
            ModelRequest.objects.filter(session_id=session_id)
            .order_by("pk")
            .values_list("expected_cached_tokens", flat=True)
        )
    finally:
        connection.close()


@pytest.mark.asyncio
async def test_the_session_takes_the_next_message_while_the_last_replys_cache_checks_still_run(
    user: Any, workspace: Workspace, notes: Any, cookie: str
) -> None:
    """The checks of a reply's requests (rendering and tokenizing a long prompt takes seconds) run as jobs of their
    own: they never hold the session."""
    held = threading.Event()
    with ScriptedServer(model="scripted", n_ctx=100_000, server_api_held=held) as server:
        endpoint = await sync_to_async(ModelEndpoint.objects.create)(
            name="checked", base_url=server.base_url, model="scripted"
        )
        session = await sync_to_async(session_start)(
            owner=user,
            workspace=workspace,
            endpoint=endpoint,
            model_name="scripted",
            tools=tool_list(allow_commands=False),
        )
        server.push(Step(tool_calls=[("read", {"path": "notes.md"})]), Step(text="Read."), Step(text="Second reply."))
        layer = get_channel_layer()
        assert layer is not None
        await layer.flush()
        async with running_worker():
            communicator, got = await connected(session.pk, cookie)
            held.set()  # the first request is counted with the server's tokenizer before it goes: not held
            await communicator.send_json_to({"type": "send", "text": "Read it"})
            await sync_to_async(server.wait_requests, thread_sensitive=False)(1, timeout=20)
            held.clear()  # from here on, the checks wait
            await until(communicator, got, idle, timeout=20)
            await communicator.send_json_to({"type": "send", "text": "And again"})
            await until(communicator, got, lambda m: "Second reply." in json.dumps(m), timeout=20)
            await until(communicator, got, idle, timeout=20)
            assert "already running" not in got.html()
            assert await sync_to_async(_checked_requests)(session.pk) == [None, None, None], "no check has run yet"
            held.set()
            async with asyncio.timeout(20):
                while None in (await sync_to_async(_checked_requests)(session.pk))[1:]:
                    await asyncio.sleep(0.05)
            await communicator.disconnect()


@pytest.mark.asyncio
async def test_pieces_that_come_while_the_last_is_published_go_on_together_in_order_before_what_follows(
    many_sessions: list[ChatSession], model: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = many_sessions[0]
    words = [f"w{n} " for n in range(200)]
    model.push(Step(text="".join(words), chunk_size=3, delay=0.002))
    sent: list[dict[str, Any]] = []

    async def slow(message: dict[str, Any], *, to: str | None = None) -> None:
        """A channel layer that takes 30 ms a publish, as a busy one does."""
        if to is None:
            sent.append(message)
        await asyncio.sleep(0.03)

    monkeypatch.setattr(jobs, "publish", slow)
    await jobs.run(session.pk, 1, Send("Stream"), reply_to=None, check_later=None)
    texts = [message for message in sent if message["event"] == "text"]
    assert "".join(message["text"] for message in texts) == "".join(words)
    assert [message["at"] for message in texts] == [
        sum(len(earlier["text"]) for earlier in texts[:k]) for k in range(len(texts))
    ]
    assert len(texts) < len(words) / 3  # merged while each publish was on its way
    names = [message["event"] for message in sent]
    last_text = max(k for k, name in enumerate(names) if name == "text")
    assert names.index("step_stored") > last_text and names.index("turn_ended") > last_text


@pytest.mark.asyncio
async def test_a_reply_s_text_goes_out_at_most_every_fifty_ms_and_nothing_after_it_waits_for_that(
    many_sessions: list[ChatSession], model: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = many_sessions[0]
    words = [f"w{n} " for n in range(300)]
    model.push(Step(text="".join(words), chunk_size=4, delay=0.004))  # about 270 pieces over about a second
    model.push(Step(text="".join(words), chunk_size=4, delay=0.004))
    sent: list[tuple[float, dict[str, Any]]] = []

    async def quick(message: dict[str, Any], *, to: str | None = None) -> None:
        if to is None:
            sent.append((asyncio.get_running_loop().time(), message))

    monkeypatch.setattr(jobs, "publish", quick)
    await jobs.run(session.pk, 1, Send("Stream"), reply_to=None, check_later=None)
    texts = [(at, message) for at, message in sent if message["event"] == "text"]
    assert "".join(message["text"] for _, message in texts) == "".join(words)
    # the last one may follow closer: the step's end sends what waits at once
    spacing = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(texts[:-1])]
    assert len(texts) < 60 and min(spacing) >= jobs.TEXT_EVENT_SECONDS * 0.9, (len(texts), min(spacing))

    monkeypatch.setattr(jobs, "TEXT_EVENT_SECONDS", 30.0)  # a rest longer than the test: nothing may wait for it
    sent.clear()
    async with asyncio.timeout(10):
        await jobs.run(session.pk, 2, Send("Again"), reply_to=None, check_later=None)
    texts = [(at, message) for at, message in sent if message["event"] == "text"]
    assert len(texts) == 2 and "".join(message["text"] for _, message in texts) == "".join(words)


@pytest.mark.parametrize(("text", "units"), [("", 0), ("plain", 5), ("é", 1), ("😀 ok", 5), ("\ud800", 1)])
def test_a_pieces_length_is_counted_as_a_browser_counts_it(text: str, units: int) -> None:
    assert jobs.utf16_length(text) == units
