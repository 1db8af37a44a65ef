"""Fixtures of the web side's fast tests: a scripted model server and a session that talks to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chat import runner
from chat.testing.scripted_server import ScriptedServer
from chat.tools import tool_list
from sessions_app.models import ChatSession, ModelEndpoint, Workspace
from sessions_app.services.sessions import session_start


@pytest.fixture
def model() -> Iterator[ScriptedServer]:
    with ScriptedServer(model="scripted") as server:
        yield server
        runner.wait_idle(timeout=20, cancel=True)


@pytest.fixture
def live_endpoint(model: ScriptedServer) -> ModelEndpoint:
    return ModelEndpoint.objects.create(name="scripted", base_url=model.base_url, model="scripted")


@pytest.fixture
def notes(workspace_dir: Path) -> Path:
    path = workspace_dir / "notes.md"
    path.write_text("".join(f"line {n}\n" for n in range(1, 31)))
    return path


@pytest.fixture
def live_session(user: Any, workspace: Workspace, live_endpoint: ModelEndpoint, notes: Path) -> ChatSession:
    return session_start(
        owner=user,
        workspace=workspace,
        endpoint=live_endpoint,
        model_name="scripted",
        tools=tool_list(allow_commands=workspace.allow_commands),
    )
