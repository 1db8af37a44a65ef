"""A session's action run as a job of the task queue, in a worker: the reply loop's events published as they come.

The job runs on the worker's event loop, one of the queue's concurrent jobs, inside a ``ThreadSensitiveContext``:
its store calls share one thread and one database connection (the one holding the session's reply lock), and no
other job's. While it runs, it listens on the session's reply group, so a Stop or a tab's request for the live
text reaches it from any web process. Streamed text is published at most every ``TEXT_EVENT_SECONDS`` (a piece
after a quiet moment at once): the pieces that come in between go on together, as one event, and anything else
the reply publishes first sends the text that waits. Its cache checks are queued as a job of their own, one for
the action's requests (``CHECKS_QUEUE``): the session is free for the next message as soon as the reply has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from channels.layers import BaseChannelLayer, get_channel_layer
from django.db import close_old_connections

from chat import wire
from chat.actions import Action, Send
from chat.agent.budget import RequestTooLarge
from chat.agent.cache_check import CheckSpec
from chat.agent.events import (
    Compacted,
    Notice,
    ReasoningDelta,
    ReplyEvent,
    StepStored,
    TextDelta,
    ToolCalled,
    TurnEnded,
    TurnsTakenBack,
    TurnStarted,
)
from chat.agent.loop import ReplyLoop, close_connection, store
from chat.agent.model import Cancel, ModelError
from chat.worker.publish import publish
from sessions_app.errors import StoreError, person_message
from sessions_app.models import ChatSession
from sessions_app.selectors.sessions import session_by_id

logger = logging.getLogger(__name__)

COMPACTED = "Compacted: the model now starts from the summary."
LISTEN_AGAIN_SECONDS = 0.5  # after the channel layer failed a receive: wait this long before listening again
MERGED_LIMIT = 16 * 1024  # characters of streamed text merged into one event at most
# A reply's streamed text goes out at most this often (a piece after a quiet moment at once); the pieces that come
# in between go on together as one event. 50 pieces a second per reply were 50 events through the channel layer,
# each web process and each tab's socket: at 50 replies on two cores they fell behind (relay p99 0.5-0.9 s).
TEXT_EVENT_SECONDS = 0.05

CheckQueue = Callable[[list[CheckSpec]], Awaitable[None]]


def utf16_length(text: str) -> int:
    """The length of ``text`` as a browser counts it (UTF-16 code units)."""
    if text.isascii():  # most pieces: known without encoding (CPython keeps whether a str is ASCII)
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


@dataclass
class _Offsets:
    """How much of the step streaming now each tab has been sent (in UTF-16 units), for its text and reasoning."""

    turn: int = 0
    step: int = 0
    text: int = 0
    reasoning: int = 0

    def at(self, turn: int, step: int, *, reasoning: bool, text: str) -> int:
        """The offset of ``text``, a piece of step ``step`` of turn ``turn``; counts it as sent."""
        if (turn, step) != (self.turn, self.step):
            self.turn, self.step, self.text, self.reasoning = turn, step, 0, 0
        length = utf16_length(text)
        if reasoning:
            self.reasoning += length
            return self.reasoning - length
        self.text += length
        return self.text - length


@dataclass
class _Delta:
    """Streamed text of one step not yet published: ``text`` from offset ``at`` (UTF-16 units)."""

    turn: int
    step: int
    reasoning: bool
    at: int
    text: str

    def message(self, session_id: int) -> dict[str, Any]:
        return wire.delta_message(
            session_id, turn=self.turn, step=self.step, text=self.text, at=self.at, reasoning=self.reasoning
        )

    def follows(self, other: _Delta) -> bool:
        """Whether ``other`` comes right after this one's text, in the same step and kind."""
        return (
            (other.turn, other.step, other.reasoning) == (self.turn, self.step, self.reasoning)
            and other.at == self.at + utf16_length(self.text)
            and len(self.text) + len(other.text) <= MERGED_LIMIT
        )


@dataclass(frozen=True)
class _Post:
    """An event to publish: to the session's group, or ``to`` one channel."""

    message: dict[str, Any]
    to: str | None = None


@dataclass(eq=False)
class Job:
    """One action of one session, run by this worker with job id ``job_id``; ``reply_to`` is the channel of the
    tab or terminal that asked (its notices go there)."""

    session_id: int
    job_id: int
    action: Action
    reply_to: str | None
    check_later: CheckQueue | None = None
    cancel: Cancel = field(default_factory=Cancel)
    failure: str = ""
    turn_id: int | None = None  # the last turn the job ended
    reply_loop: ReplyLoop | None = None
    _offsets: _Offsets = field(default_factory=_Offsets)
    _calls: list[str] = field(default_factory=list)  # the tools the step streaming now began to call
    _started_turn: bool = False
    _outbox: list[_Delta | _Post] = field(default_factory=list)  # what waits to be published, in order
    _sending: asyncio.Task[None] | None = None  # publishes the outbox, resting after a text event
    _woken: asyncio.Event = field(default_factory=asyncio.Event)  # something other than text was posted

    async def run(self) -> None:
        """Run the action, listening for Stop and live-text requests meanwhile; cancelled (the queue aborts the
        job, the worker stops): the reply stops, and its end is stored and published before the cancel goes on."""
        layer = get_channel_layer()
        assert layer is not None, "CHANNEL_LAYERS is configured"
        channel = await _listening(layer, self.session_id)
        listener = asyncio.create_task(self._listen(layer, channel), name=f"cachet-listen-{self.session_id}")
        try:
            self._post(wire.job_message(self.session_id, state="running", label=self.action.label, job=self.job_id))
            work = asyncio.ensure_future(self._work())
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                self.cancel.set()
                await work
                raise
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            with contextlib.suppress(Exception):
                await layer.group_discard(wire.reply_group(self.session_id), channel)
            self._post(wire.job_message(self.session_id, state="idle", job=self.job_id))
            self._post(self.ended_message())
            await self._published()

    async def _work(self) -> None:
        try:
            await store(close_old_connections)
            session = await store(session_by_id, session_id=self.session_id)
            self.reply_loop = ReplyLoop(session, cancel=self.cancel, checks=self.check_later)
            async with contextlib.aclosing(self.action.events(self.reply_loop)) as events:
                async for event in events:
                    await self._event(event)
        except ChatSession.DoesNotExist:
            self.failure = "The session no longer exists."
        except (StoreError, ModelError, RequestTooLarge) as error:
            await self._failed(str(error))
        except Exception as error:
            logger.exception("session %s: %s failed", self.session_id, type(self.action).__name__)
            await self._failed(person_message(error))
        finally:
            with contextlib.suppress(Exception):
                await store(close_connection)

    async def _failed(self, failure: str) -> None:
        self.failure = failure
        if isinstance(self.action, Send) and not self._started_turn:  # the words were never stored: back to the box
            self._direct(wire.words_back_message(self.session_id, self.action.words))
        self._direct(wire.notice_message(self.session_id, text=failure, level="error"))

    def _post(self, message: dict[str, Any], *, to: str | None = None) -> None:
        """Publish ``message`` (to the session's group, or ``to``) after what waits, without waiting for it: the
        reply goes on meanwhile, its next request on its way while the layer takes the events of the last."""
        self._outbox.append(_Post(message, to))
        self._woken.set()
        self._send_soon()

    def _direct(self, message: dict[str, Any]) -> None:
        if self.reply_to is not None:
            self._post(message, to=self.reply_to)

    def _stream(self, delta: _Delta) -> None:
        """Publish ``delta`` now, or with the text that waits for the next text event (``TEXT_EVENT_SECONDS``)."""
        last = self._outbox[-1] if self._outbox else None
        if isinstance(last, _Delta) and last.follows(delta):
            last.text += delta.text
        else:
            self._outbox.append(delta)
        self._send_soon()

    def _send_soon(self) -> None:
        if self._sending is None or self._sending.done():
            self._sending = asyncio.ensure_future(self._send())

    async def _send(self) -> None:
        """Publish the outbox in order; after a text event, rest until ``TEXT_EVENT_SECONDS`` have passed or
        something other than text is posted, so that the text that comes meanwhile goes on as one event."""
        while self._outbox:
            item = self._outbox.pop(0)
            if isinstance(item, _Post):
                await publish(item.message, to=item.to)
                continue
            await publish(item.message(self.session_id))
            if all(isinstance(waiting, _Delta) for waiting in self._outbox):
                self._woken.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TEXT_EVENT_SECONDS):  # no task a rest, as wait_for makes
                        await self._woken.wait()

    async def _published(self) -> None:
        """Until everything posted is published."""
        self._woken.set()
        while self._sending is not None and not self._sending.done():
            await asyncio.shield(self._sending)

    async def _event(self, event: ReplyEvent) -> None:
        """Publish ``event``: to every tab, and what only the asker is told to the asker."""
        sid = self.session_id
        match event:
            case (
                TextDelta(turn_number=turn, step=step, text=text)
                | ReasoningDelta(turn_number=turn, step=step, text=text)
            ):
                if not turn:
                    return  # a compaction's summary streams too; it is not shown as it comes
                reasoning = isinstance(event, ReasoningDelta)
                at = self._offsets.at(turn, step, reasoning=reasoning, text=text)
                self._stream(_Delta(turn, step, reasoning, at, text))
                return
            case ToolCalled(turn_number=turn, step=step, name=name):
                if turn:
                    self._offsets.at(turn, step, reasoning=False, text="")
                    self._calls.append(name)
                    self._post(wire.event_message(sid, event))
                return
            case StepStored():
                self._calls = []
            case TurnStarted():
                self._started_turn = True
            case TurnEnded(turn=turn):
                self._started_turn = True
                self.turn_id = turn.pk
            case Notice(text=text, level=level, lines=lines):
                self._direct(wire.notice_message(sid, text=text, level=level, lines=list(lines)))
                return
            case TurnsTakenBack():
                self._post(wire.event_message(sid, event))
                if event.said and event.turns:
                    self._direct(wire.words_back_message(sid, event.turns[-1].words))
                text = wire.taken_back_notice(event)
                if text:
                    level = "warning" if event.conflicts else "info"
                    self._direct(wire.notice_message(sid, text=text, level=level, lines=list(event.conflicts)))
                return
            case Compacted():
                self._post(wire.event_message(sid, event))
                self._direct(wire.notice_message(sid, text=COMPACTED, level="info"))
                return
        self._post(wire.event_message(sid, event))

    async def _listen(self, layer: BaseChannelLayer, channel: str) -> None:
        lost = False
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # the channel layer went away a moment: listen again, or a Stop could not come
                lost = True
                await asyncio.sleep(LISTEN_AGAIN_SECONDS)
                with contextlib.suppress(Exception):
                    await layer.group_add(wire.reply_group(self.session_id), channel)
                continue
            if lost:
                lost = False
            if message.get("type") == wire.STOP:
                self.cancel.set()
            elif message.get("type") == wire.LIVE and isinstance(message.get("reply_to"), str):
                await self._live(message["reply_to"])

    async def _live(self, reply_to: str) -> None:
        """Send ``reply_to`` the step streaming now as streamed so far."""
        streamed = self.reply_loop.streamed if self.reply_loop is not None else None
        if streamed is None:
            return
        turn, step, so_far = streamed
        message = wire.live_message(
            self.session_id, turn=turn, step=step, text=so_far.text, reasoning=so_far.reasoning, calls=list(self._calls)
        )
        await publish(message, to=reply_to)

    def ended_message(self) -> dict[str, Any]:
        """How the job ended, for whoever follows it."""
        requests = self.reply_loop.requests if self.reply_loop is not None else []
        return wire.job_ended_message(
            self.session_id,
            job=self.job_id,
            failure=self.failure,
            requests=[request.pk for request in requests],
            turn=self.turn_id,
        )


async def _listening(layer: BaseChannelLayer, session_id: int) -> str:
    """A channel of this job's own in the session's reply group (where the layer is away: a channel all the
    same, which joins the group once the layer is back)."""
    channel: str = await layer.new_channel()
    with contextlib.suppress(Exception):
        await layer.group_add(wire.reply_group(session_id), channel)
    return channel


async def run(
    session_id: int, job_id: int, action: Action, *, reply_to: str | None, check_later: CheckQueue | None
) -> None:
    """Run a queued job in this worker, its store calls on a thread of its own for the job's length."""
    async with ThreadSensitiveContext():
        job = Job(session_id=session_id, job_id=job_id, action=action, reply_to=reply_to, check_later=check_later)
        await job.run()
