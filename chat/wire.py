"""The typed events on the wire: what a worker publishes of a session's actions, and every web process and
terminal following the session reads. One JSON object per event, ``{"type": "cachet.event", "event": NAME,
"session": ID, ...}``, its fields given by ``SCHEMAS[NAME]`` and checked by :func:`checked` on both sides (as
Zulip checks the events it sends). Stored things travel as ids, read from the store by whoever shows them;
streamed text travels as it came.

Made by :func:`event_message` from the reply loop's events (``chat.agent.events``) and by the job's own
(:func:`job_message`, :func:`words_back_message`, :func:`live_message`, :func:`job_ended_message`); sent by the one
publish function of each kind of process (``chat.worker.publish`` in workers, ``chat.web.tabs`` in web processes).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chat.agent.events import (
    BranchFlipped,
    CacheChecked,
    Compacted,
    Notice,
    ReplyEvent,
    RequestFinished,
    RequestStarted,
    ResultStored,
    StepStored,
    Titled,
    ToolCalled,
    TurnEnded,
    TurnsTakenBack,
    TurnStarted,
    taken_back_text,
)

EVENT = "cachet.event"
SENT = "sent"  # the publisher's wall clock (``time.time()``) as the event left it: every event may carry it
STOP = "reply.stop"  # to the process running a session's reply: stop it
LIVE = "reply.live"  # to the process running a session's reply: send ``reply_to`` what the step has streamed


@dataclass(frozen=True)
class ListOf:
    """A field's type in a schema: a list of ``item``."""

    item: type


IDS = ListOf(int)
STRINGS = ListOf(str)
SECONDS = (float, int)
SECONDS_OR_NONE = (float, int, type(None))

SCHEMAS: dict[str, dict[str, type | tuple[type, ...] | ListOf]] = {
    "turn_started": {"turn": int, "number": int, "revision": int, "again": bool},
    "request_started": {"request": int, "kind": str},
    "text": {"turn": int, "step": int, "text": str, "at": int},
    "reasoning": {"turn": int, "step": int, "text": str, "at": int},
    "tool_called": {"turn": int, "step": int, "name": str},
    # a finished request's bar (``bar``: its number on the chart; ``previous_ttft``: where its line comes from) and,
    # with ``totals_*``, the session's requests added up (``sessions_app.selectors.totals.RequestTotals``)
    "request_finished": {
        "request": int,
        "bar": int,
        "previous_ttft": SECONDS_OR_NONE,
        "totals_requests": int,
        "totals_prompt_tokens": int,
        "totals_cached_tokens": int,
        "totals_prompt_seconds": SECONDS,
        "totals_timed_tokens": int,
        "totals_timed_seconds": SECONDS,
    },
    "cache_checked": {"request": int, "bar": int, "previous_ttft": SECONDS_OR_NONE},
    "step_stored": {"step": int, "revision": int},
    "result_stored": {"result": int, "revision": int},
    "turn_ended": {"turn": int, "revision": int},
    "turns_taken_back": {"numbers": IDS, "compactions": IDS, "revision": int},
    "branch_flipped": {"made_live": IDS, "revision": int},
    "compacted": {"generation": int, "revision": int},
    "titled": {"title": str},
    "notice": {"text": str, "level": str, "lines": STRINGS},
    # the job's own: queued, running or idle (``label`` says what it does; ``job`` is the queue's id of it, 0 where
    # none ran), the words of a send that never started given back to the tab that sent them, the step streaming
    # now for a tab that asked, and how the job ended
    "job": {"state": str, "label": str, "job": int},
    "words_back": {"words": str},
    "live": {"turn": int, "step": int, "text": str, "reasoning": str, "calls": STRINGS},
    "job_ended": {"job": int, "failure": str, "requests": IDS, "turn": (int, type(None))},
    # a web process's own: a tab changed the session's mode or model
    "mode_set": {"mode": str},
    "model_changed": {"revision": int},
}
TO_ONE = frozenset({"words_back", "live", "notice"})  # sent to the one channel that asked, never to the group
STATES = ("queued", "running", "idle")
LEVELS = ("info", "warning", "error")


def session_group(session_id: int) -> str:
    """The group of everything following a session: its open tabs, a terminal following a job."""
    return f"session-{session_id}"


def reply_group(session_id: int) -> str:
    """The group of the process running the session's reply: Stop and requests for its live text go there."""
    return f"reply-{session_id}"


class WireError(ValueError):
    """A message that is not an event of its schema."""


def stamped(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` as it goes on the channel layer: with the moment it is sent (:data:`SENT`), so that web processes
    measure how long the layer took to bring it (``chat.web.delivery``)."""
    return {**message, SENT: time.time()}


def checked(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """``message`` where it is an event of its schema (every field of it, of its type, and no other); else
    ``WireError``."""
    if message.get("type") != EVENT:
        raise WireError(f"not an event: {message.get('type')!r}")
    name = message.get("event")
    schema = SCHEMAS.get(name) if isinstance(name, str) else None
    if schema is None:
        raise WireError(f"no such event: {name!r}")
    if not _is(message.get("session"), int):
        raise WireError(f"{name}: no session id")
    sent = message.get(SENT)
    if sent is not None and not _is(sent, (float, int)):
        raise WireError(f"{name}: sent {sent!r} is not a time")
    fields = set(message) - {"type", "event", "session", SENT}
    if fields != set(schema):
        raise WireError(f"{name}: fields {sorted(fields)}, its schema has {sorted(schema)}")
    for field, kind in schema.items():
        value = message[field]
        if isinstance(kind, ListOf):
            if not isinstance(value, list) or not all(_is(item, kind.item) for item in value):
                raise WireError(f"{name}.{field}: {value!r} is not a list of {kind.item.__name__}")
        elif not _is(value, kind):
            raise WireError(f"{name}.{field}: {value!r} is not {kind}")
    if name == "job" and message["state"] not in STATES:
        raise WireError(f"job.state: {message['state']!r}")
    if name == "notice" and message["level"] not in LEVELS:
        raise WireError(f"notice.level: {message['level']!r}")
    return message


def _is(value: object, kind: type | tuple[type, ...]) -> bool:
    """``isinstance``, where a bool is no int."""
    if isinstance(value, bool):
        return kind is bool or (isinstance(kind, tuple) and bool in kind)
    return isinstance(value, kind)


def _message(session_id: int, event_name: str, /, **fields: Any) -> dict[str, Any]:
    return {"type": EVENT, "event": event_name, "session": session_id, **fields}


def event_message(session_id: int, event: ReplyEvent) -> dict[str, Any]:
    """The wire message of one of the reply loop's events."""
    match event:
        case TurnStarted(turn=turn, again=again):
            return _message(
                session_id, "turn_started", turn=turn.pk, number=turn.number, revision=turn.revision, again=again
            )
        case RequestStarted(request=request):
            return _message(session_id, "request_started", request=request.pk, kind=request.kind)
        case ToolCalled(turn_number=turn, step=step, name=name):
            return _message(session_id, "tool_called", turn=turn, step=step, name=name)
        case RequestFinished(request=request, place=place, totals=totals):
            return _message(
                session_id,
                "request_finished",
                request=request.pk,
                bar=place.index,
                previous_ttft=place.previous_ttft,
                totals_requests=totals.requests,
                totals_prompt_tokens=totals.prompt_tokens,
                totals_cached_tokens=totals.cached_tokens,
                totals_prompt_seconds=totals.prompt_seconds,
                totals_timed_tokens=totals.timed_tokens,
                totals_timed_seconds=totals.timed_seconds,
            )
        case CacheChecked(request=request, place=place):
            return _message(
                session_id, "cache_checked", request=request.pk, bar=place.index, previous_ttft=place.previous_ttft
            )
        case StepStored(step=step, revision=revision):
            return _message(session_id, "step_stored", step=step.pk, revision=revision)
        case ResultStored(result=result, revision=revision):
            return _message(session_id, "result_stored", result=result.pk, revision=revision)
        case TurnEnded(turn=turn):
            return turn_ended_message(session_id, turn=turn.pk, revision=turn.revision)
        case TurnsTakenBack(turns=turns):
            return _message(
                session_id,
                "turns_taken_back",
                numbers=[turn.number for turn in turns],
                compactions=list(event.compactions),
                revision=max((turn.revision for turn in turns), default=0),
            )
        case BranchFlipped(made_live=made_live):
            return _message(
                session_id,
                "branch_flipped",
                made_live=[turn.pk for turn in made_live],
                revision=max((turn.revision for turn in made_live), default=0),
            )
        case Compacted(generation=generation):
            return _message(session_id, "compacted", generation=generation.pk, revision=generation.revision)
        case Titled(session=session):
            return _message(session_id, "titled", title=session.title)
        case Notice(text=text, level=level, lines=lines):
            return notice_message(session_id, text=text, level=level, lines=list(lines))
    raise WireError(f"no wire message for {type(event).__name__}")


def turn_ended_message(session_id: int, *, turn: int, revision: int) -> dict[str, Any]:
    """The reply to turn ``turn`` ended (done, failed or interrupted: the stored turn says which)."""
    return _message(session_id, "turn_ended", turn=turn, revision=revision)


def delta_message(session_id: int, *, turn: int, step: int, text: str, at: int, reasoning: bool) -> dict[str, Any]:
    """A piece of the text (or reasoning) of step ``step`` of turn ``turn``, ``at`` its offset in UTF-16 units."""
    return _message(session_id, "reasoning" if reasoning else "text", turn=turn, step=step, text=text, at=at)


def notice_message(
    session_id: int, *, text: str, level: str = "info", lines: list[str] | None = None
) -> dict[str, Any]:
    """Something the asker should read that is not part of the transcript."""
    return _message(session_id, "notice", text=text, level=level, lines=lines or [])


def taken_back_notice(event: TurnsTakenBack) -> str:
    """What the asker is told of turns taken back (named by their places, as the page labels them)."""
    return taken_back_text(event, [turn.position for turn in reversed(event.turns)]) if event.turns else ""


def job_message(session_id: int, *, state: str, label: str = "", job: int = 0) -> dict[str, Any]:
    """A job's state: ``queued``, ``running`` (``label`` says what it does) or ``idle``."""
    return _message(session_id, "job", state=state, label=label, job=job)


def words_back_message(session_id: int, words: str) -> dict[str, Any]:
    """The words of a send that never started, for the tab that sent them."""
    return _message(session_id, "words_back", words=words)


def live_message(
    session_id: int, *, turn: int, step: int, text: str, reasoning: str, calls: list[str]
) -> dict[str, Any]:
    """What the step streaming now has streamed, for a tab that asked."""
    return _message(session_id, "live", turn=turn, step=step, text=text, reasoning=reasoning, calls=calls)


def job_ended_message(
    session_id: int, *, job: int, failure: str, requests: list[int], turn: int | None
) -> dict[str, Any]:
    """How a job ended: why it failed (empty where it did not), its requests, the last turn it ended."""
    return _message(session_id, "job_ended", job=job, failure=failure, requests=requests, turn=turn)


def mode_set_message(session_id: int, *, mode: str) -> dict[str, Any]:
    """A tab set the session's mode."""
    return _message(session_id, "mode_set", mode=mode)


def model_changed_message(session_id: int, *, revision: int) -> dict[str, Any]:
    """A tab moved the session to another model or endpoint."""
    return _message(session_id, "model_changed", revision=revision)
