"""The reply loop: build the request from the store, ask the model, run its tool calls, repeat.

Everything the model says and every result is stored before the next thing that can fail. The loop is
synchronous and runs in its own thread in the web process (and in the foreground for ``manage.py ask``);
it reports progress through ``ReplyEvents`` so the web side can stream it to every open tab.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from chat.agent import model_client
from chat.agent.model_client import Completion, ModelCancelled, ModelError, Timeouts, ToolCall
from chat.agent.workspace import read_instructions, restore_files, tool_context
from chat.tools import call_tool
from sessions_app import prompts
from sessions_app.errors import EmptySummary
from sessions_app.models import ChatSession, ModelRequest, RequestKind, Result, Step, Turn
from sessions_app.selectors.requests import BuiltRequest, build_request
from sessions_app.selectors.sessions import last_live_turn
from sessions_app.services.compaction import compaction_apply
from sessions_app.services.locks import reply_lock, reply_running
from sessions_app.services.requests import request_record_finish, request_record_start
from sessions_app.services.results import result_insert
from sessions_app.services.turns import (
    step_record,
    turn_fail,
    turn_finish,
    turn_start,
)
from sessions_app.services.undo import TakenBack, turn_regenerate, turn_rewind, turn_undo

__all__ = ["ReplyEvents", "ReplyLoop", "ReplyOutcome", "reply_lock", "reply_running", "today"]


@dataclass
class ReplyEvents:
    """Callbacks the loop calls as a reply goes on; each defaults to doing nothing."""

    turn_started: Callable[[Turn], None] = lambda turn: None
    request_started: Callable[[ModelRequest], None] = lambda request: None
    request_finished: Callable[[ModelRequest], None] = lambda request: None
    text: Callable[[str], None] = lambda delta: None
    reasoning: Callable[[str], None] = lambda delta: None
    tool_call: Callable[[ToolCall], None] = lambda call: None
    step_finished: Callable[[Step], None] = lambda step: None
    result: Callable[[Result], None] = lambda result: None
    turn_finished: Callable[[Turn], None] = lambda turn: None


@dataclass
class ReplyOutcome:
    turn: Turn


def today() -> str:
    """The date the notes state: ``CACHET_TODAY`` where set, else the server's local date."""
    return str(settings.CACHET_TODAY or timezone.localdate().isoformat())


def timeouts() -> Timeouts:
    return Timeouts(
        connect=settings.CACHET_CONNECT_TIMEOUT,
        first_token=settings.CACHET_FIRST_TOKEN_TIMEOUT,
        between_chunks=settings.CACHET_CHUNK_TIMEOUT,
    )


class CancelWatch:
    """Sets ``event`` when the turn's stop flag is set in the database (a Stop from any process)."""

    def __init__(self, turn: Turn, event: threading.Event, interval: float = 0.3) -> None:
        self.turn_id = turn.pk
        self.event = event
        self.interval = interval
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name=f"cancel-watch-{turn.pk}", daemon=True)

    def _watch(self) -> None:
        try:
            while not self.done.wait(self.interval):
                if Turn.objects.filter(pk=self.turn_id, cancel_requested=True).exists():
                    self.event.set()
                    return
        finally:
            connection.close()

    def __enter__(self) -> CancelWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=2)


def _reply_text(turn: Turn, extra: str = "") -> str:
    texts = [step.text for step in turn.steps.order_by("number") if step.text]
    if extra:
        texts.append(extra)
    return "\n\n".join(texts)


def _call_id(call: ToolCall, turn: Turn, step_number: int, position: int) -> str:
    return call.id or f"call_{turn.number}_{step_number}_{position}"


class ReplyLoop:
    """Runs replies for one session; ``cancel`` stops the one running."""

    def __init__(
        self,
        session: ChatSession,
        *,
        events: ReplyEvents | None = None,
        cancel: threading.Event | None = None,
        max_steps: int | None = None,
        client_timeouts: Timeouts | None = None,
    ) -> None:
        self.session = session
        self.events = events or ReplyEvents()
        self.cancel = cancel or threading.Event()
        self.max_steps = max_steps or settings.CACHET_MAX_STEPS or int(prompts.loop_settings()["max_steps"])
        self.timeouts = client_timeouts or timeouts()
        self.requests: list[ModelRequest] = []

    def _refresh(self) -> ChatSession:
        self.session = ChatSession.objects.select_related("workspace", "endpoint").get(pk=self.session.pk)
        return self.session

    def _ask(self, built: BuiltRequest, *, turn: Turn | None, step_number: int, kind: str) -> Completion:
        session = self.session
        request = request_record_start(
            session=session,
            turn=turn,
            step_number=step_number,
            kind=kind,
            built=built,
            endpoint_url=session.endpoint.base_url,
            model_name=session.model_name,
        )
        self.requests.append(request)
        self.events.request_started(request)
        started = time.monotonic()
        try:
            completion = model_client.stream_chat(
                base_url=session.endpoint.base_url,
                api_key=session.endpoint.api_key or None,
                body=built.body,
                timeouts=self.timeouts,
                on_text=self.events.text,
                on_reasoning=self.events.reasoning,
                on_tool_call=self.events.tool_call,
                cancel=self.cancel,
            )
        except ModelError as error:
            partial = error.partial
            request_record_finish(
                request=request,
                prompt_tokens=partial.prompt_tokens if partial else None,
                cached_tokens=partial.cached_tokens if partial else None,
                completion_tokens=partial.completion_tokens if partial else None,
                time_to_first_token=partial.time_to_first_token if partial else None,
                total_time=time.monotonic() - started,
                usage=partial.usage if partial else None,
                timings=partial.timings if partial else None,
                error=str(error),
            )
            self.events.request_finished(request)
            raise
        request_record_finish(
            request=request,
            prompt_tokens=completion.prompt_tokens,
            cached_tokens=completion.cached_tokens,
            completion_tokens=completion.completion_tokens,
            time_to_first_token=completion.time_to_first_token,
            total_time=completion.total_time,
            usage=completion.usage,
            timings=completion.timings,
        )
        self.events.request_finished(request)
        return completion

    def send(self, words: str, *, date: str | None = None) -> ReplyOutcome:
        """Store the person's message as a new turn, then run the reply to it."""
        with reply_lock(self.session):
            self._refresh()
            self._auto_compact()
            turn = turn_start(
                session=self.session,
                words=words,
                today=date or today(),
                instructions=read_instructions(self.session),
            )
            self.events.turn_started(turn)
            return self._run(turn)

    def regenerate(self, *, restore: bool = False) -> tuple[ReplyOutcome, list[str]]:
        """Take back the last reply and ask again with the same stored message."""
        with reply_lock(self.session):
            self._refresh()
            taken, turn = turn_regenerate(session=self.session)
            conflicts = self._restore(taken) if restore else []
            self.events.turn_started(turn)
            return self._run(turn), conflicts

    def undo(self, *, restore: bool = False) -> tuple[TakenBack, list[str]]:
        with reply_lock(self.session):
            taken = turn_undo(session=self._refresh())
            return taken, self._restore(taken) if restore else []

    def rewind(self, number: int, *, restore: bool = False) -> tuple[TakenBack, list[str]]:
        with reply_lock(self.session):
            taken = turn_rewind(session=self._refresh(), number=number)
            return taken, self._restore(taken) if restore else []

    def compact(self) -> str:
        """Ask the model for a summary as the next step of the conversation and start a new generation."""
        with reply_lock(self.session):
            self._refresh()
            return self._compact()

    def _restore(self, taken: TakenBack) -> list[str]:
        report = restore_files(self.session, taken.edits)
        return report.conflicts

    def _compact(self) -> str:
        built = build_request(
            self.session, current=None, model_name=self.session.model_name, extra_user=prompts.compact_task()
        )
        completion = self._ask(built, turn=None, step_number=0, kind=RequestKind.COMPACTION)
        if not completion.text.strip():
            raise EmptySummary()
        generation = compaction_apply(session=self.session, summary=completion.text)
        self._refresh()
        return generation.system_prompt

    def _auto_compact(self) -> None:
        last = ModelRequest.objects.filter(session=self.session, prompt_tokens__isnull=False).order_by("-id").first()
        if last is None or last.kind == RequestKind.COMPACTION or last_live_turn(self.session) is None:
            return
        threshold = prompts.rules_config().compaction_auto_at * self.session.endpoint.context_window
        if last.prompt_tokens is not None and last.prompt_tokens > threshold:
            with contextlib.suppress(EmptySummary, ModelError):
                self._compact()

    def _run(self, turn: Turn) -> ReplyOutcome:
        outcome = ReplyOutcome(turn=turn)
        try:
            with CancelWatch(turn, self.cancel):
                outcome.turn = self._steps(turn)
        except ModelCancelled as error:
            partial = error.partial.text if error.partial else ""
            outcome.turn = turn_fail(
                turn=turn, error="Stopped.", reply_text=_reply_text(turn, partial), interrupted=True
            )
        except ModelError as error:
            partial = error.partial.text if error.partial else ""
            outcome.turn = turn_fail(turn=turn, error=str(error), reply_text=_reply_text(turn, partial))
        except Exception as error:
            outcome.turn = turn_fail(turn=turn, error=f"Cachet failed: {error}", reply_text=_reply_text(turn))
            self.events.turn_finished(outcome.turn)
            raise
        self.events.turn_finished(outcome.turn)
        return outcome

    def _steps(self, turn: Turn) -> Turn:
        session = self.session
        for step_number in range(1, self.max_steps + 1):
            built = build_request(session, current=turn, model_name=session.model_name)
            completion = self._ask(built, turn=turn, step_number=step_number, kind=RequestKind.REPLY)
            calls: list[dict[str, Any]] = [
                {
                    "id": _call_id(call, turn, step_number, position),
                    "name": call.name,
                    "arguments": call.arguments,
                }
                for position, call in enumerate(completion.tool_calls)
            ]
            step = step_record(
                turn=turn,
                text=completion.text,
                reasoning=completion.reasoning,
                tool_calls=calls,
                finish_reason=completion.finish_reason,
            )
            self.events.step_finished(step)
            if not calls:
                return turn_finish(turn=turn, reply_text=_reply_text(turn))
            for call in calls:
                session = self._refresh()
                context = tool_context(session, turn, cancelled=self.cancel.is_set)
                arguments, outcome = call_tool(call["name"], call["arguments"], context)
                result = result_insert(
                    turn=turn,
                    step=step,
                    call_id=call["id"],
                    tool=call["name"],
                    arguments=arguments,
                    arguments_raw=call["arguments"],
                    outcome=outcome,
                )
                self.events.result(result)
            if self.cancel.is_set():
                raise ModelCancelled("Stopped.", url=session.endpoint.base_url)
        limit = str(prompts.loop_settings()["step_limit_text"]).format(steps=self.max_steps)
        return turn_finish(turn=turn, reply_text=_reply_text(turn, limit))
