from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from chat.agent.workspace import workspace_context
from chat.tools import call_tool, tool_list
from sessions_app import prompts
from sessions_app.hygiene.outcomes import ErrorOutcome, OutputOutcome
from sessions_app.models import ChatSession, ModelEndpoint, Result, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run
from tests.listeners import stop_listening

pytestmark = pytest.mark.django_db

FAST = Timeouts(connect=2.0, first_token=5.0, between_chunks=5.0)


def run_in(session: ChatSession, command: str) -> str:
    _, outcome = call_tool("run", json.dumps({"command": command}), workspace_context(session))
    if isinstance(outcome, ErrorOutcome):
        return f"error: {outcome.message}"
    assert isinstance(outcome, OutputOutcome)
    return outcome.text


@pytest.fixture
def full_session(chat_session: ChatSession) -> ChatSession:
    chat_session.mode = "full"
    chat_session.save(update_fields=["mode"])
    return chat_session


def test_the_context_carries_the_workspace_and_sandbox_settings(full_session: ChatSession, settings: Any) -> None:
    settings.CACHET_BWRAP = "/opt/bwrap"
    context = workspace_context(full_session)
    loop = prompts.loop_settings()
    assert context.allow_network is False
    assert context.sandbox.bwrap == "/opt/bwrap"
    assert context.sandbox.memory_bytes == loop.run_memory_bytes == 2 * 1024**3
    assert context.sandbox.max_processes == loop.run_max_processes == 256
    assert context.sandbox.file_max_bytes == loop.run_file_max_bytes == 1024**3
    assert context.sandbox.output_max_bytes == loop.run_output_max_bytes == 10_000_000
    assert context.sandbox.user == settings.CACHET_SANDBOX_USER == "cachet-sandbox"
    assert context.disk_quota == settings.CACHET_WORKSPACE_QUOTA_MB * 1024 * 1024 == 10 * 1024**3
    socket_dir = connection.get_connection_params()["host"]
    assert context.sandbox.hidden == (str(settings.CACHET_DATA), socket_dir)
    full_session.workspace.allow_network = True
    full_session.workspace.save()
    assert workspace_context(ChatSession.objects.get(pk=full_session.pk)).allow_network is True


def test_a_command_cannot_read_the_secret_key(full_session: ChatSession, settings: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "secret_key").write_text("very-secret-key")
    settings.CACHET_DATA = data
    assert run_in(full_session, f"cat {data}/secret_key") == (
        f"cat: {data}/secret_key: No such file or directory\n[exit 1]"
    )


def test_cachet_data_inside_a_workspace_is_covered(
    full_session: ChatSession, settings: Any, workspace_dir: Path
) -> None:
    data = workspace_dir / ".cachet"
    data.mkdir()
    (data / "secret_key").write_text("very-secret-key")
    settings.CACHET_DATA = data
    assert run_in(full_session, "ls -A .cachet; cat .cachet/secret_key") == (
        "cat: .cachet/secret_key: No such file or directory\n[exit 1]"
    )
    assert (data / "secret_key").read_text() == "very-secret-key"


@pytest.fixture
def listening() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = server.accept()
                with connection:
                    connection.sendall(b"hello\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop_listening(server, thread)


def test_the_network_follows_the_workspace_setting(full_session: ChatSession, listening: int) -> None:
    command = f"python3 -c 'import socket; print(socket.create_connection((\"127.0.0.1\", {listening})).recv(9))'"
    assert run_in(full_session, command).endswith("ConnectionRefusedError: [Errno 111] Connection refused\n[exit 1]")
    Workspace.objects.filter(pk=full_session.workspace_id).update(allow_network=True)
    assert run_in(ChatSession.objects.get(pk=full_session.pk), command) == "b'hello\\n'\n"


def test_the_bwrap_setting_is_where_run_looks(full_session: ChatSession, settings: Any, tmp_path: Path) -> None:
    settings.CACHET_BWRAP = str(tmp_path / "bwrap")
    assert run_in(full_session, "touch ran") == (
        f"error: Commands cannot run here: the sandbox program {tmp_path}/bwrap is missing. "
        "Install bubblewrap (apt-get install bubblewrap), or set CACHET_BWRAP to where it is."
    )
    assert not (Path(full_session.workspace.folder) / "ran").exists()


@pytest.mark.django_db(transaction=True)
def test_the_model_running_commands_sees_only_the_workspace(
    user: Any, workspace: Workspace, scripted: ScriptedServer, settings: Any, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "secret_key").write_text("very-secret-key")
    settings.CACHET_DATA = data
    endpoint = ModelEndpoint.objects.create(name="scripted", base_url=scripted.base_url, model="scripted")
    session = session_start(
        owner=user,
        workspace=workspace,
        endpoint=endpoint,
        model_name="scripted",
        tools=tool_list(allow_commands=True),
        mode="full",
    )
    command = f"cat {data}/secret_key; ls /; echo $HOME"
    scripted.push(Step(tool_calls=[("run", {"command": command})]), Step(text="Done."))
    turn = run(ReplyLoop(session, client_timeouts=FAST).send("look around")).turn
    assert turn.status == TurnStatus.DONE
    result = Result.objects.get(session=session)
    assert f"cat: {data}/secret_key: No such file or directory\n" in result.full_text
    assert "very-secret-key" not in result.full_text
    assert result.full_text.endswith(f"usr\n{workspace.folder}\n")
