"""Taking turns back: undo, rewind and regenerate. Nothing is deleted; numbers are never reused."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from sessions_app.errors import NoLiveTurnFrom, NothingToTakeBack, ReplyInProgress
from sessions_app.models import BreakCause, ChatSession, Generation, Result, Turn, TurnStatus
from sessions_app.services.revisions import revision_next
from sessions_app.services.turns import turn_restart


@dataclass(frozen=True)
class TakenBack:
    """The turns taken back, newest first, and the edits they made, newest first (for restoring files)."""

    turns: list[Turn]
    edits: list[Result]
    compactions_taken_back: list[int]


def _take_back(session: ChatSession, turns: list[Turn], *, cause: str) -> TakenBack:
    first = min(turn.number for turn in turns)
    revision = revision_next(session.pk)
    for turn in turns:
        turn.status = TurnStatus.TAKEN_BACK
        turn.taken_back_by = cause
        turn.revision = revision
    Turn.objects.bulk_update(turns, ["status", "taken_back_by", "revision"])
    covering = Generation.objects.filter(session=session, taken_back=False, covers_through_turn__gte=first)
    taken_generations = list(covering.values_list("number", flat=True))
    generation_changed = False
    if taken_generations:
        covering.update(taken_back=True, revision=revision)
        live = Generation.objects.filter(session=session, taken_back=False).order_by("-number").first()
        assert live is not None
        generation_changed = live.number != session.generation_number
        session.generation_number = live.number
    session.pending_breaks = [
        *session.pending_breaks,
        {"cause": cause, "turn": first, "generation_changed": generation_changed},
    ]
    session.save(update_fields=["generation_number", "pending_breaks", "updated_at"])
    edits = list(
        Result.objects.filter(turn__in=turns, kind="edit").order_by("-number"),
    )
    return TakenBack(
        turns=sorted(turns, key=lambda t: -t.number), edits=edits, compactions_taken_back=taken_generations
    )


def _lock(session: ChatSession) -> ChatSession:
    session = ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)
    if Turn.objects.filter(session=session, status=TurnStatus.OPEN).exists():
        raise ReplyInProgress()
    return session


def _live(session: ChatSession) -> list[Turn]:
    return list(Turn.objects.filter(session=session).exclude(status=TurnStatus.TAKEN_BACK).order_by("number"))


@transaction.atomic
def turn_undo(*, session: ChatSession) -> TakenBack:
    """Take back the last live turn."""
    session = _lock(session)
    live = _live(session)
    if not live:
        raise NothingToTakeBack()
    return _take_back(session, [live[-1]], cause=BreakCause.UNDO)


@transaction.atomic
def turn_rewind(*, session: ChatSession, number: int) -> TakenBack:
    """Take back every live turn numbered ``number`` or later (turn ``number`` may already be taken back);
    where none is left, nothing changes."""
    session = _lock(session)
    turns = [turn for turn in _live(session) if turn.number >= number]
    if not turns:
        raise NoLiveTurnFrom(number)
    return _take_back(session, turns, cause=BreakCause.REWIND)


@transaction.atomic
def turn_regenerate(*, session: ChatSession) -> tuple[TakenBack, Turn]:
    """Take back the last reply and open a new turn with the same stored message."""
    session = _lock(session)
    live = _live(session)
    if not live:
        raise NothingToTakeBack()
    last = live[-1]
    taken = _take_back(session, [last], cause=BreakCause.REGENERATE)
    return taken, turn_restart(session=session, like=last)
