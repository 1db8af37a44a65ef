"""The request built from the store knows where each message ends, and how many end within a prefix."""

from __future__ import annotations

import pytest

from sessions_app.models import ChatSession
from sessions_app.selectors.requests import build_request
from sessions_app.services.turns import step_record, turn_finish, turn_start

pytestmark = pytest.mark.django_db(transaction=True)


def test_messages_within_a_prefix_count_those_that_end_in_it(chat_session: ChatSession) -> None:
    for words in ("one", "two ünïcödé", "three"):
        turn = turn_start(session=chat_session, words=words, today="2026-12-01", instructions=None)
        step_record(turn=turn, number=1, text=f"re: {words}", reasoning="", tool_calls=[], finish_reason="stop")
        turn_finish(turn=turn)
    built = build_request(chat_session, current=None, model_name="m")
    assert len(built.messages) == len(built.message_offsets) == 7
    for size in range(len(built.body) + 2):
        expected = sum(1 for index in range(len(built.messages)) if built.message_end(index) <= size)
        assert built.messages_within(size) == expected, size
