"""Runs a session's actions (send, regenerate, edit, flip, undo, rewind, compact) as jobs of the task queue
(Procrastinate, on Postgres) and publishes their events to every tab.

A tab's request becomes a queued job (:func:`start`); a worker process (``manage.py worker``) picks it up and
runs it (:func:`run`), its events relayed through the channel layer to the tabs of every web process. One job
of a session runs at a time (the queue's lock on the session), and at most one waits (its queueing lock). The
job belongs to no websocket: the reply goes on when the tab that asked for it closes. While it runs, the job
listens on the session's reply group, so a Stop or a request for the live text reaches it from any tab served
by any process. Whether a reply runs is not the job's to say: the session's reply lock, which the loop holds,
is the one truth of it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from channels.layers import BaseChannelLayer, get_channel_layer
from django.db import close_old_connections, connection
from procrastinate import exceptions as queue_errors
from procrastinate.contrib.django import app as queue_app

from chat.agent.echo import echo_lines
from chat.agent.events import ReplyEvent, TurnEnded, TurnStarted
from chat.agent.loop import ReplyLoop
from chat.agent.model import Cancel, ModelError
from chat.web import fragments
from chat.web.messages import Put, pack
from chat.web.publisher import (
    MESSAGE_TYPE,
    Publisher,
    Relay,
    _Direct,
    _Echo,
    _Send,
    _Snapshot,
    reply_group,
    session_group,
)
from chat.web.socket_store import store_call
from sessions_app.errors import StoreError, person_message
from sessions_app.models import ChatSession
from sessions_app.selectors.sessions import session_by_id

logger = logging.getLogger(__name__)

STOP = "reply.stop"
ENDED = "cachet.job_ended"  # to the terminal following a job, after its last echo
TURN = "cachet.job_turn"  # to the terminal following a job: the turn it started
LIVE = "reply.live"
STOPPED_WAITING = "Stopped before it started; nothing was sent to the model."
QUEUED = "Queued: waiting for a worker…"
QUEUE = "replies"
BATON_PATIENCE_SECONDS = 1.0
LISTEN_AGAIN_SECONDS = 0.2


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


class Action:
    """Something a job does with the session's reply loop."""

    label: ClassVar[str] = "Working…"
    kind: ClassVar[str] = ""

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        raise NotImplementedError

    def payload(self) -> dict[str, Any]:
        """The action as the queued job's arguments carry it (JSON)."""
        return {"kind": self.kind, **dataclasses.asdict(self)}  # type: ignore[call-overload]


@dataclass(frozen=True)
class Send(Action):
    words: str
    label: ClassVar[str] = "Replying…"
    kind: ClassVar[str] = "send"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.send(self.words)


@dataclass(frozen=True)
class Regenerate(Action):
    restore: bool = False
    label: ClassVar[str] = "Replying again…"
    kind: ClassVar[str] = "regenerate"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.regenerate(restore=self.restore)


@dataclass(frozen=True)
class Edit(Action):
    turn: int
    words: str
    restore: bool = False
    label: ClassVar[str] = "Replying…"
    kind: ClassVar[str] = "edit"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.edit(self.turn, self.words, restore=self.restore)


@dataclass(frozen=True)
class Flip(Action):
    turn: int
    label: ClassVar[str] = "Switching branch…"
    kind: ClassVar[str] = "flip"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.flip(self.turn)


@dataclass(frozen=True)
class Undo(Action):
    restore: bool = False
    label: ClassVar[str] = "Undoing…"
    kind: ClassVar[str] = "undo"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.undo(restore=self.restore)


@dataclass(frozen=True)
class Rewind(Action):
    turn: int
    restore: bool = False
    label: ClassVar[str] = "Rewinding…"
    kind: ClassVar[str] = "rewind"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.rewind(self.turn, restore=self.restore)


@dataclass(frozen=True)
class Compact(Action):
    label: ClassVar[str] = "Compacting…"
    kind: ClassVar[str] = "compact"

    def events(self, loop: ReplyLoop) -> Iterator[ReplyEvent]:
        return loop.compact()


ACTIONS: dict[str, type[Action]] = {
    action.kind: action for action in (Send, Regenerate, Edit, Flip, Undo, Rewind, Compact)
}


def action_from(payload: dict[str, Any]) -> Action:
    """The action a queued job's arguments carry (:meth:`Action.payload`)."""
    fields = dict(payload)
    return ACTIONS[str(fields.pop("kind"))](**fields)


@dataclass(eq=False)
class Job:
    """One action running in its own thread for one session, its events relayed from ``event_loop``."""

    session_id: int
    action: Action
    layer: BaseChannelLayer
    event_loop: asyncio.AbstractEventLoop
    reply_to: str | None = None
    cancel: Cancel = field(default_factory=Cancel)  # its set() ends a read of the model's answer at once
    free: threading.Event = field(default_factory=threading.Event)  # the session is free for the next action
    done: threading.Event = field(default_factory=threading.Event)  # and the last of the job's sends is put
    relay: Relay = field(init=False)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # set on ``event_loop`` once everything is sent
    echo_to: str | None = None  # the channel of a terminal following the job (``ask``): its lines, then its end
    failure: str = ""  # why the action failed, where it did
    turn_id: int | None = None  # the last turn the job ended
    reply_loop: ReplyLoop | None = None
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
                elif message.get("type") == LIVE and isinstance(message.get("reply_to"), str):
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
        self.ended.set()

    def _direct(self, *ops: Put) -> None:
        if self.reply_to:
            for text in pack(list(ops)):
                self.relay.put(_Send(text, self.reply_to))

    def _main(self) -> None:
        with BATON.holding():
            self._run()

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        """While the loop waits on something outside the process: others hold the baton, the relay sends; once
        the loop is back at its own work, the relay is hushed until it publishes again."""
        with BATON.set_down():
            yield
        self.relay.hush()

    def _run(self) -> None:
        started_turn = False
        try:
            close_old_connections()
            session = session_by_id(session_id=self.session_id)
            publisher = Publisher(session, put=self.relay.put, reply_to=self.reply_to, label=self.action.label)
            publisher.group([fragments.controls_put(running=True, label=self.action.label)])
            self.reply_loop = ReplyLoop(session, cancel=self.cancel, waiting=self._waiting)
            for event in self.action.events(self.reply_loop):
                publisher.publish(event)
                if isinstance(event, TurnStarted):
                    started_turn = True
                    if self.echo_to is not None:
                        self.relay.put(_Direct({"type": TURN, "turn_id": event.turn.pk}, self.echo_to))
                if isinstance(event, TurnEnded):
                    self.turn_id = event.turn.pk
                if self.echo_to is not None and (lines := echo_lines(event)):
                    self.relay.put(_Echo(lines, self.echo_to))
        except ChatSession.DoesNotExist:
            self.failure = "The session no longer exists."
        except (StoreError, ModelError) as error:
            self.failure = str(error)
            if isinstance(self.action, Send) and not started_turn:
                self._direct(fragments.composer_put(self.action.words))
            self._direct(fragments.notice_put(str(error), level="error"))
        except Exception as error:
            logger.exception("session %s: %s failed", self.session_id, type(self.action).__name__)
            self.failure = person_message(error)
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
        if self.echo_to is not None:
            self.relay.put(_Direct(dict(self.ended_message()), self.echo_to))
        self.relay.close()
        self.done.set()
        self.event_loop.call_soon_threadsafe(lambda: self.event_loop.create_task(self._end()))

    def ended_message(self) -> JobEnded:
        """What the terminal following the job is told once it has ended."""
        requests = self.reply_loop.requests if self.reply_loop is not None else []
        return {
            "type": ENDED,
            "failure": self.failure,
            "request_ids": [request.pk for request in requests],
            "turn_id": self.turn_id,
        }


class JobEnded(TypedDict):
    """The last message a terminal following a job gets from it."""

    type: str
    failure: str
    request_ids: list[int]
    turn_id: int | None


_running: set[Job] = set()


def session_key(session_id: int) -> str:
    """The queue's lock (and queueing lock) of a session's jobs: one runs at a time, one waits."""
    return f"cachet-session-{session_id}"


def _queued(session_id: int, *statuses: str) -> Any:
    from procrastinate.contrib.django.models import ProcrastinateJob

    return ProcrastinateJob.objects.filter(lock=session_key(session_id), status__in=statuses)


def busy(session_id: int) -> bool:
    """Whether a job of the session waits in the queue or runs (the reply lock says only the latter)."""
    return bool(_queued(session_id, "todo", "doing").exists())


async def start(
    session_id: int, action: Action, *, reply_to: str | None, echo_to: str | None = None, queue: str = QUEUE
) -> int | None:
    """Queue ``action`` for the session, every tab of it shown the reply as queued; the job's id, or ``None`` where
    a job of the session already waits. ``echo_to``: a terminal's channel to send the job's lines to."""
    from chat.tasks import session_action

    layer = get_channel_layer()
    if layer is not None:
        for text in pack([fragments.controls_put(running=True, label=QUEUED)]):
            await layer.group_send(session_group(session_id), {"type": MESSAGE_TYPE, "text": text})
    key = session_key(session_id)
    try:
        return await session_action.configure(lock=key, queueing_lock=key, queue=queue).defer_async(
            session_id=session_id, action=action.payload(), reply_to=reply_to, echo_to=echo_to
        )
    except queue_errors.AlreadyEnqueued:
        return None


async def run(session_id: int, action: Action, *, reply_to: str | None, echo_to: str | None = None) -> None:
    """Run a queued job in this (worker) process: its thread does the work, this loop relays its events. A
    cancelled run (the queue aborts it, the worker stops) stops the reply and waits until it has ended."""
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured"
    job = Job(
        session_id=session_id,
        action=action,
        layer=layer,
        event_loop=asyncio.get_running_loop(),
        reply_to=reply_to,
        echo_to=echo_to,
    )
    await job.begin()
    try:
        await asyncio.shield(job.ended.wait())
    except asyncio.CancelledError:
        job.cancel.set()
        await job.ended.wait()
        raise


def _waiting_jobs(session_id: int) -> list[tuple[int, dict[str, Any]]]:
    return [(job.pk, dict(job.args)) for job in _queued(session_id, "todo")]


async def stop(session_id: int) -> None:
    """Stop the session's reply wherever it runs, and take out a job of it that still waits in the queue."""
    layer = get_channel_layer()
    if layer is None:
        return
    for job_id, args in await store_call(_waiting_jobs)(session_id):
        if not await queue_app.job_manager.cancel_job_by_id_async(job_id, delete_job=True):
            continue  # a worker took it meanwhile: the Stop below reaches it
        reply_to = args.get("reply_to")
        if isinstance(reply_to, str):  # the tab that asked gets its words back first
            direct: list[Put] = [fragments.notice_put(STOPPED_WAITING, level="info")]
            words = args.get("action", {}).get("words")
            if isinstance(words, str):
                direct.insert(0, fragments.composer_put(words))
            for text in pack(direct):
                await layer.send(reply_to, {"type": MESSAGE_TYPE, "text": text})
        for text in pack([fragments.controls_put(running=False)]):
            await layer.group_send(session_group(session_id), {"type": MESSAGE_TYPE, "text": text})
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
    return all(job.done.wait(timeout) for job in jobs)
