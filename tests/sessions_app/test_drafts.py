"""What a step has streamed is kept in one draft row, written over as it grows, and gone once the step is stored;
the last request's bytes are one row per session, written over as each action ends. Each is a single upsert."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.models import BreakCause, ChatSession, LastRequest, ModelRequest, StepDraft
from sessions_app.selectors.requests import previous_request
from sessions_app.services.durability import WITHOUT_WAITING
from sessions_app.services.requests import request_last_keep
from sessions_app.services.turns import step_draft_save, step_record, turn_start
from sessions_app.text import storable
from tests.sessions_app.store_kit import request_recorded

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_draft_is_one_row_written_over_then_removed_by_the_stored_step(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="hi", today="2026-12-01", instructions=None)
    step_draft_save(turn=turn, number=1, text="Hel", reasoning="")
    first = StepDraft.objects.get(turn=turn, number=1)
    with CaptureQueriesContext(connection) as queries:
        step_draft_save(turn=turn, number=1, text="Hello, wor\x00ld", reasoning="thinking")
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith(("INSERT", "UPDATE", "SELECT")) and WITHOUT_WAITING not in q["sql"]
    ]
    assert len(writes) == 1 and "ON CONFLICT" in writes[0], writes
    draft = StepDraft.objects.get(turn=turn, number=1)
    assert (draft.pk, draft.text, draft.reasoning) == (first.pk, storable("Hello, wor\x00ld"), "thinking")
    assert "\x00" not in draft.text, "a NUL is stored by the same rule as every other text"
    assert draft.updated_at >= first.updated_at
    step_draft_save(turn=turn, number=2, text="next", reasoning="")
    step_record(turn=turn, number=1, text="Hello, world", reasoning="", tool_calls=[], finish_reason="stop")
    assert list(StepDraft.objects.filter(turn=turn).values_list("number", flat=True)) == [2]


def test_the_last_request_is_one_row_per_session_written_over(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="hi", today="2026-12-01", instructions=None)
    request_last_keep(session=chat_session, last=request_recorded(chat_session, turn, step_number=1)[1])
    step_record(turn=turn, number=1, text="Hi.", reasoning="", tool_calls=[], finish_reason="stop")
    again = request_recorded(chat_session, turn, step_number=2)[1]
    with CaptureQueriesContext(connection) as queries:
        request_last_keep(session=chat_session, last=again)
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith(("INSERT", "UPDATE", "SELECT")) and WITHOUT_WAITING not in q["sql"]
    ]
    assert len(writes) == 1 and "ON CONFLICT" in writes[0], writes
    rows = list(LastRequest.objects.filter(session=chat_session))
    assert len(rows) == 1 and bytes(rows[0].body) == again.body and rows[0].turn_number == turn.number
    assert previous_request(chat_session) == again


def test_a_request_whose_bytes_were_not_kept_makes_the_next_break_a_restart(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="hi", today="2026-12-01", instructions=None)
    request_last_keep(session=chat_session, last=request_recorded(chat_session, turn, step_number=1)[1])
    step_record(turn=turn, number=1, text="Hi.", reasoning="", tool_calls=[], finish_reason="tool_calls")
    request_recorded(chat_session, turn, step_number=2)  # sent, then Cachet stopped before the action ended
    previous = previous_request(chat_session)
    assert (previous.known, previous.body, previous.turn_number) == (False, b"", None)
    request_recorded(chat_session, turn, step_number=3)
    third = ModelRequest.objects.filter(session=chat_session).order_by("-id").first()
    assert third is not None and third.break_cause == BreakCause.RESTART and third.expected_shared_bytes == 0
