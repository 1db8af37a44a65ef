from __future__ import annotations

import pytest

from chat.web.display import transcript_page
from sessions_app.models import ChatSession
from sessions_app.services.turns import turn_fail, turn_finish, turn_start
from sessions_app.services.undo import turn_regenerate

pytestmark = pytest.mark.django_db

TODAY = "2026-12-05"


def test_retries_that_came_to_nothing_are_no_branches_but_a_reply_taken_back_is(chat_session: ChatSession) -> None:
    turn_fail(turn=turn_start(session=chat_session, words="hi", today=TODAY, instructions=None), error="HTTP 500")
    for _ in range(3):  # Retry, failing again each time
        _, again = turn_regenerate(session=chat_session)
        turn_fail(turn=again, error="HTTP 500")
    _, again = turn_regenerate(session=chat_session)
    turn_finish(turn=again, unstored="Hello.")
    (shown,) = transcript_page(chat_session, running=False).entries
    assert shown.siblings == (again.number,), "four failed attempts: no ◀ 1 / 5 ▶"  # type: ignore[union-attr]
    _, third = turn_regenerate(session=chat_session)
    turn_fail(turn=third, error="HTTP 500")
    (shown,) = transcript_page(chat_session, running=False).entries
    assert shown.siblings == (again.number, third.number), "a reply to go back to, and the live attempt itself"  # type: ignore[union-attr]
