"""Jobs: a worker runs at most its concurrency of replies at once, each holding a database connection; the others
wait in the queue, their tabs told so; a Stop takes a waiting one out of the queue, and reaches through Redis a
running one whose listener lost it a moment."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.db import connection

from chat.tools import tool_list
from chat.web import jobs
from chat.web.publisher import reply_group
from sessions_app.models import ChatSession, ModelEndpoint, Turn, TurnStatus, Workspace
from sessions_app.services.locks import LOCK_NAMESPACE
from sessions_app.services.sessions import session_start
from testing.scripted_server import ScriptedServer, Step
from tests.clock import Clock
from tests.redis_kit import RedisDatabase, redis_client
from tests.web.test_consumers import connected, cookie_for, idle, until
from tests.worker_kit import running_worker

pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = 100
LIMIT = 6


@pytest_asyncio.fixture
async def fresh_layer() -> AsyncIterator[None]:
    """An empty channel layer, and a worker that runs at most ``LIMIT`` jobs at once."""
    layer = get_channel_layer()
    assert layer is not None
    await layer.flush()
    async with running_worker(concurrency=LIMIT):
        yield
        await sync_to_async(jobs.wait_idle)(30, cancel=True)


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
async def test_a_hundred_replies_at_once_wait_their_turn_and_all_finish(
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
    assert all(any(jobs.QUEUED in json.loads(raw)["ops"][0]["html"] for raw in got.raw) for _, got in tabs), (
        "every tab showed its reply queued until a worker took it"
    )
    for communicator, _ in tabs:
        await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_waiting_reply_can_be_stopped_and_gives_the_words_back(
    many_sessions: list[ChatSession], cookie: str, model: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model.push(Step(text=" ".join(f"w{n}" for n in range(200)), chunk_size=3, delay=0.01))
    layer = get_channel_layer()
    assert layer is not None
    await layer.flush()
    async with running_worker(concurrency=1):
        first, first_got = await connected(many_sessions[0].pk, cookie)
        second, second_got = await connected(many_sessions[1].pk, cookie)
        await first.send_json_to({"type": "send", "text": "Long one"})
        await until(first, first_got, lambda m: "live" in m)
        await second.send_json_to({"type": "send", "text": "Waiting one"})
        await until(second, second_got, lambda m: jobs.QUEUED in json.dumps(m, ensure_ascii=False))
        await second.send_json_to({"type": "send", "text": "Again"})
        await until(second, second_got, lambda m: "already running" in json.dumps(m))
        late, late_got = await connected(many_sessions[1].pk, cookie)
        assert jobs.QUEUED in late_got.puts["controls"], "a tab opened meanwhile shows the reply queued"
        await second.send_json_to({"type": "stop"})
        await until(second, second_got, idle)
        assert ">Waiting one</textarea>" in second_got.puts["composer-text"]
        assert jobs.STOPPED_WAITING in second_got.puts["notice"]
        await until(late, late_got, idle)
        await first.send_json_to({"type": "stop"})
        await until(first, first_got, idle)
        turns = await sync_to_async(_turns)()
        assert [(session, words) for session, words, _ in turns] == [(many_sessions[0].pk, "Long one")]
        assert len(model.requests) == 1
        for communicator in (first, second, late):
            await communicator.disconnect()
        await sync_to_async(jobs.wait_idle)(30, cancel=True)


def test_one_thread_holds_the_baton_at_a_time_and_sets_it_down_while_it_waits() -> None:
    baton = jobs.Baton(patience=5)
    holders: list[str] = []
    inside = 0
    most = 0
    lock = threading.Lock()
    waiting_on_model = threading.Event()
    model_answered = threading.Event()

    def work(name: str, seconds: float) -> None:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
            holders.append(name)
        time.sleep(seconds)
        with lock:
            inside -= 1

    def waits_on_the_model() -> None:
        with baton.holding():
            assert baton.held
            work("first, before the model", 0.05)
            with baton.set_down():
                assert not baton.held
                waiting_on_model.set()
                model_answered.wait(5)
            assert baton.held
            work("first, after the model", 0.05)
        assert not baton.held

    second_holds = threading.Event()

    def works() -> None:
        with baton.holding():
            second_holds.set()
            work("second", 0.2)

    first = threading.Thread(target=waits_on_the_model)
    first.start()
    assert waiting_on_model.wait(5)
    second = threading.Thread(target=works)
    second.start()
    assert second_holds.wait(5)
    model_answered.set()  # the first wants the baton back while the second holds it
    first.join(5)
    second.join(5)
    assert holders == ["first, before the model", "second", "first, after the model"]
    assert most == 1


def test_when_the_holder_overstays_its_patience_the_waiters_go_on_without_the_baton(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(jobs, "time", clock)  # the baton's clock: the patience runs out when the test says so
    baton = jobs.Baton(patience=0.1)
    taken = threading.Event()
    release = threading.Event()

    def holds() -> None:
        with baton.holding():
            taken.set()
            release.wait(30)  # waits on something else without setting the baton down

    holder = threading.Thread(target=holds)
    holder.start()
    assert taken.wait(5)
    went_on: list[bool] = []

    def waits() -> None:
        with baton.holding():
            went_on.append(baton.held)
            with baton.set_down():
                pass
            went_on.append(baton.held)

    waiter = threading.Thread(target=waits)
    waiter.start()
    waiter.join(0.3)  # a while within the patience, by the baton's clock: the waiter still waits
    assert waiter.is_alive() and went_on == []
    clock.advance(0.1)  # the holder has now held it as long as the patience
    waiter.join(30)
    assert not waiter.is_alive() and went_on == [False, False], "went on without the baton"
    assert holder.is_alive(), "while the holder still held it"
    release.set()
    holder.join(5)
    with baton.set_down():  # outside a job's work: nothing to set down, nothing taken after
        pass
    assert not baton.held
    with baton.holding():
        assert baton.held


def test_a_queue_longer_than_the_patience_is_served_in_order_and_no_one_goes_without() -> None:
    baton = jobs.Baton(patience=0.2)
    order: list[int] = []
    held: list[bool] = []
    queued = threading.Semaphore(0)

    def works(number: int) -> None:
        queued.release()
        with baton.holding():
            order.append(number)
            held.append(baton.held)
            time.sleep(0.08)  # each holding is short; the six of them together are not

    threads = [threading.Thread(target=works, args=(number,)) for number in range(6)]
    for thread in threads:
        thread.start()
        assert queued.acquire(timeout=5)
        time.sleep(0.01)  # in the queue before the next one comes
    for thread in threads:
        thread.join(5)
    assert order == list(range(6))
    assert held == [True] * 6


@pytest_asyncio.fixture
async def redis_layer(redis_database: RedisDatabase) -> AsyncIterator[tuple[Any, Any, RedisDatabase]]:
    """Channels' Redis layer as the settings make it with ``REDIS_URL`` on this test process's own database of
    Redis, emptied before and after, and a plain client of the same Redis."""
    from django.conf import settings  # the tests above take pytest-django's fixture of that name

    redis_database.empty()
    client = redis_client(redis_database.url)
    layer = RedisChannelLayer(hosts=[{"address": redis_database.url, "socket_timeout": settings.REDIS_SOCKET_TIMEOUT}])
    yield layer, client, redis_database
    await layer.flush()
    client.close()
    redis_database.empty()


@pytest.mark.asyncio
async def test_a_stop_reaches_a_reply_whose_listener_lost_redis_for_a_moment(
    many_sessions: list[ChatSession], model: ScriptedServer, redis_layer: tuple[Any, Any, RedisDatabase]
) -> None:
    layer, client, database = redis_layer
    session = many_sessions[0]
    model.push(Step(text=" ".join(f"w{n}" for n in range(600)), chunk_size=3, delay=0.01))
    job = jobs.Job(
        session_id=session.pk, action=jobs.Send("Long one"), layer=layer, event_loop=asyncio.get_running_loop()
    )
    await job.begin()
    async with asyncio.timeout(10):
        while not model.requests:
            await asyncio.sleep(0.02)
    listening = [c for c in client.client_list() if c.get("cmd") == "bzpopmin" and c.get("db") == str(database.number)]
    assert len(listening) == 1, listening  # the job's listener, waiting for a Stop
    client.client_kill_filter(_id=listening[0]["id"])

    def listening_again() -> bool:
        return any(
            c.get("cmd") == "bzpopmin" and c.get("db") == str(database.number) and c["id"] != listening[0]["id"]
            for c in client.client_list()
        )

    async with asyncio.timeout(10):
        while not listening_again():  # the listener noticed the lost connection and listens on a new one
            await asyncio.sleep(0.02)
    await layer.group_send(reply_group(session.pk), {"type": jobs.STOP})
    assert await sync_to_async(job.done.wait)(10), "the Stop reached the reply"
    turns = await sync_to_async(_turns)()
    assert [(session_id, status) for session_id, _, status in turns] == [(session.pk, TurnStatus.INTERRUPTED)]
    assert len(model.requests) == 1


def test_a_reply_back_from_a_wait_hushes_its_relay() -> None:
    """While the reply waits (the model, a tool) its relay sends; once it is back at its own work, the relay
    keeps quiet until it publishes again."""
    layer = get_channel_layer()
    assert layer is not None
    event_loop = asyncio.new_event_loop()
    try:
        job = jobs.Job(session_id=1, action=jobs.Send("hi"), layer=layer, event_loop=event_loop)
        with job._waiting():
            assert not job.relay.hushed
        assert job.relay.hushed
    finally:
        event_loop.close()
