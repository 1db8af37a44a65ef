"""What a step and a page cost does not grow with the session: the same queries at 10 turns as at 200."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from sessions_app.hygiene.outcomes import ReadOutcome
from sessions_app.models import ChatSession, ModelRequest, Turn
from sessions_app.services.results import result_insert
from sessions_app.services.turns import step_record, turn_finish, turn_start
from sessions_app.types import StoredCall
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)

FAST = Timeouts(connect=2.0, first_token=5.0, between_chunks=5.0)
READS = 3


def _three_reads(scripted: ScriptedServer, turn: int) -> None:
    scripted.push(
        *(Step(tool_calls=[("read", {"path": f"f{n}.txt", "offset": turn % 5 + 1})]) for n in range(READS)),
        Step(text=f"Read them, turn {turn}."),
    )


def _grow(session: ChatSession, *, to: int) -> None:
    """Store turns like the loop's (three reads and a text) straight through the services, up to ``to`` turns."""
    while Turn.objects.filter(session=session).count() < to:
        turn = turn_start(session=session, words="read them again", today="2026-11-30", instructions=None)
        for number in range(1, READS + 1):
            call = StoredCall(id=f"c{turn.number}-{number}", name="read", arguments='{"path": "f0.txt"}')
            step = step_record(turn=turn, number=number, text="", reasoning="", tool_calls=[call], finish_reason="")
            outcome = ReadOutcome("f0.txt", "/ws/f0.txt", 1, 2000, 1, 40, 40, "0" * 64, "1: x")
            result_insert(
                turn=turn,
                step=step,
                call_id=call["id"],
                tool="read",
                arguments={"path": "f0.txt"},
                arguments_raw=call["arguments"],
                outcome=outcome,
            )
        step_record(turn=turn, number=READS + 1, text="Done.", reasoning="", tool_calls=[], finish_reason="stop")
        turn_finish(turn=turn)


def _queries_of_a_turn(session: ChatSession, scripted: ScriptedServer, number: int) -> int:
    _three_reads(scripted, number)
    with CaptureQueriesContext(connection) as captured:
        turn = run(ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST).send("again")).turn
    assert turn.status == "done", turn.error
    return len(captured)


def _queries_of_the_page(client: Client, session: ChatSession) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(f"/sessions/{session.pk}/")
    assert response.status_code == 200
    return len(captured), len(response.content)


def test_a_turn_and_the_page_cost_the_same_at_10_and_200_turns(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path, user: Any
) -> None:
    for n in range(READS):
        (workspace_dir / f"f{n}.txt").write_text("".join(f"line {i} of file {n}\n" for i in range(1, 300)))
    client = Client()
    client.force_login(user)
    _grow(scripted_session, to=10)
    _queries_of_a_turn(scripted_session, scripted, 11)  # the first request through the loop, at 11 turns
    turn_queries_10 = _queries_of_a_turn(scripted_session, scripted, 12)
    page_queries_10, page_bytes_10 = _queries_of_the_page(client, scripted_session)
    _grow(scripted_session, to=200)
    turn_queries_200 = _queries_of_a_turn(scripted_session, scripted, 201)
    page_queries_200, page_bytes_200 = _queries_of_the_page(client, scripted_session)
    assert turn_queries_200 == turn_queries_10, "a step reads nothing of what came before it"
    assert page_queries_200 == page_queries_10, "the page reads the last turns, not the session"
    assert page_bytes_200 < 1.5 * page_bytes_10 + 20_000, "the page shows the last turns only"
    assert ModelRequest.objects.filter(session=scripted_session).count() == 3 * (READS + 1)
