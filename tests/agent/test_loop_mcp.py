"""Tools from a real MCP server (the official SDK's, over streamable HTTP, in a process of its own) through the reply
loop: the tool list fixed when the session starts, calls and their results, the mode, a server that is down, drops
a tool or is switched off, Stop and the time limit, and its instructions in the notes (spec §10.3, §10.4)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from procrastinate.contrib.django.models import ProcrastinateJob

from chat.agent.loop import ReplyLoop
from chat.agent.model import Cancel, Timeouts
from chat.agent.workspace import session_tools
from chat.worker import mcp_checks
from sessions_app.models import ChatSession, McpServer, ModelEndpoint, Result, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from testing.mcp_server import INSTRUCTIONS, ROOT, McpHttpServer, sandbox_command
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)

FAST = Timeouts(connect=2.0, first_token=2.0, between_chunks=1.0)
NOTES_TOOLS = ["notes__lookup", "notes__record", "notes__slow", "notes__fail", "notes__lines", "notes__where"]


@pytest.fixture(scope="module")
def notes() -> Iterator[McpHttpServer]:
    with McpHttpServer() as server:
        yield server


def _server(workspace: Workspace, url: str = "", **fields: Any) -> McpServer:
    """A server staff saved, asked for its tools here as a worker would (the job its save queued is dropped)."""
    server = McpServer.objects.create(workspace=workspace, url=url, **{"name": "notes", **fields})
    ProcrastinateJob.objects.filter(task_name="cachet.mcp_server_check").delete()
    async_to_sync(mcp_checks.run)(server.pk)
    server.refresh_from_db()
    return server


def _session(user: Any, workspace: Workspace, scripted: ScriptedServer, *, mode: str = "edit") -> ChatSession:
    endpoint = ModelEndpoint.objects.create(name="scripted", base_url=scripted.base_url, model="scripted")
    return session_start(
        owner=user,
        workspace=workspace,
        endpoint=endpoint,
        model_name="scripted",
        tools=session_tools(workspace),
        mode=mode,
    )


def _loop(session: ChatSession, **kwargs: Any) -> ReplyLoop:
    return ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST, **kwargs)


def _tool_names(body: bytes) -> list[str]:
    return [tool["function"]["name"] for tool in json.loads(body)["tools"]]


def _running(tag: str, *, within: float) -> list[str]:
    """The command lines of processes marked ``tag``, once one runs or ``within`` seconds have passed."""
    deadline = time.monotonic() + within
    while True:
        listed = os.popen("ps -ww -eo args").read().splitlines()
        found = [line for line in listed if tag in line and "ps -ww" not in line]
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def _results(session: ChatSession) -> list[str]:
    return list(Result.objects.filter(session=session).order_by("number").values_list("inserted_text", flat=True))


def test_the_servers_tools_are_fixed_with_the_session_and_a_call_answers_with_an_id(
    notes: McpHttpServer, scripted: ScriptedServer, user: Any, workspace: Workspace
) -> None:
    server = _server(workspace, notes.url)
    assert server.problem == "" and server.instructions == INSTRUCTIONS and server.checked_at is not None
    session = _session(user, workspace, scripted)
    scripted.push(
        Step(tool_calls=[("notes__lookup", {"term": "budget"}), ("notes__fail", {})]),
        Step(text="Friday."),
        Step(tool_calls=[("notes__record", {"text": "decided"})]),
        Step(text="Recorded."),
    )
    first = run(_loop(session).send("When do we ship?", date="2026-12-08")).turn
    assert first.status == TurnStatus.DONE, first.error
    assert f"Instructions of the MCP server notes:\n{INSTRUCTIONS}" in first.message
    second = run(_loop(session).send("Record it.", date="2026-12-08")).turn
    assert second.status == TurnStatus.DONE, second.error
    assert "MCP server" not in second.message  # stated once, and unchanged since
    names = _tool_names(scripted.requests[0])
    assert names[-6:] == NOTES_TOOLS and names[0] == "read"
    tools = [json.dumps(json.loads(body)["tools"]) for body in scripted.requests]
    assert len(set(tools)) == 1, "every request sends the same tool list"
    assert _results(session) == [
        "[#0001]\nnotes on budget: ship on Friday",
        "[#0002]\nnotes__fail answered with an error:\nError executing tool fail",
        "[#0003]\nrecorded 1: decided",
    ]


def test_in_plan_mode_only_the_tools_the_server_marks_read_only_run(
    notes: McpHttpServer, scripted: ScriptedServer, user: Any, workspace: Workspace
) -> None:
    _server(workspace, notes.url)
    session = _session(user, workspace, scripted, mode="plan")
    scripted.push(
        Step(tool_calls=[("notes__record", {"text": "x"}), ("notes__lookup", {"term": "plan"})]), Step(text="ok")
    )
    turn = run(_loop(session).send("Plan it.", date="2026-12-08")).turn
    assert turn.status == TurnStatus.DONE, turn.error
    assert "notes__record" in _tool_names(scripted.requests[0])  # the list never changes with the mode
    assert _results(session) == [
        "[#0001] notes__record is not available in plan mode: the MCP server notes does not mark it read-only. "
        "Say what you would do with it, or ask the person to switch to edit mode.",
        "[#0002]\nnotes on plan: ship on Friday",
    ]


def test_a_server_that_is_down_drops_a_tool_or_is_switched_off_answers_the_unavailable_text(
    scripted: ScriptedServer, user: Any, workspace: Workspace
) -> None:
    with McpHttpServer() as first:
        server = _server(workspace, first.url)
        session = _session(user, workspace, scripted)
    scripted.push(Step(tool_calls=[("notes__lookup", {"term": "a"})]), Step(text="down"))
    assert run(_loop(session).send("Look it up.", date="2026-12-08")).turn.status == TurnStatus.DONE
    with McpHttpServer(without=["lookup"], port=first.port):
        scripted.push(Step(tool_calls=[("notes__lookup", {"term": "a"})]), Step(text="dropped"))
        assert run(_loop(session).send("Again.", date="2026-12-08")).turn.status == TurnStatus.DONE
        McpServer.objects.filter(pk=server.pk).update(enabled=False)
        scripted.push(Step(tool_calls=[("notes__lookup", {"term": "a"})]), Step(text="off"))
        assert run(_loop(session).send("Once more.", date="2026-12-08")).turn.status == TurnStatus.DONE
    down, dropped, off = _results(session)
    assert down.startswith("[#0001] notes__lookup is not available now: the MCP server notes does not answer (")
    assert dropped == "[#0002] notes__lookup is not available now: the MCP server notes no longer offers it."
    gone = "the MCP server notes is switched off or gone from this workspace."
    assert off == f"[#0003] notes__lookup is not available now: {gone}"
    assert len({json.dumps(json.loads(body)["tools"]) for body in scripted.requests}) == 1
    server.refresh_from_db()
    assert "lookup" not in server.tools_json  # the dropped tool's listing was kept when the call found it gone


def test_a_changed_instruction_goes_in_the_next_note(scripted: ScriptedServer, user: Any, workspace: Workspace) -> None:
    with McpHttpServer() as first:
        server = _server(workspace, first.url)
        session = _session(user, workspace, scripted)
        scripted.push(Step(text="ok"), Step(text="ok"), Step(text="ok"))
        run(_loop(session).send("one", date="2026-12-08"))
    with McpHttpServer(instructions="Always cite the page.", port=first.port):
        async_to_sync(mcp_checks.run)(server.pk)
        two = run(_loop(session).send("two", date="2026-12-08")).turn
    assert two.message.endswith("<note>\nInstructions of the MCP server notes:\nAlways cite the page.\n</note>")
    McpServer.objects.filter(pk=server.pk).update(enabled=False)
    three = run(_loop(session).send("three", date="2026-12-08")).turn
    removed = "The MCP server notes gives no instructions any more; its earlier ones no longer apply."
    assert three.message.endswith(f"<note>\n{removed}\n</note>")
    assert json.loads(scripted.requests[2])["messages"][1]["content"].endswith(f"{INSTRUCTIONS}\n</note>")


def test_stop_ends_a_call_and_a_slow_one_ends_at_its_time_limit(
    notes: McpHttpServer, scripted: ScriptedServer, user: Any, workspace: Workspace
) -> None:
    _server(workspace, notes.url, call_timeout=1)
    session = _session(user, workspace, scripted)
    scripted.push(Step(tool_calls=[("notes__slow", {"seconds": 5})]), Step(text="late"))
    started = time.monotonic()
    assert run(_loop(session).send("Wait.", date="2026-12-08")).turn.status == TurnStatus.DONE
    assert time.monotonic() - started < 4
    assert _results(session) == ["[#0001] notes__slow did not answer within 1 s."]
    McpServer.objects.filter(workspace=workspace).update(call_timeout=60)
    scripted.push(Step(tool_calls=[("notes__slow", {"seconds": 30})]), Step(text="never asked"))
    cancel = Cancel()
    threading.Timer(1.0, cancel.set).start()
    started = time.monotonic()
    turn = run(_loop(session, cancel=cancel).send("Wait long.", date="2026-12-08")).turn
    assert time.monotonic() - started < 10
    assert turn.status == TurnStatus.INTERRUPTED
    assert _results(session)[-1] == "[#0002] Stopped: notes__slow had not answered yet."


def test_a_long_answer_is_capped_on_the_way_in_and_stored_whole(
    notes: McpHttpServer, scripted: ScriptedServer, user: Any, workspace: Workspace
) -> None:
    _server(workspace, notes.url)
    session = _session(user, workspace, scripted)
    scripted.push(Step(tool_calls=[("notes__lines", {"count": 1000})]), Step(text="long"))
    run(_loop(session).send("List.", date="2026-12-08"))
    result = Result.objects.get(session=session)
    assert "[700 lines elided, full output #0001]" in result.inserted_text
    assert result.full_text.endswith("line 999\nline 1000")


def test_a_session_in_another_workspace_is_not_offered_the_servers_tools(
    notes: McpHttpServer, scripted: ScriptedServer, user: Any, workspace: Workspace, tmp_path: Any
) -> None:
    _server(workspace, notes.url)
    folder = tmp_path / "other"
    folder.mkdir()
    other = Workspace.objects.create(name="other", folder=str(folder), open_to_everyone=True)
    session = _session(user, other, scripted)
    scripted.push(Step(tool_calls=[("notes__lookup", {"term": "x"})]), Step(text="no"))
    run(_loop(session).send("Try.", date="2026-12-08"))
    assert not any(name.startswith("notes__") for name in _tool_names(scripted.requests[0]))
    assert _results(session)[0].startswith("[#0001] There is no tool named notes__lookup.")


def test_a_server_run_as_a_command_runs_in_the_workspaces_sandbox(
    scripted: ScriptedServer, user: Any, workspace: Workspace, workspace_dir: Any
) -> None:
    """Over stdio: the official SDK's server, started by the system's Python in the sandbox ``run`` uses, as the
    sandbox user, in the workspace; it sees the folders staff bound read-only and nothing else of the host."""
    tag = f"where-{uuid.uuid4().hex}"
    command, folders = sandbox_command(tag)
    server = _server(workspace, command=command, read_only_folders="\n".join(folders))
    assert server.problem == "", server.problem
    assert server.instructions == INSTRUCTIONS
    session = _session(user, workspace, scripted)
    secret = str(ROOT / ".cachet")
    probe = {"paths": [str(workspace_dir), "/root", secret, folders[0], "/etc/shadow"]}
    scripted.push(Step(tool_calls=[("notes__lookup", {"term": "stdio"}), ("notes__where", probe)]), Step(text="ok"))
    turn = run(_loop(session).send("Where are you?", date="2026-12-08")).turn
    assert turn.status == TurnStatus.DONE, turn.error
    looked, where = _results(session)
    assert looked == "[#0001]\nnotes on stdio: ship on Friday"
    seen = json.loads(where.split("\n", 1)[1])
    assert seen["uid"] != 0 and seen["cwd"] == str(workspace_dir)
    assert seen["sees"] == {
        str(workspace_dir): True,
        "/root": False,
        secret: False,
        folders[0]: True,
        "/etc/shadow": False,
    }
    assert _running(tag, within=0) == []  # the sandbox ended with the call, and all it started


def test_a_command_that_is_no_mcp_server_is_said_so(scripted: ScriptedServer, user: Any, workspace: Workspace) -> None:
    server = _server(workspace, name="broken", command="echo 'no such server' >&2; exit 3")
    assert server.problem == "its command ended: no such server"
    assert server.tools_json == ""


def test_stop_kills_a_command_server_with_everything_it_started(
    scripted: ScriptedServer, user: Any, workspace: Workspace
) -> None:
    tag = f"stop-{uuid.uuid4().hex}"
    command, folders = sandbox_command(tag)
    _server(workspace, command=command, read_only_folders="\n".join(folders))
    session = _session(user, workspace, scripted)
    scripted.push(Step(tool_calls=[("notes__slow", {"seconds": 60})]), Step(text="never asked"))
    seen: list[str] = []
    watching = threading.Thread(target=lambda: seen.extend(_running(tag, within=10)), daemon=True)
    watching.start()
    cancel = Cancel()
    threading.Timer(2.0, cancel.set).start()
    started = time.monotonic()
    turn = run(_loop(session, cancel=cancel).send("Wait.", date="2026-12-08")).turn
    assert time.monotonic() - started < 15
    assert turn.status == TurnStatus.INTERRUPTED
    assert _results(session) == ["[#0001] Stopped: notes__slow had not answered yet."]
    watching.join(5)
    assert seen, "the server's command never ran"
    assert list(_running(tag, within=0)) == []  # ended with the call, and all it started
