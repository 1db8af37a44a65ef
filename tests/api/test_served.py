"""The API of a real ``manage.py serve`` (Daphne, and the worker it starts) on the test database: a token made by
``manage.py apitoken``, a reply followed as it streams (each event as it happens, not at the end), the session's
own event stream across processes, and schemathesis running the published schema against it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from django.conf import settings
from django.contrib.auth.models import User
from httpx_sse import connect_sse
from schemathesis.core.result import Ok

from sessions_app.models import ChatSession, ModelEndpoint, Workspace
from testing.scripted_server import ScriptedServer, Step
from tests.serve_kit import SECRET_KEY, Served, served, subprocess_database_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def model() -> Iterator[ScriptedServer]:
    with ScriptedServer(model="scripted", when_empty=Step(text="Fine.")) as server:
        yield server


@pytest.fixture
def cachet(tmp_path_factory: pytest.TempPathFactory, model: ScriptedServer) -> Iterator[Served]:
    data = tmp_path_factory.mktemp("api-served")
    folder = data / "workspaces" / "team"
    folder.mkdir(parents=True)
    User.objects.create_user(username="ada", password="ada-password-1")
    Workspace.objects.create(name="team", folder=str(folder), open_to_everyone=True)
    ModelEndpoint.objects.create(name="scripted", base_url=model.base_url, model="scripted")
    with served(data, CACHET_LOGIN_REFUSAL_DELAY="0") as running:  # schemathesis tries wrong tokens too
        yield running


def apitoken(data: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``manage.py apitoken`` on the test database, as an admin runs it."""
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "PYTEST_CURRENT_TEST"}}
    env.update(
        DATABASE_URL=subprocess_database_url(),
        CACHET_DATA=str(data),
        SECRET_KEY=SECRET_KEY,
        DJANGO_SETTINGS_MODULE="cachet.settings",
        PYTHONPATH=str(settings.BASE_DIR),
    )
    command = [sys.executable, "manage.py", "apitoken", *arguments]
    return subprocess.run(command, cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=120)


def test_apitoken_prints_the_token_on_its_last_line(cachet: Served) -> None:
    made = apitoken(cachet.data, "ada", "--name", "ci", "--write")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.rstrip().splitlines()[-1]
    assert secret.startswith("cachet_") and len(secret) == 50
    assert "read-write token 'ci' for ada" in made.stderr
    me = httpx.get(cachet.url + "/api/v1/me", headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert me.json()["token"] == {"name": "ci", "access": "write"}
    nobody = apitoken(cachet.data, "nobody")
    assert nobody.returncode == 1 and "There is no user 'nobody'." in nobody.stderr


def test_a_reply_streams_to_a_script_as_it_is_written(cachet: Served, model: ScriptedServer) -> None:
    secret = apitoken(cachet.data, "ada", "--write").stdout.rstrip().splitlines()[-1]
    headers = {"Authorization": f"Bearer {secret}"}
    model.push(Step(text=" ".join(f"word{n}" for n in range(60)), chunk_size=8, delay=0.03))
    arrived: list[tuple[float, str, str]] = []
    with httpx.Client(base_url=cachet.url, headers=headers, timeout=60) as client:
        endpoint = ModelEndpoint.objects.get(name="scripted").pk  # not serve's default, on the discard port
        with connect_sse(client, "POST", "/api/v1/sessions", json={"text": "count", "endpoint": endpoint}) as source:
            assert source.response.status_code == 201
            for sse in source.iter_sse():
                arrived.append((time.monotonic(), sse.event, sse.data))
        names = [name for _, name, _ in arrived]
        assert names[-1] == "job_ended" and '"failure":""' in arrived[-1][2]
        first_text = next((at for at, name, _ in arrived if name == "text"), None)
        assert first_text is not None, arrived
        assert arrived[-1][0] - first_text > 0.3, "the events came at once, at the end: something buffered them"
        session_id = ChatSession.objects.get().pk

        heard: list[tuple[str, str]] = []
        listening = threading.Event()

        def listen() -> None:
            with (
                httpx.Client(base_url=cachet.url, headers=headers, timeout=60) as watcher,
                connect_sse(watcher, "GET", f"/api/v1/sessions/{session_id}/events") as events,
            ):
                listening.set()
                for sse in events.iter_sse():
                    heard.append((sse.event, sse.data))
                    if sse.event == "turn_ended":
                        return

        watcher = threading.Thread(target=listen, daemon=True)
        watcher.start()
        assert listening.wait(30)
        time.sleep(0.3)  # the stream's channel has joined the session's group by the time its headers came back
        model.push(Step(text="Second reply."))
        queued = client.post(f"/api/v1/sessions/{session_id}/messages", json={"text": "again"})
        assert queued.status_code == 202
        watcher.join(30)
        assert not watcher.is_alive(), f"the session's stream heard no turn end: {heard}"
        assert "".join(__import__("json").loads(data)["text"] for name, data in heard if name == "text") == (
            "Second reply."
        )


def test_schemathesis_finds_nothing_against_the_schema(cachet: Served) -> None:
    secret = apitoken(cachet.data, "ada", "--write").stdout.rstrip().splitlines()[-1]
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=cachet.url, headers=headers, timeout=60) as client:
        endpoint = ModelEndpoint.objects.get(name="scripted").pk
        made = client.post("/api/v1/sessions", json={"text": "something to read", "endpoint": endpoint})
        assert made.status_code == 201
    loaded = schemathesis.openapi.from_url(cachet.url + "/api/v1/openapi.json")
    schema = loaded.exclude(path_regex=r"/events$")  # a stream that lasts while the client listens
    checked: list[str] = []
    for found in schema.get_all_operations():
        assert isinstance(found, Ok), f"schemathesis cannot read an operation: {found.err()}"
        operation = found.ok()

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(
            max_examples=12,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(hypothesis.HealthCheck),
            phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        )
        def check(case: Any) -> None:
            case.call_and_validate(base_url=cachet.url, headers=headers, timeout=60)

        check()
        checked.append(operation.label)
    assert len(checked) >= 14, checked
