"""Runs a session's reply loop in a background thread of the web process and streams it to every tab.

One job at a time per session in this process (``ReplyInProgress`` otherwise); across processes the
loop's Postgres advisory lock (``chat.agent.loop.reply_lock``) refuses the second one the same way. A job is a
send, a regenerate, an undo, a rewind or a compaction; it does not belong to any websocket, so the reply
goes on when the tab that asked for it closes.

Progress goes to the channel-layer group ``session-<id>`` as ready HTML (``chat.web.fragments``): every event
carries the job's id and a sequence number. The job also keeps the text the current step has streamed so
far; a tab that (re)connects takes a :class:`Snapshot` of it and renders the stored turns, and drops the
events the snapshot already covers (see ``chat.web.consumers``).

The events are sent on the web server's event loop (the one the consumer that started the job runs on)
with ``asyncio.run_coroutine_threadsafe``: the in-memory channel layer's queues belong to that loop, and a
send from a fresh loop in this thread (what a bare ``async_to_sync`` does here) would not wake its readers.
Without a running loop (a management command, a test) it falls back to ``async_to_sync``.

Stop sets the job's event at once (the model client checks it every few hundredths of a second) and the
turn's ``cancel_requested`` flag in the database, which the loop of any process watches.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import close_old_connections, connection

from chat.agent.loop import ReplyEvents, ReplyLoop, reply_lock, reply_running
from chat.agent.model_client import ModelError, ToolCall
from chat.web import fragments
from chat.web.display import LiveText
from sessions_app.errors import ReplyInProgress, StoreError
from sessions_app.models import ChatSession, ModelRequest, RequestKind, Result, Step, Turn, TurnStatus
from sessions_app.services.turns import turn_request_cancel
from sessions_app.services.undo import TakenBack

logger = logging.getLogger(__name__)

MESSAGE_TYPE = "cachet.html"
SEND_TIMEOUT = 10.0
FINISHING_WAIT = 5.0


def group_name(session_id: int) -> str:
    return f"session-{session_id}"


@dataclass(frozen=True)
class Snapshot:
    """What a job has streamed so far, as of event ``seq``."""

    job_id: str
    seq: int
    label: str
    turn_number: int | None
    live: LiveText


class Action:
    """Something a job does with the session's reply loop."""

    label: ClassVar[str] = "Working…"

    def run(self, loop: ReplyLoop, job: Job) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Send(Action):
    words: str
    label: ClassVar[str] = "Replying…"

    def run(self, loop: ReplyLoop, job: Job) -> None:
        try:
            loop.send(self.words)
        except StoreError:
            if job.turn_number is None:
                job.direct(fragments.composer(self.words))
            raise


@dataclass(frozen=True)
class Regenerate(Action):
    restore: bool = False
    label: ClassVar[str] = "Replying again…"

    def run(self, loop: ReplyLoop, job: Job) -> None:
        job.rerender_on_start = True
        _, conflicts = loop.regenerate(restore=self.restore)
        if conflicts:
            job.direct(fragments.notice("Some files were not restored:", level="warning", lines=conflicts))


@dataclass(frozen=True)
class Undo(Action):
    restore: bool = False
    label: ClassVar[str] = "Undoing…"

    def run(self, loop: ReplyLoop, job: Job) -> None:
        taken, conflicts = loop.undo(restore=self.restore)
        job.taken_back(taken, conflicts, restore=self.restore)


@dataclass(frozen=True)
class Rewind(Action):
    turn: int
    restore: bool = False
    label: ClassVar[str] = "Rewinding…"

    def run(self, loop: ReplyLoop, job: Job) -> None:
        taken, conflicts = loop.rewind(self.turn, restore=self.restore)
        job.taken_back(taken, conflicts, restore=self.restore)


@dataclass(frozen=True)
class Compact(Action):
    label: ClassVar[str] = "Compacting…"

    def run(self, loop: ReplyLoop, job: Job) -> None:
        loop.compact()
        job.group(fragments.transcript_html(loop.session))
        job.direct(fragments.notice("Compacted: the model now starts from the summary.", level="info"))


@dataclass
class Job:
    """One action running in its own thread for one session."""

    session_id: int
    action: Action
    reply_to: str | None = None
    event_loop: asyncio.AbstractEventLoop | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    cancel: threading.Event = field(default_factory=threading.Event)
    finishing: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    turn_number: int | None = None
    rerender_on_start: bool = False
    _live: LiveText = field(default_factory=LiveText)
    _seq: int = 0
    _label: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None

    # --- state shared with the consumers -----------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._lock:
            live = replace(self._live, calls=list(self._live.calls))
            return Snapshot(self.id, self._seq, self._label or self.action.label, self.turn_number, live)

    def _next(self, update: Callable[[], None] | None = None) -> int:
        """The next event's number, after applying ``update`` to the state under the same lock."""
        with self._lock:
            if update is not None:
                update()
            self._seq += 1
            return self._seq

    # --- sending ----------------------------------------------------------------------------------------

    def _deliver(self, make: Callable[[Any], Awaitable[None]]) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        loop = self.event_loop
        try:
            if loop is not None and loop.is_running():
                asyncio.run_coroutine_threadsafe(_awaited(make(layer)), loop).result(timeout=SEND_TIMEOUT)
            else:
                async_to_sync(_awaited)(make(layer))
        except Exception:
            logger.warning("session %s: could not send an update to the page", self.session_id, exc_info=True)

    def group(self, html: str, seq: int | None = None) -> None:
        """Send ``html`` to every tab of the session."""
        number = self._next() if seq is None else seq
        message = {"type": MESSAGE_TYPE, "html": html, "job": self.id, "seq": number}
        self._deliver(lambda layer: layer.group_send(group_name(self.session_id), message))

    def direct(self, html: str) -> None:
        """Send ``html`` to the tab that asked for this job only (a notice, the words of an undone turn)."""
        reply_to = self.reply_to
        if reply_to:
            message = {"type": MESSAGE_TYPE, "html": html, "job": "", "seq": 0}
            self._deliver(lambda layer: layer.send(reply_to, message))

    # --- the loop's events --------------------------------------------------------------------------------

    def events(self) -> ReplyEvents:
        return ReplyEvents(
            turn_started=self._turn_started,
            request_started=self._request_started,
            request_finished=self._request_finished,
            text=self._text,
            reasoning=self._reasoning,
            tool_call=self._tool_call,
            step_finished=self._step_finished,
            result=self._result,
            turn_finished=self._turn_finished,
        )

    def _turn_started(self, turn: Turn) -> None:
        def update() -> None:
            self.turn_number = turn.number
            self._live = LiveText()
            self._label = self.action.label

        seq = self._next(update)
        if self.rerender_on_start:
            session = ChatSession.objects.get(pk=self.session_id)
            html = fragments.transcript_html(session) + fragments.title(self.session_id)
        else:
            html = fragments.turn_appended(turn)
        self.group(html + fragments.controls(running=True, label=self.action.label), seq)

    def _request_started(self, request: ModelRequest) -> None:
        if request.kind == RequestKind.COMPACTION:
            self.rerender_on_start = True

            def update() -> None:
                self._label = Compact.label

            self.group(fragments.controls(running=True, label=Compact.label), self._next(update))

    def _request_finished(self, request: ModelRequest) -> None:
        self.group(fragments.chart_replaced(self.session_id))

    def _text(self, delta: str) -> None:
        number = self.turn_number
        if number is None:
            return  # a compaction's summary streams too; it is not shown as it comes

        def update() -> None:
            self._live.text += delta

        self.group(fragments.text_delta(number, delta), self._next(update))

    def _reasoning(self, delta: str) -> None:
        number = self.turn_number
        if number is None:
            return

        def update() -> None:
            self._live.reasoning += delta

        self.group(fragments.reasoning_delta(number, delta), self._next(update))

    def _tool_call(self, call: ToolCall) -> None:
        number = self.turn_number
        if number is None:
            return

        def update() -> None:
            self._live.calls.append(call.name)

        self.group(fragments.calling(number, call.name), self._next(update))

    def _step_finished(self, step: Step) -> None:
        def update() -> None:
            self._live = LiveText()

        seq = self._next(update)
        self.group(fragments.steps_replaced(step.turn), seq)

    def _result(self, result: Result) -> None:
        self.group(fragments.result_row(result))

    def _turn_finished(self, turn: Turn) -> None:
        def update() -> None:
            self._live = LiveText()

        seq = self._next(update)
        self.group(fragments.turn_replaced(turn), seq)

    # --- undo and rewind ----------------------------------------------------------------------------------

    def taken_back(self, taken: TakenBack, conflicts: list[str], *, restore: bool) -> None:
        """Show the transcript without the taken-back turns; the person gets the first one's words back."""
        session = ChatSession.objects.get(pk=self.session_id)
        self.group(fragments.transcript_html(session))
        first = taken.turns[-1]
        self.direct(fragments.composer(first.words))
        numbers = ", ".join(str(turn.number) for turn in reversed(taken.turns))
        text = f"Took back turn{'s' if len(taken.turns) > 1 else ''} {numbers}."
        if restore and taken.edits:
            text += " The files they changed were restored" + (" except:" if conflicts else ".")
        self.direct(fragments.notice(text, level="warning" if conflicts else "info", lines=conflicts))

    # --- the thread ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self._main, name=f"cachet-reply-{self.session_id}", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            close_old_connections()
            self.group(fragments.controls(running=True, label=self.action.label))
            session = ChatSession.objects.select_related("workspace", "endpoint").get(pk=self.session_id)
            self.action.run(ReplyLoop(session, events=self.events(), cancel=self.cancel), self)
        except ChatSession.DoesNotExist:
            pass
        except (StoreError, ModelError) as error:
            self.direct(fragments.notice(str(error), level="error"))
        except Exception as error:
            logger.exception("session %s: %s failed", self.session_id, type(self.action).__name__)
            self.direct(fragments.notice(f"Cachet failed: {error}", level="error"))
        finally:
            self.finishing.set()
            try:
                self.group(fragments.controls(running=False))
            except Exception:
                logger.exception("session %s: could not send the idle state", self.session_id)
            finally:
                with _registry_lock:
                    if _jobs.get(self.session_id) is self:
                        del _jobs[self.session_id]
                connection.close()
                self.done.set()


async def _awaited(awaitable: Awaitable[None]) -> None:
    await awaitable


_registry_lock = threading.Lock()
_jobs: dict[int, Job] = {}


def start(
    session_id: int,
    action: Action,
    *,
    reply_to: str | None = None,
    event_loop: asyncio.AbstractEventLoop | None = None,
) -> Job:
    """Start ``action`` for the session in a new thread; ``ReplyInProgress`` when a job of it is running."""
    with _registry_lock:
        existing = _jobs.get(session_id)
    if existing is not None and existing.finishing.is_set():
        existing.done.wait(FINISHING_WAIT)
    with _registry_lock:
        if session_id in _jobs:
            raise ReplyInProgress()
        job = Job(session_id=session_id, action=action, reply_to=reply_to, event_loop=event_loop)
        _jobs[session_id] = job
    job.start()
    return job


def current(session_id: int) -> Job | None:
    with _registry_lock:
        return _jobs.get(session_id)


def snapshot(session_id: int) -> Snapshot | None:
    job = current(session_id)
    return job.snapshot() if job is not None and not job.finishing.is_set() else None


def stop(session_id: int) -> bool:
    """Stop the session's reply: this process's job at once, any process's through the turn's flag."""
    job = current(session_id)
    if job is not None:
        job.cancel.set()
    turn = Turn.objects.filter(session_id=session_id, status=TurnStatus.OPEN).order_by("-number").first()
    if turn is not None:
        turn_request_cancel(turn=turn)
    return job is not None or turn is not None


def wait_idle(timeout: float = 30.0, *, cancel: bool = False) -> bool:
    """Wait for every job of this process to end (tests; shutting down); ``cancel`` stops them first."""
    with _registry_lock:
        jobs = list(_jobs.values())
    for job in jobs:
        if cancel:
            job.cancel.set()
    return all(job.done.wait(timeout) for job in jobs)


@dataclass(frozen=True)
class PageState:
    """Whether a reply (or undo, compaction…) is running for a session, and what it streamed so far."""

    running: bool
    label: str = ""
    snapshot: Snapshot | None = None

    @property
    def live(self) -> LiveText | None:
        return self.snapshot.live if self.snapshot is not None else None


def page_state(session: ChatSession) -> PageState:
    """The state a page shows. An open turn nobody is replying to (its server stopped) is marked
    interrupted here, so the page shows its error and a retry instead of waiting forever."""
    taken = snapshot(session.pk)
    if taken is not None:
        return PageState(True, taken.label, taken)
    if current(session.pk) is not None:
        return PageState(False)
    if not Turn.objects.filter(session=session, status=TurnStatus.OPEN).exists():
        return PageState(False)
    if reply_running(session):
        return PageState(True, Send.label)
    try:
        with reply_lock(session):
            pass
    except ReplyInProgress:
        return PageState(True, Send.label)
    return PageState(Turn.objects.filter(session=session, status=TurnStatus.OPEN).exists(), Send.label)
