"""The turn tree in the store: undo, rewind, regenerate, edit and flip, and compactions following their turns."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.apps import apps

from sessions_app.errors import AlreadyLive, EmptyMessage, NoLiveTurnFrom, NoSuchTurn, ReplyInProgress, TurnNotFound
from sessions_app.models import BreakCause, ChatSession, Generation, TakenBackBy, Turn, TurnStatus
from sessions_app.selectors.sessions import history_turns
from sessions_app.services.compaction import compaction_apply
from sessions_app.services.turns import turn_fail, turn_finish, turn_start
from sessions_app.services.undo import branch_flip, turn_edit, turn_regenerate, turn_rewind, turn_undo

pytestmark = pytest.mark.django_db

TODAY = "2026-11-30"


def said(session: ChatSession, words: str, *, failed: bool = False) -> Turn:
    turn = turn_start(session=session, words=words, today=TODAY, instructions=None)
    if failed:
        return turn_fail(turn=turn, error="The server answered 500.")
    return turn_finish(turn=turn, unstored=f"reply to {words}")


def edit(session: ChatSession, number: int, words: str) -> Turn:
    _, turn = turn_edit(session=session, turn=number, words=words, today=TODAY, instructions=None)
    return turn_finish(turn=turn, unstored=f"reply to {words}")


def tree(session: ChatSession) -> dict[int, tuple[int | None, int, str]]:
    """Each turn's parent's number, position and status."""
    return {
        turn.number: (turn.parent.number if turn.parent else None, turn.position, turn.status)
        for turn in Turn.objects.filter(session=session).select_related("parent")
    }


def live(session: ChatSession) -> list[int]:
    return list(
        Turn.objects.filter(session=session)
        .exclude(status=TurnStatus.TAKEN_BACK)
        .order_by("number")
        .values_list("number", flat=True)
    )


def pending(session: ChatSession) -> list[Any]:
    return list(ChatSession.objects.get(pk=session.pk).pending_breaks)


DONE, FAILED, BACK = TurnStatus.DONE, TurnStatus.FAILED, TurnStatus.TAKEN_BACK


def test_turns_form_a_path_each_after_the_last_live_one(chat_session: ChatSession) -> None:
    for words in ("one", "two", "three"):
        said(chat_session, words)
    turn_undo(session=chat_session)
    said(chat_session, "four")
    assert tree(chat_session) == {1: (None, 1, DONE), 2: (1, 2, DONE), 3: (2, 3, BACK), 4: (2, 3, DONE)}


def test_regenerate_adds_a_sibling_and_keeps_the_old_reply(chat_session: ChatSession) -> None:
    said(chat_session, "one")
    said(chat_session, "two")
    taken, again = turn_regenerate(session=chat_session)
    assert [turn.number for turn in taken.turns] == [2]
    assert (again.number, again.parent_id, again.position) == (3, Turn.objects.get(number=1).pk, 2)
    old = Turn.objects.get(session=chat_session, number=2)
    assert (old.status, old.live_status, old.taken_back_by) == (BACK, DONE, TakenBackBy.REGENERATE)
    assert old.reply_text == "reply to two" and again.message == old.message
    assert pending(chat_session)[-1]["cause"] == BreakCause.REGENERATE


def test_edit_starts_a_branch_where_the_edited_turn_stood(chat_session: ChatSession) -> None:
    for words in ("one", "two", "three"):
        said(chat_session, words)
    taken, opened = turn_edit(session=chat_session, turn=1, words="uno", today=TODAY, instructions=None)
    assert [turn.number for turn in taken.turns] == [3, 2, 1]
    assert {turn.taken_back_by for turn in taken.turns} == {TakenBackBy.EDIT}
    assert (opened.number, opened.parent_id, opened.position, opened.status) == (4, None, 1, TurnStatus.OPEN)
    assert opened.words == "uno" and TODAY in opened.message, "a first turn again states the date"
    assert pending(chat_session)[-1] == {"cause": BreakCause.BRANCH, "turn": 1, "generation_changed": False}
    with pytest.raises(ReplyInProgress):
        turn_edit(session=chat_session, turn=4, words="x", today=TODAY, instructions=None)
    turn_finish(turn=opened)
    with pytest.raises(TurnNotFound):
        turn_edit(session=chat_session, turn=2, words="x", today=TODAY, instructions=None)
    with pytest.raises(EmptyMessage):
        turn_edit(session=chat_session, turn=4, words="  \n", today=TODAY, instructions=None)
    assert live(chat_session) == [4]


def test_flip_brings_a_branch_back_as_it_was_left(chat_session: ChatSession) -> None:
    said(chat_session, "one")
    said(chat_session, "two")
    said(chat_session, "three", failed=True)
    edit(chat_session, 2, "deux")  # turn 4 after turn 1
    said(chat_session, "cinq")  # turn 5 after turn 4
    flipped = branch_flip(session=chat_session, turn=2)
    assert [turn.number for turn in flipped.made_live] == [2, 3]
    assert [turn.number for turn in flipped.taken_back] == [5, 4]
    assert tree(chat_session) == {
        1: (None, 1, DONE),
        2: (1, 2, DONE),
        3: (2, 3, FAILED),
        4: (1, 2, BACK),
        5: (4, 3, BACK),
    }
    assert Turn.objects.get(number=4).taken_back_by == TakenBackBy.BRANCH
    assert pending(chat_session)[-1] == {"cause": BreakCause.BRANCH, "turn": 2, "generation_changed": False}
    back = branch_flip(session=chat_session, turn=4)
    assert [turn.number for turn in back.made_live] == [4, 5]
    assert live(chat_session) == [1, 4, 5]
    assert Turn.objects.get(number=3).live_status == FAILED


def test_flip_to_a_turn_deep_in_a_branch_brings_back_the_turns_above_it(chat_session: ChatSession) -> None:
    for words in ("one", "two", "three", "four"):
        said(chat_session, words)
    edit(chat_session, 2, "deux")  # turn 5
    flipped = branch_flip(session=chat_session, turn=3)
    assert [turn.number for turn in flipped.made_live] == [2, 3, 4]
    assert live(chat_session) == [1, 2, 3, 4]


def test_a_flip_leaves_taken_back_what_was_undone_on_that_branch(chat_session: ChatSession) -> None:
    for words in ("one", "two", "three"):
        said(chat_session, words)
    turn_undo(session=chat_session)
    edit(chat_session, 2, "deux")  # turn 4
    flipped = branch_flip(session=chat_session, turn=2)
    assert [turn.number for turn in flipped.made_live] == [2]
    assert live(chat_session) == [1, 2]
    assert Turn.objects.get(number=3).taken_back_by == TakenBackBy.UNDO


def test_undo_and_rewind_keep_their_meaning_within_the_live_branch(chat_session: ChatSession) -> None:
    for words in ("one", "two", "three"):
        said(chat_session, words)
    edit(chat_session, 2, "deux")  # turn 4
    branch_flip(session=chat_session, turn=2)
    with pytest.raises(NoLiveTurnFrom):
        turn_rewind(session=chat_session, number=4)
    assert [turn.number for turn in turn_undo(session=chat_session).turns] == [3]
    assert [turn.number for turn in turn_rewind(session=chat_session, number=2).turns] == [2]
    assert live(chat_session) == [1]
    said(chat_session, "again")
    assert tree(chat_session)[5] == (1, 2, DONE)


def test_a_flip_refuses_a_live_turn_and_a_turn_that_is_not_there(chat_session: ChatSession) -> None:
    said(chat_session, "one")
    with pytest.raises(AlreadyLive):
        branch_flip(session=chat_session, turn=1)
    with pytest.raises(NoSuchTurn):
        branch_flip(session=chat_session, turn=9)


def test_a_compaction_is_live_exactly_while_the_turns_it_covers_are(chat_session: ChatSession) -> None:
    for words in ("one", "two", "three"):
        said(chat_session, words)
    compaction_apply(session=chat_session, summary="We counted to three.")
    said(chat_session, "four")  # turn 4, in generation 2
    taken, _ = turn_edit(session=chat_session, turn=2, words="deux", today=TODAY, instructions=None)
    assert taken.compactions_taken_back == [2]
    session = ChatSession.objects.get(pk=chat_session.pk)
    assert session.generation_number == 1 and Generation.objects.get(session=session, number=2).taken_back
    assert pending(session)[-1] == {"cause": BreakCause.BRANCH, "turn": 2, "generation_changed": True}
    turn_finish(turn=Turn.objects.get(session=session, number=5))
    compaction_apply(session=session, summary="We counted in French.")  # generation 3, covering turn 5
    flipped = branch_flip(session=session, turn=2)
    assert (flipped.compactions_taken_back, flipped.compactions_made_live) == ([3], [2])
    session.refresh_from_db()
    assert session.generation_number == 2
    assert [turn.number for turn in history_turns(session)] == [4], "after the summary: the turn it does not cover"
    assert pending(session)[-1] == {"cause": BreakCause.BRANCH, "turn": 2, "generation_changed": True}
    flipped = branch_flip(session=session, turn=5)
    assert (flipped.compactions_taken_back, flipped.compactions_made_live) == ([2], [3])
    session.refresh_from_db()
    assert session.generation_number == 3 and list(history_turns(session)) == []
    turn_undo(session=session)
    session.refresh_from_db()
    assert session.generation_number == 1, "undoing the covered turn takes its compaction back, as before"


def test_a_compaction_on_another_branch_stays_taken_back_while_this_one_is_live(chat_session: ChatSession) -> None:
    said(chat_session, "one")
    said(chat_session, "two")
    edit(chat_session, 2, "deux")  # turn 3
    compaction_apply(session=chat_session, summary="One, deux.")  # generation 2 covers turn 3
    branch_flip(session=chat_session, turn=2)
    assert Generation.objects.get(session=chat_session, number=2).taken_back
    said(chat_session, "trois")  # turn 4 after turn 2, generation 1
    session = ChatSession.objects.get(pk=chat_session.pk)
    assert session.generation_number == 1
    assert [turn.number for turn in history_turns(session)] == [1, 2, 4]


def _migration() -> Any:
    return importlib.import_module("sessions_app.migrations.0006_turn_tree")


def test_the_migration_derives_each_turns_parent_from_numbers_and_taken_back_state(chat_session: ChatSession) -> None:
    # 1, 2, 3; undo 3; 4; regenerate 4 -> 5; rewind 2; 6
    for words in ("one", "two", "three"):
        said(chat_session, words)
    turn_undo(session=chat_session)
    said(chat_session, "four")
    turn_finish(turn=turn_regenerate(session=chat_session)[1])
    turn_rewind(session=chat_session, number=2)
    said(chat_session, "six")
    expected = tree(chat_session)
    assert expected == {
        1: (None, 1, DONE),
        2: (1, 2, BACK),
        3: (2, 3, BACK),
        4: (2, 3, BACK),
        5: (2, 3, BACK),
        6: (1, 2, DONE),
    }
    statuses = dict(Turn.objects.filter(session=chat_session).values_list("number", "live_status"))
    Turn.objects.filter(session=chat_session).update(parent=None, position=1, live_status="", taken_back_in=None)
    _migration().set_parents(apps, None)
    assert tree(chat_session) == expected
    after = Turn.objects.filter(session=chat_session)
    assert dict(after.values_list("number", "live_status")) == statuses
    assert {turn.taken_back_in for turn in after if turn.number in (2, 5)} == {Turn.objects.get(number=2).revision}


def test_the_migration_guesses_a_taken_back_turns_status_from_its_error() -> None:
    migration = _migration()
    assert migration.live_status_of(Turn(error="")) == TurnStatus.DONE
    assert migration.live_status_of(Turn(error="Stopped.")) == TurnStatus.INTERRUPTED
    assert migration.live_status_of(Turn(error="The server answered 500.")) == TurnStatus.FAILED
