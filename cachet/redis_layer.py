"""The channel layer where ``REDIS_URL`` is set: Redis pub/sub on redis-py's asyncio client, as channels_redis's
pub/sub layer works (each channel and group a pub/sub channel, one connection for subscriptions and a pool for
publishing per event loop), quiet and quick when Redis goes away.

channels_redis' core layer keeps each message in a sorted set and takes it with four round trips (a cleanup
script, a blocking pop, a backup and its removal), one message at a time per process, after a group send of
four more; at fifty replies streaming that queue grew to 1-2 s (``bench/layer_bench.py``). Pub/sub is one
``PUBLISH`` per group send, heard by the processes subscribed to the group, with no keys to clean.

On top of what channels_redis's pub/sub layer does: sends made while another is on its way go out together in
one pipeline; a command that finds its pooled connection stale (Redis restarted meanwhile) is tried once more
on a new connection, so the first websocket after an outage works; connecting gives up after
``CONNECT_TIMEOUT`` seconds; a channel made or a group joined while Redis is away is subscribed to once it is
back (a reply's job starts and stores its turn during an outage); once a lost subscription is back, each group
member on that loop is sent ``LAYER_BACK`` (what was published meanwhile never came: a tab's consumer brings its
page up to date from the store); a lost subscription logs one warning per outage and one line when it is back,
instead of a traceback a second; and a loop's connections close with the loop (``asyncio.run`` and
``async_to_sync`` cancel its task).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from typing import Any

from channels.layers import BaseChannelLayer
from redis.asyncio import Redis
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from cachet.pg_layer import LAYER_BACK, decode, encode

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 2.0
LISTEN_AGAIN_SECONDS = 0.5
READ_SECONDS = 1.0  # the subscription's read waits this long for a message before it reads again
_LOST = (RedisConnectionError, RedisTimeoutError, OSError)


def channel_prefix(url: str) -> str:
    """The prefix of every pub/sub channel of the Redis database ``url`` names: Redis's pub/sub channels are shared
    by all its databases, so two installations (or test runs) on one Redis, each on a database of its own, would
    otherwise hear each other's groups (``session-1`` of one is ``session-1`` of the other). The database is the one
    redis-py connects to: ``redis://host/N``, ``rediss://host/N``, a ``?db=N`` (which wins over the path), a
    ``unix:///path?db=N``; none given is 0."""
    return f"cachet-db{int(parse_url(url).get('db') or 0)}"


def _host(hosts: Any) -> dict[str, Any]:
    """The one Redis of channels_redis's ``hosts`` setting (a list of URLs or of dicts with an ``address``)."""
    if not hosts:
        return {"address": "redis://localhost:6379"}
    if isinstance(hosts, str | bytes) or len(hosts) != 1:
        raise ValueError("hosts is a list of one Redis")
    host = hosts[0]
    return dict(host) if isinstance(host, dict) else {"address": host}


class RedisPubSubLayer(BaseChannelLayer):  # type: ignore[misc]
    """Channels' layer interface over Redis pub/sub; a connection of its own on each event loop that uses it."""

    extensions = ["groups", "flush"]

    def __init__(
        self,
        hosts: Any = None,
        prefix: str = "asgi",
        *,
        expiry: int = 60,
        capacity: int = 100,
        channel_capacity: dict[str, int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity, **kwargs)
        self.options = _host(hosts)
        self.address = str(self.options.pop("address"))
        self.prefix = prefix
        self._lock = threading.Lock()
        self._links: dict[asyncio.AbstractEventLoop, _Link] = {}
        self._lost_at: float | None = None

    async def new_channel(self, prefix: str = "specific.") -> str:
        """A new channel of this loop, subscribed to by the time it is returned."""
        channel = f"{self.prefix}{prefix}{uuid.uuid4().hex}"
        await self._link().open(channel)
        return channel

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """Publish ``message`` to ``channel``."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        await self._link().publish(channel, encode(message).encode())

    async def receive(self, channel: str) -> dict[str, Any]:
        """The next message of ``channel``; a receive cancelled (its consumer ended) takes the channel away."""
        self.require_valid_channel_name(channel)
        link = self._link()
        queue = link.queues.get(channel)
        if queue is None:
            queue = await link.open(channel)
        try:
            body = await queue.get()
        except (asyncio.CancelledError, TimeoutError):
            if link.queues.get(channel) is queue:
                del link.queues[channel]
                with contextlib.suppress(*_LOST):
                    await link.pubsub.unsubscribe(channel)
            raise
        return decode(body.decode())

    async def group_add(self, group: str, channel: str) -> None:
        """Add a channel of this loop to ``group``, subscribing to the group."""
        self.require_valid_group_name(group)
        link = self._link()
        if channel not in link.queues:
            raise RuntimeError("group_add takes a channel made on this loop (new_channel)")
        name = self._group_channel(group)
        members = link.groups.setdefault(name, set())
        first = not members
        members.add(channel)
        if first:
            await link.subscribe(name)

    async def group_discard(self, group: str, channel: str) -> None:
        """Take ``channel`` out of ``group``; the last member unsubscribes."""
        link = self._link()
        name = self._group_channel(group)
        members = link.groups.get(name)
        if members is None or channel not in members:
            return
        members.discard(channel)
        if not members:
            del link.groups[name]
            link.pending.discard(name)
            await link.pubsub.unsubscribe(name)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Publish ``message`` to every member of ``group``: one ``PUBLISH``."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_group_name(group)
        await self._link().publish(self._group_channel(group), encode(message).encode())

    async def flush(self) -> None:
        """Forget this loop's channels and groups and close its connections (made again on next use)."""
        with self._lock:
            link = self._links.get(asyncio.get_running_loop())
        if link is not None:
            link.task.cancel()
            await asyncio.wait({link.task})

    def _group_channel(self, group: str) -> str:
        return f"{self.prefix}__group__{group}"

    def _link(self) -> _Link:
        loop = asyncio.get_running_loop()
        link = self._links.get(loop)
        if link is None:
            with self._lock:
                for ended in [other for other in self._links if other.is_closed()]:
                    del self._links[ended]
                link = self._links.get(loop)
                if link is None:
                    link = self._links[loop] = _Link(self, loop)
        return link

    def _drop(self, link: _Link) -> None:
        with self._lock:
            if self._links.get(link.loop) is link:
                del self._links[link.loop]

    def _lost(self, error: BaseException) -> None:
        with self._lock:
            if self._lost_at is not None:
                return
            self._lost_at = time.monotonic()
        logger.warning("the channel layer lost Redis (%s); listening again", error)

    def _back(self) -> None:
        with self._lock:
            lost_at, self._lost_at = self._lost_at, None
        if lost_at is not None:
            logger.info("the channel layer hears Redis again after %.1f s", time.monotonic() - lost_at)


class _Link:
    """One event loop's connections to Redis, the channels made on it, and the groups they are in."""

    def __init__(self, layer: RedisPubSubLayer, loop: asyncio.AbstractEventLoop) -> None:
        self.layer = layer
        self.loop = loop
        options = {"socket_connect_timeout": CONNECT_TIMEOUT, "retry": Retry(NoBackoff(), 1), **layer.options}
        self.client: Redis = Redis.from_url(layer.address, **options)
        self.pubsub = self.client.pubsub()
        self.queues: dict[str, asyncio.Queue[bytes]] = {}
        self.groups: dict[str, set[str]] = {}  # a group's pub/sub channel: its members made on this loop
        self.subscribed = asyncio.Event()
        self.pending: set[str] = set()  # channels and groups to subscribe to once Redis is back
        self.lost = False  # the subscription failed since it last read
        self.outbox: list[tuple[str, bytes, asyncio.Future[None]]] = []
        self.publishing = asyncio.Lock()
        self.task = loop.create_task(self.listen(), name="cachet channel layer")

    async def open(self, channel: str) -> asyncio.Queue[bytes]:
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=self.layer.get_capacity(channel))
        self.queues[channel] = queue
        await self.subscribe(channel)
        return queue

    async def subscribe(self, name: str) -> None:
        """Subscribe to ``name`` now, or (Redis is away) once the subscription reads again."""
        try:
            await self.pubsub.subscribe(name)
        except _LOST as error:
            self.pending.add(name)
            self.lost = True
            self.layer._lost(error)
        self.subscribed.set()

    def tell_back(self) -> None:
        """``LAYER_BACK`` to every group member on this loop: what was published while Redis was away is lost."""
        members = {channel for channels in self.groups.values() for channel in channels}
        body = encode({"type": LAYER_BACK}).encode()
        for channel in members:
            queue = self.queues.get(channel)
            if queue is not None:
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(body)

    async def publish(self, channel: str, body: bytes) -> None:
        """Publish ``body``: with whatever else waits to be published here, in one pipeline (the lock's holder
        sends everything waiting, in order, and the others find theirs sent when they get the lock)."""
        sent: asyncio.Future[None] = self.loop.create_future()
        self.outbox.append((channel, body, sent))
        async with self.publishing:
            if sent.done():
                return sent.result()
            batch, self.outbox = self.outbox, []
            try:
                if len(batch) == 1:
                    await self.client.publish(channel, body)
                else:
                    async with self.client.pipeline(transaction=False) as pipe:
                        for name, data, _ in batch:
                            pipe.publish(name, data)
                        await pipe.execute()
            except asyncio.CancelledError:
                self.outbox[:0] = [item for item in batch if item[2] is not sent]  # the next holder sends them
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
        return None

    async def listen(self) -> None:
        """Read the subscription's messages into the channels' queues, until the loop ends."""
        try:
            while True:
                if not self.pubsub.subscribed and not self.pending:
                    self.subscribed.clear()
                    await self.subscribed.wait()
                try:
                    if self.pending:
                        names = sorted(self.pending)
                        await self.pubsub.subscribe(*names)
                        self.pending.difference_update(names)
                    message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=READ_SECONDS)
                except _LOST as error:
                    self.lost = True
                    self.layer._lost(error)
                    await asyncio.sleep(LISTEN_AGAIN_SECONDS)
                    continue
                except Exception:
                    logger.exception("the channel layer could not take a message from Redis")
                    await asyncio.sleep(1)
                    continue
                if self.layer._lost_at is not None:
                    self.layer._back()
                if self.lost:
                    self.lost = False
                    self.tell_back()
                if message is not None:
                    self.deliver(message)
        finally:
            self.layer._drop(self)
            with contextlib.suppress(Exception):
                await self.pubsub.aclose()  # type: ignore[no-untyped-call]
            with contextlib.suppress(Exception):
                await self.client.aclose()

    def deliver(self, message: dict[str, Any]) -> None:
        name = message["channel"].decode() if isinstance(message["channel"], bytes) else str(message["channel"])
        channels = [name] if name in self.queues else self.groups.get(name, ())
        for channel in channels:
            queue = self.queues.get(channel)
            if queue is not None:
                with contextlib.suppress(asyncio.QueueFull):  # a full channel misses it, as with Channels' layers
                    queue.put_nowait(message["data"])
