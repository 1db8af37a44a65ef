"""A turn's life: the person's message stored with its note, the reply's steps, and how it ended."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from sessions_app import prompts
from sessions_app.errors import ReplyInProgress
from sessions_app.hygiene import StatedContext, compose_message
from sessions_app.hygiene.config import ContextConfig
from sessions_app.models import ChatSession, Generation, Step, Turn, TurnStatus
from sessions_app.selectors.sessions import history_turns
from sessions_app.text import storable, storable_or_none


def stated_context(session: ChatSession, *, generation: Generation) -> StatedContext:
    """What the request being built last stated: the date, the mode and the workspace instructions."""
    stated = StatedContext(date=None, mode=generation.mode, instructions=None)
    for turn in history_turns(session, generation=generation):
        stated = StatedContext(
            date=turn.note_date or stated.date,
            mode=turn.note_mode or stated.mode,
            instructions=stated.instructions if turn.note_instructions is None else (turn.note_instructions or None),
        )
    return stated


def _locked(session: ChatSession) -> ChatSession:
    return ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)


def _next_turn_number(session: ChatSession) -> int:
    number = session.next_turn_number
    session.next_turn_number = number + 1
    return number


@transaction.atomic
def turn_start(
    *,
    session: ChatSession,
    words: str,
    today: str,
    instructions: str | None,
    config: ContextConfig | None = None,
) -> Turn:
    """Store the person's message, with the note it needs, as a new open turn. One open turn per session."""
    words = storable(words)
    instructions = storable_or_none(instructions)
    session = _locked(session)
    if Turn.objects.filter(session=session, status=TurnStatus.OPEN).exists():
        raise ReplyInProgress()
    generation = Generation.objects.get(session=session, number=session.generation_number)
    stated = stated_context(session, generation=generation)
    composed = compose_message(
        words,
        today=today,
        mode=session.mode,
        mode_text=prompts.mode_text(session.mode),
        instructions=instructions,
        stated=stated,
        config=config or prompts.rules_config(),
    )
    turn = Turn.objects.create(
        session=session,
        number=_next_turn_number(session),
        generation=generation,
        words=words,
        message=composed.text,
        note_date=composed.date_noted or "",
        note_mode=composed.mode_noted or "",
        note_instructions=composed.instructions_noted,
        mode=session.mode,
    )
    if not session.title:
        session.title = " ".join(words.split())[:80]
    session.save(update_fields=["next_turn_number", "title", "updated_at"])
    return turn


@transaction.atomic
def turn_restart(*, session: ChatSession, like: Turn) -> Turn:
    """A new open turn carrying ``like``'s stored message as it is (regenerate asks again with it)."""
    session = _locked(session)
    if Turn.objects.filter(session=session, status=TurnStatus.OPEN).exists():
        raise ReplyInProgress()
    turn = Turn.objects.create(
        session=session,
        number=_next_turn_number(session),
        generation_id=Generation.objects.get(session=session, number=session.generation_number).pk,
        words=like.words,
        message=like.message,
        note_date=like.note_date,
        note_mode=like.note_mode,
        note_instructions=like.note_instructions,
        mode=session.mode,
    )
    session.save(update_fields=["next_turn_number", "updated_at"])
    return turn


@transaction.atomic
def step_record(
    *,
    turn: Turn,
    text: str,
    reasoning: str,
    tool_calls: list[dict[str, Any]],
    finish_reason: str | None,
) -> Step:
    """Store one step of a reply as the model sent it; each tool call holds id, name and raw arguments."""
    number = turn.steps.count() + 1
    return Step.objects.create(
        turn=turn,
        number=number,
        text=storable(text),
        reasoning=storable(reasoning),
        tool_calls=[
            {"id": storable(c["id"]), "name": storable(c["name"]), "arguments": storable(c["arguments"])}
            for c in tool_calls
        ],
        finish_reason=storable(finish_reason or ""),
    )


@transaction.atomic
def turn_finish(*, turn: Turn, reply_text: str) -> Turn:
    turn = Turn.objects.select_for_update(no_key=True).get(pk=turn.pk)
    turn.reply_text = storable(reply_text)
    turn.status = TurnStatus.DONE
    turn.finished_at = timezone.now()
    turn.save(update_fields=["reply_text", "status", "finished_at"])
    ChatSession.objects.filter(pk=turn.session_id).update(updated_at=timezone.now())
    return turn


@transaction.atomic
def turn_fail(*, turn: Turn, error: str, reply_text: str = "", interrupted: bool = False) -> Turn:
    """End a reply that could not finish: its message, steps and results stay stored."""
    turn = Turn.objects.select_for_update(no_key=True).get(pk=turn.pk)
    if turn.status != TurnStatus.OPEN:
        return turn
    turn.reply_text = storable(reply_text)
    turn.error = storable(error)
    turn.status = TurnStatus.INTERRUPTED if interrupted else TurnStatus.FAILED
    turn.finished_at = timezone.now()
    turn.save(update_fields=["reply_text", "error", "status", "finished_at"])
    return turn


@transaction.atomic
def turn_request_cancel(*, turn: Turn) -> None:
    Turn.objects.filter(pk=turn.pk, status=TurnStatus.OPEN).update(cancel_requested=True)


@transaction.atomic
def turns_interrupt_orphans(*, session: ChatSession, reason: str) -> int:
    """Mark interrupted the open turns nobody is replying to (the caller holds the session's reply lock)."""
    count = 0
    for turn in Turn.objects.select_for_update(no_key=True).filter(session=session, status=TurnStatus.OPEN):
        texts = [step.text for step in turn.steps.order_by("number") if step.text]
        turn.reply_text = "\n\n".join(texts)
        turn.error = storable(reason)
        turn.status = TurnStatus.INTERRUPTED
        turn.finished_at = timezone.now()
        turn.save(update_fields=["reply_text", "error", "status", "finished_at"])
        count += 1
    return count
