"""The channel layer where ``REDIS_URL`` is set: channels_redis' pub/sub layer, kept quiet and quick when Redis
goes away.

channels_redis' core layer keeps each message in a sorted set and takes it with four round trips (a cleanup
script, a blocking pop, a backup and its removal), one message at a time per process, after a group send of
four more; at fifty replies streaming that queue grew to 1-2 s (``bench/layer_bench.py``). Pub/sub is one
``PUBLISH`` per group send, heard by the processes subscribed to the group, with no keys to clean.

Here, on top of it: a command that finds its pooled connection stale (Redis restarted meanwhile) is tried
once more on a new connection, so the first websocket after an outage works; connecting gives up after
``CONNECT_TIMEOUT`` seconds; and a lost subscription logs one warning per outage and one line when it is back,
instead of a traceback a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer, RedisSingleShardConnection
from channels_redis.utils import _wrap_close, decode_hosts
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 2.0
LISTEN_AGAIN_SECONDS = 0.5


class _Shard(RedisSingleShardConnection):  # type: ignore[misc]
    def __init__(self, host: Any, channel_layer: Any) -> None:
        super().__init__(host, channel_layer)
        self._outbox: list[tuple[str, bytes, asyncio.Future[None]]] = []

    async def publish(self, channel: str, message: bytes) -> None:
        """Publish ``message``: with whatever else waits to be published here, in one pipeline.

        channels_redis publishes one message per round trip behind a lock, so twenty-five replies streaming
        from one worker queue up behind each other's round trips; here the lock's holder sends everything
        waiting, in order, and the others find theirs sent when they get the lock."""
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.append((channel, message, sent))
        async with self._lock:
            if not sent.done():
                batch, self._outbox = self._outbox, []
                try:
                    self._ensure_redis()
                    if len(batch) == 1:
                        await self._redis.publish(channel, message)
                    else:
                        async with self._redis.pipeline(transaction=False) as pipe:
                            for name, body, _ in batch:
                                pipe.publish(name, body)
                            await pipe.execute()
                except asyncio.CancelledError:
                    self._outbox[:0] = [item for item in batch if item[2] is not sent]  # the next holder sends them
                    raise
                except BaseException as error:
                    for _, _, other in batch:
                        if other is not sent and not other.done():
                            other.set_exception(error)
                            other.exception()  # retrieved: a waiter cancelled meanwhile logs nothing
                    raise
                for _, _, other in batch:
                    if not other.done():
                        other.set_result(None)
        return sent.result() if sent.done() else None

    async def _do_receiving(self) -> None:
        lost_at: float | None = None
        while True:
            try:
                if self._pubsub and self._pubsub.subscribed:
                    message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
                    if lost_at is not None:
                        logger.info("the channel layer hears Redis again after %.1f s", time.monotonic() - lost_at)
                        lost_at = None
                    self._receive_message(message)
                else:
                    await asyncio.sleep(0.1)
            except (RedisConnectionError, RedisTimeoutError, OSError) as error:
                if lost_at is None:
                    lost_at = time.monotonic()
                    logger.warning("the channel layer lost Redis (%s); listening again", error)
                await asyncio.sleep(LISTEN_AGAIN_SECONDS)
            except Exception:
                logger.exception("the channel layer could not take a message from Redis")
                await asyncio.sleep(1)


class _LoopLayer(RedisPubSubLoopLayer):  # type: ignore[misc]
    def __init__(self, hosts: Any = None, **kwargs: Any) -> None:
        super().__init__(hosts=hosts, **kwargs)
        self._shards = [_Shard(host, self) for host in decode_hosts(hosts)]


def _host(host: Any) -> Any:
    if isinstance(host, dict):
        return {"socket_connect_timeout": CONNECT_TIMEOUT, "retry": Retry(NoBackoff(), 1), **host}
    return host


def channel_prefix(url: str) -> str:
    """The prefix of every pub/sub channel of the Redis database ``url`` names: Redis's pub/sub channels are shared
    by all its databases, so two installations (or test runs) on one Redis, each on a database of its own, would
    otherwise hear each other's groups (``session-1`` of one is ``session-1`` of the other). The database is the one
    redis-py connects to: ``redis://host/N``, ``rediss://host/N``, a ``?db=N`` (which wins over the path), a
    ``unix:///path?db=N``; none given is 0."""
    return f"cachet-db{int(parse_url(url).get('db') or 0)}"


class RedisPubSubLayer(RedisPubSubChannelLayer):  # type: ignore[misc]
    """channels_redis' pub/sub layer, one retry on a stale connection, one warning per outage."""

    def __init__(self, *args: Any, hosts: Any = None, **kwargs: Any) -> None:
        hosts = [_host(host) for host in decode_hosts(hosts)]
        super().__init__(*args, hosts=hosts, **kwargs)

    def _get_layer(self) -> Any:
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = _LoopLayer(*self._args, **self._kwargs, channel_layer=self)
            _wrap_close(self, loop)
        return layer
