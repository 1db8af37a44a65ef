"""The Postgres channel layer: groups and direct sends across processes (two layers of this process, each with its
own connection, and a real second process), large messages, expiry and capacity as Channels' in-memory layer,
and what happens when Postgres goes away and comes back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from asgiref.sync import async_to_sync
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings

from cachet import pg_layer
from cachet.pg_layer import LAYER_BACK, LayerUnavailable, PostgresChannelLayer
from tests.cachet.proxy_kit import Proxy, proxy
from tests.clock import Clock

pytestmark = pytest.mark.asyncio

Make = Callable[..., PostgresChannelLayer]
MB = "ü" * 500_000  # a megabyte of UTF-8, far over a notification's 8,000 bytes


@pytest.fixture
def database(transactional_db: None) -> str:
    """The test database's name (the layer connects to it on its own connection)."""
    from django.db import connections

    name: str = connections["default"].settings_dict["NAME"]
    return name


@pytest_asyncio.fixture
async def make(database: str) -> AsyncIterator[Make]:
    """New layers, each as another process's would be (a connection of its own), closed after the test."""
    made: list[PostgresChannelLayer] = []

    def new(**kwargs: Any) -> PostgresChannelLayer:
        layer = PostgresChannelLayer(**kwargs)
        made.append(layer)
        return layer

    yield new
    for layer in made:
        await layer.close()


async def until(condition: Callable[[], bool], seconds: float = 20) -> None:
    """Poll ``condition`` until it holds; fail after ``seconds``."""
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.01)


async def got(layer: PostgresChannelLayer, channel: str) -> dict[str, Any]:
    return await asyncio.wait_for(layer.receive(channel), 20)


def _sql(query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement on a connection of its own, made as Django makes them."""
    from django.db import connections

    wrapper = connections.create_connection("default")
    connection = wrapper.get_new_connection(wrapper.get_connection_params())
    connection.autocommit = True
    try:
        cursor = connection.execute(query.encode(), params)
        return list(cursor.fetchall()) if cursor.description else []
    finally:
        connection.close()


async def test_it_is_the_layer_without_redis() -> None:
    assert isinstance(get_channel_layer(), PostgresChannelLayer)


async def test_a_group_send_reaches_every_member_in_every_process_once_and_in_order(make: Make) -> None:
    here, there = make(), make()
    first, gone = await here.new_channel(), await here.new_channel()
    far = await there.new_channel()
    for layer, channel in ((here, first), (here, gone), (there, far)):
        await layer.group_add("tabs", channel)
    await here.group_discard("tabs", gone)
    for number in range(3):
        await here.group_send("tabs", {"type": "cachet.message", "text": f"m{number}"})
    for layer, channel in ((here, first), (there, far)):
        assert [(await got(layer, channel))["text"] for _ in range(3)] == ["m0", "m1", "m2"]
    await there.send(gone, {"type": "after"})  # behind the group's messages, had they reached it
    assert (await got(here, gone))["type"] == "after"
    await there.group_send("nobody", {"type": "lost"})


async def test_a_direct_send_reaches_a_channel_of_another_process_and_of_this_one(make: Make) -> None:
    here, there = make(), make()
    mine = await here.new_channel()
    await there.send(mine, {"type": "from.there", "n": 1, "nested": {"ops": [1, 2]}, "raw": b"\x00\xff"})
    assert await got(here, mine) == {"type": "from.there", "n": 1, "nested": {"ops": [1, 2]}, "raw": b"\x00\xff"}
    message: dict[str, Any] = {"type": "from.here", "ops": [{"id": "a"}]}
    await here.send(mine, message)
    message["ops"][0]["id"] = "changed"
    assert await got(here, mine) == {"type": "from.here", "ops": [{"id": "a"}]}


async def test_a_message_too_large_for_a_notification_goes_through_the_table(make: Make) -> None:
    here, there = make(), make()
    tab, other = await here.new_channel(), await here.new_channel()
    await here.group_add("tabs", tab)
    await here.group_add("tabs", other)
    await there.group_send("tabs", {"type": "big", "text": MB})
    await there.send(tab, {"type": "big.direct", "text": MB})
    assert (await got(here, tab))["text"] == MB
    assert (await got(here, other))["text"] == MB
    assert await got(here, tab) == {"type": "big.direct", "text": MB}
    stored = await asyncio.to_thread(_sql, "SELECT count(*) FROM cachet_layer_message WHERE expires > now()")
    assert stored[0][0] >= 2


async def test_an_expired_message_is_dropped_and_its_unread_channel_leaves_its_groups(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(pg_layer, "time", clock)
    layer = make(expiry=10)
    read, unread = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("tabs", unread)
    await layer.send(read, {"type": "old"})
    await layer.send(unread, {"type": "old"})
    clock.advance(11)
    await layer.send(read, {"type": "new"})
    assert (await got(layer, read))["type"] == "new"
    await layer.group_send("tabs", {"type": "wakes the connection's task, which looks for expired messages"})
    await until(lambda: all("tabs" not in link.groups for link in layer._links.values()))


async def test_a_full_channel_refuses_a_send_and_is_skipped_by_a_group_send(make: Make) -> None:
    layer = make(capacity=2)
    full, free = await layer.new_channel(), await layer.new_channel()
    await layer.send(full, {"type": "x"})
    await layer.send(full, {"type": "x"})
    with pytest.raises(ChannelFull):
        await layer.send(full, {"type": "x"})
    for channel in (full, free):
        await layer.group_add("tabs", channel)
    await layer.group_send("tabs", {"type": "y"})
    assert (await got(layer, free))["type"] == "y"
    assert [(await got(layer, full))["type"] for _ in range(2)] == ["x", "x"]


async def test_flush_forgets_this_process_s_channels_and_groups(make: Make) -> None:
    here, there = make(), make()
    tab = await here.new_channel()
    await here.group_add("tabs", tab)
    await here.send(tab, {"type": "old"})
    await here.flush()
    await there.group_send("tabs", {"type": "not heard"})
    await there.send(tab, {"type": "new"})
    assert (await got(here, tab))["type"] == "new"


async def test_a_send_from_a_thread_of_its_own_loop_reaches_a_receive_on_this_one(make: Make) -> None:
    """The way synchronous code sends (``async_to_sync`` in a thread: a loop of its own each call)."""
    layer = make()
    tab = await layer.new_channel()
    await layer.group_add("tabs", tab)

    def from_a_thread() -> None:
        for number in range(3):
            async_to_sync(layer.group_send)("tabs", {"type": "threaded", "n": number})

    await asyncio.to_thread(from_a_thread)
    assert [(await got(layer, tab))["n"] for _ in range(3)] == [0, 1, 2]


async def test_two_real_processes_reach_each_other_s_groups_and_channels(make: Make, database: str) -> None:
    layer = make()
    reply, fan_a, fan_b = await layer.new_channel(), await layer.new_channel(), await layer.new_channel()
    await layer.group_add("test-out", fan_a)
    await layer.group_add("test-out", fan_b)
    peer = subprocess.Popen(
        [sys.executable, "-m", "tests.cachet.pg_layer_peer", database],
        cwd=settings.BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "cachet.settings"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert peer.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(peer.stdout.readline), 60)
        assert line.startswith("ready "), line
        peer_channel = line.split()[1]
        for text in ("hello", MB):
            await layer.group_send("peer-in", {"type": "echo", "reply_to": reply, "text": text})
            assert await got(layer, reply) == {"type": "echoed", "text": text}
            assert await got(layer, fan_a) == {"type": "fanned", "text": text}
            assert await got(layer, fan_b) == {"type": "fanned", "text": text}
        await layer.send(peer_channel, {"type": "echo", "reply_to": reply, "text": "direct"})
        assert (await got(layer, reply))["text"] == "direct"
        await layer.send(peer_channel, {"type": "bye"})
        assert await asyncio.to_thread(peer.wait, 30) == 0
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()


async def test_it_listens_again_after_postgres_ends_its_connection_with_a_warning_at_each_end(
    make: Make, caplog: pytest.LogCaptureFixture
) -> None:
    here, there = make(), make()
    tab = await here.new_channel()
    await here.group_add("tabs", tab)
    await until(lambda: here.backend_pid is not None)
    first = here.backend_pid
    caplog.set_level(logging.INFO, logger="cachet.pg_layer")
    assert await asyncio.to_thread(_sql, "SELECT pg_terminate_backend(%s)", (first,)) == [(True,)]
    await until(lambda: here.backend_pid not in (None, first))
    await there.group_send("tabs", {"type": "after"})
    assert (await got(here, tab))["type"] == LAYER_BACK  # its connection was lost: the tab is told to catch up
    assert (await got(here, tab))["type"] == "after"
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "lost its connection" in warnings[0]
    assert "reaches Postgres again" in warnings[1]


async def test_using_the_layer_starts_no_thread(make: Make) -> None:
    """Its connections are psycopg's async ones, driven by a task on the loop that uses the layer."""
    before = threading.active_count()
    here, there = make(), make()
    tab, far = await here.new_channel(), await there.new_channel()
    await here.group_add("tabs", tab)
    await there.group_send("tabs", {"type": "group"})
    await there.group_send("tabs", {"type": "big", "text": MB})
    await here.send(far, {"type": "direct"})
    assert [(await got(here, tab))["type"] for _ in range(2)] == ["group", "big"]
    assert (await got(there, far))["type"] == "direct"
    assert here.connected and there.connected
    assert threading.active_count() == before, [thread.name for thread in threading.enumerate()]


async def test_each_loop_has_a_connection_of_its_own_closed_with_its_loop(make: Make) -> None:
    layer = make()
    tab = await layer.new_channel()
    await layer.group_add("tabs", tab)
    mine = layer.backend_pid

    def from_a_thread() -> tuple[int | None, int]:
        async def use() -> tuple[int | None, int]:
            await layer.group_send("tabs", {"type": "from another loop"})
            theirs = await layer.new_channel()
            await layer.send(theirs, {"type": "to that loop"})
            assert (await got(layer, theirs))["type"] == "to that loop"
            return layer.backend_pid, len(layer._links)

        return asyncio.run(use())

    theirs, links = await asyncio.to_thread(from_a_thread)
    assert theirs is not None and theirs != mine and links == 2
    assert (await got(layer, tab))["type"] == "from another loop"
    assert len(layer._links) == 1  # the other loop's ended with it
    for _ in range(100):  # the client closed it; its backend process may take a moment to go, on a busy machine
        backends = await asyncio.to_thread(
            _sql, "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (pg_layer.APPLICATION_NAME,)
        )
        if theirs not in {row[0] for row in backends}:
            break
        await asyncio.sleep(0.05)
    assert theirs not in {row[0] for row in backends}


class _Proxied(PostgresChannelLayer):
    """A layer whose connections go through ``proxy``, to take Postgres away from it alone."""

    def __init__(self, through: Proxy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.through = through

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        from django.db import connections

        params = connections["default"].get_connection_params()
        return await psycopg.AsyncConnection.connect(
            host="127.0.0.1",
            port=self.through.port,
            dbname=params["dbname"],
            user=params.get("user"),
            password=params.get("password"),
            connect_timeout=5,
        )


@pytest.fixture
def postgres_proxy(database: str) -> Iterator[Proxy]:
    from django.db import connections

    params = connections["default"].get_connection_params()
    host, port = str(params.get("host") or "/var/run/postgresql"), int(params.get("port") or 5432)
    target: tuple[str, int] | str = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)
    with proxy(target) as made:
        yield made


async def test_while_postgres_is_away_sends_fail_at_once_with_one_warning_and_groups_are_heard_again_after(
    make: Make, postgres_proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    away = _Proxied(postgres_proxy)
    there = make()
    try:
        tab = await away.new_channel()
        await away.group_add("tabs", tab)
        await until(lambda: away.connected)
        caplog.set_level(logging.INFO, logger="cachet.pg_layer")
        postgres_proxy.cut()
        await until(lambda: not away.connected)
        for number in range(5):
            with pytest.raises(LayerUnavailable):
                await away.group_send("tabs", {"type": "during", "n": number})
        assert [(await got(away, tab))["n"] for _ in range(5)] == [0, 1, 2, 3, 4]  # this process's tabs
        with pytest.raises(LayerUnavailable):
            await away.send(await there.new_channel(), {"type": "elsewhere"})
        joined = await away.new_channel()
        await away.group_add("joined-meanwhile", joined)  # kept, and listened to once Postgres is back
        await asyncio.sleep(3)  # tries to connect again, backing off: 0.05 s, 0.1 s, … 2 s
        for _ in range(20):
            with pytest.raises(LayerUnavailable):
                await away.group_send("tabs", {"type": "during"})
        warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert all(record.exc_info is None for record in caplog.records)

        postgres_proxy.mend()
        await until(lambda: away.connected)
        await there.group_send("tabs", {"type": "back"})
        await there.group_send("joined-meanwhile", {"type": "back"})
        # what was sent to this process meanwhile is lost: its group members are told so, then hear again
        kinds = []
        while (message := await got(away, tab))["type"] != "back":
            kinds.append(message["type"])
        assert set(kinds) <= {"during", LAYER_BACK} and kinds.count(LAYER_BACK) == 1, kinds
        assert [(await got(away, joined))["type"] for _ in range(2)] == [LAYER_BACK, "back"]
        await away.group_send("tabs", {"type": "sent again"})
        assert (await got(away, tab))["type"] == "sent again"
        warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
        assert len(warnings) == 2 and "reaches Postgres again" in warnings[1], warnings
        assert all(record.exc_info is None for record in caplog.records)
    finally:
        await away.close()


@contextlib.contextmanager
def _another_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of the test's, as a second one of a process would."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def test_an_outage_that_every_loop_of_a_layer_sees_is_told_once(
    database: str, postgres_proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    away = _Proxied(postgres_proxy)
    with _another_loop() as other:

        async def join() -> str:
            channel = await away.new_channel()
            await away.group_add("there", channel)
            return channel

        def on_other(coroutine: Any) -> Any:
            return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, other))

        try:
            tab = await away.new_channel()
            await away.group_add("tabs", tab)
            theirs = await on_other(join())
            assert len(away._links) == 2 and all(link.state is pg_layer._State.UP for link in away._links.values())
            caplog.set_level(logging.INFO, logger="cachet.pg_layer")
            postgres_proxy.cut()
            await until(lambda: all(link.state is not pg_layer._State.UP for link in away._links.values()))
            await asyncio.sleep(1)
            postgres_proxy.mend()
            await until(lambda: all(link.state is pg_layer._State.UP for link in away._links.values()))
            await away.group_send("there", {"type": "back"})
            assert (await on_other(got(away, theirs)))["type"] == LAYER_BACK
            assert (await on_other(got(away, theirs)))["type"] == "back"
            warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
            assert len(warnings) == 2, warnings
        finally:
            await away.close()


class _Reconnecting(_Proxied):
    """A layer whose tries to connect again wait for ``release`` (a try that hangs) and then fail."""

    def __init__(self, through: Proxy, **kwargs: Any) -> None:
        super().__init__(through, **kwargs)
        self.opened = 0
        self.trying = asyncio.Event()
        self.release = asyncio.Event()

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        self.opened += 1
        if self.opened == 1:
            return await super()._open()
        self.trying.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.release.wait(), 20)
        raise psycopg.OperationalError("connection refused")


async def test_a_group_send_waiting_on_a_try_to_connect_that_fails_still_reaches_this_process(
    database: str, postgres_proxy: Proxy
) -> None:
    layer = _Reconnecting(postgres_proxy)
    try:
        tab = await layer.new_channel()
        await layer.group_add("tabs", tab)
        await until(lambda: layer.connected)
        postgres_proxy.cut()
        await asyncio.wait_for(layer.trying.wait(), 20)
        sending = asyncio.ensure_future(layer.group_send("tabs", {"type": "during"}))
        await asyncio.sleep(0.1)
        assert not sending.done()  # it waits for the try, not failing at once
        layer.release.set()
        with pytest.raises(LayerUnavailable, match="this process's channels only"):
            await sending
        assert (await got(layer, tab))["type"] == "during"
    finally:
        layer.release.set()
        await layer.close()


async def test_a_send_postgres_does_not_take_in_time_fails_at_its_deadline_and_the_next_goes_through(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One timer a link times its sends: each that Postgres has not taken within ``send_timeout`` fails then, with
    a line that says so, however many wait; once Postgres takes them again, sends go through."""
    layer, there = make(send_timeout=0.3), make()
    target = await there.new_channel()
    await layer.send(target, {"type": "before"})
    assert (await got(there, target))["type"] == "before"
    taking = asyncio.Event()
    sending = pg_layer._Link.send_outbox

    async def stuck(self: Any, connection: Any) -> None:
        await taking.wait()
        await sending(self, connection)

    monkeypatch.setattr(pg_layer._Link, "send_outbox", stuck)
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = [asyncio.ensure_future(layer.send(target, {"type": "during", "n": n})) for n in range(3)]
    await asyncio.sleep(0.1)
    late = asyncio.ensure_future(layer.send(target, {"type": "during", "n": 3}))
    outcomes = await asyncio.wait_for(asyncio.gather(*waiting, late, return_exceptions=True), 5)
    assert all(isinstance(outcome, LayerUnavailable) for outcome in outcomes), outcomes
    assert "did not take the message within 0.3 s" in str(outcomes[0])
    assert 0.35 <= loop.time() - started < 2, "the late one failed at its own deadline, not the first's"
    monkeypatch.undo()
    taking.set()
    await layer.send(target, {"type": "after"})
    assert (await got(there, target))["type"] == "after"
