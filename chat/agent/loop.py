"""The reply loop: build the request from the store, ask the model, run its tool calls, repeat.

Each action (send, regenerate, edit, flip, undo, rewind, compact) is an asynchronous generator of typed events
(``chat.agent.events``) that holds the session's reply lock while it runs: a worker publishes the events to the
session's tabs, ``manage.py ask`` prints them, the conformance runner checks them. The person's message and
everything the model says and every result are stored before the next thing that can fail; the text of the step
being streamed is saved as it comes (at most a second's worth is lost with a process).

Concurrency is asyncio's and nothing of the loop's own. The model's answer is read on the caller's event loop
(``chat.agent.model``), and Stop interrupts that read at once. The store is Django's, synchronous: every store
call goes through ``sync_to_async(thread_sensitive=True)``, so all the calls of one action run on one thread
and one database connection, the one that holds the session's lock. That thread is the caller's where a
synchronous caller runs the action through ``async_to_sync`` (a test, a command), and one of its own for each job
where a worker runs it inside a ``ThreadSensitiveContext``.

A finished request's cache check asks the server to render and tokenize the prompt (a second or more on a long
one). It never holds the session: the action hands it to ``checks`` (a worker queues it as a job of its own), or,
where it has none, checks once the lock is let go, before the action's generator ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

from chat.agent import placement, server_api
from chat.agent.budget import (
    RequestCounter,
    RequestTooLarge,
    endpoint_window,
    images_learned,
    images_refused,
    window_forget,
    window_learned,
)
from chat.agent.cache_check import CheckSpec, run_check
from chat.agent.events import (
    BarPlace,
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
    Titled,
    ToolCalled,
    TurnEnded,
    TurnsTakenBack,
    TurnStarted,
)
from chat.agent.mcp_calls import McpPlanned, McpRefused, mcp_outcome, mcp_planned
from chat.agent.model import (
    Cancel,
    Completion,
    HttpModel,
    Model,
    ModelCancelled,
    ModelClient,
    ModelContextExceeded,
    ModelError,
    ModelUnavailable,
    ReasoningPiece,
    TextPiece,
    Timeouts,
    ToolCall,
    ToolCallPiece,
    new_client,
)
from chat.agent.sampling import sampled_body
from chat.agent.workspace import read_instructions, restore_files, tool_context
from chat.tools import ToolContext, call_tool, only_reads
from sessions_app import prompts
from sessions_app.errors import (
    EmptySummary,
    EndpointRefused,
    NotAMember,
    StoreError,
    WorkspaceRefused,
    person_message,
)
from sessions_app.hygiene import PriorResult
from sessions_app.hygiene.config import ContextConfig
from sessions_app.hygiene.outcomes import Outcome
from sessions_app.models import (
    STOPPED,
    BreakCause,
    ChatSession,
    ModelRequest,
    RequestKind,
    Result,
    TitleSource,
    Turn,
    TurnStatus,
)
from sessions_app.selectors.requests import (
    BuiltRequest,
    PreviousRequest,
    RequestBuilder,
    build_request,
    previous_request,
)
from sessions_app.selectors.sessions import (
    current_generation,
    endpoint_refusal,
    history_turns,
    session_by_id,
    session_standing,
    workspace_refusal,
)
from sessions_app.selectors.totals import ChartTally, chart_tally
from sessions_app.services.compaction import compaction_apply
from sessions_app.services.locks import reply_lock
from sessions_app.services.mcp import mcp_server_listed
from sessions_app.services.requests import request_last_keep, request_record_finish, request_record_start
from sessions_app.services.results import prior_result, reply_table, result_insert
from sessions_app.services.sessions import session_title_by_model
from sessions_app.services.turns import step_draft_save, step_record, turn_fail, turn_finish, turn_start
from sessions_app.services.undo import TakenBack, branch_flip, turn_edit, turn_regenerate, turn_rewind, turn_undo
from sessions_app.tool_names import split_name
from sessions_app.types import StoredCall

logger = logging.getLogger(__name__)

DRAFT_SECONDS = 1.0
DATABASE_LOST = "The database went away during the reply; what it had written is kept. Send again or regenerate."
_NOTHING_TO_CHECK = (BreakCause.FIRST, BreakCause.MODEL_CHANGE, BreakCause.RESTART)

P = ParamSpec("P")
T = TypeVar("T")


async def store(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``function`` run on the action's store thread (its database connection holds the session's lock)."""
    return await sync_to_async(function, thread_sensitive=True)(*args, **kwargs)


def close_connection() -> None:
    """Close the calling thread's database connection (through ``store``: the action's own)."""
    connection.close()


def today() -> str:
    """The date the notes state: ``CACHET_TODAY`` where set, else the server's local date."""
    return str(settings.CACHET_TODAY or timezone.localdate().isoformat())


def timeouts() -> Timeouts:
    return Timeouts(
        connect=settings.CACHET_CONNECT_TIMEOUT,
        first_token=settings.CACHET_FIRST_TOKEN_TIMEOUT,
        between_chunks=settings.CACHET_CHUNK_TIMEOUT,
    )


def _call_id(call: ToolCall, turn: Turn, step_number: int, position: int) -> str:
    return call.id or f"call_{turn.number}_{step_number}_{position}"


@dataclass
class _Streamed:
    """What the step being asked has streamed so far."""

    text: str = ""
    reasoning: str = ""
    saved_at: float = 0.0
    saved_size: int = 0


CheckSink = Callable[[list[CheckSpec]], Awaitable[None]]  # takes an action's checks, all at once


class ReplyLoop:
    """Runs the actions of one session; ``cancel`` stops the one running. ``checks`` takes the cache checks of the
    requests sent (a worker queues them); without, the action runs them itself once it has let the session go."""

    def __init__(
        self,
        session: ChatSession,
        *,
        model: Model | None = None,
        cancel: Cancel | None = None,
        config: ContextConfig | None = None,
        date: str | None = None,
        max_steps: int | None = None,
        client_timeouts: Timeouts | None = None,
        checks: CheckSink | None = None,
        titles: bool | None = None,
    ) -> None:
        self.session = session
        self.titles = settings.CACHET_TITLES if titles is None else titles  # ask the model for the title
        self.cancel = cancel or Cancel()
        self.config = config or prompts.rules_config()
        self.date = date
        self.max_steps = max_steps or settings.CACHET_MAX_STEPS or prompts.loop_settings().max_steps
        self.timeouts = client_timeouts or timeouts()
        self.requests: list[ModelRequest] = []
        self.streamed: tuple[int, int, _Streamed] | None = None  # the step streaming now: turn, step, its text
        self._checks_to = checks
        self._given_model = model
        self._previous: PreviousRequest | None = None
        self._last_built: BuiltRequest | None = None  # the last request this loop sent whole
        self._builder: RequestBuilder | None = None
        self._counter: RequestCounter | None = None
        self._window_asked = False  # asked again in this action, before compacting or refusing for size
        self._placed: placement.Placed | None = None  # where this action's last request went
        self._avoid: frozenset[str] = frozenset()  # replicas this action could not reach
        self._checks: list[CheckSpec] = []
        self._last_unkept = False
        self._client: ModelClient | None = None
        self._drafted: set[tuple[int, int]] = set()
        self._tally: ChartTally | None = None  # the chart as this action's requests leave it

    # --- holding the session ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self, *, asking: bool = True) -> AsyncGenerator[None, None]:
        """The session held for an action; ``asking``: one that asks its model (undo, rewind and a flip do not)."""
        lock = reply_lock(self.session)
        await store(lock.__enter__)
        try:
            await store(self._admitted, asking)
            try:
                yield
            finally:
                await store(self._keep_last_request)
                if self._client is not None:
                    await self._client.aclose()
                    self._client = None
                self._previous = None
                self._builder = None
                self._counter = None
                self._window_asked = False
                self._placed = None
                self._avoid = frozenset()
        finally:
            await store(lock.__exit__, None, None, None)

    def _admitted(self, asking: bool) -> None:
        self._refresh()
        refused = workspace_refusal(session=self.session)  # the owner removed, or the folder now forbidden
        if refused is not None:
            raise refused
        endpoint_refused = endpoint_refusal(session=self.session) if asking else None  # no longer granted
        if endpoint_refused is not None:
            raise endpoint_refused

    async def _checked(self) -> AsyncGenerator[ReplyEvent, None]:
        """The cache checks of this action's requests, the session let go: handed on, or run here."""
        checks, self._checks = self._checks, []
        if self._checks_to is not None:
            if checks:
                await self._checks_to(checks)
            return
        for spec in checks:
            request = await run_check(spec)
            if request is not None:
                yield CacheChecked(request, BarPlace(spec.bar, spec.previous_ttft))

    def _keep_last_request(self) -> None:
        if not self._last_unkept or self._previous is None:
            return
        try:
            request_last_keep(session=self.session, last=self._previous)
            self._last_unkept = False
        except Exception:  # the next action then finds the last request unknown and says so
            logger.exception("session %s: could not keep the last request's bytes", self.session.pk)

    def _refresh(self) -> ChatSession:
        self.session = session_by_id(session_id=self.session.pk)
        return self.session

    def _model_at(self, url: str) -> Model:
        if self._given_model is not None:
            return self._given_model
        if self._client is None:
            self._client = new_client()
        api_key = self.session.endpoint.api_key or None
        return HttpModel(base_url=url, api_key=api_key, timeouts=self.timeouts, client=self._client)

    def _place(self) -> placement.Placed:
        """Where the next request goes: the session's replica and slot (``chat.agent.placement``)."""
        if self._given_model is not None:
            return placement.Placed(self.session.endpoint.base_url)
        if self._placed is None:
            self._placed = placement.last_placed(self.session)
        self._placed = placement.place(self.session, previous=self._placed, avoid=self._avoid)
        return self._placed

    def _fail_over(self, placed: placement.Placed) -> bool:
        """Leave a replica that could not be reached for another, where the endpoint has one left."""
        urls = self.session.endpoint.urls
        if len(urls) < 2 or placed.url in self._avoid or len(self._avoid) + 1 >= len(urls):
            return False
        placement.mark_down(placed.url)
        self._avoid = self._avoid | {placed.url}
        return True

    @property
    def counter(self) -> RequestCounter:
        """Counts this action's requests against the endpoint's window (asked of the server when it is old)."""
        if self._counter is None:
            window = endpoint_window(self.session.endpoint, model=self.session.model_name)
            self._counter = RequestCounter(self.session, window=window)
        return self._counter

    def _window_grew(self) -> bool:
        """Ask the server its window again, once an action, before compacting or refusing for size (it may have
        restarted with a larger one); whether the window changed."""
        if self._window_asked:
            return False
        self._window_asked = True
        before = self.counter.window.tokens
        after = endpoint_window(self.session.endpoint, model=self.session.model_name, refresh=True)
        if after.tokens == before:
            return False
        self._counter = None
        return True

    def next_request(self) -> BuiltRequest:
        """The request the next step would send: of the open reply, or else the next turn's history."""
        if self._builder is not None:
            return self._builder.build()
        return build_request(self._refresh(), current=None, model_name=self.session.model_name)

    # --- the actions ------------------------------------------------------------------------------------

    async def send(self, words: str, *, date: str | None = None) -> AsyncGenerator[ReplyEvent, None]:
        """Store the person's message as a new turn, then run the reply to it (compacting first where the
        conversation would pass ``compaction.auto_at``)."""
        async with self._locked():
            day = date or self.date or today()
            turn = await store(self._started, words, day)
            async with contextlib.aclosing(self._reply_titled(turn, compact_first=True)) as events:
                async for event in events:
                    yield event
        async with contextlib.aclosing(self._checked()) as events:
            async for event in events:
                yield event

    async def _reply_titled(self, turn: Turn, **options: bool) -> AsyncGenerator[ReplyEvent, None]:
        """The reply to ``turn``, then, where it was the session's first and ended well, the session's title."""
        async with contextlib.aclosing(self._reply(turn, **options)) as events:
            async for event in events:
                if isinstance(event, TurnEnded):
                    turn = event.turn
                yield event
        if await store(self._title_due, turn):
            async with contextlib.aclosing(self._title(turn)) as events:
                async for event in events:
                    yield event

    def _title_due(self, turn: Turn) -> bool:
        """Whether to ask for the session's title now: its first reply ended well, its title is still the first
        words typed, and no title was asked for it before."""
        if not self.titles or turn.status != TurnStatus.DONE:
            return False
        session = self._refresh()
        if session.title_source != TitleSource.TYPED:
            return False
        if Turn.objects.filter(session=session).exclude(status=TurnStatus.TAKEN_BACK).exclude(pk=turn.pk).exists():
            return False
        return not session.model_requests.filter(kind=RequestKind.TITLE).exists()

    def _title_request(self) -> BuiltRequest | None:
        """The next turn's request with the title task as its message, where it fits the window."""
        built = build_request(
            self.session, current=None, model_name=self.session.model_name, extra_user=prompts.title_task()
        )
        return built if self.counter.fits(self.counter.count(built)) else None

    async def _title(self, turn: Turn) -> AsyncGenerator[ReplyEvent, None]:
        """Ask the model for the session's title as the next turn of the conversation would ask (so the next
        request still finds the whole conversation cached), and title the session with its answer. It is no turn
        and is never shown; where it fails, the first words typed stay the title."""
        built = await store(self._title_request)
        if built is None:
            return
        completion: Completion | None = None
        try:
            asked = self._ask(built, turn=turn, step_number=0, kind=RequestKind.TITLE)
            async with contextlib.aclosing(asked) as items:
                async for item in items:
                    if isinstance(item, Completion):
                        completion = item
                    else:
                        yield item
        except ModelError as error:
            logger.info("session %s: no title from the model: %s", self.session.pk, error)
            return
        if completion is None:
            return
        titled = await store(session_title_by_model, session_id=self.session.pk, answer=completion.text)
        if titled is not None:
            self.session = titled
            yield Titled(titled)

    def _started(self, words: str, day: str) -> Turn:
        instructions = read_instructions(self.session)
        return turn_start(session=self.session, words=words, today=day, instructions=instructions, config=self.config)

    async def regenerate(self, *, restore: bool = False) -> AsyncGenerator[ReplyEvent, None]:
        """Take back the last reply and ask again with the same stored message."""
        async with self._locked():
            taken, turn = await store(self._regenerated)
            yield await store(self._taken_back, taken, restore=restore)
            async with contextlib.aclosing(self._reply_titled(turn, again=True)) as events:
                async for event in events:
                    yield event
        async with contextlib.aclosing(self._checked()) as events:
            async for event in events:
                yield event

    def _regenerated(self) -> tuple[TakenBack, Turn]:
        taken, turn = turn_regenerate(
            session=self.session,
            today=self.date or today(),
            instructions=read_instructions(self.session),
            config=self.config,
        )
        self._refresh()
        return taken, turn

    async def edit(
        self, turn_number: int, words: str, *, restore: bool = False, date: str | None = None
    ) -> AsyncGenerator[ReplyEvent, None]:
        """Start a new branch from live turn ``turn_number`` with ``words`` in its place, then run the reply."""
        async with self._locked():
            taken, turn = await store(self._edited, turn_number, words, date or self.date or today())
            yield await store(self._taken_back, taken, restore=restore)
            async with contextlib.aclosing(self._reply_titled(turn)) as events:
                async for event in events:
                    yield event
        async with contextlib.aclosing(self._checked()) as events:
            async for event in events:
                yield event

    def _edited(self, turn_number: int, words: str, day: str) -> tuple[TakenBack, Turn]:
        taken, turn = turn_edit(
            session=self.session,
            turn=turn_number,
            words=words,
            today=day,
            instructions=read_instructions(self.session),
            config=self.config,
        )
        self._refresh()
        return taken, turn

    async def flip(self, turn_number: int) -> AsyncGenerator[ReplyEvent, None]:
        """Make the branch through turn ``turn_number`` the live one."""
        async with self._locked(asking=False):
            flipped = await store(branch_flip, session=self.session, turn=turn_number)
            yield BranchFlipped(
                taken_back=tuple(flipped.taken_back),
                made_live=tuple(flipped.made_live),
                compactions_taken_back=tuple(flipped.compactions_taken_back),
                compactions_made_live=tuple(flipped.compactions_made_live),
            )

    async def undo(self, *, restore: bool = False) -> AsyncGenerator[ReplyEvent, None]:
        """Take back the last live turn."""
        async with self._locked(asking=False):
            taken = await store(turn_undo, session=self.session)
            yield await store(self._taken_back, taken, restore=restore)

    async def rewind(self, number: int, *, restore: bool = False) -> AsyncGenerator[ReplyEvent, None]:
        """Take back turn ``number`` and every later live turn."""
        async with self._locked(asking=False):
            taken = await store(turn_rewind, session=self.session, number=number)
            yield await store(self._taken_back, taken, restore=restore)

    async def compact(self) -> AsyncGenerator[ReplyEvent, None]:
        """Ask the model for a summary as the next step of the conversation and start a new generation."""
        async with self._locked(), contextlib.aclosing(self._compact()) as events:
            async for event in events:
                yield event
        async with contextlib.aclosing(self._checked()) as events:
            async for event in events:
                yield event

    # --- inside the lock ----------------------------------------------------------------------------------

    def _taken_back(self, taken: TakenBack, *, restore: bool) -> TurnsTakenBack:
        conflicts = restore_files(self.session, taken.edits).conflicts if restore else []
        return TurnsTakenBack(
            turns=tuple(taken.turns),
            restored=restore,
            edits=len(taken.edits),
            conflicts=tuple(conflicts),
            compactions=tuple(taken.compactions_taken_back),
        )

    async def _compact(
        self,
        built: BuiltRequest | None = None,
        *,
        within: Turn | None = None,
        after_step: int | None = None,
        step_number: int = 0,
    ) -> AsyncGenerator[ReplyEvent, None]:
        """Ask for the summary with ``built`` (by default the next turn's history and the task), then start the
        new generation; ``within`` and ``after_step`` say how much of a running reply it covers."""
        if built is None:
            built = await store(
                build_request,
                self.session,
                current=None,
                model_name=self.session.model_name,
                extra_user=prompts.compact_task(),
            )
            await store(self._summary_fits, built)
        completion: Completion | None = None
        asked = self._ask(built, turn=within, step_number=step_number, kind=RequestKind.COMPACTION)
        async with contextlib.aclosing(asked) as items:
            async for item in items:
                if isinstance(item, Completion):
                    completion = item
                else:
                    yield item
        assert completion is not None
        if not completion.text.strip():
            raise EmptySummary()
        generation = await store(self._compaction_applied, completion.text, within, after_step)
        yield Compacted(generation)

    def _compaction_applied(self, summary: str, within: Turn | None, after_step: int | None) -> Any:
        generation = compaction_apply(
            session=self.session,
            summary=summary,
            config=self.config,
            within=within,
            after_step=after_step,
            # the reply goes on in the new generation with its message carrying the full note, as of now
            today=(self.date or today()) if within is not None else None,
            instructions=read_instructions(self.session) if within is not None else None,
        )
        self._refresh()
        return generation

    def _compaction_due(self, turn: Turn) -> BuiltRequest | None:
        """Before a turn's first step: the summary request (covering the turns before it) where its first request,
        as counted now, would pass ``compaction.auto_at`` and the summary request fits; else ``None``."""
        if not history_turns(self.session).filter(number__lt=turn.number).exists():
            return None
        assert self._builder is not None
        counter = self.counter
        first = self._builder.build()
        if counter.past_threshold(counter.count(first)) and self._window_grew():
            counter = self.counter
        if not counter.past_threshold(counter.count(first)):
            return None
        builder = RequestBuilder(self.session, model_name=self.session.model_name, current=turn, upto_step=-1)
        built = builder.build(extra_user=prompts.compact_task())
        if not counter.fits(counter.count(built)):
            return None  # the first step finds it does not fit either, and says what to do
        return built

    async def _compact_first(self, turn: Turn) -> AsyncGenerator[ReplyEvent, None]:
        """Compact the turns before ``turn`` where its first request would pass ``compaction.auto_at``: its
        message is stored already, and the reply goes on from the summary with it."""
        built = await store(self._compaction_due, turn)
        if built is None:
            return
        try:
            async with contextlib.aclosing(self._compact(built, within=turn, after_step=None, step_number=0)) as events:
                async for event in events:
                    yield event
        except (EmptySummary, ModelError) as error:
            yield Notice(f"Could not compact before this turn: {error}", level="warning")
        else:
            self._builder = await store(RequestBuilder, self.session, model_name=self.session.model_name, current=turn)

    def _fitting_plan(
        self, turn: Turn, built: BuiltRequest, step_number: int
    ) -> tuple[BuiltRequest, int | None] | None:
        """Where ``built`` does not fit the window: the summary request that covers as many of the reply's steps
        as it can carry, and the step it covers up to (``None``: the turns before); ``None`` where ``built``
        fits. ``RequestTooLarge`` where nothing fits."""
        counter = self.counter
        size = counter.count(built)
        if counter.fits(size) or size.how == "guess":
            return None  # a guess, with nothing measured yet, does not refuse: the server judges
        if self._window_grew():
            counter = self.counter
            size = counter.count(built)
            if counter.fits(size):
                return None
        generation = current_generation(self.session)
        resumed = generation.resumes_after_step if generation.covers_through_turn == turn.number else None
        candidates: list[int] = list(range(step_number - 2, (resumed if resumed is not None else -1), -1))
        if resumed is None and history_turns(self.session).filter(number__lt=turn.number).exists():
            candidates.append(-1)
        for upto in candidates:
            builder = RequestBuilder(self.session, model_name=self.session.model_name, current=turn, upto_step=upto)
            summary_request = builder.build(extra_user=prompts.compact_task())
            if counter.fits(counter.count(summary_request)):
                return summary_request, upto if upto >= 0 else None
        raise counter.too_large(size, compacting_helps=False)  # no summary request fits either

    def _summary_fits(self, built: BuiltRequest) -> None:
        """Compact now's request, refused before it is sent where it cannot fit the window (the server would
        refuse it, and its refusal advised compacting)."""
        size = self.counter.count(built)
        if not self.counter.fits(size) and size.how != "guess":
            raise self.counter.too_large(size, compacting_helps=False)

    def _rebuilt(self, turn: Turn) -> BuiltRequest:
        """After a compaction inside the reply: the request of its next step, which must fit now."""
        self._builder = RequestBuilder(self.session, model_name=self.session.model_name, current=turn)
        built = self._builder.build()
        size = self.counter.count(built)
        if not self.counter.fits(size):
            raise self.counter.too_large(size)
        return built

    async def _fitting(
        self, turn: Turn, built: BuiltRequest, step_number: int, table: list[PriorResult]
    ) -> AsyncGenerator[ReplyEvent | BuiltRequest, None]:
        """``built`` where it fits the window; else the reply is compacted, covering as many of its steps as
        the summary request can carry, and goes on from the summary; where nothing fits, ``RequestTooLarge``.
        Yields the events of a compaction, then the request to send."""
        plan = await store(self._fitting_plan, turn, built, step_number)
        if plan is None:
            yield built
            return
        summary_request, after_step = plan
        async with contextlib.aclosing(
            self._compact(summary_request, within=turn, after_step=after_step, step_number=step_number)
        ) as events:
            async for event in events:
                yield event
        table.clear()  # §7: after any compaction the dedupe table is empty, though the request carries steps
        yield await store(self._rebuilt, turn)

    def _record_start(
        self, built: BuiltRequest, *, turn: Turn | None, step_number: int, kind: str
    ) -> tuple[ModelRequest, bytes, placement.Placed, bytes]:
        """Place the request and write its record; the request, the bytes it is compared with, where it goes and
        the bytes sent."""
        session = self.session
        if self._tally is None:
            self._tally = chart_tally(session)
        if self._previous is None:
            self._previous = previous_request(session)
        else:  # only this action's own writes add breaks while it holds the lock, and they refresh the session
            self._previous = replace(self._previous, pending=tuple(session.pending_breaks or ()))
        previous_body = self._previous.body
        placed = self._place()
        sent = placement.placed_body(sampled_body(built.body, session, kind=kind), placed)
        request, self._previous = request_record_start(
            session=session,
            turn=turn,
            step_number=step_number,
            kind=kind,
            built=built,
            endpoint_url=placed.url,
            slot=placed.slot,
            moved=placed.moved,
            model_name=session.model_name,
            previous=self._previous,
            bytes_sent=len(sent),
        )
        return request, previous_body, placed, sent

    def _failed(self, request: ModelRequest, error: ModelError, placed: placement.Placed, started: float) -> bool:
        """Record a request that failed, and learn from it; whether it goes again to another replica."""
        session = self.session
        _finish(request, error.partial, started=started, error=str(error))
        if isinstance(error, ModelUnavailable) and self._fail_over(placed):
            return True
        if isinstance(error, ModelContextExceeded) and error.n_ctx:
            window_learned(session.endpoint, error.n_ctx)
        elif isinstance(error, ModelContextExceeded):  # refused for length without saying the window
            endpoint_window(session.endpoint, model=session.model_name, refresh=True)
        elif isinstance(error, ModelUnavailable):  # it may come back restarted, with another window
            window_forget(session.endpoint)
        elif images_refused(error):
            images_learned(session.endpoint)
        if isinstance(error, ModelContextExceeded | ModelUnavailable):
            self._counter = None
        return False

    def _answered(
        self, request: ModelRequest, completion: Completion, built: BuiltRequest, previous_body: bytes
    ) -> RequestFinished:
        """Record the answer, and note the request's cache check (run once the session is let go)."""
        _finish(request, completion)
        finished = self._finished(request)
        if self._counter is not None:
            self._counter.learned(built.body, completion.prompt_tokens)
        previous_built = self._last_built if self._last_built and self._last_built.body == previous_body else None
        self._last_built = built
        spec = self._check_spec(request, built, previous_body, previous_built)
        if spec is not None:
            self._checks.append(replace(spec, bar=finished.place.index, previous_ttft=finished.place.previous_ttft))
        return finished

    def _finished(self, request: ModelRequest) -> RequestFinished:
        """``request``, finished, on the chart: its bar after the ones before, the totals with it."""
        tally = self._tally if self._tally is not None else ChartTally()
        place = BarPlace(tally.bars + 1, tally.last_time_to_first_token)
        self._tally = tally.plus(request)
        return RequestFinished(request, place, self._tally.totals)

    async def _ask(
        self, built: BuiltRequest, *, turn: Turn | None, step_number: int, kind: str
    ) -> AsyncGenerator[ReplyEvent | Completion, None]:
        """Record and send one request: its events as it goes, then the model's answer (a ``Completion``). The
        record comes first: where it fails, nothing is sent."""
        request, previous_body, placed, sent = await store(
            self._record_start, built, turn=turn, step_number=step_number, kind=kind
        )
        started = time.monotonic()
        answer = self._model_at(placed.url).stream(sent, cancel=self.cancel)
        answer.start()  # on its way while the events go out
        self._last_unkept = True
        self.requests.append(request)
        shown = turn if kind == RequestKind.REPLY else None  # a summary streams too, but is no step of the turn
        number = shown.number if shown is not None else 0
        streamed = _Streamed(saved_at=time.monotonic())
        if shown is not None:
            self.streamed = (number, step_number, streamed)
        failed_over = False
        try:
            yield RequestStarted(request)
            async with contextlib.aclosing(answer.__aiter__()) as pieces:
                async for piece in pieces:
                    if isinstance(piece, TextPiece):
                        streamed.text += piece.text
                        yield TextDelta(number, step_number, piece.text)
                    elif isinstance(piece, ReasoningPiece):
                        streamed.reasoning += piece.text
                        yield ReasoningDelta(number, step_number, piece.text)
                    elif isinstance(piece, ToolCallPiece):
                        yield ToolCalled(number, step_number, piece.name)
                    if shown is not None:
                        await self._save_draft(shown, step_number, streamed)
        except ModelError as error:
            failed_over = await store(self._failed, request, error, placed, started)
            yield self._finished(request)
            if not failed_over:
                raise
        except BaseException:  # the action was closed or cancelled: the request ends stopped
            await asyncio.shield(store(_finish, request, None, started=started, error=STOPPED))
            self._finished(request)
            raise
        finally:
            self.streamed = None
            await answer.aclose()
        if failed_over:  # nothing reached the server: the same request goes to another replica
            async with contextlib.aclosing(self._ask(built, turn=turn, step_number=step_number, kind=kind)) as events:
                async for item in events:
                    yield item
            return
        completion = answer.completion
        assert completion is not None, "a stream that ends without an error has its completion"
        yield await store(self._answered, request, completion, built, previous_body)
        yield completion

    def _check_spec(
        self, request: ModelRequest, built: BuiltRequest, previous_body: bytes, previous_built: BuiltRequest | None
    ) -> CheckSpec | None:
        """What the request's cache check needs, where one is due: what it should have found cached, and why
        the server reused less."""
        if self._given_model is not None or request.break_cause in _NOTHING_TO_CHECK or not previous_body:
            return None
        if not server_api.may_render(self.session.endpoint.base_url):
            return None
        return CheckSpec(
            request_id=request.pk,
            base_url=self.session.endpoint.base_url,
            previous_body=previous_body,
            body=built.body,
            promised_messages=built.messages_within(request.expected_shared_bytes),
            harness_break=request.break_cause == BreakCause.UNEXPECTED,
            previous_known=previous_built is not None,
        )

    async def _save_draft(self, turn: Turn, step_number: int, streamed: _Streamed) -> None:
        size = len(streamed.text) + len(streamed.reasoning)
        if size == streamed.saved_size:
            return
        now = time.monotonic()
        if now - streamed.saved_at >= DRAFT_SECONDS:
            streamed.saved_at, streamed.saved_size = now, size
            await store(
                step_draft_save, turn=turn, number=step_number, text=streamed.text, reasoning=streamed.reasoning
            )
            self._drafted.add((turn.pk, step_number))

    def _opened(self, turn: Turn) -> None:
        self._builder = RequestBuilder(self.session, model_name=self.session.model_name, current=turn)

    async def _reply(
        self, turn: Turn, *, again: bool = False, compact_first: bool = False
    ) -> AsyncGenerator[ReplyEvent, None]:
        """Run the reply to the open ``turn`` until the model answers without a tool call."""
        try:
            await store(self._opened, turn)  # before the turn is said started: a request asked then is the turn's
            yield TurnStarted(turn, again=again)
            if compact_first:
                async with contextlib.aclosing(self._compact_first(turn)) as events:
                    async for event in events:
                        yield event
            async with contextlib.aclosing(self._steps(turn)) as events:
                async for item in events:
                    if isinstance(item, Turn):
                        turn = item
                    else:
                        yield item
        except (RequestTooLarge, WorkspaceRefused, EndpointRefused) as error:
            turn = await store(turn_fail, turn=turn, error=str(error))
        except ModelCancelled as error:
            turn = await store(turn_fail, turn=turn, error=STOPPED, unstored=_partial_text(error), interrupted=True)
        except ModelError as error:
            said = f"{error} {prompts.loop_settings().images_refused_text}" if images_refused(error) else str(error)
            turn = await store(turn_fail, turn=turn, error=said, unstored=_partial_text(error))
        except DatabaseError:
            # Postgres went away: where it answers again, the turn ends interrupted with what had streamed;
            # where not, it stays open without a lock, and a worker's sweep ends it so once it is back.
            logger.warning("session %s: the database went away during turn %s", turn.session_id, turn.number)
            await store(close_old_connections)
            turn = await store(turn_fail, turn=turn, error=DATABASE_LOST, interrupted=True)
        except (GeneratorExit, asyncio.CancelledError):
            await asyncio.shield(store(turn_fail, turn=turn, error=STOPPED, interrupted=True))
            raise
        except Exception as error:
            logger.exception("session %s: the reply to turn %s failed", turn.session_id, turn.number)
            turn = await store(turn_fail, turn=turn, error=person_message(error))
            if not isinstance(error, StoreError):
                yield TurnEnded(turn)
                raise
        finally:
            self._builder = None
        yield TurnEnded(turn)

    def _step_stored(self, turn: Turn, step_number: int, completion: Completion) -> tuple[Any, list[StoredCall]]:
        calls = [
            StoredCall(id=_call_id(call, turn, step_number, position), name=call.name, arguments=call.arguments)
            for position, call in enumerate(completion.tool_calls)
        ]
        step = step_record(
            turn=turn,
            number=step_number,
            text=completion.text,
            reasoning=completion.reasoning,
            tool_calls=calls,
            finish_reason=completion.finish_reason,
            drafted=(turn.pk, step_number) in self._drafted,
            # Before a call that may change something runs, its step is on disk; a step that only reads or ends
            # the reply gets there with the next request's record or the turn's end.
            wait_for_disk=not all(only_reads(call["name"]) for call in calls),
        )
        assert self._builder is not None
        self._builder.add_assistant(step)
        return step, calls

    def _tool_ran(
        self,
        turn: Turn,
        step: Any,
        call: StoredCall,
        context: ToolContext,
        table: list[PriorResult],
        number: int,
    ) -> Result:
        # Every call, a read too, obeys what holds when it runs: the mode, the workspace's permissions, and
        # whether the owner may still use the workspace (one query).
        now = _as_now(context, self.session)
        arguments, outcome = call_tool(call["name"], call["arguments"], now)
        return self._inserted(turn, step, call, arguments, outcome, table, number)

    async def _mcp_ran(
        self,
        turn: Turn,
        step: Any,
        call: StoredCall,
        context: ToolContext,
        table: list[PriorResult],
        number: int,
    ) -> Result:
        """A call of an MCP server's tool, awaited here (the server answers over the network), its result
        inserted as any other's."""
        planned = await store(self._mcp_planned, call, context)
        if isinstance(planned, McpRefused):
            return await store(self._inserted, turn, step, call, planned.arguments, planned.outcome, table, number)
        outcome, listing = await mcp_outcome(planned, config=self.config, cancel=self.cancel)
        if listing is not None:
            await store(
                mcp_server_listed,
                server_id=planned.server_id,
                tools_json=listing.as_json(),
                instructions=listing.instructions,
            )
        return await store(self._inserted, turn, step, call, planned.arguments, outcome, table, number)

    def _mcp_planned(self, call: StoredCall, context: ToolContext) -> McpPlanned | McpRefused:
        now = _as_now(context, self.session)
        return mcp_planned(call["name"], call["arguments"], now, workspace_id=self.session.workspace_id)

    def _inserted(
        self,
        turn: Turn,
        step: Any,
        call: StoredCall,
        arguments: object,
        outcome: Outcome,
        table: list[PriorResult],
        number: int,
    ) -> Result:
        result = result_insert(
            turn=turn,
            step=step,
            call_id=call["id"],
            tool=call["name"],
            arguments=arguments,
            arguments_raw=call["arguments"],
            outcome=outcome,
            table=table,
            config=self.config,
            number=number,
        )
        table.append(prior_result(result))
        assert self._builder is not None
        self._builder.add_result(result)
        return result

    def _tooled(self, turn: Turn) -> tuple[list[PriorResult], ToolContext, int]:
        table: list[PriorResult] = reply_table(turn)
        context = tool_context(self.session, table=table, cancelled=self.cancel.is_set, config=self.config)
        return table, context, self.session.next_result_number  # only replies take result numbers, and this one
        # holds the lock

    def _built(self, turn: Turn) -> BuiltRequest:
        assert self._builder is not None
        built = self._builder.build()
        if settings.CACHET_CHECK_REQUESTS:
            _check_built(self.session, turn, built)
        return built

    async def _steps(self, turn: Turn) -> AsyncGenerator[ReplyEvent | Turn, None]:
        """The reply's steps; yields their events, then the turn as it ended."""
        table, context, result_number = await store(self._tooled, turn)
        for step_number in range(1, self.max_steps + 1):
            built = await store(self._built, turn)
            async with contextlib.aclosing(self._fitting(turn, built, step_number, table)) as events:
                async for item in events:
                    if isinstance(item, BuiltRequest):
                        built = item
                    else:
                        yield item
            completion: Completion | None = None
            async with contextlib.aclosing(
                self._ask(built, turn=turn, step_number=step_number, kind=RequestKind.REPLY)
            ) as events:
                async for asked in events:
                    if isinstance(asked, Completion):
                        completion = asked
                    else:
                        yield asked
            assert completion is not None
            step, calls = await store(self._step_stored, turn, step_number, completion)
            yield StepStored(step, turn.revision)
            if not calls:
                yield await store(turn_finish, turn=turn)
                return
            for call in calls:
                if self.cancel.is_set():
                    break
                if split_name(call["name"]) is not None and call["name"] in context.tools:
                    result = await self._mcp_ran(turn, step, call, context, table, result_number)
                else:
                    result = await store(self._tool_ran, turn, step, call, context, table, result_number)
                result_number = result.number + 1
                yield ResultStored(result, turn.revision)
            if self.cancel.is_set():
                raise ModelCancelled(STOPPED, url=self.session.endpoint.base_url)
        limit = prompts.loop_settings().step_limit_text.format(steps=self.max_steps)
        yield await store(turn_finish, turn=turn, unstored=limit)


def _finish(
    request: ModelRequest,
    got: Completion | None,
    *,
    started: float = 0.0,
    error: str = "",
    wait_for_disk: bool = False,
) -> None:
    """Complete ``request``'s row with what the server reported (all of it, or what came before ``error``)."""
    request_record_finish(
        request=request,
        prompt_tokens=got.prompt_tokens if got else None,
        cached_tokens=got.cached_tokens if got else None,
        completion_tokens=got.completion_tokens if got else None,
        time_to_first_token=got.time_to_first_token if got else None,
        total_time=got.total_time if got and not error else time.monotonic() - started,
        usage=got.usage if got else None,
        timings=got.timings if got else None,
        error=error,
        wait_for_disk=wait_for_disk,
    )
    placement.release(request, cached_tokens=got.cached_tokens if got else None)


def _as_now(context: ToolContext, session: ChatSession) -> ToolContext:
    """``context`` with the session's mode and its workspace's permissions as they are now: either can
    change while a reply runs, and a call obeys what holds when it runs. An owner removed from the workspace
    meanwhile ends the reply (``NotAMember``): the call is not run."""
    now = session_standing(session=session)
    if not now.member:
        raise NotAMember(session.workspace.name, during_reply=True)
    return replace(context, mode=now.mode, allow_commands=now.allow_commands, allow_network=now.allow_network)


def _partial_text(error: ModelError) -> str:
    return error.partial.text if error.partial is not None else ""


def _check_built(session: ChatSession, turn: Turn, built: BuiltRequest) -> None:
    """In tests: the request grown step by step is the one the store gives when read afresh."""
    fresh = build_request(session, current=turn, model_name=session.model_name)
    if fresh.body != built.body:
        raise AssertionError(f"session {session.pk} turn {turn.number}: the request built step by step differs")
