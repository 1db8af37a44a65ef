"""The reply loop: build the request from the store, ask the model, run its tool calls, repeat.

Each action (send, regenerate, edit, flip, undo, rewind, compact) is a generator of typed events (``chat.agent.events``)
that holds the session's reply lock while it is iterated: ``manage.py ask`` prints the events, the web side
publishes them to the session's tabs, and the conformance runner checks them. Everything the model says
and every result is stored before the next thing that can fail; the text of the step being streamed is
saved as it comes.

Iterate an action to its end (or ``close()`` it) in the thread that started it: the lock belongs to that
thread's database connection.

Between two requests of a reply the server waits only for what the next request needs (the step and its results
stored, the request recorded); the answer's record and the events of the step and its results follow once the next
request is sent. That record's commit is the one that waits for the disk, so the flush of what the step stored
is not between the model's answer and the next request either (``sessions_app.services.durability``).

A finished request's cache check asks the server to render and tokenize the prompt (up to a second or more on
a long one), so it runs on a worker thread beside the reply; its result is stored by the loop's own thread
when the next request starts and, at the latest, when the action ends.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from chat.agent import placement, server_api
from chat.agent.budget import RequestCounter, RequestTooLarge, endpoint_window, window_forget, window_learned
from chat.agent.cache_check import CacheCheck, check_request
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
)
from chat.agent.model import (
    Cancel,
    Completion,
    HttpModel,
    Idle,
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
from sessions_app.errors import EmptySummary, NotAMember, StoreError, WorkspaceRefused, person_message
from sessions_app.hygiene import PriorResult
from sessions_app.hygiene.config import ContextConfig
from sessions_app.models import BreakCause, ChatSession, ModelRequest, RequestKind, Turn
from sessions_app.selectors.requests import (
    BuiltRequest,
    PreviousRequest,
    RequestBuilder,
    build_request,
    previous_request,
)
from sessions_app.selectors.sessions import (
    current_generation,
    history_turns,
    session_by_id,
    session_standing,
    workspace_refusal,
)
from sessions_app.services.compaction import compaction_apply
from sessions_app.services.locks import reply_lock
from sessions_app.services.requests import (
    request_last_keep,
    request_record_cache_check,
    request_record_finish,
    request_record_start,
)
from sessions_app.services.results import prior_result, reply_table, result_insert
from sessions_app.services.turns import (
    message_preview,
    step_draft_save,
    step_record,
    turn_fail,
    turn_finish,
    turn_start,
)
from sessions_app.services.undo import (
    TakenBack,
    branch_flip,
    turn_edit,
    turn_regenerate,
    turn_rewind,
    turn_undo,
)
from sessions_app.types import StoredCall

logger = logging.getLogger(__name__)

DRAFT_SECONDS = 1.0
STOPPED = "Stopped."
DATABASE_LOST = "The database went away during the reply; what it had written is kept. Send again or regenerate."
CHECK_WORKERS = 4
CHECK_WAIT_SECONDS = 30.0
_NOTHING_TO_CHECK = (BreakCause.FIRST, BreakCause.MODEL_CHANGE, BreakCause.RESTART)

_checker: ThreadPoolExecutor | None = None
_checker_lock = threading.Lock()


def _cache_checker() -> ThreadPoolExecutor:
    """The threads that run cache checks, started on first use."""
    global _checker
    with _checker_lock:
        if _checker is None:
            _checker = ThreadPoolExecutor(max_workers=CHECK_WORKERS, thread_name_prefix="cachet-cache-check")
        return _checker


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


@dataclass(frozen=True)
class _PendingCheck:
    request: ModelRequest
    check: Future[CacheCheck | None]


@dataclass(frozen=True)
class _Answered:
    """A request whose answer is in, recorded once the next request is on its way."""

    request: ModelRequest
    completion: Completion
    built: BuiltRequest
    previous_body: bytes
    previous_built: BuiltRequest | None  # the request sent before, where its bytes are ``previous_body``


@dataclass
class _Streamed:
    """What the step being asked has streamed so far."""

    text: str = ""
    reasoning: str = ""
    saved_at: float = 0.0
    saved_size: int = 0


class ReplyLoop:
    """Runs the actions of one session; ``cancel`` stops the one running."""

    def __init__(
        self,
        session: ChatSession,
        *,
        model: Model | None = None,
        cancel: threading.Event | None = None,
        config: ContextConfig | None = None,
        date: str | None = None,
        max_steps: int | None = None,
        client_timeouts: Timeouts | None = None,
        waiting: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        """``waiting`` is entered around every wait on something outside the process (the model's answer, a
        tool, a cache check): the web process lets another reply do its own work meanwhile."""
        self.session = session
        self.waiting = waiting
        self.cancel = cancel or Cancel()  # a ``Cancel`` wakes a wait on the model at once
        self.config = config or prompts.rules_config()
        self.date = date
        self.max_steps = max_steps or settings.CACHET_MAX_STEPS or prompts.loop_settings().max_steps
        self.timeouts = client_timeouts or timeouts()
        self.requests: list[ModelRequest] = []
        self._given_model = model
        self._previous: PreviousRequest | None = None
        self._last_built: BuiltRequest | None = None  # the last request this loop sent whole
        self._builder: RequestBuilder | None = None
        self._history: RequestBuilder | None = None  # the next turn's history, read for the compaction check
        self._open: Turn | None = None
        self._counter: RequestCounter | None = None
        self._window_asked = False  # asked again in this action, before compacting or refusing for size
        self._placed: placement.Placed | None = None  # where this action's last request went
        self._avoid: frozenset[str] = frozenset()  # replicas this action could not reach
        self._checks: list[_PendingCheck] = []
        self._last_unkept = False
        self._client: ModelClient | None = None
        self._drafted: set[tuple[int, int]] = set()
        self._held: list[ReplyEvent | _Answered] = []

    # --- holding the session ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with reply_lock(self.session):
            self._refresh()
            refused = workspace_refusal(session=self.session)  # the owner removed, or the folder now forbidden
            if refused is not None:
                raise refused
            try:
                yield
            finally:
                self._settle()
                for _checked in self._checks_stored(wait=True):
                    pass
                self._keep_last_request()
                if self._client is not None:
                    self._client.close()
                    self._client = None
                self._previous = None
                self._builder = None
                self._history = None
                self._open = None
                self._counter = None
                self._window_asked = False
                self._placed = None
                self._avoid = frozenset()

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

    @property
    def model(self) -> Model:
        return self._model_at(self.session.endpoint.base_url)

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

    def send(self, words: str, *, date: str | None = None) -> Iterator[ReplyEvent]:
        """Store the person's message as a new turn, then run the reply to it."""
        with self._locked():
            day = date or self.date or today()
            instructions = read_instructions(self.session)
            yield from self._auto_compact(words, day, instructions)
            turn = turn_start(
                session=self.session, words=words, today=day, instructions=instructions, config=self.config
            )
            yield from self._reply(turn)

    def regenerate(self, *, restore: bool = False) -> Iterator[ReplyEvent]:
        """Take back the last reply and ask again with the same stored message."""
        with self._locked():
            taken, turn = turn_regenerate(
                session=self.session,
                today=self.date or today(),
                instructions=read_instructions(self.session),
                config=self.config,
            )
            self._refresh()
            yield self._taken_back(taken, restore=restore)
            yield from self._reply(turn, again=True)

    def edit(
        self, turn_number: int, words: str, *, restore: bool = False, date: str | None = None
    ) -> Iterator[ReplyEvent]:
        """Start a new branch from live turn ``turn_number`` with ``words`` in its place, then run the reply."""
        with self._locked():
            taken, turn = turn_edit(
                session=self.session,
                turn=turn_number,
                words=words,
                today=date or self.date or today(),
                instructions=read_instructions(self.session),
                config=self.config,
            )
            self._refresh()
            yield self._taken_back(taken, restore=restore)
            yield from self._reply(turn)

    def flip(self, turn_number: int) -> Iterator[ReplyEvent]:
        """Make the branch through turn ``turn_number`` the live one."""
        with self._locked():
            flipped = branch_flip(session=self.session, turn=turn_number)
            yield BranchFlipped(
                taken_back=tuple(flipped.taken_back),
                made_live=tuple(flipped.made_live),
                compactions_taken_back=tuple(flipped.compactions_taken_back),
                compactions_made_live=tuple(flipped.compactions_made_live),
            )

    def undo(self, *, restore: bool = False) -> Iterator[ReplyEvent]:
        """Take back the last live turn."""
        with self._locked():
            yield self._taken_back(turn_undo(session=self.session), restore=restore)

    def rewind(self, number: int, *, restore: bool = False) -> Iterator[ReplyEvent]:
        """Take back turn ``number`` and every later live turn."""
        with self._locked():
            yield self._taken_back(turn_rewind(session=self.session, number=number), restore=restore)

    def compact(self) -> Iterator[ReplyEvent]:
        """Ask the model for a summary as the next step of the conversation and start a new generation."""
        with self._locked():
            yield from self._compact()
            yield from self._checks_stored(wait=True)

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

    def _compact(
        self,
        built: BuiltRequest | None = None,
        *,
        within: Turn | None = None,
        after_step: int | None = None,
        step_number: int = 0,
    ) -> Iterator[ReplyEvent]:
        """Ask for the summary with ``built`` (by default the next turn's history and the task), then start the
        new generation; ``within`` and ``after_step`` say how much of a running reply it covers."""
        if built is None:
            built = build_request(
                self.session, current=None, model_name=self.session.model_name, extra_user=prompts.compact_task()
            )
        completion = yield from self._ask(built, turn=within, step_number=step_number, kind=RequestKind.COMPACTION)
        if not completion.text.strip():
            raise EmptySummary()
        generation = compaction_apply(
            session=self.session,
            summary=completion.text,
            config=self.config,
            within=within,
            after_step=after_step,
            # the reply goes on in the new generation with its message carrying the full note, as of now
            today=(self.date or today()) if within is not None else None,
            instructions=read_instructions(self.session) if within is not None else None,
        )
        self._refresh()
        yield Compacted(generation)

    def _auto_compact(self, words: str, day: str, instructions: str | None) -> Iterator[ReplyEvent]:
        """Compact first where the turn's first request, as counted now, would pass ``compaction.auto_at``."""
        if not history_turns(self.session).exists():
            return
        message = message_preview(
            session=self.session,
            words=words,
            today=day,
            instructions=instructions,
            config=self.config,
        )
        counter = self.counter
        history = RequestBuilder(self.session, model_name=self.session.model_name, current=None)
        first = history.build(extra_user=message)
        if counter.past_threshold(counter.count(first)) and self._window_grew():
            counter = self.counter
        if not counter.past_threshold(counter.count(first)):
            self._history = history  # the turn's first request starts from the same history, read once
            return
        built = history.build(extra_user=prompts.compact_task())
        if not counter.fits(counter.count(built)):
            self._history = history
            return  # the turn's first step finds it does not fit either, and says what to do
        try:
            yield from self._compact(built)
        except (EmptySummary, ModelError) as error:
            yield Notice(f"Could not compact before this turn: {error}", level="warning")

    def _fitting(
        self, turn: Turn, built: BuiltRequest, step_number: int, table: list[PriorResult]
    ) -> Generator[ReplyEvent, None, BuiltRequest]:
        """``built`` where it fits the window; else the reply is compacted, covering as many of its steps as
        the summary request can carry, and goes on from the summary; where nothing fits, ``RequestTooLarge``."""
        counter = self.counter
        size = counter.count(built)
        if counter.fits(size) or size.how == "guess":
            return built  # a guess, with nothing measured yet, does not refuse: the server judges
        if self._window_grew():
            counter = self.counter
            size = counter.count(built)
            if counter.fits(size):
                return built
        generation = current_generation(self.session)
        resumed = generation.resumes_after_step if generation.covers_through_turn == turn.number else None
        candidates: list[int] = list(range(step_number - 2, (resumed if resumed is not None else -1), -1))
        if resumed is None and history_turns(self.session).filter(number__lt=turn.number).exists():
            candidates.append(-1)
        for upto in candidates:
            builder = RequestBuilder(self.session, model_name=self.session.model_name, current=turn, upto_step=upto)
            summary_request = builder.build(extra_user=prompts.compact_task())
            if not counter.fits(counter.count(summary_request)):
                continue
            after_step = upto if upto >= 0 else None
            yield from self._compact(summary_request, within=turn, after_step=after_step, step_number=step_number)
            self._builder = RequestBuilder(self.session, model_name=self.session.model_name, current=turn)
            table.clear()  # §7: after any compaction the dedupe table is empty, though the request carries steps
            built = self._builder.build()
            size = counter.count(built)
            if counter.fits(size):
                return built
            break
        raise counter.too_large(size)

    def _ask(
        self, built: BuiltRequest, *, turn: Turn | None, step_number: int, kind: str, hold: bool = False
    ) -> Generator[ReplyEvent, None, Completion]:
        """Send and record one request; yields its events and returns the model's answer.

        The request goes out while its record is written (a record that fails stops it). What waits for a
        request to be on its way (the record of the answer before it, the events of the step and results stored
        since) follows as soon as this one is sent, so the model server is not kept idle by bookkeeping; with
        ``hold``, this answer's record waits in turn for the next request. Finished cache checks are stored while
        the model is quiet (an ``Idle`` piece), else when the action ends: never between an answer and the next
        request."""
        session = self.session
        if self._previous is None:
            self._previous = previous_request(session)
        else:  # only this action's own writes add breaks while it holds the lock, and they refresh the session
            self._previous = replace(self._previous, pending=tuple(session.pending_breaks or ()))
        previous_body = self._previous.body
        placed = self._place()
        started = time.monotonic()
        sent = placement.placed_body(sampled_body(built.body, session, kind=kind), placed)
        answer = self._model_at(placed.url).stream(sent, cancel=self.cancel)
        answer.start(wait=False)  # on its way while its record is written
        try:
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
        except BaseException:
            answer.close()
            raise
        self._last_unkept = True
        self.requests.append(request)
        shown = turn if kind == RequestKind.REPLY else None  # a summary streams too, but is no step of the turn
        number = shown.number if shown is not None else 0
        streamed = _Streamed(saved_at=time.monotonic())
        failed_over = False
        try:
            with self.waiting():  # from the request on: what runs meanwhile waits for the model anyway
                answer.start()
                yield from self._release(flush=True)
                yield RequestStarted(request)
                for piece in answer:
                    if isinstance(piece, Idle):  # the model computes: store the checks done meanwhile
                        yield from self._checks_stored(wait=False)
                    elif isinstance(piece, TextPiece):
                        streamed.text += piece.text
                        yield TextDelta(number, step_number, piece.text)
                    elif isinstance(piece, ReasoningPiece):
                        streamed.reasoning += piece.text
                        yield ReasoningDelta(number, step_number, piece.text)
                    elif isinstance(piece, ToolCallPiece):
                        yield ToolCalled(number, step_number, piece.name)
                    if shown is not None:
                        self._save_draft(shown, step_number, streamed, idle=isinstance(piece, Idle))
        except GeneratorExit:
            _finish(request, None, started=started, error=STOPPED)
            raise
        except ModelError as error:
            _finish(request, error.partial, started=started, error=str(error))
            if isinstance(error, ModelUnavailable) and self._fail_over(placed):
                failed_over = True
            elif isinstance(error, ModelContextExceeded) and error.n_ctx:
                window_learned(session.endpoint, error.n_ctx)
                self._counter = None
            elif isinstance(error, ModelContextExceeded):  # refused for length without saying the window
                endpoint_window(session.endpoint, model=session.model_name, refresh=True)
                self._counter = None
            elif isinstance(error, ModelUnavailable):  # it may come back restarted, with another window
                window_forget(session.endpoint)
                self._counter = None
            yield RequestFinished(request)
            if not failed_over:
                raise
        finally:
            answer.close()
        if failed_over:  # nothing reached the server: the same request goes to another replica
            return (yield from self._ask(built, turn=turn, step_number=step_number, kind=kind, hold=hold))
        completion = answer.completion
        assert completion is not None, "a stream that ends without an error has its completion"
        if self._counter is not None:
            self._counter.learned(built.body, completion.prompt_tokens)
        previous_built = self._last_built if self._last_built and self._last_built.body == previous_body else None
        self._last_built = built
        answered = _Answered(request, completion, built, previous_body, previous_built)
        if hold:
            self._held.append(answered)
        else:
            yield from self._answered(answered)
        return completion

    def _answered(self, answered: _Answered, *, wait_for_disk: bool = False) -> Iterator[ReplyEvent]:
        request = answered.request
        _finish(request, answered.completion, wait_for_disk=wait_for_disk)
        self._check_cache(request, answered.built, answered.previous_body, answered.previous_built)
        yield RequestFinished(request)

    def _release(self, *, flush: bool = False) -> Iterator[ReplyEvent]:
        """Record the held answers and yield the held events, in order. With ``flush`` (a request was just
        sent), the first answer's record waits for the disk, and so brings there the step, its results and the
        request stored since the last commit that did, before the model's next answer is read."""
        while self._held:
            item = self._held.pop(0)
            if isinstance(item, _Answered):
                yield from self._answered(item, wait_for_disk=flush)
                flush = False
            else:
                yield item

    def _release_after_failure(self) -> Iterator[ReplyEvent]:
        try:
            yield from self._release()
        except Exception:
            logger.exception("session %s: could not record the last answer", self.session.pk)
            self._held.clear()

    def _settle(self) -> None:
        """Record the held answers where their events can no longer be yielded (the action was closed)."""
        held, self._held = self._held, []
        for item in held:
            if isinstance(item, _Answered):
                try:
                    _finish(item.request, item.completion)
                except Exception:
                    logger.exception("session %s: could not record request %s", self.session.pk, item.request.pk)

    def _check_cache(
        self, request: ModelRequest, built: BuiltRequest, previous_body: bytes, previous_built: BuiltRequest | None
    ) -> None:
        """After the answer, beside the reply: what the request should have found cached, and why the server
        reused less."""
        if self._given_model is not None or request.break_cause in _NOTHING_TO_CHECK:
            return
        endpoint = self.session.endpoint
        if not server_api.may_render(endpoint.base_url):
            return
        promised = built.messages_within(request.expected_shared_bytes)
        check = _cache_checker().submit(
            check_request,
            base_url=endpoint.base_url,
            api_key=endpoint.api_key or None,
            previous_body=previous_body,
            body=built.body,
            messages=built.messages,
            tools=built.tools,
            previous_messages=previous_built.messages if previous_built is not None else None,
            previous_tools=previous_built.tools if previous_built is not None else (),
            promised_messages=promised,
            harness_break=request.break_cause == BreakCause.UNEXPECTED,
            reported_cached=request.cached_tokens,
        )
        self._checks.append(_PendingCheck(request, check))

    def _checks_stored(self, *, wait: bool) -> Iterator[CacheChecked]:
        """Store the cache checks that are done (with ``wait``, all of them); a check that fails is logged and
        fails nothing else."""
        pending: list[_PendingCheck] = []
        for item in self._checks:
            if not wait and not item.check.done():
                pending.append(item)
                continue
            request = item.request
            try:
                if not item.check.done():
                    with self.waiting():
                        futures.wait([item.check], timeout=CHECK_WAIT_SECONDS)
                check = item.check.result(timeout=0)
                if check is None:
                    continue
                request_record_cache_check(
                    request=request,
                    expected_cached_tokens=check.expected_cached,
                    miss=check.miss,
                    tokens_lost=check.tokens_lost,
                    message=check.message,
                    before=check.before,
                    after=check.after,
                )
            except Exception:
                logger.exception("session %s: the cache check of request %s failed", request.session_id, request.pk)
                continue
            yield CacheChecked(request)
        self._checks = pending

    def _save_draft(self, turn: Turn, step_number: int, streamed: _Streamed, *, idle: bool) -> None:
        size = len(streamed.text) + len(streamed.reasoning)
        if size == streamed.saved_size:
            return
        now = time.monotonic()
        if idle or now - streamed.saved_at >= DRAFT_SECONDS:
            step_draft_save(turn=turn, number=step_number, text=streamed.text, reasoning=streamed.reasoning)
            streamed.saved_at, streamed.saved_size = now, size
            self._drafted.add((turn.pk, step_number))

    def _reply(self, turn: Turn, *, again: bool = False) -> Iterator[ReplyEvent]:
        """Run the reply to the open ``turn`` until the model answers without a tool call."""
        self._open = turn
        history, self._history = self._history, None
        if history is not None and history.generation.pk == turn.generation_id:
            history.open(turn)
            self._builder = history
        else:
            self._builder = RequestBuilder(self.session, model_name=self.session.model_name, current=turn)
        yield TurnStarted(turn, again=again)
        try:
            turn = yield from self._steps(turn)
        except (RequestTooLarge, WorkspaceRefused) as error:
            turn = turn_fail(turn=turn, error=str(error))
        except ModelCancelled as error:
            turn = turn_fail(turn=turn, error=STOPPED, unstored=_partial_text(error), interrupted=True)
        except ModelError as error:
            turn = turn_fail(turn=turn, error=str(error), unstored=_partial_text(error))
        except GeneratorExit:
            turn_fail(turn=turn, error=STOPPED, interrupted=True)
            raise
        except DatabaseError:
            # Postgres went away: where it answers again, the turn ends interrupted with what had streamed;
            # where not, it stays open without a lock, and a worker's sweep ends it so once it is back.
            logger.warning("session %s: the database went away during turn %s", turn.session_id, turn.number)
            close_old_connections()
            turn = turn_fail(turn=turn, error=DATABASE_LOST, interrupted=True)
        except Exception as error:
            logger.exception("session %s: the reply to turn %s failed", turn.session_id, turn.number)
            turn = turn_fail(turn=turn, error=person_message(error))
            if not isinstance(error, StoreError):
                yield from self._release_after_failure()
                yield TurnEnded(turn)
                raise
        finally:
            self._open = None
            self._builder = None
        yield from self._release_after_failure()
        yield TurnEnded(turn)
        yield from self._checks_stored(wait=True)

    def _steps(self, turn: Turn) -> Generator[ReplyEvent, None, Turn]:
        session = self.session
        builder = self._builder
        assert builder is not None
        table: list[PriorResult] = reply_table(turn)
        context = tool_context(session, table=table, cancelled=self.cancel.is_set, config=self.config)
        result_number = session.next_result_number  # only replies take result numbers, and this one holds the lock
        for step_number in range(1, self.max_steps + 1):
            built = builder.build()
            if settings.CACHET_CHECK_REQUESTS:
                _check_built(self.session, turn, built)
            built = yield from self._fitting(turn, built, step_number, table)
            builder = self._builder
            assert builder is not None
            completion = yield from self._ask(
                built, turn=turn, step_number=step_number, kind=RequestKind.REPLY, hold=True
            )
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
                # Before a call that may change something runs, its step is on disk; a step that only reads
                # or ends the reply gets there with the next request's record or the turn's end.
                wait_for_disk=not all(only_reads(call["name"]) for call in calls),
            )
            builder.add_assistant(step)
            if not calls:
                yield from self._release()
                yield StepStored(step, turn.revision)
                return turn_finish(turn=turn)
            self._held.append(StepStored(step, turn.revision))  # its events follow once the next request is sent
            for call in step.tool_calls:
                if self.cancel.is_set():
                    break
                # Every call, a read too, obeys what holds when it runs: the mode, the workspace's permissions,
                # and whether the owner may still use the workspace (one query).
                now = _as_now(context, session)
                with self.waiting():
                    arguments, outcome = call_tool(call["name"], call["arguments"], now)
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
                    number=result_number,
                )
                result_number = result.number + 1
                table.append(prior_result(result))
                builder.add_result(result)
                self._held.append(ResultStored(result, turn.revision))
            if self.cancel.is_set():
                raise ModelCancelled(STOPPED, url=self.model.url)
        yield from self._release()
        limit = prompts.loop_settings().step_limit_text.format(steps=self.max_steps)
        return turn_finish(turn=turn, unstored=limit)


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
    placement.release(request)


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
