"""The reply loop against a server that sends lone surrogates as JSON escapes: the turn ends, its text stored."""

from __future__ import annotations

import json

import pytest

from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from sessions_app.models import ChatSession, Result, TurnStatus
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)


def test_lone_surrogates_in_the_stream_are_stored_and_sent_back(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(
        Step(text="half \ud83d", reasoning="why \udfff", tool_calls=[("list", '{"path": "."}\ud800')]),
        Step(text="whole"),
    )
    loop = ReplyLoop(
        ChatSession.objects.get(pk=scripted_session.pk),
        client_timeouts=Timeouts(connect=2.0, first_token=2.0, between_chunks=2.0),
    )
    turn = run(loop.send("hi \ud800")).turn
    assert turn.status == TurnStatus.DONE, turn.error
    assert turn.words == "hi \ufffd"
    assert turn.reply_text == "half \ufffd\n\nwhole"
    step = turn.steps.get(number=1)
    assert step.reasoning == "why \ufffd"
    assert step.tool_calls[0]["arguments"] == '{"path": "."}\ufffd'
    assert Result.objects.get(turn=turn).arguments_raw == '{"path": "."}\ufffd'
    second = json.loads(scripted.requests[1])["messages"]
    assert second[-2]["content"] == "half \ufffd" and second[-2]["reasoning_content"] == "why \ufffd"
