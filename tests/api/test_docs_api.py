"""``docs/api.md`` as written: its curl lines run one after another against a real ``manage.py serve`` (and its
worker) on the scripted model server, with the token and the new session's id put in; its Python client runs as
a script. What each prints is what the docs say it is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from sessions_app.models import ChatSession, ModelEndpoint
from sessions_app.services.tokens import api_token_create
from testing.scripted_server import ScriptedServer, Step
from tests.serve_kit import Served, served

pytestmark = pytest.mark.django_db(transaction=True)

DOC = Path(settings.BASE_DIR) / "docs" / "api.md"


def block_after(marker: str) -> str:
    """The fenced block on the line after the docs-test marker naming ``marker``."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(rf"<!-- docs-test: tested-by [^ ]*::{re.escape(marker)} -->\n```\w*\n(.*?)```", text, re.S)
    assert found is not None, f"docs/api.md has no block tested by {marker}"
    return found.group(1)


@pytest.fixture
def model() -> Iterator[ScriptedServer]:
    with ScriptedServer(model="scripted", when_empty=Step(text="Fine.")) as server:
        yield server


@pytest.fixture
def cachet(tmp_path_factory: pytest.TempPathFactory, model: ScriptedServer) -> Iterator[Served]:
    User.objects.create_user(username="ada", password="ada-password-1")
    with served(tmp_path_factory.mktemp("api-docs")) as running:
        ModelEndpoint.objects.filter(name="default").update(base_url=model.base_url)  # serve's, on the discard port
        yield running


@pytest.fixture
def environment(cachet: Served) -> dict[str, str]:
    secret = api_token_create(owner=User.objects.get(username="ada"), name="docs", access="write").secret
    return {**os.environ, "CACHET": cachet.url, "TOKEN": secret}


def test_the_curl_examples_run_as_written(environment: dict[str, str], model: ScriptedServer, tmp_path: Path) -> None:
    lines = block_after("test_the_curl_examples_run_as_written").strip().splitlines()
    assert lines[0].startswith("export CACHET=") and "TOKEN=" in lines[0]
    model.push(Step(text="", tool_calls=[("read", {"path": "README.md"})]), Step(text="It has no README.md."))
    model.push(Step(text=" ".join(f"w{n}" for n in range(300)), chunk_size=2, delay=0.05))  # stopped midway
    printed: list[str] = []
    session_id = 0
    for line in lines[1:]:
        if session_id:
            line = line.replace("/sessions/1", f"/sessions/{session_id}")
        done = subprocess.run(
            ["bash", "-c", line], env=environment, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        printed.append(done.stdout)
        if not session_id and "text/event-stream" in line:
            session_id = ChatSession.objects.get().pk
    me, listed, started, queued, stopped, turns, result, renamed, exported = printed
    assert json.loads(me)["token"] == {"name": "docs", "access": "write"}
    assert json.loads(listed) == {"count": 0, "items": []}
    assert started.startswith("event: job\n") and "event: tool_called" in started and "event: job_ended" in started
    assert "It has no README.md." in "".join(
        json.loads(data)["text"] for data in re.findall(r"^event: text\ndata: (.*)$", started, re.M)
    )
    assert json.loads(queued)["session"] == session_id
    assert json.loads(stopped) == {"sent": True}
    assert json.loads(turns)["items"][0]["words"] == "What is in README.md?"
    assert json.loads(result)["id"] == "#0001" and json.loads(result)["tool"] == "read"
    assert json.loads(renamed)["title"] == "Docs tour"
    assert exported == "" and json.loads((tmp_path / "session.json").read_text())["format"] == "cachet-session"


def test_the_python_example_runs_as_written(environment: dict[str, str], model: ScriptedServer) -> None:
    model.push(Step(text="", tool_calls=[("read", {"path": "README.md"})]), Step(text="A short summary."))
    script = block_after("test_the_python_example_runs_as_written")
    done = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["", "[read]", "A short summary.", "done", "1 done A short summary."]
