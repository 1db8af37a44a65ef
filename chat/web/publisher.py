"""The one publisher of a reply's events: each event of ``chat.agent.events`` becomes page changes for every
tab of the session (or a notice for the tab that asked), rendered here, in the reply's thread.

Streamed text does not go out piece by piece: :class:`Relay`, on the web server's event loop, gathers the
deltas of about ``COALESCE_SECONDS`` into one message, keeps the text of the step being streamed for tabs
that connect late, and sends everything in the order it was published. At most every ``RENDER_SECONDS`` it
also sends the step's markdown rendered so far (``chat.web.live_markdown``: finished blocks once, the tail
again), which the page shows in place of the raw text until the stored step replaces both.

Between the model's answer and the next request the reply's thread has work of its own (storing the step, running
a tool, building the request), and on two cores the event loop sending what it gathered would take the interpreter
from it: the thread :meth:`Relay.hush`-es the relay when it comes back from a wait, and the relay holds its
sends until the thread publishes something again (the next request is then on its way, or the turn is over) or
``HUSH_SECONDS`` pass.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from channels.layers import BaseChannelLayer

from chat.agent.echo import EchoLine
from chat.agent.events import (
    BranchFlipped,
    CacheChecked,
    Compacted,
    Notice,
    ReasoningDelta,
    ReplyEvent,
    RequestFinished,
    RequestStarted,
    ResultStored,
    StepStored,
    TextDelta,
    ToolCalled,
    TurnEnded,
    TurnsTakenBack,
    TurnStarted,
    taken_back_text,
)
from chat.web import chart, fragments, live_markdown
from chat.web.display import (
    CompactionView,
    ended_turn,
    row_for_result,
    single_turn,
    started_turn,
    step_view,
    transcript_page,
)
from chat.web.messages import Op, live_messages, pack, utf16_length
from sessions_app.models import ChatSession, RequestKind, Result, Step
from sessions_app.selectors.requests import finished_requests, last_time_to_first_token
from sessions_app.selectors.totals import session_totals

logger = logging.getLogger(__name__)

COALESCE_SECONDS = 0.05
RENDER_SECONDS = 0.1
RENDER_SHARE = 0.2  # of the process's time, at most, spent rendering the live text of all replies streaming
HUSH_SECONDS = 0.05
MESSAGE_TYPE = "cachet.message"
ECHO = "cachet.echo"  # lines for a terminal following a job
COMPACTING = "Compacting…"


def session_group(session_id: int) -> str:
    """The group of a session's open tabs."""
    return f"session-{session_id}"


def reply_group(session_id: int) -> str:
    """The group of the process running the session's reply: Stop and requests for its live text go there."""
    return f"reply-{session_id}"


@dataclass(frozen=True)
class _Send:
    text: str
    to: str | None  # None: the session's group


@dataclass(frozen=True)
class _Delta:
    turn: int
    step: int
    kind: str  # "text", "reasoning" or "call"
    text: str


@dataclass(frozen=True)
class _Snapshot:
    reply_to: str


@dataclass(frozen=True)
class _Echo:
    """Lines for the terminal following the job (``manage.py ask``), on its channel ``to``."""

    lines: list[EchoLine]
    to: str


@dataclass(frozen=True)
class _Direct:
    """A message of its own to one channel (the end of a job, for the terminal following it)."""

    message: dict[str, Any]
    to: str


_Item = _Send | _Delta | _Snapshot | _Echo | _Direct


class Relay:
    """Sends a job's messages from the event loop, in order; gathers deltas; answers live-text requests.

    ``put`` may be called from any thread; everything else runs on ``loop``.
    """

    def __init__(self, *, session_id: int, layer: BaseChannelLayer, loop: asyncio.AbstractEventLoop) -> None:
        self.session_id = session_id
        self.layer = layer
        self.loop = loop
        self._items: collections.deque[_Item] = collections.deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._waiting = False  # the relay waits for items, or to be spoken to: the next put wakes it
        self._hushed_until = 0.0
        self._task: asyncio.Task[None] | None = None
        self.turn = 0
        self.step = 0
        self.text = ""
        self.reasoning = ""
        self.calls: list[str] = []
        self.rendered = live_markdown.LiveMarkdown()
        self._rendered_at = 0.0
        self._render_gap = RENDER_SECONDS

    def start(self) -> None:
        self._task = self.loop.create_task(self._run())

    def hush(self) -> None:
        """Hold the sends for at most ``HUSH_SECONDS``, until the next put of anything but streamed text."""
        self._hushed_until = time.monotonic() + HUSH_SECONDS

    @property
    def hushed(self) -> bool:
        return self._hushed_until > time.monotonic()

    def put(self, item: _Item) -> None:
        self._items.append(item)
        if not isinstance(item, _Delta):
            self._hushed_until = 0.0
        if self._waiting:  # only an idle relay is woken: one gathering deltas takes them at its deadline
            self._waiting = False
            self.loop.call_soon_threadsafe(self._wake.set)

    def close(self) -> None:
        self._closed = True
        self.loop.call_soon_threadsafe(self._wake.set)

    async def finished(self) -> None:
        if self._task is not None:
            await self._task

    async def _send(self, text: str, to: str | None) -> None:
        await self._send_message({"type": MESSAGE_TYPE, "text": text}, to)

    async def _echo(self, first: _Echo) -> None:
        """Send ``first`` with the echo lines to the same terminal already waiting behind it, in one message."""
        lines = list(first.lines)
        while self._items and isinstance(self._items[0], _Echo) and self._items[0].to == first.to:
            lines.extend(self._items.popleft().lines)  # type: ignore[union-attr]
        await self._send_message({"type": ECHO, "lines": lines}, first.to)

    async def _send_message(self, message: dict[str, Any], to: str | None) -> None:
        try:
            if to is None:
                await self.layer.group_send(session_group(self.session_id), message)
            else:
                await self.layer.send(to, message)
        except Exception as error:
            if not _layer.failing:  # one line while the layer fails, not a traceback for every piece streamed
                logger.warning("session %s: could not send an update to the page: %r", self.session_id, error)
            _layer.failing = True
        else:
            _layer.failing = False

    async def _run(self) -> None:
        try:
            await self._relay()
        finally:
            _streaming.discard(self)

    async def _relay(self) -> None:
        while True:
            if not self._items and not self._closed:
                self._waiting = True
                if not self._items and not self._closed:  # looked at again once a put can see the flag
                    await self._woken_or(self._render_wait())
                self._waiting = False
            while self._items:
                await self._quiet()
                item = self._items.popleft()
                if isinstance(item, _Delta):
                    await self._deltas(item)
                elif isinstance(item, _Snapshot):
                    await self._snapshot(item.reply_to)
                elif isinstance(item, _Echo):
                    await self._echo(item)
                elif isinstance(item, _Direct):
                    await self._send_message(item.message, item.to)
                else:
                    await self._send(item.text, item.to)
                await self._render_if_due()
            if self._closed and not self._items:
                return
            await self._render_if_due()

    def _render_wait(self) -> float | None:
        """Seconds until the step's text is due to be rendered again; ``None`` when it is rendered as it is."""
        if not self.turn or len(self.text) == self.rendered.rendered_length:
            return None
        return max(0.0, self._rendered_at + self._render_gap - time.monotonic())

    async def _woken_or(self, seconds: float | None) -> None:
        """Wait until the relay is woken or ``seconds`` pass (``None``: no limit)."""
        self._wake.clear()
        if seconds is None:
            await self._wake.wait()
        elif seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), seconds)

    async def _quiet(self) -> None:
        """Wait while the relay is hushed (and not closed)."""
        while not self._closed and self.hushed:
            self._waiting = True
            if not self._closed:  # looked at again once a put can see the flag
                await self._woken_or(self._hushed_until - time.monotonic())
            self._waiting = False

    async def _render_if_due(self) -> None:
        if self._render_wait() != 0.0:
            return
        await self._quiet()
        turn, text = self.turn, self.text
        piece, cost = await asyncio.to_thread(_advance, self.rendered, text)
        self._rendered_at = time.monotonic()
        self._render_gap = render_gap(cost, streaming=len(_streaming))
        for message in pack(live_markdown.piece_puts(turn, piece)):
            await self._send(message, None)

    async def _start_step(self, turn: int, step: int) -> None:
        if (turn, step) != (self.turn, self.step):
            _streaming.add(self)
            self.turn, self.step = turn, step
            self.text, self.reasoning, self.calls = "", "", []
            self.rendered = live_markdown.LiveMarkdown()
            for message in pack([live_markdown.container_put(turn)]):
                await self._send(message, None)

    async def _deltas(self, first: _Delta) -> None:
        """Send ``first`` with the deltas of the same step that come within ``COALESCE_SECONDS``."""
        deadline = time.monotonic() + COALESCE_SECONDS
        await self._start_step(first.turn, first.step)
        text_at, reasoning_at = utf16_length(self.text), utf16_length(self.reasoning)
        text, reasoning, calls = [], [], []
        item: _Delta | None = first
        while item is not None:
            if item.kind == "text":
                text.append(item.text)
            elif item.kind == "reasoning":
                reasoning.append(item.text)
            else:
                calls.append(item.text)
            item = None
            while item is None:
                head = self._items[0] if self._items else None
                if isinstance(head, _Delta) and (head.turn, head.step) == (first.turn, first.step):
                    self._items.popleft()
                    item = head
                    continue
                remaining = deadline - time.monotonic()
                if head is not None or remaining <= 0 or self._closed:
                    break
                # Puts meanwhile do not wake the loop (one wake-up per piece cost more than the rest of its
                # relay); only close() does, else the deadline.
                await self._woken_or(remaining)
        await self._quiet()
        new_text, new_reasoning = "".join(text), "".join(reasoning)
        self.text += new_text
        self.reasoning += new_reasoning
        self.calls.extend(calls)
        for message in live_messages(
            turn=first.turn,
            step=first.step,
            text=new_text,
            text_at=text_at,
            reasoning=new_reasoning,
            reasoning_at=reasoning_at,
            calls=calls,
        ):
            await self._send(message, None)

    async def _snapshot(self, reply_to: str) -> None:
        if not self.turn:
            return
        for message in pack(live_markdown.snapshot_puts(self.turn, self.rendered)):
            await self._send(message, reply_to)
        for message in live_messages(
            turn=self.turn,
            step=self.step,
            text=self.text,
            reasoning=self.reasoning,
            calls=self.calls,
            reset=True,
        ):
            await self._send(message, reply_to)


_streaming: set[Relay] = set()  # the relays of this process that have streamed a step's text


@dataclass
class _LayerHealth:
    failing: bool = False  # the channel layer refused this process's last send


_layer = _LayerHealth()


def render_gap(cost: float, *, streaming: int) -> float:
    """Seconds until a step's live text is rendered again, its last render having taken ``cost`` seconds of
    processor time: a costly tail renders less often, and so does each of many replies streaming at once."""
    return max(RENDER_SECONDS, cost * max(1, streaming) / RENDER_SHARE)


def _advance(rendered: live_markdown.LiveMarkdown, text: str) -> tuple[live_markdown.LivePiece, float]:
    """The rendered piece, and the processor time it took."""
    started = time.thread_time()
    piece = rendered.advance(text)
    return piece, time.thread_time() - started


@dataclass
class _ShownTurn:
    """What the tabs were shown of the turn a reply runs: its siblings as it started, its steps and results."""

    turn_id: int
    siblings: tuple[int, ...]
    steps: list[Step] = field(default_factory=list)
    results: dict[int, list[Result]] = field(default_factory=dict)


class Publisher:
    """Renders a reply's events into page changes and hands them to ``put`` in order (from the reply's thread)."""

    def __init__(self, session: ChatSession, *, put: Callable[[_Item], None], reply_to: str | None, label: str) -> None:
        self.session = session
        self.put = put
        self.reply_to = reply_to
        self.label = label
        finished = finished_requests(session=session)
        self.bars = finished.count()
        self.last_ttft = last_time_to_first_token(finished)
        self.totals = session_totals(session)
        self.shown_bars: dict[int, chart.Bar] = {}
        self.window = fragments.chart_window(session)
        self.shown: _ShownTurn | None = None  # the turn this reply runs, as the tabs were shown it

    def group(self, ops: list[Op], *, rev: int | None = None) -> None:
        for text in pack(ops, rev=rev):
            self.put(_Send(text, None))

    def direct(self, ops: list[Op]) -> None:
        if self.reply_to:
            for text in pack(ops):
                self.put(_Send(text, self.reply_to))

    def notice(self, text: str, *, level: str = "info", lines: tuple[str, ...] = ()) -> None:
        self.direct([fragments.notice_put(text, level=level, lines=lines)])

    def publish(self, event: ReplyEvent) -> None:
        """Turn ``event`` into what the tabs see."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _turn_started(self, event: TurnStarted) -> None:
        turn = event.turn
        view = started_turn(turn)
        self.shown = _ShownTurn(turn.pk, view.siblings)
        self.session.refresh_from_db(fields=["title", "pinned"])
        self.group(
            [
                fragments.turn_put(view),
                fragments.title_put(self.session),
                fragments.sidebar_title_put(self.session),
                fragments.controls_put(running=True, label=self.label),
                fragments.attachments_put(self.session),
            ],
            rev=turn.revision,
        )

    def _request_started(self, event: RequestStarted) -> None:
        if event.request.kind == RequestKind.COMPACTION:
            self.group([fragments.controls_put(running=True, label=COMPACTING)])

    def _delta(self, event: TextDelta | ReasoningDelta | ToolCalled) -> None:
        if not event.turn_number:
            return  # a compaction's summary streams too; it is not shown as it comes
        if isinstance(event, TextDelta):
            self.put(_Delta(event.turn_number, event.step, "text", event.text))
        elif isinstance(event, ReasoningDelta):
            self.put(_Delta(event.turn_number, event.step, "reasoning", event.text))
        else:
            self.put(_Delta(event.turn_number, event.step, "call", event.name))

    def _request_finished(self, event: RequestFinished) -> None:
        request = event.request
        self.bars += 1
        bar = chart.Bar(self.bars, request, self.last_ttft)
        if request.time_to_first_token is not None:
            self.last_ttft = request.time_to_first_token
        self.shown_bars[request.pk] = bar
        self.totals = self.totals.plus(request)
        self.group([fragments.bar_put(bar, window=self.window), fragments.summary_put(self.totals)])

    def _cache_checked(self, event: CacheChecked) -> None:
        bar = self.shown_bars.pop(event.request.pk, None)
        if bar is not None:
            self.group([fragments.bar_put(bar, window=self.window)])

    def _step_stored(self, event: StepStored) -> None:
        step = event.step
        turn = step.turn
        view = step_view(step, [])
        if self.shown is not None and self.shown.turn_id == step.turn_id:
            self.shown.steps.append(step)
        self.group(
            [fragments.step_put(view, session_id=turn.session_id, turn_number=turn.number, open=True)],
            rev=event.revision,
        )
        self.put(_Delta(turn.number, step.number + 1, "text", ""))

    def _result_stored(self, event: ResultStored) -> None:
        result = event.result
        row = row_for_result(result)
        if self.shown is not None and self.shown.turn_id == result.turn_id and result.step_id is not None:
            self.shown.results.setdefault(result.step_id, []).append(result)
        if row is not None:
            self.group([fragments.row_put(row, session_id=result.session_id)], rev=event.revision)

    def _turn_ended(self, event: TurnEnded) -> None:
        turn, shown = event.turn, self.shown
        if shown is not None and shown.turn_id == turn.pk:
            view = ended_turn(turn, steps=shown.steps, results=shown.results, siblings=shown.siblings)
        else:
            view = single_turn(turn, running=False)
        self.group([fragments.turn_put(view)], rev=turn.revision)

    def _taken_back(self, event: TurnsTakenBack) -> None:
        turns = event.turns
        if not turns:
            return
        ops: list[Op] = [fragments.turn_remove(turn.number) for turn in turns]
        ops.extend(fragments.compaction_remove(number) for number in event.compactions)
        self.group(ops, rev=max(turn.revision for turn in turns))
        if event.said:
            self.direct([fragments.composer_put(turns[-1].words)])
        text = taken_back_text(event, [turn.position for turn in reversed(turns)])
        if text:
            self.notice(text, level="warning" if event.conflicts else "info", lines=event.conflicts)

    def _branch_flipped(self, event: BranchFlipped) -> None:
        """The page shows the live branch again: its last turns, as a page loads them, with its compactions."""
        if not event.made_live:
            return
        page = transcript_page(self.session, running=False)
        self.group(
            [fragments.transcript_put(page, session_id=self.session.pk)],
            rev=max(turn.revision for turn in event.made_live),
        )

    def _compacted(self, event: Compacted) -> None:
        generation = event.generation
        self.group([fragments.compaction_put(CompactionView(generation))], rev=generation.revision)
        self.notice("Compacted: the model now starts from the summary.")

    def _notice(self, event: Notice) -> None:
        self.notice(event.text, level=event.level, lines=event.lines)


_HANDLERS: dict[type[Any], Callable[[Publisher, Any], None]] = {
    TurnStarted: Publisher._turn_started,
    RequestStarted: Publisher._request_started,
    TextDelta: Publisher._delta,
    ReasoningDelta: Publisher._delta,
    ToolCalled: Publisher._delta,
    RequestFinished: Publisher._request_finished,
    CacheChecked: Publisher._cache_checked,
    StepStored: Publisher._step_stored,
    ResultStored: Publisher._result_stored,
    TurnEnded: Publisher._turn_ended,
    TurnsTakenBack: Publisher._taken_back,
    BranchFlipped: Publisher._branch_flipped,
    Compacted: Publisher._compacted,
    Notice: Publisher._notice,
}
