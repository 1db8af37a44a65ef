"""The channel layer with ``REDIS_URL``: Redis's pub/sub, on this test process's own Redis database, reached
through a proxy the test cuts and mends as Redis going down and coming back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from django.conf import settings
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from cachet.pg_layer import LAYER_BACK
from cachet.redis_layer import RedisPubSubLayer, channel_prefix
from chat.wire import session_group
from tests.cachet.proxy_kit import Proxy, proxy
from tests.redis_kit import REDIS, RedisDatabase

pytestmark = pytest.mark.asyncio


@pytest.fixture
def redis_proxy(redis_database: RedisDatabase) -> Iterator[tuple[Proxy, str]]:
    """A proxy to the machine's Redis, and the URL of this test process's database through it."""
    redis_database.empty()
    host, port = REDIS.removeprefix("redis://").split(":")
    with proxy((host, int(port))) as made:
        yield made, f"{made.url}/{redis_database.number}"
    redis_database.empty()


@pytest_asyncio.fixture
async def layer(redis_proxy: tuple[Proxy, str]) -> AsyncIterator[RedisPubSubLayer]:
    url = redis_proxy[1]
    made = RedisPubSubLayer(hosts=[{"address": url, "socket_timeout": 5.0}], prefix=channel_prefix(url))
    yield made
    with contextlib.suppress(Exception):
        await made.flush()


async def until(condition: Callable[[], bool], seconds: float = 20) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.01)


async def heard(layer: RedisPubSubLayer, group: str, channel: str, seconds: float = 20) -> dict[str, Any]:
    """Send to ``group`` until ``channel`` hears it (its subscription comes back on its own time)."""
    async with asyncio.timeout(seconds):
        while True:
            await layer.group_send(group, {"type": "ping"})
            try:
                message: dict[str, Any] = await asyncio.wait_for(layer.receive(channel), 0.2)
                return message
            except TimeoutError:
                continue


def _warnings(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == name and record.levelno >= logging.WARNING]


async def test_a_group_send_is_one_publish_heard_by_the_group_s_members(layer: RedisPubSubLayer) -> None:
    first, second = await layer.new_channel(), await layer.new_channel()
    for channel in (first, second):
        await layer.group_add("tabs", channel)
    for number in range(3):
        await layer.group_send("tabs", {"type": "cachet.message", "text": f"m{number}"})
    for channel in (first, second):
        got = [await asyncio.wait_for(layer.receive(channel), 5) for _ in range(3)]
        assert [message["text"] for message in got] == ["m0", "m1", "m2"]


async def test_sends_made_together_go_out_in_order_in_a_few_round_trips(
    layer: RedisPubSubLayer, monkeypatch: pytest.MonkeyPatch
) -> None:
    tab = await layer.new_channel()
    await layer.group_add("tabs", tab)
    assert (await heard(layer, "tabs", tab))["type"] == "ping"
    round_trips = 0
    send = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
        nonlocal round_trips
        round_trips += 1
        return await send(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    await asyncio.gather(*(layer.group_send("tabs", {"type": "piece", "n": number}) for number in range(50)))
    got = [await asyncio.wait_for(layer.receive(tab), 5) for _ in range(50)]
    assert [message["n"] for message in got] == list(range(50))
    assert round_trips <= 3, round_trips  # channels_redis alone: 50, one after another


async def test_sends_made_together_while_redis_is_away_all_fail(
    layer: RedisPubSubLayer, redis_proxy: tuple[Proxy, str]
) -> None:
    tab = await layer.new_channel()
    await layer.group_add("tabs", tab)
    assert (await heard(layer, "tabs", tab))["type"] == "ping"
    redis_proxy[0].cut()
    outcomes = await asyncio.gather(
        *(layer.group_send("tabs", {"type": "during"}) for _ in range(10)), return_exceptions=True
    )
    assert all(isinstance(outcome, RedisConnectionError) for outcome in outcomes), outcomes


async def test_while_redis_is_away_sends_fail_at_once_with_one_warning(
    layer: RedisPubSubLayer, redis_proxy: tuple[Proxy, str], caplog: pytest.LogCaptureFixture
) -> None:
    tab = await layer.new_channel()
    await layer.group_add("tabs", tab)
    assert (await heard(layer, "tabs", tab))["type"] == "ping"
    caplog.set_level(logging.INFO)
    redis_proxy[0].cut()
    await until(lambda: bool(_warnings(caplog, "cachet.redis_layer")))  # its subscription noticed
    for _ in range(20):
        with pytest.raises(RedisConnectionError):
            await layer.group_send("tabs", {"type": "during"})
    assert len(_warnings(caplog, "cachet.redis_layer")) == 1
    assert all(record.exc_info is None for record in caplog.records)
    redis_proxy[0].mend()
    assert (await heard(layer, "tabs", tab))["type"] in {"ping", "during", LAYER_BACK}
    assert len(_warnings(caplog, "cachet.redis_layer")) == 1


async def test_what_a_job_starts_while_redis_is_away_is_heard_once_it_is_back_and_members_are_told_to_catch_up(
    layer: RedisPubSubLayer, redis_proxy: tuple[Proxy, str], caplog: pytest.LogCaptureFixture
) -> None:
    tab = await layer.new_channel()
    await layer.group_add("tabs", tab)
    assert (await heard(layer, "tabs", tab))["type"] == "ping"
    caplog.set_level(logging.INFO)
    redis_proxy[0].cut()
    await until(lambda: bool(_warnings(caplog, "cachet.redis_layer")))
    # A reply's job starts now: its channel and its group are made without Redis, and the job goes on.
    job = await layer.new_channel()
    await layer.group_add("replies", job)
    redis_proxy[0].mend()
    # What was published meanwhile is lost: each member is told so once the subscription reads again.
    assert (await asyncio.wait_for(layer.receive(tab), 10))["type"] == LAYER_BACK
    assert (await asyncio.wait_for(layer.receive(job), 10))["type"] == LAYER_BACK
    assert (await heard(layer, "replies", job))["type"] == "ping"
    await layer.send(job, {"type": "stop"})
    assert (await asyncio.wait_for(layer.receive(job), 5))["type"] == "stop"


async def test_the_first_socket_after_redis_is_back_works_on_a_connection_that_went_stale(
    layer: RedisPubSubLayer, redis_proxy: tuple[Proxy, str], caplog: pytest.LogCaptureFixture
) -> None:
    tab = await layer.new_channel()
    await layer.group_add("tabs", tab)
    assert (await heard(layer, "tabs", tab))["type"] == "ping"  # the publishing connection is pooled now
    caplog.set_level(logging.INFO)
    redis_proxy[0].cut()
    await until(lambda: bool(_warnings(caplog, "cachet.redis_layer")))
    redis_proxy[0].mend()
    # Nothing was sent while Redis was away: the pooled connection is stale, and tried once more on a new one.
    later = await layer.new_channel()
    await layer.group_add("later", later)  # what a socket opened now does first
    await layer.group_send("later", {"type": "first after"})
    first = await asyncio.wait_for(layer.receive(later), 5)
    if first["type"] == LAYER_BACK:  # it joined before the subscription read again: told to catch up, harmless
        first = await asyncio.wait_for(layer.receive(later), 5)
    assert first["type"] == "first after"


async def test_it_is_built_on_redis_py_alone_not_on_channels_redis_s_internals() -> None:
    code = "import sys, cachet.redis_layer; print(sorted(m for m in sys.modules if m.startswith('channels_redis')))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=settings.BASE_DIR, capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stdout


async def test_a_loop_s_connections_close_with_it(redis_proxy: tuple[Proxy, str]) -> None:
    url = redis_proxy[1]
    layer = RedisPubSubLayer(hosts=[{"address": url, "socket_timeout": 5.0}], prefix=channel_prefix(url))

    async def use() -> None:
        tab = await layer.new_channel()
        await layer.group_add("tabs", tab)
        await layer.group_send("tabs", {"type": "once"})
        assert (await asyncio.wait_for(layer.receive(tab), 5))["type"] == "once"

    opened = redis_proxy[0].connections
    await asyncio.to_thread(asyncio.run, use())
    assert redis_proxy[0].connections > opened
    assert not layer._links
    await until(lambda: redis_proxy[0].open_connections() == 0)


async def test_the_prefix_is_the_databases_own() -> None:
    assert channel_prefix("redis://127.0.0.1:6379/3") == "cachet-db3"
    assert channel_prefix("redis://127.0.0.1:6379") == "cachet-db0"
    assert channel_prefix("redis://127.0.0.1:6379/?db=7") == "cachet-db7"


@pytest.mark.parametrize(
    ("url", "prefix"),
    [
        ("redis://127.0.0.1:6379/3", "cachet-db3"),
        ("redis://:password@redis.example:6379/12", "cachet-db12"),
        ("rediss://redis.example:6380/5", "cachet-db5"),
        ("rediss://redis.example:6380", "cachet-db0"),
        ("redis://127.0.0.1:6379?db=4", "cachet-db4"),
        ("redis://127.0.0.1:6379/2?db=6", "cachet-db6"),  # as redis-py reads it: the query's db wins
        ("unix:///run/redis/redis.sock?db=3", "cachet-db3"),
        ("unix:///run/redis/redis.sock?password=x&db=9", "cachet-db9"),
        ("unix:///run/redis/redis.sock", "cachet-db0"),
        ("unix:///var/lib/redis/7", "cachet-db0"),  # a socket whose name is a number is not database 7
    ],
)
async def test_every_url_form_gives_its_databases_prefix(url: str, prefix: str) -> None:
    assert channel_prefix(url) == prefix


async def test_unix_sockets_on_different_databases_get_different_prefixes() -> None:
    prefixes = {channel_prefix(f"unix:///run/redis.sock?db={number}") for number in range(4)}
    assert len(prefixes) == 4


async def test_two_databases_of_one_redis_do_not_hear_each_others_groups(redis_database: RedisDatabase) -> None:
    """Redis's pub/sub is shared by its databases: without the prefix, a group of one installation (or test run)
    on database 3 heard the same group of another on database 4."""
    ours = redis_database.url
    theirs = f"{REDIS}/0"  # another database's name; nothing is written to it
    layers = [
        RedisPubSubLayer(hosts=[{"address": url, "socket_timeout": 5.0}], prefix=channel_prefix(url))
        for url in (ours, theirs)
    ]
    try:
        channels = [await layer.new_channel() for layer in layers]
        for layer, channel in zip(layers, channels, strict=True):
            await layer.group_add(session_group(1), channel)
        assert (await heard(layers[1], session_group(1), channels[1]))["type"] == "ping"
        await layers[0].group_send(session_group(1), {"type": "ours"})
        assert (await asyncio.wait_for(layers[0].receive(channels[0]), 10))["type"] == "ours"
        await layers[1].group_send(session_group(1), {"type": "theirs"})
        message = await asyncio.wait_for(layers[1].receive(channels[1]), 10)
        while message["type"] == "ping":
            message = await asyncio.wait_for(layers[1].receive(channels[1]), 10)
        assert message["type"] == "theirs"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(layers[0].receive(channels[0]), 0.5)
    finally:
        for layer in layers:
            await layer.flush()
