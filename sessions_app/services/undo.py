"""Taking turns back and bringing branches back: undo, rewind, regenerate, edit and flip.

Nothing is deleted and numbers are never reused. The turns form a tree (``Turn.parent``); the live branch is
the path of turns not taken back, from a first turn to the last live one. Undo, rewind, regenerate and edit
take back the end of the live branch; regenerate and edit then start a sibling of the first turn taken back.
A flip makes another branch the live one. A compaction is live exactly while the turn it covers through is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Exists, OuterRef

from sessions_app.errors import (
    AlreadyLive,
    EmptyMessage,
    NoLiveTurnFrom,
    NoSuchTurn,
    NothingToTakeBack,
    ReplyInProgress,
    TurnNotFound,
)
from sessions_app.hygiene.config import ContextConfig
from sessions_app.models import (
    BreakCause,
    ChatSession,
    Generation,
    Result,
    TakenBackBy,
    Turn,
    TurnStatus,
    Upload,
)
from sessions_app.services.revisions import revision_next
from sessions_app.services.turns import turn_restart, turn_start
from sessions_app.services.uploads import uploads_unsay

_STATE_FIELDS = ["status", "live_status", "taken_back_by", "taken_back_in", "revision"]
_LARGE_FIELDS = ("message", "reply_text")


@dataclass(frozen=True)
class TakenBack:
    """The turns taken back, newest first, and the edits they made, newest first (for restoring files)."""

    turns: list[Turn]
    edits: list[Result]
    compactions_taken_back: list[int]


@dataclass(frozen=True)
class Flipped:
    """A flip: the turns taken back (newest first), the turns made live (oldest first), and the compactions
    each way by generation number."""

    taken_back: list[Turn]
    made_live: list[Turn]
    compactions_taken_back: list[int]
    compactions_made_live: list[int]


@dataclass(frozen=True)
class _GenerationsMoved:
    taken_back: list[int]
    made_live: list[int]
    changed: bool


def _generations_follow(session: ChatSession, *, revision: int) -> _GenerationsMoved:
    """A compaction is live exactly while the turn it covers through is (then all the turns it covers are,
    since the live turns are one path); the session's generation is the newest live one."""
    covered_live = Turn.objects.filter(session=session, number=OuterRef("covers_through_turn")).exclude(
        status=TurnStatus.TAKEN_BACK
    )
    rows = list(
        Generation.objects.filter(session=session, covers_through_turn__isnull=False)
        .annotate(covered_live=Exists(covered_live))
        .values_list("number", "taken_back", "covered_live")
    )
    taken = [number for number, taken_back, live in rows if not live and not taken_back]
    made_live = [number for number, taken_back, live in rows if live and taken_back]
    if taken:
        Generation.objects.filter(session=session, number__in=taken).update(taken_back=True, revision=revision)
    if made_live:
        Generation.objects.filter(session=session, number__in=made_live).update(taken_back=False, revision=revision)
    newest = (
        Generation.objects.filter(session=session, taken_back=False)
        .order_by("-number")
        .values_list("number", flat=True)
        .first()
    )
    assert newest is not None, "the first generation covers no turn, so it is always live"
    changed = newest != session.generation_number
    session.generation_number = newest
    return _GenerationsMoved(taken_back=taken, made_live=made_live, changed=changed)


def _mark_taken_back(turns: Sequence[Turn], *, by: str, revision: int) -> None:
    for turn in turns:
        turn.live_status = turn.status
        turn.status = TurnStatus.TAKEN_BACK
        turn.taken_back_by = by
        turn.taken_back_in = revision
        turn.revision = revision


def _take_back(session: ChatSession, turns: list[Turn], *, by: str, cause: str) -> TakenBack:
    """Take back ``turns`` (the end of the live branch), with what follows for compactions and the next
    request, whose break ``cause`` is recorded as pending."""
    first = min(turn.number for turn in turns)
    revision = revision_next(session.pk)
    _mark_taken_back(turns, by=by, revision=revision)
    Turn.objects.bulk_update(turns, _STATE_FIELDS)
    uploads_unsay(session=session, turns=turns)
    moved = _generations_follow(session, revision=revision)
    session.pending_breaks = [
        *session.pending_breaks,
        {"cause": cause, "turn": first, "generation_changed": moved.changed},
    ]
    session.save(update_fields=["generation_number", "pending_breaks", "updated_at"])
    edits = list(
        Result.objects.filter(turn__in=turns, kind="edit").order_by("-number"),
    )
    return TakenBack(turns=sorted(turns, key=lambda t: -t.number), edits=edits, compactions_taken_back=moved.taken_back)


def _lock(session: ChatSession) -> ChatSession:
    session = ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)
    if Turn.objects.filter(session=session, status=TurnStatus.OPEN).exists():
        raise ReplyInProgress()
    return session


def _live(session: ChatSession) -> list[Turn]:
    """The live branch, first turn first."""
    return list(
        Turn.objects.filter(session=session)
        .exclude(status=TurnStatus.TAKEN_BACK)
        .defer(*_LARGE_FIELDS)
        .order_by("number")
    )


@transaction.atomic
def turn_undo(*, session: ChatSession) -> TakenBack:
    """Take back the last live turn."""
    session = _lock(session)
    live = _live(session)
    if not live:
        raise NothingToTakeBack()
    return _take_back(session, [live[-1]], by=TakenBackBy.UNDO, cause=BreakCause.UNDO)


@transaction.atomic
def turn_rewind(*, session: ChatSession, number: int) -> TakenBack:
    """Take back every live turn numbered ``number`` or later (turn ``number`` may already be taken back);
    where none is left, nothing changes."""
    session = _lock(session)
    turns = [turn for turn in _live(session) if turn.number >= number]
    if not turns:
        raise NoLiveTurnFrom(number)
    return _take_back(session, turns, by=TakenBackBy.REWIND, cause=BreakCause.REWIND)


@transaction.atomic
def turn_regenerate(
    *, session: ChatSession, today: str = "", instructions: str | None = None, config: ContextConfig | None = None
) -> tuple[TakenBack, Turn]:
    """Take back the last reply and open its sibling: a new turn with the same stored message (with a note that
    names the model where the session moved to another since: ``today`` and ``instructions`` compose it); the
    files its message said arrived belong to the new turn."""
    session = _lock(session)
    live = _live(session)
    if not live:
        raise NothingToTakeBack()
    last = live[-1]
    said = list(Upload.objects.filter(turn=last).defer("image").order_by("id"))
    taken = _take_back(session, [last], by=TakenBackBy.REGENERATE, cause=BreakCause.REGENERATE)
    again = turn_restart(session=session, like=last, today=today, instructions=instructions, config=config, said=said)
    Upload.objects.filter(pk__in=[upload.pk for upload in said], turn__isnull=True).update(turn=again)
    return taken, again


@transaction.atomic
def turn_edit(
    *,
    session: ChatSession,
    turn: int,
    words: str,
    today: str,
    instructions: str | None,
    config: ContextConfig | None = None,
) -> tuple[TakenBack, Turn]:
    """Start a new branch where live turn ``turn`` (its stored number) stands: that turn and every later one
    are taken back, and ``words`` become a new open turn after the same turn as the edited one."""
    session = _lock(session)
    if not words.strip():
        raise EmptyMessage()
    live = _live(session)
    if not any(each.number == turn for each in live):
        raise TurnNotFound(turn)
    taken = _take_back(
        session, [each for each in live if each.number >= turn], by=TakenBackBy.EDIT, cause=BreakCause.BRANCH
    )
    opened = turn_start(session=session, words=words, today=today, instructions=instructions, config=config)
    return taken, opened


def _branch_through(target: Turn, taken_back: list[Turn], live_ids: set[int]) -> list[Turn]:
    """The branch a flip to ``target`` brings back, first turn first: the taken-back turns above it up to
    the live branch, ``target``, then the turns that were taken back with it, as the branch was left."""
    by_id = {turn.pk: turn for turn in taken_back}
    children: dict[int, list[Turn]] = {}
    for turn in taken_back:
        if turn.parent_id is not None:
            children.setdefault(turn.parent_id, []).append(turn)
    above: list[Turn] = []
    turn = target
    while turn.parent_id is not None and turn.parent_id not in live_ids:
        turn = by_id[turn.parent_id]
        above.append(turn)
    below: list[Turn] = []
    turn = target
    while True:
        with_it = [
            child
            for child in children.get(turn.pk, [])
            if child.taken_back_in is not None and child.taken_back_in == turn.taken_back_in
        ]
        if not with_it:
            break
        turn = max(with_it, key=lambda child: child.number)
        below.append(turn)
    return [*reversed(above), target, *below]


@transaction.atomic
def branch_flip(*, session: ChatSession, turn: int) -> Flipped:
    """Make the branch through turn ``turn`` (its stored number) the live one: its turns live again as they
    were, the live turns after the point where the branches part taken back."""
    session = _lock(session)
    target = Turn.objects.filter(session=session, number=turn).defer(*_LARGE_FIELDS).first()
    if target is None:
        raise NoSuchTurn(turn)
    if target.status != TurnStatus.TAKEN_BACK:
        raise AlreadyLive()
    live = _live(session)
    taken_back = list(Turn.objects.filter(session=session, status=TurnStatus.TAKEN_BACK).defer(*_LARGE_FIELDS))
    branch = _branch_through(
        next(each for each in taken_back if each.pk == target.pk), taken_back, {each.pk for each in live}
    )
    leaving = [each for each in live if each.position >= branch[0].position]
    revision = revision_next(session.pk)
    _mark_taken_back(leaving, by=TakenBackBy.BRANCH, revision=revision)
    for each in branch:
        each.status = each.live_status or TurnStatus.DONE
        each.live_status = ""
        each.taken_back_by = ""
        each.taken_back_in = None
        each.revision = revision
    Turn.objects.bulk_update([*leaving, *branch], _STATE_FIELDS)
    moved = _generations_follow(session, revision=revision)
    session.pending_breaks = [
        *session.pending_breaks,
        {"cause": BreakCause.BRANCH, "turn": branch[0].number, "generation_changed": moved.changed},
    ]
    session.save(update_fields=["generation_number", "pending_breaks", "updated_at"])
    return Flipped(
        taken_back=sorted(leaving, key=lambda t: -t.number),
        made_live=branch,
        compactions_taken_back=moved.taken_back,
        compactions_made_live=moved.made_live,
    )
