"""The API's actions through the whole ASGI stack, queued for a worker of the task queue (on the test's event loop)
that asks the scripted model server: a message sent, its reply's typed events followed as Server-Sent Events with
httpx-sse (as ``docs/api.md`` shows), regenerate, undo, rewind and stop; and what is refused, with nothing queued."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from httpx_sse import aconnect_sse

from cachet.asgi import application
from sessions_app.models import ChatSession, ModelEndpoint, Turn, TurnStatus, Workspace
from sessions_app.services.tokens import api_token_create
from testing.scripted_server import ScriptedServer, Step
from tests.worker_kit import running_worker

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

Event = tuple[str, dict[str, Any]]


@pytest_asyncio.fixture(autouse=True)
async def worker() -> AsyncIterator[None]:
    layer = get_channel_layer()
    assert layer is not None
    await layer.flush()
    async with running_worker():
        yield


@pytest_asyncio.fixture
async def api(user: Any) -> AsyncIterator[httpx.AsyncClient]:
    made = await sync_to_async(api_token_create)(owner=user, name="tests", access="write")
    transport = httpx.ASGITransport(app=application, client=("127.0.0.1", 40000))
    headers = {"Authorization": f"Bearer {made.secret}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000", headers=headers) as client:
        yield client


async def streamed(api: httpx.AsyncClient, method: str, path: str, body: dict[str, Any]) -> tuple[int, list[Event]]:
    """The status and events of an action asked with ``Accept: text/event-stream``, to its job's end."""
    async with asyncio.timeout(30), aconnect_sse(api, method, path, json=body) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        assert source.response.headers["cache-control"] == "no-cache"
        events = [(sse.event, json.loads(sse.data)) async for sse in source.aiter_sse()]
    return source.response.status_code, events


def named(events: list[Event], name: str) -> list[dict[str, Any]]:
    return [data for event, data in events if event == name]


def text_of(events: list[Event]) -> str:
    return "".join(data["text"] for data in named(events, "text"))


def turns_of(session_id: int) -> list[tuple[int, str]]:
    return list(Turn.objects.filter(session_id=session_id).order_by("number").values_list("number", "status"))


async def test_a_session_started_and_its_reply_streamed(
    api: httpx.AsyncClient, workspace: Workspace, live_endpoint: ModelEndpoint, model: ScriptedServer
) -> None:
    model.push(Step(text="Hello there, from the model.", chunk_size=4))
    body = {"text": "hello", "workspace": workspace.pk, "endpoint": live_endpoint.pk}
    status, events = await streamed(api, "POST", "/api/v1/sessions", body)
    assert status == 201
    names = [event for event, _ in events]
    assert names[0] == "job" and names[-1] == "job_ended"
    assert "turn_started" in names and "turn_ended" in names and "request_finished" in names
    assert text_of(events) == "Hello there, from the model."
    assert named(events, "job_ended")[0]["failure"] == ""
    assert all("sent" not in data and "type" not in data for _, data in events)
    session_id = named(events, "job")[0]["session"]
    listed = (await api.get("/api/v1/sessions")).json()
    assert [item["id"] for item in listed["items"]] == [session_id]
    assert listed["items"][0]["title"] == "hello" and listed["items"][0]["totals"]["requests"] >= 1


async def test_send_then_read_the_turns(
    api: httpx.AsyncClient, live_session: ChatSession, model: ScriptedServer
) -> None:
    model.push(Step(text="", tool_calls=[("read", {"path": "notes.md"})]), Step(text="It counts lines."))
    queued = await api.post(f"/api/v1/sessions/{live_session.pk}/messages", json={"text": "what is in notes.md?"})
    assert queued.status_code == 202
    answer = queued.json()
    assert answer["session"] == live_session.pk and answer["events"].endswith(f"/events?job={answer['job']}")
    async with asyncio.timeout(30):
        while await sync_to_async(turns_of)(live_session.pk) != [(1, TurnStatus.DONE)]:
            await asyncio.sleep(0.05)
    turns = (await api.get(f"/api/v1/sessions/{live_session.pk}/turns")).json()
    turn = turns["items"][0]
    assert (turn["words"], turn["reply"]) == ("what is in notes.md?", "It counts lines.")
    call = turn["steps"][0]["tool_calls"][0]
    assert call["name"] == "read" and call["result"] == "#0001"
    result = (await api.get(f"/api/v1/sessions/{live_session.pk}/results/0001")).json()
    assert result["full_text"].startswith("1: line 1\n") and result["inserted_text"].startswith("[#0001")


async def test_regenerate_undo_and_rewind(
    api: httpx.AsyncClient, live_session: ChatSession, model: ScriptedServer
) -> None:
    session = f"/api/v1/sessions/{live_session.pk}"
    model.push(Step(text="", tool_calls=[("read", {"path": "notes.md"})]), Step(text="First."))
    status, events = await streamed(api, "POST", f"{session}/messages", {"text": "one"})
    assert status == 202
    stored = named(events, "result_stored")
    assert [(data["id"], data["number"]) for data in stored] == [("#0001", 1)]
    model.push(Step(text="Second."))
    _, events = await streamed(api, "POST", f"{session}/messages", {"text": "two"})
    assert text_of(events) == "Second."
    model.push(Step(text="Second, again."))
    _, events = await streamed(api, "POST", f"{session}/regenerate", {})
    assert named(events, "turn_started")[0]["again"] is True and text_of(events) == "Second, again."
    _, events = await streamed(api, "POST", f"{session}/undo", {})
    assert named(events, "turns_taken_back")[0]["numbers"] == [3]
    _, events = await streamed(api, "POST", f"{session}/rewind", {"turn": 1})
    assert named(events, "turns_taken_back")[0]["numbers"] == [1]
    assert (await api.get(f"{session}/turns")).json()["count"] == 0
    every = (await api.get(f"{session}/turns?taken_back=true")).json()
    assert [(turn["number"], turn["live"]) for turn in every["items"]] == [(1, False), (2, False), (3, False)]
    _, events = await streamed(api, "POST", f"{session}/undo", {})
    assert named(events, "job_ended")[0]["failure"] != ""  # nothing left to take back: said, not a 500


async def test_a_second_send_while_one_runs_is_refused_and_stop_ends_it(
    api: httpx.AsyncClient, live_session: ChatSession, model: ScriptedServer
) -> None:
    session = f"/api/v1/sessions/{live_session.pk}"
    model.push(Step(text=" ".join(f"w{n}" for n in range(400)), chunk_size=2, delay=0.02))

    async def follow() -> tuple[int, list[Event]]:
        return await streamed(api, "POST", f"{session}/messages", {"text": "a long one"})

    following = asyncio.create_task(follow())
    async with asyncio.timeout(30):
        while not (await api.get(session)).json()["running"]:
            await asyncio.sleep(0.05)
    refused = await api.post(f"{session}/messages", json={"text": "and another"})
    assert refused.status_code == 409
    assert refused.json()["detail"].startswith("A reply is already running")
    stopped = await api.post(f"{session}/stop")
    assert stopped.json() == {"sent": True}
    _, events = await following
    assert named(events, "turn_ended") and named(events, "job_ended")
    assert await sync_to_async(turns_of)(live_session.pk) == [(1, TurnStatus.INTERRUPTED)]
    assert [turn["words"] for turn in (await api.get(f"{session}/turns")).json()["items"]] == ["a long one"]


async def test_an_endpoint_taken_back_refuses_the_send_and_queues_nothing(
    api: httpx.AsyncClient, live_session: ChatSession, live_endpoint: ModelEndpoint
) -> None:
    live_endpoint.open_to_everyone = False
    await sync_to_async(live_endpoint.save)()
    refused = await api.post(f"/api/v1/sessions/{live_session.pk}/messages", json={"text": "hi"})
    assert refused.status_code == 403
    assert "may no longer use" in refused.json()["detail"] or "endpoint" in refused.json()["detail"]
    assert await sync_to_async(turns_of)(live_session.pk) == []
    undo = await api.post(f"/api/v1/sessions/{live_session.pk}/undo", json={})
    assert undo.status_code == 202  # taking back asks no model


async def test_a_blank_or_oversize_message_is_refused(
    api: httpx.AsyncClient, live_session: ChatSession, settings: Any
) -> None:
    blank = await api.post(f"/api/v1/sessions/{live_session.pk}/messages", json={"text": "  \n"})
    assert (blank.status_code, blank.json()["detail"]) == (422, "Write a message first.")
    settings.CACHET_MAX_MESSAGE_BYTES = 10
    large = await api.post(f"/api/v1/sessions/{live_session.pk}/messages", json={"text": "x" * 11})
    assert large.status_code == 413
    assert await sync_to_async(turns_of)(live_session.pk) == []


async def test_a_session_create_with_a_workspace_not_theirs_is_refused(
    api: httpx.AsyncClient, live_endpoint: ModelEndpoint, tmp_path: Any
) -> None:
    folder = tmp_path / "closed"
    folder.mkdir()
    closed = await sync_to_async(Workspace.objects.create)(name="closed", folder=str(folder), open_to_everyone=False)
    refused = await api.post(
        "/api/v1/sessions", json={"text": "hi", "workspace": closed.pk, "endpoint": live_endpoint.pk}
    )
    assert refused.status_code == 404
    assert refused.json()["detail"] == f"There is no workspace {closed.pk} open to you."
    assert await sync_to_async(ChatSession.objects.count)() == 0


async def test_a_reply_that_fails_says_why_in_its_stream(api: httpx.AsyncClient, chat_session: ChatSession) -> None:
    """The session's endpoint is the discard port: the turn fails, and the stream's ``turn_ended`` says so."""
    status, events = await streamed(api, "POST", f"/api/v1/sessions/{chat_session.pk}/messages", {"text": "hi"})
    assert status == 202
    ended = named(events, "turn_ended")[0]
    assert (ended["number"], ended["status"]) == (1, "failed")
    assert ended["error"].startswith("Cannot reach the model server")
