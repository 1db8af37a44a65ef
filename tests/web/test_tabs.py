"""What a web process shows its tabs of each typed event: every event type has its page messages, each marked with
the session revision it brings a tab to (so a tab that reconnects asks for exactly what it lacks), and what is read
from the store is read once for all the tabs of a process."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext
from procrastinate.contrib.django.models import ProcrastinateJob

from chat import wire
from chat.actions import Send
from chat.agent.events import RequestFinished, ResultStored, StepStored, TextDelta
from chat.agent.loop import ReplyLoop
from chat.web import chart, fragments, queueing, tabs
from chat.web.display import row_for_result, single_turn, started_turn
from chat.web.sync import PageState, catch_up
from sessions_app.models import ChatSession, ModelEndpoint, Turn
from sessions_app.selectors.requests import finished_requests
from sessions_app.selectors.totals import session_totals
from sessions_app.services.turns import step_record, turn_fail, turn_finish, turn_start
from sessions_app.services.undo import turn_edit
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)


def _shown(event: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(text) for text in async_to_sync(tabs.page_messages)(wire.checked(event))]


def _revision_of(messages: list[dict[str, Any]], dom_id: str) -> int:
    for message in messages:
        if any(op.get("id") == dom_id for op in message.get("ops", [])):
            return int(message["rev"])
    raise AssertionError(f"nothing put {dom_id}")


def test_every_event_type_has_its_page_messages() -> None:
    assert set(wire.SCHEMAS) == set(tabs.AT_ONCE) | set(tabs.FROM_STORE)
    assert not set(tabs.AT_ONCE) & set(tabs.FROM_STORE)


def test_a_step_shown_after_its_results_were_stored_carries_its_own_revision(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path
) -> None:
    (workspace_dir / "a.py").write_text("print('a')\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.py"})]), Step(text="Done."))
    ran = run(ReplyLoop(scripted_session).send("read it"))
    messages = [
        message
        for event in ran.events
        if not isinstance(event, TextDelta)
        for message in _shown(wire.event_message(scripted_session.pk, event))
    ]
    steps = [event for event in ran.events if isinstance(event, StepStored)]
    results = [event for event in ran.events if isinstance(event, ResultStored)]
    row = row_for_result(results[0].result)
    assert row is not None
    step_revision = _revision_of(messages, f"step-{steps[0].step.pk}")
    row_revision = _revision_of(messages, row.dom_id)
    assert step_revision == steps[0].revision < row_revision == results[0].revision
    caught = catch_up(scripted_session.pk, PageState(revision=step_revision, first_turn=1, last_bar=0))
    assert any(row.dom_id in text for text in caught.messages), "a tab that has the step but not the row gets it"
    ended = _shown(wire.turn_ended_message(scripted_session.pk, turn=ran.turn.pk, revision=ran.turn.revision))
    turn = Turn.objects.get(pk=ran.turn.pk)
    assert ended[0]["ops"][0]["html"] == fragments.turn_put(single_turn(turn, running=False)).html
    assert ended[0]["rev"] == turn.revision


def test_streamed_text_is_sent_on_with_its_offset_and_a_stored_step_moves_the_live_area_on(
    scripted_session: ChatSession, scripted: ScriptedServer
) -> None:
    piece = wire.delta_message(scripted_session.pk, turn=3, step=2, text="é!", at=40, reasoning=False)
    assert _shown(piece) == [{"live": {"turn": 3, "step": 2, "text": "é!", "text_at": 40}}]
    thought = wire.delta_message(scripted_session.pk, turn=3, step=2, text="hm", at=7, reasoning=True)
    assert _shown(thought) == [{"live": {"turn": 3, "step": 2, "reasoning": "hm", "reasoning_at": 7}}]
    scripted.push(Step(text="Hello."))
    ran = run(ReplyLoop(scripted_session).send("hi"))
    stored = next(event for event in ran.events if isinstance(event, StepStored))
    shown = _shown(wire.event_message(scripted_session.pk, stored))
    assert shown[-1] == {"live": {"turn": ran.turn.number, "step": stored.step.number + 1}}


def test_what_is_read_from_the_store_is_read_once_for_every_tab_of_the_process(
    scripted_session: ChatSession, scripted: ScriptedServer
) -> None:
    scripted.push(Step(text="Hello."))
    ran = run(ReplyLoop(scripted_session).send("hi"))
    event = wire.turn_ended_message(scripted_session.pk, turn=ran.turn.pk, revision=ran.turn.revision)
    first = _shown(event)
    with CaptureQueriesContext(connection) as queries:
        again = [_shown(event) for _ in range(5)]
    assert again == [first] * 5
    assert len(queries) == 0


def test_a_jobs_queued_state_that_comes_after_it_ran_is_not_shown(chat_session: ChatSession) -> None:
    """The worker ran a short reply before the web process that queued it said so: the page stays idle."""
    session, ran, waits = chat_session.pk, 10**9 + 1, 10**9 + 2  # ids no job of the queue has had
    assert _shown(wire.job_message(session, state="running", label="Replying…", job=ran))
    assert _shown(wire.job_message(session, state="idle", job=ran))
    assert _shown(wire.job_message(session, state="queued", label="Queued: waiting for a worker…", job=ran)) == []
    assert _shown(wire.job_message(session, state="queued", label="Queued: waiting for a worker…", job=waits))


def test_a_tab_that_says_hello_after_its_process_relayed_a_jobs_end_is_shown_idle(chat_session: ChatSession) -> None:
    """The queue marks a job done only after the job published its end: a hello in between found it "doing" and
    put the page back to queued, where it stayed (the browser test of New chat, once under load)."""
    job = queueing.defer(chat_session.pk, Send(words="hi"))
    assert job is not None
    ProcrastinateJob.objects.filter(pk=job).update(status="doing")
    state = PageState(revision=chat_session.revision, first_turn=1, last_bar=0)
    assert catch_up(chat_session.pk, state).running, "doing, and no end heard of: it starts"
    _shown(wire.job_message(chat_session.pk, state="running", label="Replying…", job=job))
    assert catch_up(chat_session.pk, state).running
    _shown(wire.job_message(chat_session.pk, state="idle", job=job))
    assert not catch_up(chat_session.pk, state).running, "its end relayed: idle, though the queue says doing"


def test_an_event_of_something_gone_shows_nothing(chat_session: ChatSession) -> None:
    assert _shown(wire.turn_ended_message(chat_session.pk, turn=10**9, revision=1)) == []


def test_a_started_turn_is_shown_as_the_full_view_shows_it(chat_session: ChatSession) -> None:
    first = turn_start(session=chat_session, words="first", today="2026-12-01", instructions=None)
    views = [(started_turn(first), single_turn(first, running=True))]
    step_record(turn=first, number=1, text="One.", reasoning="", tool_calls=[], finish_reason="stop")
    turn_finish(turn=first)
    second = turn_start(session=chat_session, words="second", today="2026-12-01", instructions=None)
    turn_fail(turn=second, error="Stopped.")
    _, branch = turn_edit(
        session=chat_session, turn=second.number, words="second, again", today="2026-12-01", instructions=None
    )
    views.append((started_turn(branch), single_turn(branch, running=True)))
    assert views[1][0].siblings == (second.number, branch.number)
    for started, full in views:
        assert (started.siblings, started.is_last, started.steps, started.draft) == (
            full.siblings,
            full.is_last,
            full.steps,
            full.draft,
        )
        assert fragments.turn_put(started).html == fragments.turn_put(full).html


def test_a_finished_request_shows_its_bar_and_the_summary_as_the_chart_page_does_with_one_query(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path
) -> None:
    (workspace_dir / "a.py").write_text("print('a')\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.py"})]), Step(text="Done."))
    run(ReplyLoop(scripted_session).send("read it"))
    scripted.push(Step(text="Again."))
    ran = run(ReplyLoop(scripted_session).send("and again"))
    finished = [event for event in ran.events if isinstance(event, RequestFinished)][-1]
    with CaptureQueriesContext(connection) as queries:
        shown = _shown(wire.event_message(scripted_session.pk, finished))
    assert len(queries) == 1, "the request itself: no query over the session's requests"
    session = ChatSession.objects.select_related("endpoint").get(pk=scripted_session.pk)
    bars = chart.bars_of(list(finished_requests(session=session).order_by("id")))
    ops = {op["id"]: op["html"] for message in shown for op in message["ops"]}
    assert bars[-1].request.pk == finished.request.pk and len(bars) == 3
    assert ops[f"bar-{finished.request.pk}"] == fragments.bar_put(bars[-1], window=fragments.chart_window(session)).html
    assert ops["chart-summary"] == fragments.summary_put(session_totals(session)).html
    assert re.fullmatch(r'<span id="chart-headline">3 requests · \d+ % cached</span>', ops["chart-headline"])
    assert ops["axis-titles"] == fragments.axis_put(fragments.chart_window(session)).html


def test_each_bar_redraws_the_axis_with_the_window_it_was_drawn_against(
    scripted_session: ChatSession, scripted: ScriptedServer
) -> None:
    """The chart's axis named the window of when the page was drawn; after a server started with another window,
    or a model change, one screen showed 8,192, 16,384 and 4,096. Each bar now comes with the axis drawn again."""
    scripted.push(Step(text="One."))
    ran = run(ReplyLoop(scripted_session).send("hi"))
    finished = [event for event in ran.events if isinstance(event, RequestFinished)][-1]
    ModelEndpoint.objects.filter(pk=scripted_session.endpoint_id).update(context_window=4096)
    shown = _shown(wire.event_message(scripted_session.pk, finished))
    ops = {op["id"]: op["html"] for message in shown for op in message["ops"]}
    assert "share of the 4,096 token window" in ops["axis-titles"]


def test_a_title_from_the_model_is_put_in_the_heading_and_the_sidebar(chat_session: ChatSession) -> None:
    from sessions_app.services.sessions import session_title_by_model

    turn_start(session=chat_session, words="what does app.py do", today="2026-12-01", instructions=None)
    titled = session_title_by_model(session_id=chat_session.pk, answer="Reading app.py")
    assert titled is not None
    messages = _shown({"type": wire.EVENT, "event": "titled", "session": chat_session.pk, "title": titled.title})
    puts = {op["id"]: op["html"] for message in messages for op in message.get("ops", [])}
    assert "Reading app.py" in puts["session-title"] and "Reading app.py" in puts[f"side-title-{chat_session.pk}"]
    assert _shown({"type": wire.EVENT, "event": "titled", "session": 10**9, "title": "x"}) == []
