"""A turn's message states what changed since the last note: read back from the few turns that noted something."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.hygiene import NOTHING_STATED, ComposedMessage, StatedContext, stated_after
from sessions_app.models import ChatSession, Generation, Turn
from sessions_app.services.sessions import session_set_mode
from sessions_app.services.turns import stated_context, turn_finish, turn_start

pytestmark = pytest.mark.django_db(transaction=True)


def _every_turn_folded(session: ChatSession) -> StatedContext:
    stated = NOTHING_STATED
    for turn in Turn.objects.filter(session=session).order_by("number"):
        stated = stated_after(
            stated,
            ComposedMessage(
                "",
                workspace_noted=turn.note_workspace or None,
                model_noted=turn.note_model or None,
                mode_noted=turn.note_mode or None,
                date_noted=turn.note_date or None,
                instructions_noted=turn.note_instructions,
            ),
        )
    return stated


def _turn(session: ChatSession, *, today: str, instructions: str | None) -> Turn:
    turn = turn_start(session=session, words="go on", today=today, instructions=instructions)
    return turn_finish(turn=turn)


def test_what_was_stated_is_the_latest_note_of_each_kind(chat_session: ChatSession) -> None:
    session = chat_session
    for number in range(1, 31):
        today = "2026-11-30" if number < 12 else "2026-12-01"
        instructions = "Be brief." if number < 20 else None  # the workspace's AGENTS.md went away at turn 20
        if number == 8:
            session = session_set_mode(session=session, mode="plan")
        if number == 25:
            session = session_set_mode(session=session, mode="edit")
        _turn(ChatSession.objects.get(pk=session.pk), today=today, instructions=instructions)
    session = ChatSession.objects.get(pk=session.pk)
    generation = Generation.objects.get(session=session, number=session.generation_number)
    noted = Turn.objects.filter(session=session).exclude(
        note_workspace="", note_model="", note_mode="", note_date="", note_instructions__isnull=True
    )
    assert 3 <= noted.count() <= 8, "only the turns where something changed carry a note"

    stated = stated_context(session, generation=generation)

    assert stated == _every_turn_folded(session)
    assert (stated.date, stated.mode, stated.instructions) == ("2026-12-01", "edit", None)
    with CaptureQueriesContext(connection) as captured:
        stated_context(session, generation=generation)
    assert len(captured) == 1
