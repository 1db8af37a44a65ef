"""An action's cache checks, queued as one job of the checks queue: the job checks each request in turn, stores each
check and tells the session's tabs where each bar stands, as the action left it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from chat import tasks, wire
from chat.agent.cache_check import CheckSpec
from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from chat.tools import tool_list
from chat.worker import checks
from sessions_app.models import ModelEndpoint, ModelRequest, Workspace
from sessions_app.selectors.requests import finished_requests
from sessions_app.services.sessions import session_start
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)

FAST = Timeouts(connect=2.0, first_token=5.0, between_chunks=5.0)


def test_one_job_checks_the_actions_requests_and_shows_each_bar_where_it_stands(
    user: Any, workspace: Workspace, notes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[list[dict[str, Any]]] = []

    async def queued(specs: list[CheckSpec]) -> None:
        batches.append([spec.as_json() for spec in specs])

    published: list[dict[str, Any]] = []

    async def publish(message: dict[str, Any], *, to: str | None = None) -> None:
        published.append(dict(wire.checked(message)))

    monkeypatch.setattr(checks, "publish", publish)
    with ScriptedServer(n_ctx=50_000) as server:
        endpoint = ModelEndpoint.objects.create(name="checked", base_url=server.base_url, model="scripted")
        tools = tool_list(allow_commands=False)
        session = session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=tools)
        server.push(
            Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]),
            Step(text="Once more.", tool_calls=[("read", {"path": "notes.md", "offset": 2})]),
            Step(text="Done."),
        )
        run(ReplyLoop(session, client_timeouts=FAST, checks=queued).send("read the notes twice"))
        assert len(batches) == 1 and len(batches[0]) == 2, "the action's two checks, as one job"
        assert ModelRequest.objects.filter(session=session, expected_cached_tokens__isnull=False).count() == 0
        async_to_sync(tasks.cache_checks.func)(specs=batches[0])
    bars = list(finished_requests(session=session).order_by("id"))
    checked = [request for request in bars if request.expected_cached_tokens is not None]
    assert [request.pk for request in checked] == [spec["request_id"] for spec in batches[0]]
    assert [(message["event"], message["request"]) for message in published] == [
        ("cache_checked", request.pk) for request in checked
    ]
    assert [message["bar"] for message in published] == [bars.index(request) + 1 for request in checked]
    assert [message["previous_ttft"] for message in published] == [
        bars[bars.index(request) - 1].time_to_first_token for request in checked
    ]
