"""The channel layer without Redis: Postgres ``LISTEN``/``NOTIFY`` on the Django ``default`` database (the
embedded one included), so that every process on one database (web processes, ``manage.py ask``, workers)
reaches every other's channels with nothing else to install.

The layer has one connection for each event loop that uses it (psycopg's ``AsyncConnection``, driven by a task
on that loop: Daphne has one loop; ``async_to_sync`` and tests make others), as channels_redis's pub/sub layer
has. A loop's connection listens on one Postgres channel per group that has members joined on that loop
(``cachet_g_`` and the md5 of the group's name), and on one for the channels that loop made (``cachet_p_``…),
which a direct send names; it waits for notifications with psycopg's ``notifies()``. A group send is one
notification, which only the connections with members of the group hear; sends that come while the connection
is busy go out together in one statement. A message larger than a notification may carry (7,500 bytes here;
Postgres takes under 8,000) is stored in the ``cachet_layer_message`` table, and its notification names the
row, which stays until it expires. Heard messages wait in per-channel queues with the capacity and expiry of
Channels' in-memory layer, and are taken by ``receive`` on whichever event loop it runs.

When Postgres goes away a loop's connection is made again (at once, then backing off to every 2 s) and listens
again; the layer logs one warning when the outage starts and one when it ends. Meanwhile group sends reach this
process's own members and then raise :class:`LayerUnavailable` (at once, or when the try to connect again
fails), direct sends to other processes raise it at once, and group membership is kept, to be listened to once
Postgres is back. Messages sent to this process while it was not connected are lost: once its connection is back,
each group member on that loop is sent a ``LAYER_BACK`` message, on which a tab's consumer brings the page up to
date from the store. A loop's connection closes without a word when the loop ends (``asyncio.run``
and ``async_to_sync`` cancel its task), and every one at exit (:func:`close_all`), before an embedded Postgres
that this process started is stopped.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import collections
import contextlib
import enum
import hashlib
import itertools
import json
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer

logger = logging.getLogger(__name__)

TABLE = "cachet_layer_message"
PAYLOAD_LIMIT = 7500  # bytes of a notification's payload; Postgres refuses 8000 and more
GROUP_PREFIX = "cachet_g_"
PROCESS_PREFIX = "cachet_p_"
CHANNEL_PREFIX = "cachet_c_"  # a channel without "!": whichever process receives on it listens
SEND_TIMEOUT = 5.0  # the longest a send or a group_add waits for the layer's connection
RECONNECT_SECONDS = (0.05, 2.0)  # the first wait before connecting again, and the longest
CLEAN_SECONDS = 1.0
TABLE_CLEAN_SECONDS = 60.0
CLOSE_SECONDS = 5.0  # the longest closing waits for a connection driven by another thread's loop
APPLICATION_NAME = "cachet channel layer"
BYTES_KEY = "__bytes__"
# The message a layer puts in each group member's channel on a loop whose connection is back after it was lost:
# what was sent meanwhile never came, and a consumer that shows a session brings its page up to date from the store.
LAYER_BACK = "cachet.layer_back"

_layers: weakref.WeakSet[PostgresChannelLayer] = weakref.WeakSet()
_exit_hook_pid = 0


class LayerUnavailable(ConnectionError):
    """Postgres is out of reach: the message reached no other process."""


class _State(enum.Enum):
    CONNECTING = "connecting"  # sends wait (a first connection, or the first try after a loss)
    UP = "up"
    DOWN = "down"  # a try failed: sends fail at once


def pg_channel(prefix: str, name: str) -> str:
    """The Postgres channel of a group, a process or a channel name."""
    return prefix + hashlib.md5(name.encode(), usedforsecurity=False).hexdigest()


def _process_key(channel: str) -> str:
    """The key of the loop that made a channel (``prefix.KEY!random``)."""
    return channel.split("!", 1)[0].rsplit(".", 1)[-1]


def _bytes_out(value: object) -> object:
    if isinstance(value, bytes | bytearray):
        return {BYTES_KEY: base64.b64encode(value).decode("ascii")}
    raise TypeError(f"a channel layer message cannot hold {type(value).__name__}")


def _bytes_in(value: dict[str, Any]) -> object:
    if len(value) == 1 and BYTES_KEY in value:
        return base64.b64decode(value[BYTES_KEY])
    return value


def encode(message: dict[str, Any]) -> str:
    """The message as JSON text (bytes in base64)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"), default=_bytes_out)


def decode(text: str) -> dict[str, Any]:
    """The message of :func:`encode`'s text."""
    message: dict[str, Any] = json.loads(text, object_hook=_bytes_in)
    return message


@dataclass
class _Box:
    """A local channel's messages (expiry time, message) and the receive waiting on it, if any."""

    queue: collections.deque[tuple[float, dict[str, Any]]] = field(default_factory=collections.deque)
    waiter: asyncio.Future[None] | None = None


@dataclass
class _Outgoing:
    pg: str
    target: str
    body: str
    done: asyncio.Future[None]
    deadline: float = 0.0  # on the loop's clock: not taken by Postgres by then, the send fails


_Result = tuple[asyncio.Future[None], BaseException | None]


def _settle_here(results: Iterable[_Result]) -> None:
    for future, error in results:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def _settle(results: Sequence[_Result]) -> None:
    """Settle futures on their own loops: at once on the running loop, else one call per loop (one wake-up
    of each loop however many futures it has)."""
    if not results:
        return
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    by_loop: dict[asyncio.AbstractEventLoop, list[_Result]] = {}
    for result in results:
        by_loop.setdefault(result[0].get_loop(), []).append(result)
    for loop, some in by_loop.items():
        if loop is running:
            _settle_here(some)
        else:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle_here, some)


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    """Wake receives, on their own loops."""
    _settle([(waiter, None) for waiter in waiters])


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class PostgresChannelLayer(BaseChannelLayer):  # type: ignore[misc]
    """Channels' layer interface over Postgres ``LISTEN``/``NOTIFY``; usable from any event loop or thread."""

    extensions = ["groups", "flush"]

    def __init__(
        self,
        *,
        database: str = "default",
        expiry: int = 60,
        group_expiry: int = 86400,
        capacity: int = 100,
        channel_capacity: dict[str, int] | None = None,
        send_timeout: float = SEND_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity, **kwargs)
        self.database = database
        self.group_expiry = group_expiry
        self.send_timeout = send_timeout
        self._lock = threading.Lock()
        self._boxes: dict[str, _Box] = {}
        self._links: dict[asyncio.AbstractEventLoop, _Link] = {}
        self._keys: dict[str, _Link] = {}  # a loop's key (in the names of the channels it made): its link
        self._pid = os.getpid()
        self._seq = itertools.count()
        self._cleaned_at = 0.0
        self._table_cleaned_at = 0.0
        self._outage_since: float | None = None
        self._stopping = False
        _layers.add(self)

    # The interface.

    async def new_channel(self, prefix: str = "specific") -> str:
        """A new channel name of this loop (listened to by the time it is returned)."""
        link = self._link()
        if not link.made:
            with self._lock:
                link.made = True
                link.changed = True
            await link.sync()
        return f"{prefix}.{link.key}!{uuid.uuid4().hex}"

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """Send to ``channel``: at once when it is this process's, else through Postgres."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        if self._is_local(channel):
            with self._lock:
                waiter = self._put(channel, _copied(message), full_raises=True)
            _wake([waiter] if waiter else [])
            return
        link = self._link()
        pg = (
            pg_channel(PROCESS_PREFIX, _process_key(channel)) if "!" in channel else pg_channel(CHANNEL_PREFIX, channel)
        )
        await link.post(pg, channel, encode(message))

    async def receive(self, channel: str) -> dict[str, Any]:
        """The next message of one of this process's channels, waiting for it."""
        self.require_valid_channel_name(channel)
        link = self._link()
        if "!" not in channel:
            with self._lock:
                new = not any(channel in other.plain for other in self._links.values())
                if new:
                    link.plain.add(channel)
                    link.changed = True
            if new:
                await link.sync()
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                box = self._boxes.get(channel)
                if box is None:
                    box = self._boxes[channel] = _Box()
                now = time.time()
                while box.queue and box.queue[0][0] < now:
                    box.queue.popleft()
                if box.queue:
                    return box.queue.popleft()[1]
                waiter: asyncio.Future[None] = loop.create_future()
                box.waiter = waiter
            try:
                await waiter
            finally:
                with self._lock:
                    if box.waiter is waiter:
                        box.waiter = None

    async def group_add(self, group: str, channel: str) -> None:
        """Add a channel of this process to ``group``; this loop listens on the group when it is its first."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        link = self._link()
        with self._lock:
            for other in self._links.values():
                if other is not link and channel in other.groups.get(group, {}):
                    other.groups[group][channel] = time.time()  # joined on that loop, which hears it
                    return
            members = link.groups.setdefault(group, {})
            first = not members
            members[channel] = time.time()
            if first:
                link.group_of[pg_channel(GROUP_PREFIX, group)] = group
                link.changed = True
        if first:
            await link.sync()

    async def group_discard(self, group: str, channel: str) -> None:
        """Take ``channel`` out of ``group``; the last member on a loop stops its listening."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        emptied = []
        with self._lock:
            for link in self._links.values():
                members = link.groups.get(group)
                if members is None or channel not in members:
                    continue
                del members[channel]
                if not members:
                    link.forget_group(group)
                    emptied.append(link)
        for link in emptied:
            link.poke()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Send to every member of ``group`` in every process: one notification."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_group_name(group)
        link = self._link()
        body = encode(message)
        try:
            await link.post(pg_channel(GROUP_PREFIX, group), "", body)
        except LayerUnavailable as error:
            self._deliver_group(group, body)
            raise LayerUnavailable(f"{error}; the message reached this process's channels only") from None

    async def flush(self) -> None:
        """Forget every channel, message and group of this process."""
        with self._lock:
            for channel, box in list(self._boxes.items()):
                if box.waiter is None:
                    del self._boxes[channel]
                else:  # a receive waits on it: it stays, empty
                    box.queue.clear()
            links = list(self._links.values())
            for link in links:
                link.groups.clear()
                link.group_of.clear()
                link.plain.clear()
                link.changed = True
        here = self._links.get(asyncio.get_running_loop())
        for link in links:
            if link is not here:
                link.poke()
        if here is not None:
            await here.sync()

    async def close(self) -> None:
        """Close the layer's connections (tests; shutting down); using it again connects again."""
        running = asyncio.get_running_loop()
        for link in self._all_links():
            if link.loop is running:
                await link.stop()
            elif link.loop.is_running():
                with contextlib.suppress(Exception):
                    stopped = asyncio.run_coroutine_threadsafe(link.stop(), link.loop)
                    await asyncio.wait_for(asyncio.wrap_future(stopped), CLOSE_SECONDS)
            else:
                link.abandon()

    def close_sync(self) -> None:
        """:meth:`close` from synchronous code."""
        running = _running_loop()
        for link in self._all_links():
            if link.loop is running:  # called from this loop's own thread: it cannot be waited for here
                link.task.cancel()
            elif link.loop.is_running():
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(link.stop(), link.loop).result(CLOSE_SECONDS)
            elif not link.loop.is_closed() and running is None:
                with contextlib.suppress(Exception):
                    link.loop.run_until_complete(link.stop())
            else:
                link.abandon()

    @property
    def connected(self) -> bool:
        """Whether the connection of this loop (or, outside one, of any) is up now."""
        link = self._current()
        return link is not None and link.state is _State.UP

    @property
    def backend_pid(self) -> int | None:
        """The Postgres backend of this loop's connection, while connected."""
        link = self._current()
        return link.backend_pid if link is not None and link.state is _State.UP else None

    # The caller's side.

    def _link(self) -> _Link:
        """The running loop's link, made (and its connection started) on first use."""
        loop = asyncio.get_running_loop()
        link = self._links.get(loop)
        if link is not None and self._pid == os.getpid():
            return link
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its parent's connections are not its own
                self._pid = os.getpid()
                self._links.clear()
                self._keys.clear()
            ended = [old for old in self._links.values() if old.loop.is_closed()]
            for old in ended:
                self._drop(old)
            link = self._links.get(loop)
            if link is None:
                link = self._links[loop] = _Link(self, loop)
                self._keys[link.key] = link
        for old in ended:
            old.abandon()
        return link

    def _all_links(self) -> list[_Link]:
        with self._lock:
            return list(self._links.values())

    def _drop(self, link: _Link) -> None:
        """Forget ``link`` (the lock held)."""
        if self._links.get(link.loop) is link:
            del self._links[link.loop]
        if self._keys.get(link.key) is link:
            del self._keys[link.key]

    def _current(self) -> _Link | None:
        loop = _running_loop()
        link = self._links.get(loop) if loop is not None else None
        if link is None and loop is None:
            link = next(iter(self._all_links()), None)
        return link

    def _is_local(self, channel: str) -> bool:
        return "!" in channel and _process_key(channel) in self._keys

    def _put(self, channel: str, message: dict[str, Any], *, full_raises: bool) -> asyncio.Future[None] | None:
        """Queue ``message`` for a local channel (the lock held); the receive to wake, if one waits."""
        box = self._boxes.get(channel)
        if box is None:
            box = self._boxes[channel] = _Box()
        if len(box.queue) >= self.get_capacity(channel):
            if full_raises:
                raise ChannelFull(channel)
            return None
        box.queue.append((time.time() + self.expiry, message))
        waiter, box.waiter = box.waiter, None
        return waiter

    def _deliver_group(self, group: str, body: str) -> None:
        """Deliver to the group's members on every loop of this process."""
        waiters = []
        with self._lock:
            channels = [channel for link in self._links.values() for channel in link.groups.get(group, ())]
            for channel in channels:
                waiter = self._put(channel, decode(body), full_raises=False)
                if waiter is not None:
                    waiters.append(waiter)
        _wake(waiters)

    def _tell_back(self, link: _Link) -> None:
        """Put ``LAYER_BACK`` in the channel of every group member joined on ``link``'s loop."""
        waiters = []
        with self._lock:
            channels = {channel for members in link.groups.values() for channel in members}
            for channel in channels:
                waiter = self._put(channel, {"type": LAYER_BACK}, full_raises=False)
                if waiter is not None:
                    waiters.append(waiter)
        _wake(waiters)

    def _delivered(self, link: _Link, name: str, target: str, body: str) -> list[asyncio.Future[None]]:
        waiters = []
        with self._lock:
            if name.startswith(GROUP_PREFIX):
                group = link.group_of.get(name)
                channels = list(link.groups.get(group, ())) if group is not None else []
            else:
                channels = [target] if self._is_local(target) or target in link.plain else []
            for channel in channels:
                with contextlib.suppress(ChannelFull):
                    waiter = self._put(channel, decode(body), full_raises=True)
                    if waiter is not None:
                        waiters.append(waiter)
        return waiters

    def _clean(self) -> None:
        """Drop, at most once a second, channels whose oldest message expired (nobody reads them) with their
        group memberships, and memberships older than ``group_expiry``."""
        now = time.time()
        if now - self._cleaned_at < CLEAN_SECONDS:
            return
        self._cleaned_at = now
        emptied = []
        with self._lock:
            dead = {
                channel
                for channel, box in self._boxes.items()
                if box.waiter is None and box.queue and box.queue[0][0] < now
            }
            for channel in dead:
                del self._boxes[channel]
            for link in self._links.values():
                for group, members in list(link.groups.items()):
                    for channel, joined in list(members.items()):
                        if channel in dead or joined < now - self.group_expiry:
                            del members[channel]
                    if not members:
                        link.forget_group(group)
                        emptied.append(link)
        for link in emptied:
            link.poke()

    # The connections' side.

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        """A new connection to the layer's database, with the parameters Django gives its own."""
        from django.db import connections

        params = connections.create_connection(self.database).get_connection_params()
        params.pop("cursor_factory", None)  # Django's, for its synchronous connections
        params.update(application_name=APPLICATION_NAME)
        params.setdefault("connect_timeout", 5)
        if not str(params.get("host", "")).startswith("/"):  # TCP: notice a vanished server within seconds
            params.update(
                keepalives=1, keepalives_idle=10, keepalives_interval=3, keepalives_count=3, tcp_user_timeout=10_000
            )
        return await psycopg.AsyncConnection.connect(**params)

    def _lost(self, error: BaseException, *, connecting: bool) -> None:
        """Log the start of an outage (once, however many loops notice it)."""
        with self._lock:
            if self._stopping or self._outage_since is not None:
                return
            self._outage_since = time.monotonic()
        if connecting:
            logger.warning("the channel layer cannot reach Postgres (%s); trying again", _short(error))
        else:
            logger.warning("the channel layer lost its connection to Postgres (%s); connecting again", _short(error))

    def _back(self) -> None:
        with self._lock:
            since, self._outage_since = self._outage_since, None
        if since is not None:
            logger.warning("the channel layer reaches Postgres again after %.1f s", time.monotonic() - since)

    async def _store(self, connection: psycopg.AsyncConnection[Any], body: str) -> int:
        now = time.monotonic()
        if now - self._table_cleaned_at > TABLE_CLEAN_SECONDS:
            self._table_cleaned_at = now
            await connection.execute(f"DELETE FROM {TABLE} WHERE expires < now()")
        cursor = await connection.execute(
            f"INSERT INTO {TABLE} (expires, body) VALUES (now() + make_interval(secs => %s), %s) RETURNING id",
            (self.expiry, body),
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])


class _Link:
    """One event loop's connection, driven by a task on that loop, and what it listens on."""

    def __init__(self, layer: PostgresChannelLayer, loop: asyncio.AbstractEventLoop) -> None:
        self.layer = layer
        self.loop = loop
        self.key = uuid.uuid4().hex[:16]
        self.made = False  # it made channels: it listens on its key's Postgres channel
        self.groups: dict[str, dict[str, float]] = {}  # group: {channel: when it joined}
        self.group_of: dict[str, str] = {}  # Postgres channel: group
        self.plain: set[str] = set()  # channels without "!" received on here
        self.changed = True  # what to listen on changed since the task last looked
        self.state = _State.CONNECTING
        self.served = False  # it was connected once: a later connection tells its members what may be lost
        self.backend_pid: int | None = None
        self.connection: psycopg.AsyncConnection[Any] | None = None
        self.outbox: collections.deque[_Outgoing] = collections.deque()
        self.posted: collections.deque[_Outgoing] = collections.deque()  # sends not yet settled, oldest first
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.syncs: list[asyncio.Future[None]] = []
        self.inbox: collections.deque[tuple[str, str]] = collections.deque()  # heard, waiting for the table
        self.listening: set[str] = set()
        self.wake = asyncio.Event()
        self.task = loop.create_task(self.drive(), name="cachet channel layer")

    # Called on the link's loop, or (poke, forget_group) from anywhere.

    def poke(self) -> None:
        """Wake the link's task."""
        if _running_loop() is self.loop:
            self.wake.set()
        else:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                self.loop.call_soon_threadsafe(self.wake.set)

    def forget_group(self, group: str) -> None:
        """Stop hearing ``group`` here (the layer's lock held)."""
        self.groups.pop(group, None)
        self.group_of.pop(pg_channel(GROUP_PREFIX, group), None)
        self.changed = True

    async def post(self, pg: str, target: str, body: str) -> None:
        if self.state is _State.DOWN:
            raise LayerUnavailable("Postgres is out of reach: the message was not sent")
        done: asyncio.Future[None] = self.loop.create_future()
        outgoing = _Outgoing(pg, target, body, done, self.loop.time() + self.layer.send_timeout)
        self.outbox.append(outgoing)
        posted = self.posted
        while posted and posted[0].done.done():  # the settled ones at its front: it holds the unsettled
            posted.popleft()
        posted.append(outgoing)
        self.wake.set()
        if self.deadline_timer is None:
            self.deadline_timer = self.loop.call_at(outgoing.deadline, self.expire)
        await done

    def expire(self) -> None:
        """One timer a link times its sends (a timeout a send cost each a timer, a task lookup and a cancel): the
        sends whose deadline passed fail; it is set again for the oldest one left."""
        self.deadline_timer = None
        now = self.loop.time()
        posted = self.posted
        while posted and (posted[0].done.done() or posted[0].deadline <= now):
            item = posted.popleft()
            if not item.done.done():
                seconds = self.layer.send_timeout
                item.done.set_exception(LayerUnavailable(f"Postgres did not take the message within {seconds:g} s"))
        if posted:
            self.deadline_timer = self.loop.call_at(posted[0].deadline, self.expire)

    async def sync(self) -> None:
        """Wait until the link listens on what it needs now (not while Postgres is away)."""
        if self.state is _State.DOWN:
            return
        done: asyncio.Future[None] = self.loop.create_future()
        self.syncs.append(done)
        self.wake.set()
        with contextlib.suppress(TimeoutError, LayerUnavailable):
            async with asyncio.timeout(self.layer.send_timeout):
                await done

    async def stop(self) -> None:
        """Cancel the task, which closes the connection."""
        self.task.cancel()
        await asyncio.wait({self.task})

    def abandon(self) -> None:
        """Close the connection of a link whose loop runs no more."""
        with self.layer._lock:
            self.layer._drop(self)
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.pgconn.finish()

    # The link's task.

    async def drive(self) -> None:
        delay = RECONNECT_SECONDS[0]
        try:
            while True:
                try:
                    connection = await self.layer._open()
                except Exception as error:
                    self.state = _State.DOWN
                    self.fail_pending(error)
                    self.layer._lost(error, connecting=True)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RECONNECT_SECONDS[1])
                    continue
                _hook_exit()
                delay = RECONNECT_SECONDS[0]
                self.connection = connection
                try:
                    await self.serve(connection)
                except Exception as error:
                    self.state = _State.CONNECTING
                    self.fail_pending(error)
                    self.layer._lost(error, connecting=False)
                finally:
                    self.connection = None
                    self.backend_pid = None
                    with contextlib.suppress(Exception):
                        await connection.close()
        finally:
            self.state = _State.CONNECTING
            self.fail_pending(LayerUnavailable("the channel layer is closed"))
            with self.layer._lock:
                self.layer._drop(self)

    async def serve(self, connection: psycopg.AsyncConnection[Any]) -> None:
        await connection.set_autocommit(True)
        self.backend_pid = connection.info.backend_pid
        self.listening = set()
        self.inbox.clear()
        with self.layer._lock:
            self.changed = True
        await self.work(connection)
        self.state = _State.UP
        self.layer._back()
        if self.served:
            self.layer._tell_back(self)
        self.served = True
        hearing: asyncio.Task[None] | None = None
        try:
            while True:
                self.wake.clear()
                if self.outbox or self.syncs or self.inbox or self.changed:
                    if hearing is not None:
                        await _stopped(hearing)
                        hearing = None
                    await self.work(connection)
                    continue
                if hearing is None:
                    hearing = self.loop.create_task(self.hear(connection))
                    hearing.add_done_callback(lambda _: self.wake.set())
                elif hearing.done():
                    await _stopped(hearing)  # the connection failed: raises why
                    hearing = None
                    continue
                self.layer._clean()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLEAN_SECONDS):
                        await self.wake.wait()
        finally:
            if hearing is not None:
                hearing.cancel()
                await asyncio.wait({hearing})
                if not hearing.cancelled():
                    hearing.exception()  # retrieved: the connection's failure is told once, by the caller

    async def hear(self, connection: psycopg.AsyncConnection[Any]) -> None:
        async with contextlib.aclosing(connection.notifies()) as notifies:
            async for notify in notifies:
                if self.inbox or notify.payload.startswith("r"):  # in order, behind one the table holds
                    self.inbox.append((notify.channel, notify.payload))
                    self.wake.set()
                else:
                    self.deliver(notify.channel, notify.payload)

    def deliver(self, name: str, payload: str, body: str | None = None) -> None:
        try:
            _, target, text = payload.split("|", 2)
            _wake(self.layer._delivered(self, name, target, text if body is None else body))
        except Exception:
            logger.exception("the channel layer could not read a message on %s", name)

    async def work(self, connection: psycopg.AsyncConnection[Any]) -> None:
        await self.listen(connection)
        await self.send_outbox(connection)
        await self.dispatch(connection)

    def wanted(self) -> set[str] | None:
        """What to listen on now; ``None`` when that has not changed."""
        with self.layer._lock:
            if not self.changed:
                return None
            self.changed = False
            wanted = set(self.group_of)
            wanted.update(pg_channel(CHANNEL_PREFIX, channel) for channel in self.plain)
            if self.made:
                wanted.add(pg_channel(PROCESS_PREFIX, self.key))
        return wanted

    async def listen(self, connection: psycopg.AsyncConnection[Any]) -> None:
        syncs, self.syncs = self.syncs, []
        try:
            wanted = self.wanted()
            if wanted is not None:
                added, dropped = wanted - self.listening, self.listening - wanted
                if added or dropped:
                    statements = [f'LISTEN "{name}"' for name in sorted(added)]
                    statements += [f'UNLISTEN "{name}"' for name in sorted(dropped)]
                    await connection.execute("; ".join(statements).encode())
                self.listening = wanted
        except BaseException:
            self.syncs[:0] = syncs
            with self.layer._lock:
                self.changed = True
            raise
        _settle([(done, None) for done in syncs])

    async def send_outbox(self, connection: psycopg.AsyncConnection[Any]) -> None:
        batch = [item for item in self.outbox if not item.done.done()]  # a send that timed out is not sent
        self.outbox.clear()
        if not batch:
            return
        try:
            names, payloads = [], []
            for item in batch:
                kind, body = "m", item.body
                if len(body.encode()) > PAYLOAD_LIMIT - 200:
                    kind, body = "r", str(await self.layer._store(connection, body))
                names.append(item.pg)
                payloads.append(f"{kind}{next(self.layer._seq):x}|{item.target}|{body}")
            # Binary arrays (%b): psycopg escapes a text array's elements in Python, 10 ms for 40 KB of payload.
            await connection.execute(
                "SELECT count(pg_notify(c, p)) FROM unnest(%b::text[], %b::text[]) AS t(c, p)", (names, payloads)
            )
        except Exception as error:
            if not (connection.broken or connection.closed):  # this batch's fault, not the connection's
                _settle([(item.done, error) for item in batch])
                return
            failure = LayerUnavailable(f"Postgres is out of reach: {_short(error)}")
            _settle([(item.done, failure) for item in batch])
            raise
        except BaseException:
            _settle([(item.done, LayerUnavailable("the channel layer is closed")) for item in batch])
            raise
        _settle([(item.done, None) for item in batch])

    async def dispatch(self, connection: psycopg.AsyncConnection[Any]) -> None:
        while self.inbox:
            name, payload = self.inbox[0]
            body = None
            if payload.startswith("r"):
                try:
                    row_id = int(payload.split("|", 2)[2])
                except ValueError:
                    row_id = 0
                cursor = await connection.execute(f"SELECT body FROM {TABLE} WHERE id = %s", (row_id,))
                row = await cursor.fetchone()
                if row is None:  # expired before it was read
                    self.inbox.popleft()
                    continue
                body = str(row[0])
            self.inbox.popleft()
            self.deliver(name, payload, body)

    def fail_pending(self, error: BaseException) -> None:
        batch, self.outbox = list(self.outbox), collections.deque()
        syncs, self.syncs = self.syncs, []
        failure = error if isinstance(error, LayerUnavailable) else LayerUnavailable(_short(error))
        _settle([(item.done, failure) for item in batch] + [(done, failure) for done in syncs])


async def _stopped(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it; raise what it failed with, if it did before."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and (error := task.exception()) is not None:
        raise error


def _hook_exit() -> None:
    """Close every layer at exit: registered once per process, after its first connection (an embedded Postgres
    registers its stop when started, and exit handlers run last in, first out, so this one comes first)."""
    global _exit_hook_pid
    if _exit_hook_pid != os.getpid():
        _exit_hook_pid = os.getpid()
        atexit.register(_at_exit)


def _at_exit() -> None:
    for layer in list(_layers):
        layer._stopping = True
    close_all()


def _copied(message: dict[str, Any]) -> dict[str, Any]:
    if all(isinstance(value, str | int | float | bool | type(None)) for value in message.values()):
        return dict(message)
    return decode(encode(message))


def _short(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def close_all() -> None:
    """Close every Postgres layer of this process (at exit; tests, before their database is dropped)."""
    for layer in list(_layers):
        layer.close_sync()
