"""Changing a session's model: a new generation, the history kept, a compaction still shown once."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.agent.loop import ReplyLoop
from chat.web.display import CompactionView, transcript_page
from sessions_app.errors import ReplyInProgress
from sessions_app.models import BreakCause, ChatSession, ModelEndpoint, ModelRequest, Turn, TurnStatus
from sessions_app.selectors.sessions import compactions
from sessions_app.services.sessions import session_change_model
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db


def test_a_change_of_model_after_a_compaction_keeps_the_summary_and_is_no_compaction(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(Step(text="One."), Step(text="Summary: we said one."), Step(text="Two."))
    loop = ReplyLoop(scripted_session)
    run(loop.send("First"))
    compacted = run(loop.compact()).compacted
    run(loop.send("Second"))
    revision = ChatSession.objects.get(pk=scripted_session.pk).revision
    with ScriptedServer(model="other") as other:
        endpoint = ModelEndpoint.objects.create(name="other", base_url=other.base_url, model="other")
        session = session_change_model(session=scripted_session, endpoint=endpoint, model_name="other")
        assert session.revision == revision + 1
        moved = session.generations.get(number=session.generation_number)
        assert moved.number == 3 and moved.revision == session.revision and moved.model_name == "other"
        assert (moved.summary, moved.table, moved.covers_through_turn) == (
            compacted.summary,
            compacted.table,
            compacted.covers_through_turn,
        )
        assert moved.system_prompt.endswith(compacted.system_prompt[-200:]), "the summary rides along"
        assert list(compactions(session)) == [compacted]
        page = transcript_page(session, running=False)
        markers = [entry for entry in page.entries if isinstance(entry, CompactionView)]
        assert [marker.generation.number for marker in markers] == [compacted.number]
        other.push(Step(text="Three, from the other model."))
        run(ReplyLoop(session).send("Third"))
        body = json.loads(other.requests[0])
    assert body["model"] == "other" and "Summary: we said one." in body["messages"][0]["content"]
    assert [message["content"] for message in body["messages"] if message["role"] == "assistant"] == ["Two."]
    last = ModelRequest.objects.filter(session=session).order_by("-id").first()
    assert last is not None and last.break_cause == BreakCause.MODEL_CHANGE


def test_a_reply_start_reads_the_current_generation_once_outside_the_turns_lock_and_again_after_a_compaction(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(Step(text="One."), Step(text="Two."), Step(text="Summary: we said one and two."), Step(text="Three."))
    loop = ReplyLoop(scripted_session)
    run(loop.send("First"))
    with CaptureQueriesContext(connection) as captured:
        run(loop.send("Second"))
    reads = [query for query in captured.captured_queries if 'FROM "sessions_app_generation"' in query["sql"]]
    assert len(reads) == 2, "once for the reply, once under the lock that stores the message"
    run(loop.compact())
    run(loop.send("Third"))
    body = json.loads(scripted.requests[-1])
    assert "Summary: we said one and two." in body["messages"][0]["content"], "the new generation's prompt"


def test_the_same_model_again_changes_nothing_and_a_name_is_needed(chat_session: ChatSession) -> None:
    same = session_change_model(session=chat_session, endpoint=chat_session.endpoint, model_name=" scripted ")
    assert same.generation_number == 1 and same.revision == chat_session.revision and same.pending_breaks == []
    for wrong, message in (("  ", "Name the model"), ("m" * 201, "at most 200 characters")):
        with pytest.raises(ValueError, match=message):
            session_change_model(session=chat_session, endpoint=chat_session.endpoint, model_name=wrong)
    Turn.objects.create(
        session=chat_session, number=1, generation=chat_session.generations.get(), words="w", message="w", mode="edit"
    )
    assert Turn.objects.get().status == TurnStatus.OPEN
    with pytest.raises(ReplyInProgress):
        session_change_model(session=chat_session, endpoint=chat_session.endpoint, model_name="another")
    assert ChatSession.objects.get(pk=chat_session.pk).model_name == "scripted"
