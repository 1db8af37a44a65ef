"""Jobs: at most ``CACHET_MAX_REPLIES`` replies hold a database connection at once; the others wait in order,
their tabs told so, and a Stop reaches a waiting one too, and through Redis one whose listener lost it a moment."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
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
from sessions_app.services.sessions import session_start
from testing.scripted_server import ScriptedServer, Step
from tests.clock import Clock
from tests.redis_kit import RedisDatabase, redis_client
from tests.web.test_consumers import connected, cookie_for, idle, until


def test_slots_are_taken_first_come_first_served_and_never_more_than_the_limit() -> None:
    slots = jobs.ReplySlots()
    order: list[int] = []
    told: dict[int, list[int]] = {}
    inside = 0
    most = 0
    lock = threading.Lock()
    gate = threading.Event()

    def worker(number: int) -> None:
        nonlocal inside, most
        assert slots.acquire(limit=2, cancelled=lambda: False, waiting=told.setdefault(number, []).append)
        with lock:
            order.append(number)
            inside += 1
            most = max(most, inside)
        gate.wait(5)
        time.sleep(0.01)
        with lock:
            inside -= 1
        slots.release()

    threads = []
    for number in range(8):
        thread = threading.Thread(target=worker, args=(number,))
        thread.start()
        threads.append(thread)
        while slots.holding + slots.waiting < number + 1:  # each queues before the next starts
            time.sleep(0.001)
    assert slots.holding == 2 and slots.waiting == 6
    gate.set()
    for thread in threads:
        thread.join(10)
    assert order == list(range(8)), "in the order they asked"
    assert most == 2 and slots.peak == 2 and slots.holding == 0 and slots.waiting == 0
    assert told[0] == [] and told[1] == []
    assert told[7][0] == 5, "a waiter is told how many wait before it"
    assert told[7] == sorted(set(told[7]), reverse=True), "and again as that number falls"


def test_a_cancelled_waiter_leaves_the_queue_holding_nothing() -> None:
    slots = jobs.ReplySlots()
    assert slots.acquire(limit=1, cancelled=lambda: False, waiting=lambda ahead: None)
    cancel = threading.Event()
    outcome: list[bool] = []
    thread = threading.Thread(
        target=lambda: outcome.append(slots.acquire(limit=1, cancelled=cancel.is_set, waiting=lambda ahead: None))
    )
    thread.start()
    while slots.waiting == 0:
        time.sleep(0.001)
    cancel.set()
    slots.wake()
    thread.join(5)
    assert outcome == [False] and slots.waiting == 0 and slots.holding == 1
    slots.release()
    assert slots.acquire(limit=1, cancelled=lambda: False, waiting=lambda ahead: None)


pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = 100
LIMIT = 6


@pytest_asyncio.fixture
async def fresh_layer() -> AsyncIterator[None]:
    layer = get_channel_layer()
    assert layer is not None
    await layer.flush()
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


@pytest.fixture
def fresh_slots(monkeypatch: pytest.MonkeyPatch) -> jobs.ReplySlots:
    slots = jobs.ReplySlots()
    monkeypatch.setattr(jobs, "SLOTS", slots)
    return slots


@pytest.fixture
def backends_seen() -> Iterator[list[int]]:
    """How many connections Postgres serves for the test database, sampled every 20 ms from a thread."""
    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        try:
            while not done.wait(0.02):
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
                    row = cursor.fetchone()
                    seen.append(int(row[0]) if row else 0)
        finally:
            connection.close()

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    yield seen
    done.set()
    thread.join(5)


@pytest.mark.asyncio
async def test_a_hundred_replies_at_once_wait_their_turn_and_all_finish(
    many_sessions: list[ChatSession],
    cookie: str,
    model: ScriptedServer,
    fresh_slots: jobs.ReplySlots,
    backends_seen: list[int],
    fresh_layer: None,
    settings: Any,
) -> None:
    settings.CACHET_MAX_REPLIES = LIMIT
    model.push(*(Step(text="Short answer, streamed in pieces.", chunk_size=4, delay=0.005) for _ in many_sessions))
    tabs = [await connected(session.pk, cookie) for session in many_sessions]
    before = max(backends_seen[-3:] or [0])
    for communicator, _ in tabs:
        await communicator.send_json_to({"type": "send", "text": "Go"})
    async with asyncio.timeout(120):
        await asyncio.gather(*(until(communicator, got, idle, timeout=110) for communicator, got in tabs))
    assert [status for _, _, status in await sync_to_async(_turns)()] == [TurnStatus.DONE] * SESSIONS
    assert len(model.requests) == SESSIONS
    assert fresh_slots.peak == LIMIT and fresh_slots.holding == 0 and fresh_slots.waiting == 0
    assert max(backends_seen) <= before + LIMIT + 2, "replies hold at most the limit's connections"
    everything = [json.loads(raw) for _, got in tabs for raw in got.raw]
    assert not any("notice error" in json.dumps(message) for message in everything)
    waited = [got for _, got in tabs if any("Waiting: the server is busy" in raw for raw in got.raw)]
    assert len(waited) >= SESSIONS - LIMIT - 10, "the tabs of replies that waited said so"
    for communicator, _ in tabs:
        await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_waiting_reply_can_be_stopped_and_gives_the_words_back(
    many_sessions: list[ChatSession],
    cookie: str,
    model: ScriptedServer,
    fresh_slots: jobs.ReplySlots,
    fresh_layer: None,
    settings: Any,
) -> None:
    settings.CACHET_MAX_REPLIES = 1
    model.push(Step(text=" ".join(f"w{n}" for n in range(200)), chunk_size=3, delay=0.01))
    first, first_got = await connected(many_sessions[0].pk, cookie)
    second, second_got = await connected(many_sessions[1].pk, cookie)
    await first.send_json_to({"type": "send", "text": "Long one"})
    await until(first, first_got, lambda m: "live" in m)
    await second.send_json_to({"type": "send", "text": "Waiting one"})
    await until(second, second_got, lambda m: "this one is next" in json.dumps(m))
    await second.send_json_to({"type": "send", "text": "Again"})
    await until(second, second_got, lambda m: "already running" in json.dumps(m))
    late, late_got = await connected(many_sessions[1].pk, cookie)
    await until(late, late_got, lambda m: "this one is next" in json.dumps(m))
    await second.send_json_to({"type": "stop"})
    await until(second, second_got, idle)
    assert ">Waiting one</textarea>" in second_got.puts["composer-text"]
    assert jobs.STOPPED_WAITING in second_got.puts["notice"]
    await first.send_json_to({"type": "stop"})
    await until(first, first_got, idle)
    turns = await sync_to_async(_turns)()
    assert [(session, words) for session, words, _ in turns] == [(many_sessions[0].pk, "Long one")]
    assert len(model.requests) == 1
    for communicator in (first, second, late):
        await communicator.disconnect()


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


def test_the_setting_has_a_floor_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    slots = jobs.ReplySlots()
    assert slots.acquire(limit=0, cancelled=lambda: False, waiting=lambda ahead: None)
    assert slots.holding == 1


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
