"""The publisher turns a reply's events into page changes, each marked with the session revision it brings a tab
to, so a tab that reconnects asks for exactly what it lacks."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.layers import get_channel_layer

from chat.agent.events import ReplyEvent, ResultStored, StepStored, TurnEnded
from chat.agent.loop import ReplyLoop
from chat.web import fragments
from chat.web import publisher as publisher_module
from chat.web.display import row_for_result, single_turn, started_turn
from chat.web.publisher import (
    RENDER_SECONDS,
    RENDER_SHARE,
    Publisher,
    Relay,
    _Delta,
    _Item,
    _Send,
    render_gap,
    session_group,
)
from chat.web.sync import PageState, catch_up
from sessions_app.models import ChatSession, Turn
from sessions_app.services.turns import step_record, turn_fail, turn_finish, turn_start
from sessions_app.services.undo import turn_edit
from testing.scripted_server import ScriptedServer, Step

pytestmark = pytest.mark.django_db(transaction=True)


def _revision_of(messages: list[dict[str, Any]], dom_id: str) -> int:
    for message in messages:
        if any(op.get("id") == dom_id for op in message.get("ops", [])):
            return int(message["rev"])
    raise AssertionError(f"nothing put {dom_id}")


def test_a_step_published_after_its_results_were_stored_carries_its_own_revision(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path
) -> None:
    (workspace_dir / "a.py").write_text("print('a')\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.py"})]))
    scripted.push(Step(text="Done."))
    sent: list[str] = []

    def put(item: _Item) -> None:
        if isinstance(item, _Send):
            sent.append(item.text)

    publisher = Publisher(scripted_session, put=put, reply_to=None, label="Replying…")
    steps: list[StepStored] = []
    results: list[ResultStored] = []
    for event in ReplyLoop(scripted_session).send("read it"):
        publisher.publish(event)  # the step's event comes once its result is stored and the next request sent
        if isinstance(event, StepStored):
            steps.append(event)
        elif isinstance(event, ResultStored):
            results.append(event)
    messages = [json.loads(text) for text in sent]
    row = row_for_result(results[0].result)
    assert row is not None
    step_revision = _revision_of(messages, f"step-{steps[0].step.pk}")
    row_revision = _revision_of(messages, row.dom_id)
    assert step_revision == steps[0].revision < row_revision == results[0].revision
    caught = catch_up(scripted_session.pk, PageState(revision=step_revision, first_turn=1, last_bar=0))
    assert any(row.dom_id in text for text in caught.messages), "a tab that has the step but not the row gets it"


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


def _ended_html(session: ChatSession, events: Iterator[ReplyEvent], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The HTML the publisher sent for each turn that ended, built without asking the store."""
    sent: list[str] = []

    def put(item: _Item) -> None:
        if isinstance(item, _Send):
            sent.append(item.text)

    def refused(turn: Any, *, running: bool) -> Any:
        raise AssertionError("the ended turn is read from the store")

    publisher = Publisher(session, put=put, reply_to=None, label="Replying…")
    ended: list[str] = []
    for event in events:
        if isinstance(event, TurnEnded):
            sent.clear()
            with monkeypatch.context() as patched:
                patched.setattr(publisher_module, "single_turn", refused)
                publisher.publish(event)
            ops = [op for text in sent for op in json.loads(text)["ops"]]
            ended.append(next(op["html"] for op in ops if op["id"] == f"turn-{event.turn.number}"))
        else:
            publisher.publish(event)
    return ended


def _full_html(session: ChatSession, number: int) -> str:
    turn = Turn.objects.get(session=session, number=number)
    return fragments.turn_put(single_turn(turn, running=False)).html


def test_an_ended_turn_is_shown_as_the_full_view_shows_it(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace_dir / "a.py").write_text("\n".join(f"line {n}" for n in range(80)) + "\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.py"}), ("read", {"path": "missing.py"})]))
    scripted.push(Step(reasoning="Looked.", text="It has **80** lines.", tool_calls=[("list", {"path": "."})]))
    scripted.push(Step(text="Done: 80 lines."))
    first = _ended_html(scripted_session, ReplyLoop(scripted_session).send("count it"), monkeypatch)
    assert first == [_full_html(scripted_session, 1)]
    assert first[0].count('class="tool-name"') == 3 and 'class="reasoning"' in first[0]

    scripted.push(Step(text="half", fault="cut"))
    failed = _ended_html(scripted_session, ReplyLoop(scripted_session).send("again"), monkeypatch)
    assert failed == [_full_html(scripted_session, 2)]

    scripted.push(Step(text="Regenerated."))
    again = _ended_html(scripted_session, ReplyLoop(scripted_session).regenerate(), monkeypatch)
    assert again == [_full_html(scripted_session, 3)]
    assert 'sibling-at">2 / 2' in again[0]

    scripted.push(Step(text="Edited."))
    edited = _ended_html(scripted_session, ReplyLoop(scripted_session).edit(1, "count it again"), monkeypatch)
    assert edited == [_full_html(scripted_session, 4)]

    cancel = threading.Event()
    loop = ReplyLoop(scripted_session, cancel=cancel)
    scripted.push(Step(tool_calls=[("read", {"path": "a.py"})]))

    def stopping() -> Iterator[ReplyEvent]:
        for event in loop.send("stop after the read"):
            if isinstance(event, ResultStored):
                cancel.set()
            yield event

    stopped = _ended_html(scripted_session, stopping(), monkeypatch)
    assert stopped == [_full_html(scripted_session, 5)]


def test_live_text_renders_at_most_every_tenth_of_a_second_and_less_often_as_it_costs_more_or_many_stream() -> None:
    assert render_gap(0.001, streaming=1) == RENDER_SECONDS
    assert render_gap(0.001, streaming=0) == RENDER_SECONDS
    assert render_gap(0.05, streaming=1) == pytest.approx(0.05 / RENDER_SHARE)
    # Fifty replies streaming at once share the same part of the process as one did.
    assert render_gap(0.004, streaming=50) == pytest.approx(50 * 0.004 / RENDER_SHARE)
    assert render_gap(0.004, streaming=50) == pytest.approx(1.0)


async def _relay_and_tab(session_id: int) -> tuple[Relay, Callable[..., Awaitable[list[str]]]]:
    """A relay on the in-memory layer and what a tab of its session receives within some seconds (or until
    what it received holds ``until``)."""
    layer = get_channel_layer()
    assert layer is not None
    channel = await layer.new_channel()
    await layer.group_add(session_group(session_id), channel)
    relay = Relay(session_id=session_id, layer=layer, loop=asyncio.get_running_loop())
    relay.start()

    async def received(seconds: float, until: str | None = None) -> list[str]:
        texts: list[str] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = await asyncio.wait_for(layer.receive(channel), left)
            except TimeoutError:
                break
            texts.append(str(message["text"]))
            if until is not None and until in "".join(texts):
                break
        return texts

    return relay, received


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=False)
async def test_a_hushed_relay_holds_streamed_text_until_the_reply_publishes_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between the model's answer and the next request the reply's thread works and the relay keeps quiet;
    what the thread publishes next (the next request is on its way) lets everything out, in order."""
    monkeypatch.setattr(publisher_module, "HUSH_SECONDS", 30.0)
    relay, received = await _relay_and_tab(9101)
    relay.hush()
    assert relay.hushed
    relay.put(_Delta(1, 1, "text", "held-text"))
    assert await received(0.3) == [], "nothing goes out while hushed"
    relay.put(_Send('{"ops": [], "marker": "published"}', None))
    assert not relay.hushed
    texts = "".join(await received(30.0, until="published"))
    assert "held-text" in texts and "published" in texts
    assert texts.index("held-text") < texts.index("published"), "in the order put"
    relay.close()
    await relay.finished()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=False)
async def test_a_hush_runs_out_by_itself_and_a_closed_relay_is_never_hushed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "HUSH_SECONDS", 0.3)
    relay, received = await _relay_and_tab(9102)
    relay.hush()
    relay.put(_Delta(1, 1, "text", "after-the-hush"))
    texts = "".join(await received(30.0, until="after-the-hush"))
    assert "after-the-hush" in texts
    assert not relay.hushed, "it went out once the hush had run out: nothing else let it out"
    monkeypatch.setattr(publisher_module, "HUSH_SECONDS", 30.0)
    relay.hush()
    relay.put(_Delta(1, 1, "text", "at-the-close"))
    relay.close()
    await asyncio.wait_for(relay.finished(), 2.0)
    assert "at-the-close" in "".join(await received(0.5))
