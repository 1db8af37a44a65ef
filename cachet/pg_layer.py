"""The channel layer without Redis: Postgres ``LISTEN``/``NOTIFY`` on the Django ``default`` database (the
embedded one included), so that every process on one database (web processes, ``manage.py ask``, workers)
reaches every other's channels with nothing else to install.

Each layer (one per process) has one connection, owned by a thread of its own. It listens on one Postgres
channel per group that has members in this process (``cachet_g_`` and the md5 of the group's name), and on one
for the channels this process made (``cachet_p_``…), which a direct send names. A group send is one
notification, which only the processes with members of the group hear; sends that come while the connection
is busy go out together in one statement. A message larger than a notification may carry (7,500 bytes here;
Postgres takes under 8,000) is stored in the ``cachet_layer_message`` table, and its notification names the
row, which stays until it expires. Heard messages wait in per-channel queues with the capacity and expiry of
Channels' in-memory layer, and are taken by ``receive`` on whichever event loop it runs.

When Postgres goes away the thread connects again (at once, then backing off to every 2 s) and listens again;
it logs one warning per outage and one line when it is back. Meanwhile group sends reach this process's own
members and then raise :class:`LayerUnavailable` (at once, or when the try to connect again fails), direct
sends to other processes raise it at once, and group membership is kept, to be listened to once Postgres is
back. Messages sent to this process while it was not connected are lost: a tab asks for the live text again
when it sees a gap.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import enum
import hashlib
import itertools
import json
import logging
import os
import select
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
from psycopg import pq
from psycopg.pq.abc import PGconn

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
APPLICATION_NAME = "cachet channel layer"
BYTES_KEY = "__bytes__"

_layers: weakref.WeakSet[PostgresChannelLayer] = weakref.WeakSet()


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
    """The process part of a process's channel name (``prefix.PROCESS!random``)."""
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
    done: asyncio.Future[None]  # on the sender's loop


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
        self.process = uuid.uuid4().hex[:16]
        self._lock = threading.Lock()
        self._boxes: dict[str, _Box] = {}
        self._groups: dict[str, dict[str, float]] = {}  # group: {channel: when it joined}
        self._group_of: dict[str, str] = {}  # Postgres channel: group
        self._plain: set[str] = set()  # channels without "!" received on here
        self._outbox: collections.deque[_Outgoing] = collections.deque()
        self._syncs: list[asyncio.Future[None]] = []
        self._state = _State.CONNECTING
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._stopping = False
        self._wake_r, self._wake_w = -1, -1
        self._woken = False
        self._seq = itertools.count()
        self._cleaned_at = 0.0
        self._table_cleaned_at = 0.0
        self._backend_pid: int | None = None
        self._inbox: collections.deque[tuple[str, str]] = collections.deque()  # heard: (Postgres channel, payload)
        self._listening: set[str] = set()
        self._pending_syncs: list[asyncio.Future[None]] = []
        self._changed = True  # what to listen on changed since the thread last looked
        _layers.add(self)

    # The interface.

    async def new_channel(self, prefix: str = "specific") -> str:
        """A new channel name of this process (listened to by the time it is returned)."""
        self._start()
        if self._state is _State.CONNECTING:
            await self._sync()
        return f"{prefix}.{self.process}!{uuid.uuid4().hex}"

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
        self._start()
        pg = (
            pg_channel(PROCESS_PREFIX, _process_key(channel)) if "!" in channel else pg_channel(CHANNEL_PREFIX, channel)
        )
        await self._post(pg, channel, encode(message))

    async def receive(self, channel: str) -> dict[str, Any]:
        """The next message of one of this process's channels, waiting for it."""
        self.require_valid_channel_name(channel)
        self._start()
        if "!" not in channel and channel not in self._plain:
            with self._lock:
                self._plain.add(channel)
                self._changed = True
            await self._sync()
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
        """Add one of this process's channels to ``group``; listens on the group when it is the first here."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        self._start()
        with self._lock:
            members = self._groups.setdefault(group, {})
            first = not members
            members[channel] = time.time()
            if first:
                self._group_of[pg_channel(GROUP_PREFIX, group)] = group
                self._changed = True
        if first:
            await self._sync()

    async def group_discard(self, group: str, channel: str) -> None:
        """Take ``channel`` out of ``group``; the last member here stops the listening."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        with self._lock:
            members = self._groups.get(group)
            if members is None:
                return
            members.pop(channel, None)
            last = not members
            if last:
                self._forget_group(group)
        if last:
            self._poke()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Send to every member of ``group`` in every process: one notification."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_group_name(group)
        self._start()
        body = encode(message)
        try:
            await self._post(pg_channel(GROUP_PREFIX, group), "", body)
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
            self._groups.clear()
            self._group_of.clear()
            self._plain.clear()
            self._changed = True
        if self._thread is not None:
            await self._sync()

    async def close(self) -> None:
        """Stop the layer's thread and close its connection (tests; shutting down)."""
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """:meth:`close` from synchronous code."""
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            return
        self._stopping = True
        self._poke()
        thread.join(10)
        self._thread = None
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def connected(self) -> bool:
        """Whether the layer's connection is up now."""
        return self._state is _State.UP

    @property
    def backend_pid(self) -> int | None:
        """The Postgres backend of the layer's connection, while connected."""
        return self._backend_pid if self.connected else None

    # The caller's side.

    def _is_local(self, channel: str) -> bool:
        return "!" in channel and _process_key(channel) == self.process

    def _start(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            self._pid = os.getpid()  # a forked child starts a thread and a connection of its own
            self._stopping = False
            self._state = _State.CONNECTING
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            self._woken = False
            thread = threading.Thread(target=self._run, name="cachet-channel-layer", daemon=True)
            self._thread = thread
        thread.start()

    def _poke(self) -> None:
        """Wake the layer's thread (once, however many ask before it looks)."""
        with self._lock:
            if self._woken or self._wake_w < 0:
                return
            self._woken = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    async def _post(self, pg: str, target: str, body: str) -> None:
        if self._state is _State.DOWN:
            raise LayerUnavailable("Postgres is out of reach: the message was not sent")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._outbox.append(_Outgoing(pg, target, body, done))
        self._poke()
        try:
            async with asyncio.timeout(self.send_timeout):
                await done
        except TimeoutError:
            raise LayerUnavailable(f"Postgres did not take the message within {self.send_timeout:g} s") from None

    async def _sync(self) -> None:
        """Wait until the thread listens on what this process needs now (not while Postgres is away)."""
        if self._state is _State.DOWN:
            self._poke()
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._syncs.append(done)
        self._poke()
        with contextlib.suppress(TimeoutError, LayerUnavailable):
            async with asyncio.timeout(self.send_timeout):
                await done

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
        waiters = []
        with self._lock:
            for channel in list(self._groups.get(group, ())):
                waiter = self._put(channel, decode(body), full_raises=False)
                if waiter is not None:
                    waiters.append(waiter)
        _wake(waiters)

    def _forget_group(self, group: str) -> None:
        self._groups.pop(group, None)
        self._group_of.pop(pg_channel(GROUP_PREFIX, group), None)
        self._changed = True

    # The layer's thread.

    def _run(self) -> None:
        delay = RECONNECT_SECONDS[0]
        outage_started: float | None = None
        while not self._stopping:
            try:
                connection = self._connect()
            except Exception as error:
                self._state = _State.DOWN
                self._fail_pending(error)
                if outage_started is None:
                    outage_started = time.monotonic()
                    logger.warning("the channel layer cannot reach Postgres (%s); trying again", _short(error))
                self._pause(delay)
                delay = min(delay * 2, RECONNECT_SECONDS[1])
                continue
            if outage_started is not None:
                logger.info("the channel layer reaches Postgres again after %.1f s", time.monotonic() - outage_started)
                outage_started = None
            delay = RECONNECT_SECONDS[0]
            try:
                self._serve(connection)
            except Exception as error:
                if self._stopping:
                    break
                outage_started = time.monotonic()
                logger.warning(
                    "the channel layer lost its connection to Postgres (%s); connecting again", _short(error)
                )
                self._state = _State.CONNECTING
                self._fail_pending(error)
            finally:
                self._backend_pid = None
                with contextlib.suppress(Exception):
                    connection.close()
        self._fail_pending(LayerUnavailable("the channel layer is closed"))

    def _pause(self, seconds: float) -> None:
        with contextlib.suppress(OSError, ValueError):
            select.select([self._wake_r], [], [], seconds)

    def _open(self) -> psycopg.Connection[Any]:
        """A new connection to the layer's database, made as Django makes its own (so the embedded Postgres is
        started again should it have stopped)."""
        from django.db import connections

        wrapper = connections.create_connection(self.database)
        params = wrapper.get_connection_params()
        params.update(application_name=APPLICATION_NAME)
        params.setdefault("connect_timeout", 5)
        if not str(params.get("host", "")).startswith("/"):  # TCP: notice a vanished server within seconds
            params.update(
                keepalives=1, keepalives_idle=10, keepalives_interval=3, keepalives_count=3, tcp_user_timeout=10_000
            )
        connection: psycopg.Connection[Any] = wrapper.get_new_connection(params)
        return connection

    def _connect(self) -> psycopg.Connection[Any]:
        connection = self._open()
        connection.autocommit = True
        connection.add_notify_handler(self._heard)
        self._inbox.clear()
        self._listening = set()
        with self._lock:
            self._changed = True
        self._backend_pid = connection.info.backend_pid
        self._listen(connection)
        self._state = _State.UP
        return connection

    def _heard(self, notify: psycopg.Notify) -> None:
        self._inbox.append((notify.channel, notify.payload))

    def _serve(self, connection: psycopg.Connection[Any]) -> None:
        pgconn = connection.pgconn
        socket = connection.fileno()
        while not self._stopping:
            with self._lock:
                self._woken = False
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
            self._listen(connection)
            self._send_outbox(connection)
            self._read(pgconn)
            self._dispatch(connection)
            self._clean()
            with self._lock:
                busy = self._woken or bool(self._outbox) or bool(self._syncs)
            if busy or self._inbox:
                continue
            readable, _, _ = select.select([socket, self._wake_r], [], [], CLEAN_SECONDS)
            if socket in readable:
                self._read(pgconn)

    def _read(self, pgconn: PGconn) -> None:
        pgconn.consume_input()
        if pgconn.status != pq.ConnStatus.OK:
            raise psycopg.OperationalError("the connection to Postgres is closed")
        while (notify := pgconn.notifies()) is not None:
            self._inbox.append((notify.relname.decode(), notify.extra.decode()))

    def _wanted(self) -> set[str] | None:
        """What to listen on now; ``None`` when that has not changed."""
        with self._lock:
            syncs, self._syncs = self._syncs, []
            self._pending_syncs = syncs
            if not self._changed:
                return None
            self._changed = False
            wanted = {pg_channel(PROCESS_PREFIX, self.process)}
            wanted.update(self._group_of)
            wanted.update(pg_channel(CHANNEL_PREFIX, channel) for channel in self._plain)
        return wanted

    def _listen(self, connection: psycopg.Connection[Any]) -> None:
        wanted = self._wanted()
        if wanted is not None:
            added, dropped = wanted - self._listening, self._listening - wanted
            if added or dropped:
                statements = [f'LISTEN "{name}"' for name in sorted(added)]
                statements += [f'UNLISTEN "{name}"' for name in sorted(dropped)]
                connection.execute("; ".join(statements).encode())
            self._listening = wanted
        _settle([(done, None) for done in self._pending_syncs])
        self._pending_syncs = []

    def _send_outbox(self, connection: psycopg.Connection[Any]) -> None:
        with self._lock:
            batch = [item for item in self._outbox if not item.done.done()]  # a send that timed out is not sent
            self._outbox.clear()
        if not batch:
            return
        try:
            names, payloads = [], []
            for item in batch:
                kind, body = "m", item.body
                if len(body.encode()) > PAYLOAD_LIMIT - 200:
                    kind, body = "r", str(self._store(connection, body))
                names.append(item.pg)
                payloads.append(f"{kind}{next(self._seq):x}|{item.target}|{body}")
            # Binary arrays (%b): psycopg escapes a text array's elements in Python, 10 ms for 40 KB of payload.
            connection.execute(
                "SELECT count(pg_notify(c, p)) FROM unnest(%b::text[], %b::text[]) AS t(c, p)", (names, payloads)
            )
        except psycopg.OperationalError as error:
            failure = LayerUnavailable(f"Postgres is out of reach: {_short(error)}")
            _settle([(item.done, failure) for item in batch])
            raise
        except Exception as error:
            _settle([(item.done, error) for item in batch])
            return
        _settle([(item.done, None) for item in batch])

    def _store(self, connection: psycopg.Connection[Any], body: str) -> int:
        now = time.monotonic()
        if now - self._table_cleaned_at > TABLE_CLEAN_SECONDS:
            self._table_cleaned_at = now
            connection.execute(f"DELETE FROM {TABLE} WHERE expires < now()")
        row = connection.execute(
            f"INSERT INTO {TABLE} (expires, body) VALUES (now() + make_interval(secs => %s), %s) RETURNING id",
            (self.expiry, body),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def _dispatch(self, connection: psycopg.Connection[Any]) -> None:
        waiters: list[asyncio.Future[None]] = []
        while self._inbox:
            name, payload = self._inbox.popleft()
            try:
                header, target, body = payload.split("|", 2)
                if header[0] == "r":
                    row = connection.execute(f"SELECT body FROM {TABLE} WHERE id = %s", (int(body),)).fetchone()
                    if row is None:
                        continue  # expired before it was read
                    body = row[0]
                waiters.extend(self._delivered(name, target, body))
            except psycopg.OperationalError:
                raise
            except Exception:
                logger.exception("the channel layer could not read a message on %s", name)
        _wake(waiters)

    def _delivered(self, name: str, target: str, body: str) -> list[asyncio.Future[None]]:
        waiters = []
        with self._lock:
            if name.startswith(GROUP_PREFIX):
                group = self._group_of.get(name)
                channels = list(self._groups.get(group, ())) if group is not None else []
            else:
                channels = [target] if self._is_local(target) or target in self._plain else []
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
        with self._lock:
            dead = {
                channel
                for channel, box in self._boxes.items()
                if box.waiter is None and box.queue and box.queue[0][0] < now
            }
            for channel in dead:
                del self._boxes[channel]
            for group, members in list(self._groups.items()):
                for channel, joined in list(members.items()):
                    if channel in dead or joined < now - self.group_expiry:
                        del members[channel]
                if not members:
                    self._forget_group(group)

    def _fail_pending(self, error: BaseException) -> None:
        with self._lock:
            batch, self._outbox = list(self._outbox), collections.deque()
            syncs, self._syncs = self._syncs, []
        failure = error if isinstance(error, LayerUnavailable) else LayerUnavailable(_short(error))
        _settle([(item.done, failure) for item in batch] + [(done, failure) for done in syncs])


def _copied(message: dict[str, Any]) -> dict[str, Any]:
    if all(isinstance(value, str | int | float | bool | type(None)) for value in message.values()):
        return dict(message)
    return decode(encode(message))


def _short(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def close_all() -> None:
    """Close every Postgres layer of this process (tests, before their database is dropped)."""
    for layer in list(_layers):
        layer.close_sync()
