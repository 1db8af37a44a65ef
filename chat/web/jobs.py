"""Runs a session's actions (send, regenerate, edit, flip, undo, rewind, compact) in a thread of the web process and
publishes their events to every tab.

A job belongs to no websocket: the reply goes on when the tab that asked for it closes. While it runs,
the job listens on the session's reply group, so a Stop or a request for the live text reaches it from
any tab served by any process (through Redis where several serve). Whether a reply runs is not the job's
to say: the session's reply lock, which the loop holds, is the one truth of it.

A running action holds one database connection (the lock lives on it) for as long as it runs, so at most
``CACHET_MAX_REPLIES`` of them run at once in a process; the others wait their turn in order, holding no
connection, and their tabs say so.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings
from django.db import close_old_connections, connection

from chat.agent.events import ReplyEvent, TurnStarted
from chat.agent.loop import ReplyLoop
from chat.agent.model_client import ModelError
from chat.web import fragments
from chat.web.messages import Put, pack
from chat.web.publisher import Publisher, Relay, _Send, _Snapshot, reply_group
from sessions_app.errors import StoreError, person_message
from sessions_app.models import ChatSession
from sessions_app.selectors.sessions import session_by_id

logger = logging.getLogger(__name__)

STOP = "reply.stop"
LIVE = "reply.live"
STOPPED_WAITING = "Stopped before it started; nothing was sent to the model."
BATON_PATIENCE_SECONDS = 1.0
LISTEN_AGAIN_SECONDS = 0.2


class ReplySlots:
    """At most ``limit`` holders at once in this process; the others wait first come, first served."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()
        self.holding = 0
        self.peak = 0

    def acquire(self, *, limit: int, cancelled: Callable[[], bool], waiting: Callable[[int], None]) -> bool:
        """Wait for a slot; ``waiting(ahead)`` is told how many wait before this one whenever that changes.
        False when ``cancelled()`` became true first (then no slot is held)."""
        ticket = object()
        told: int | None = None
        with self._condition:
            self._queue.append(ticket)
        while True:
            with self._condition:
                ahead = self._queue.index(ticket)
                if ahead == 0 and self.holding < max(1, limit):
                    self._queue.popleft()
                    self.holding += 1
                    self.peak = max(self.peak, self.holding)
                    self._condition.notify_all()
                    return True
                if cancelled():
                    self._queue.remove(ticket)
                    self._condition.notify_all()
                    return False
                if ahead == told:
                    self._condition.wait()
                    continue
            told = ahead
            waiting(ahead)

    def release(self) -> None:
        with self._condition:
            self.holding -= 1
            self._condition.notify_all()

    def wake(self) -> None:
        """Let waiters look again whether they were cancelled."""
        with self._condition:
            self._condition.notify_all()

    @property
    def waiting(self) -> int:
        with self._condition:
            return len(self._queue)


SLOTS = ReplySlots()


class Baton:
    """One reply thread of the process at a time holds the baton to do its own work (storing, building,
    rendering); the others wait for it, first come, first served.

    Reply threads share one interpreter with the event loop that relays every reply's text to its tabs. When
    fifty replies start or end at once, each thread got its share of the interpreter and the relay only one
    share of fifty-one, so a streamed piece waited behind all of them. A holder sets the baton down while it
    waits on something else (the model's answer, a tool). ``patience`` bounds one holding, not the queue: when
    the holder has kept the baton that long without setting it down (it waits on something that is not its
    own work), the threads waiting go on without it, so nothing waits long on a holder that waits in turn, and
    a long queue of short holdings stays a queue.
    """

    def __init__(self, *, patience: float) -> None:
        self.patience = patience
        self._mutex = threading.Lock()
        self._queue: collections.deque[threading.Event] = collections.deque()
        self._taken = False
        self._since = 0.0  # when the current holding began
        self._local = threading.local()

    @property
    def held(self) -> bool:
        """Whether this thread holds the baton."""
        return bool(getattr(self._local, "held", False))

    def _take(self) -> None:
        with self._mutex:
            if not self._taken and not self._queue:
                self._taken, self._since = True, time.monotonic()
                self._local.held = True
                return
            turn = threading.Event()
            self._queue.append(turn)
        while True:
            with self._mutex:
                if turn.is_set():
                    self._local.held = True
                    return
                remaining = self._since + self.patience - time.monotonic()
                if remaining <= 0:  # the holder overstays: go on without the baton
                    self._queue.remove(turn)
                    self._local.held = False
                    return
            turn.wait(remaining)

    def _drop(self) -> None:
        if not self.held:
            return
        self._local.held = False
        with self._mutex:
            self._since = time.monotonic()
            if self._queue:
                self._queue.popleft().set()  # handed on: still taken, by the next in the queue
            else:
                self._taken = False

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold the baton (when it comes, or its holder overstays ``patience``) for a job's work."""
        self._local.working = True
        self._take()
        try:
            yield
        finally:
            self._drop()
            self._local.working = False

    @contextlib.contextmanager
    def set_down(self) -> Iterator[None]:
        """Let another thread hold the baton meanwhile; within a job's work, wait for it again after."""
        self._drop()
        try:
            yield
        finally:
            if getattr(self._local, "working", False):
                self._take()


BATON = Baton(patience=BATON_PATIENCE_SECONDS)


def waiting_label(ahead: int) -> str:
    """What the tabs of a session whose reply waits for a slot show."""
    if ahead:
        return f"Waiting: the server is busy with other replies ({ahead} waiting before this one)…"
    return "Waiting: the server is busy with other replies; this one is next…"


class Action:
    """Something a job does with the session's reply loop."""

    label: ClassVar[str] = "Working…"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        raise NotImplementedError


@dataclass(frozen=True)
class Send(Action):
    words: str
    label: ClassVar[str] = "Replying…"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.send(self.words)


@dataclass(frozen=True)
class Regenerate(Action):
    restore: bool = False
    label: ClassVar[str] = "Replying again…"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.regenerate(restore=self.restore)


@dataclass(frozen=True)
class Edit(Action):
    turn: int
    words: str
    restore: bool = False
    label: ClassVar[str] = "Replying…"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.edit(self.turn, self.words, restore=self.restore)


@dataclass(frozen=True)
class Flip(Action):
    turn: int
    label: ClassVar[str] = "Switching branch…"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.flip(self.turn)


@dataclass(frozen=True)
class Undo(Action):
    restore: bool = False
    label: ClassVar[str] = "Undoing…"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.undo(restore=self.restore)


@dataclass(frozen=True)
class Rewind(Action):
    turn: int
    restore: bool = False
    label: ClassVar[str] = "Rewinding…"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.rewind(self.turn, restore=self.restore)


@dataclass(frozen=True)
class Compact(Action):
    label: ClassVar[str] = "Compacting…"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.compact()


@dataclass(eq=False)
class Job:
    """One action running in its own thread for one session, its events relayed from ``event_loop``."""

    session_id: int
    action: Action
    layer: BaseChannelLayer
    event_loop: asyncio.AbstractEventLoop
    reply_to: str | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    free: threading.Event = field(default_factory=threading.Event)  # the session is free for the next action
    done: threading.Event = field(default_factory=threading.Event)  # and the last of the job's sends is put
    relay: Relay = field(init=False)
    waiting: str = ""  # the label while the job waits for a slot
    _listener: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.relay = Relay(session_id=self.session_id, layer=self.layer, loop=self.event_loop)

    async def begin(self) -> None:
        """Listen on the reply group, then start the thread (so a Stop sent at once is not missed)."""
        channel = await self.layer.new_channel()
        await self.layer.group_add(reply_group(self.session_id), channel)
        self._listener = self.event_loop.create_task(self._listen(channel))
        self.relay.start()
        _running.add(self)
        threading.Thread(target=self._main, name=f"cachet-reply-{self.session_id}", daemon=True).start()

    async def _listen(self, channel: str) -> None:
        lost = False
        try:
            while True:
                try:
                    message = await self.layer.receive(channel)
                except Exception:  # Redis went away a moment: listen again, or a Stop could no longer come
                    if not lost:
                        logger.warning("session %s: the reply's listener lost the channel layer", self.session_id)
                    lost = True
                    await asyncio.sleep(LISTEN_AGAIN_SECONDS)
                    with contextlib.suppress(Exception):
                        await self.layer.group_add(reply_group(self.session_id), channel)
                    continue
                lost = False
                if message.get("type") == STOP:
                    self.cancel.set()
                    SLOTS.wake()
                elif message.get("type") == LIVE and isinstance(message.get("reply_to"), str):
                    if self.waiting:
                        for text in pack([fragments.controls_put(running=True, label=self.waiting)]):
                            self.relay.put(_Send(text, message["reply_to"]))
                    self.relay.put(_Snapshot(message["reply_to"]))
        finally:
            with contextlib.suppress(Exception):
                await self.layer.group_discard(reply_group(self.session_id), channel)

    async def _end(self) -> None:
        await self.relay.finished()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        _running.discard(self)

    def _direct(self, *ops: Put) -> None:
        if self.reply_to:
            for text in pack(list(ops)):
                self.relay.put(_Send(text, self.reply_to))

    def _wait(self, ahead: int) -> None:
        self.waiting = waiting_label(ahead)
        for text in pack([fragments.controls_put(running=True, label=self.waiting)]):
            self.relay.put(_Send(text, None))

    def _main(self) -> None:
        if not SLOTS.acquire(limit=settings.CACHET_MAX_REPLIES, cancelled=self.cancel.is_set, waiting=self._wait):
            self._stopped_waiting()
            return
        self.waiting = ""
        try:
            with BATON.holding():
                self._run()
        finally:
            SLOTS.release()

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        """While the loop waits on something outside the process: others hold the baton, the relay sends; once
        the loop is back at its own work, the relay is hushed until it publishes again."""
        with BATON.set_down():
            yield
        self.relay.hush()

    def _stopped_waiting(self) -> None:
        try:
            if isinstance(self.action, Send | Edit):
                self._direct(fragments.composer_put(self.action.words))
            self._direct(fragments.notice_put(STOPPED_WAITING, level="info"))
        finally:
            self._finish()

    def _run(self) -> None:
        started_turn = False
        try:
            close_old_connections()
            session = session_by_id(session_id=self.session_id)
            publisher = Publisher(session, put=self.relay.put, reply_to=self.reply_to, label=self.action.label)
            publisher.group([fragments.controls_put(running=True, label=self.action.label)])
            for event in self.action.events(ReplyLoop(session, cancel=self.cancel, waiting=self._waiting)):
                started_turn = started_turn or isinstance(event, TurnStarted)
                publisher.publish(event)
        except ChatSession.DoesNotExist:
            pass
        except (StoreError, ModelError) as error:
            if isinstance(self.action, Send) and not started_turn:
                self._direct(fragments.composer_put(self.action.words))
            self._direct(fragments.notice_put(str(error), level="error"))
        except Exception as error:
            logger.exception("session %s: %s failed", self.session_id, type(self.action).__name__)
            if isinstance(self.action, Send) and not started_turn:
                self._direct(fragments.composer_put(self.action.words))
            self._direct(fragments.notice_put(person_message(error), level="error"))
        finally:
            connection.close()
            self._finish()

    def _finish(self) -> None:
        self.free.set()  # before the idle state goes out: a tab that acts on seeing it finds the session free
        try:
            for text in pack([fragments.controls_put(running=False)]):
                self.relay.put(_Send(text, None))
        except Exception:
            logger.exception("session %s: could not send the idle state", self.session_id)
        self.relay.close()
        self.done.set()
        self.event_loop.call_soon_threadsafe(lambda: self.event_loop.create_task(self._end()))


_running: set[Job] = set()


def busy(session_id: int) -> bool:
    """Whether a job of this process is running or waiting for the session (the lock says only the former)."""
    return any(job.session_id == session_id and not job.free.is_set() for job in list(_running))


async def start(session_id: int, action: Action, *, reply_to: str | None) -> Job:
    """Start ``action`` for the session in a new thread of this process."""
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured"
    job = Job(
        session_id=session_id, action=action, layer=layer, event_loop=asyncio.get_running_loop(), reply_to=reply_to
    )
    await job.begin()
    return job


async def stop(session_id: int) -> None:
    """Ask whichever process runs the session's reply to stop it."""
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(reply_group(session_id), {"type": STOP})


async def ask_live(session_id: int, reply_to: str) -> None:
    """Ask whichever process runs the session's reply to send ``reply_to`` what the step has streamed."""
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(reply_group(session_id), {"type": LIVE, "reply_to": reply_to})


def wait_idle(timeout: float = 30.0, *, cancel: bool = False) -> bool:
    """Wait for every job of this process to end (tests; shutting down); ``cancel`` stops them first."""
    jobs = list(_running)
    for job in jobs:
        if cancel:
            job.cancel.set()
    SLOTS.wake()
    return all(job.done.wait(timeout) for job in jobs)
