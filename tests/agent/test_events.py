"""What a person is told of turns taken back."""

from __future__ import annotations

from chat.agent.events import TurnsTakenBack, taken_back_text, turns_named
from sessions_app.models import TakenBackBy, Turn


def taken(*numbers: int, by: str, restored: bool = False, edits: int = 0, conflicts: tuple[str, ...] = ()) -> str:
    turns = tuple(Turn(number=number, taken_back_by=by) for number in sorted(numbers, reverse=True))
    event = TurnsTakenBack(turns=turns, restored=restored, edits=edits, conflicts=conflicts)
    return taken_back_text(event, sorted(numbers))


def test_turns_are_named_in_plain_english() -> None:
    assert turns_named([2]) == "turn 2"
    assert turns_named([2, 3]) == "turns 2 and 3"
    assert turns_named([2, 3, 4]) == "turns 2, 3 and 4"


def test_undo_and_rewind_say_what_they_took_back_and_restored() -> None:
    assert taken(2, by=TakenBackBy.UNDO) == "Took back turn 2."
    assert taken(2, by=TakenBackBy.UNDO, restored=True) == "Took back turn 2.", "no edits: nothing to restore"
    assert taken(2, by=TakenBackBy.UNDO, restored=True, edits=1) == (
        "Took back turn 2; the files it changed were restored."
    )
    assert taken(2, 3, by=TakenBackBy.REWIND, restored=True, edits=2) == (
        "Took back turns 2 and 3; the files they changed were restored."
    )
    assert taken(2, 3, by=TakenBackBy.REWIND, restored=True, edits=2, conflicts=("a.py",)) == (
        "Took back turns 2 and 3; the files they changed were restored except:"
    )


def test_regenerate_and_edit_say_only_what_they_restored() -> None:
    assert taken(3, by=TakenBackBy.REGENERATE) == ""
    assert taken(1, 2, by=TakenBackBy.EDIT) == ""
    assert taken(3, by=TakenBackBy.REGENERATE, restored=True, edits=1) == "The files turn 3 changed were restored."
