from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessions_app.models import ChatSession, ModelEndpoint, Workspace


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="ada", password="ada-password-1")


@pytest.fixture
def other_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="bob", password="bob-password-1")


@pytest.fixture
def workspace_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder.resolve()


@pytest.fixture
def workspace(workspace_dir: Path) -> Workspace:
    return Workspace.objects.create(name="ws", folder=str(workspace_dir), allow_commands=True)


@pytest.fixture
def endpoint() -> ModelEndpoint:
    return ModelEndpoint.objects.create(name="local", base_url="http://127.0.0.1:9/v1", model="scripted")


@pytest.fixture
def chat_session(user: Any, workspace: Workspace, endpoint: ModelEndpoint) -> ChatSession:
    from sessions_app.services.sessions import session_start

    return session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=[])
