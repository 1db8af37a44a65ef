"""A row written by one statement of the hot path is the row ``Model.objects.create`` writes."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from sessions_app.hygiene.outcomes import OutputOutcome
from sessions_app.models import ChatSession, ModelRequest, Result, Step, StepDraft, Turn
from sessions_app.selectors.requests import build_request, previous_request
from sessions_app.services.durability import WITHOUT_WAITING
from sessions_app.services.requests import request_record_finish
from sessions_app.services.results import result_insert
from sessions_app.services.rows import row_insert, row_stored, row_update, row_values
from sessions_app.services.turns import step_draft_save, step_record, turn_start
from tests.sessions_app.store_kit import request_recorded

pytestmark = pytest.mark.django_db(transaction=True)


def _turn(session: ChatSession) -> Turn:
    return turn_start(session=session, words="hi", today="2026-12-01", instructions=None)


def test_an_inserted_row_reads_back_as_the_orm_writes_it(chat_session: ChatSession) -> None:
    turn = _turn(chat_session)
    calls = [{"id": "c1", "name": "read", "arguments": '{"path": "a"}'}]
    by_orm = Step.objects.create(turn=turn, number=1, text="t", tool_calls=calls, finish_reason="tool_calls")
    step = Step(turn=turn, number=2, text="t", tool_calls=calls, finish_reason="tool_calls")
    with connection.cursor() as cursor:
        cursor.execute(f"{row_insert(Step).sql} RETURNING id", row_values(step))
        row = cursor.fetchone()
    assert row is not None
    stored = row_stored(step, int(row[0]))
    assert not stored._state.adding and stored.pk == row[0]
    again = Step.objects.get(pk=stored.pk)
    assert again.created_at is not None and again.created_at >= by_orm.created_at, "auto_now_add is set"
    ignore = {"id", "number"}
    assert {k: v for k, v in model_to_dict(again).items() if k not in ignore} == {
        k: v for k, v in model_to_dict(by_orm).items() if k not in ignore
    }
    assert again.tool_calls == calls, "JSON goes in as JSON"


def test_a_step_is_one_statement_that_drops_its_draft_and_moves_the_revision_on(chat_session: ChatSession) -> None:
    turn = _turn(chat_session)
    step_draft_save(turn=turn, number=1, text="He", reasoning="")
    before = ChatSession.objects.get(pk=chat_session.pk).revision
    with CaptureQueriesContext(connection) as queries:
        step = step_record(turn=turn, number=1, text="Hello", reasoning="", tool_calls=[], finish_reason="stop")
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]
    assert not StepDraft.objects.filter(turn=turn).exists()
    revision = ChatSession.objects.get(pk=chat_session.pk).revision
    assert revision == before + 1 == turn.revision == Turn.objects.get(pk=turn.pk).revision
    assert Step.objects.get(pk=step.pk).text == "Hello"


def test_a_step_of_a_turn_that_is_gone_is_not_stored(chat_session: ChatSession) -> None:
    turn = _turn(chat_session)
    Turn.objects.filter(pk=turn.pk).delete()
    before = ChatSession.objects.get(pk=chat_session.pk).revision
    with pytest.raises(Turn.DoesNotExist):
        step_record(turn=turn, number=1, text="Hello", reasoning="", tool_calls=[], finish_reason="stop")
    assert not Step.objects.exists()
    assert ChatSession.objects.get(pk=chat_session.pk).revision == before, "the statement is undone whole"


def test_a_request_record_is_one_statement_that_clears_the_pending_breaks(chat_session: ChatSession) -> None:
    turn = _turn(chat_session)
    ChatSession.objects.filter(pk=chat_session.pk).update(pending_breaks=[{"cause": "undo", "turn": 1}])
    chat_session.refresh_from_db()
    previous = previous_request(chat_session)
    assert previous.pending
    built = build_request(chat_session, current=turn, model_name="m")
    with CaptureQueriesContext(connection) as queries:
        request, _ = request_recorded(chat_session, turn, built=built, previous=previous)
    assert len(queries.captured_queries) == 1
    assert ChatSession.objects.get(pk=chat_session.pk).pending_breaks == [] == chat_session.pending_breaks
    stored = ModelRequest.objects.get(pk=request.pk)
    assert (stored.status, stored.bytes_sent, stored.turn_id) == ("sending", len(built.body), turn.pk)
    assert stored.started_at is not None


def _insert(turn: Turn, step: Step, *, number: int | None) -> Result:
    return result_insert(
        turn=turn,
        step=step,
        call_id="c1",
        tool="run",
        arguments={"command": "true"},
        arguments_raw='{"command": "true"}',
        outcome=OutputOutcome(text="ok"),
        table=[],
        number=number,
    )


def test_a_result_whose_number_the_reply_knows_is_one_statement(chat_session: ChatSession) -> None:
    turn = _turn(chat_session)
    step = step_record(turn=turn, number=1, text="", reasoning="", tool_calls=[], finish_reason="tool_calls")
    with CaptureQueriesContext(connection) as queries:
        result = _insert(turn, step, number=1)
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]
    stored = Result.objects.get(pk=result.pk)
    assert (stored.number, stored.session_id, stored.step_id) == (1, chat_session.pk, step.pk)
    assert stored.inserted_text.startswith("[#0001]") and stored.created_at is not None
    session = ChatSession.objects.get(pk=chat_session.pk)
    assert session.next_result_number == 2 and session.revision == turn.revision


def test_a_result_whose_number_is_taken_gets_the_next_one_in_one_transaction(chat_session: ChatSession) -> None:
    turn = _turn(chat_session)
    step = step_record(turn=turn, number=1, text="", reasoning="", tool_calls=[], finish_reason="tool_calls")
    _insert(turn, step, number=1)
    with CaptureQueriesContext(connection) as queries:
        result = _insert(turn, step, number=1)  # as a caller that did not see the first would ask
    statements = [q["sql"] for q in queries.captured_queries]
    assert statements[1] == "BEGIN" and statements[-1] == "COMMIT" and len(statements) == 5, statements
    assert result.number == 2 and result.inserted_text.startswith("[#0002]")
    assert list(Result.objects.order_by("number").values_list("number", flat=True)) == [1, 2]
    assert ChatSession.objects.get(pk=chat_session.pk).next_result_number == 3
    with CaptureQueriesContext(connection) as queries:
        assert _insert(turn, step, number=None).number == 3
    assert queries.captured_queries[0]["sql"] == "BEGIN", "without a number: the transaction"


@pytest.mark.parametrize("wait_for_disk", [True, False])
def test_a_request_is_completed_in_one_statement(chat_session: ChatSession, wait_for_disk: bool) -> None:
    turn = _turn(chat_session)
    request, _ = request_recorded(chat_session, turn)
    with CaptureQueriesContext(connection) as queries:
        request_record_finish(
            request=request,
            prompt_tokens=120,
            cached_tokens=100,
            completion_tokens=7,
            time_to_first_token=0.25,
            total_time=1.5,
            usage={"prompt_tokens": 120, "note": "a\x00b"},
            timings=None,
            wait_for_disk=wait_for_disk,
        )
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == 1 and statements[0].startswith('WITH finished AS (UPDATE "sessions_app_modelrequest"')
    assert "INSERT INTO sessions_app_usageday" in statements[0], "the same statement adds it to the day's usage"
    assert (WITHOUT_WAITING in statements[0]) is not wait_for_disk
    stored = ModelRequest.objects.get(pk=request.pk)
    assert (stored.status, stored.prompt_tokens, stored.cached_tokens, stored.total_time) == ("done", 120, 100, 1.5)
    assert stored.usage == {"prompt_tokens": 120, "note": "a\u2400b"} and stored.timings is None
    assert stored.finished_at is not None and stored.error == ""


def test_a_revision_bump_changes_the_turn_in_place_however_long_the_message(chat_session: ChatSession) -> None:
    words = " ".join(f"word{i} and some text" for i in range(5000))  # 120 KB, full-text indexed
    turn = turn_start(session=chat_session, words=words, today="2026-12-01", instructions=None)
    with connection.cursor() as cursor:
        cursor.execute(
            'EXPLAIN (ANALYZE, WAL, FORMAT JSON) UPDATE "sessions_app_turn" SET revision = revision + 1 WHERE id = %s',
            [turn.pk],
        )
        row = cursor.fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    wal_bytes = plan[0]["Plan"]["WAL Bytes"]
    assert wal_bytes < 1000, f"the update wrote {wal_bytes} bytes of WAL: it went through the turn's indexes"


def test_an_update_of_a_field_the_model_lacks_writes_nothing(chat_session: ChatSession) -> None:
    turn = _turn(chat_session)
    request, _ = request_recorded(chat_session, turn)
    request.status = "done"
    with CaptureQueriesContext(connection) as queries, pytest.raises(ValueError, match="statu"):
        row_update(request, ["status", "statu"])
    assert not queries.captured_queries
    assert ModelRequest.objects.get(pk=request.pk).status == "sending"
