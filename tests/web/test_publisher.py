"""The publisher turns a reply's events into page changes, each marked with the session revision it brings a tab
to, so a tab that reconnects asks for exactly what it lacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chat.agent.events import ResultStored, StepStored
from chat.agent.loop import ReplyLoop
from chat.testing.scripted_server import ScriptedServer, Step
from chat.web.display import row_for_result
from chat.web.publisher import Publisher, _Item, _Send
from chat.web.sync import PageState, catch_up
from sessions_app.models import ChatSession

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
