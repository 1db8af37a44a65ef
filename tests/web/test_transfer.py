"""Export as Markdown and JSON, and Import of that JSON, through the pages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from chat.agent.loop import ReplyLoop
from chat.web.transfer import export_filename
from sessions_app.models import ChatSession, Workspace
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db


@pytest.fixture
def ada(client: Client, user: Any) -> Client:
    client.force_login(user)
    return client


@pytest.fixture
def bob(other_user: Any) -> Client:
    client = Client()
    client.force_login(other_user)
    return client


def chatted(session: ChatSession, model: ScriptedServer) -> ChatSession:
    """Two turns, a read in the first, and a regenerated second reply: a tree with a branch."""
    model.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"}), ("list", {})]),
        Step(text="The notes have **30** lines."),
        Step(text="First answer to the second."),
        Step(text="Second answer to the second."),
    )
    loop = ReplyLoop(session)
    run(loop.send("How long are the notes?", date="2026-11-30"))
    run(loop.send("And the last line?", date="2026-11-30"))
    run(loop.regenerate())
    session.refresh_from_db()
    return session


def body(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def test_markdown_export_is_the_live_branch_as_read(
    ada: Client, live_session: ChatSession, model: ScriptedServer
) -> None:
    session = chatted(live_session, model)
    response = ada.get(f"/sessions/{session.pk}/export.md")
    assert response.status_code == 200 and response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="' + export_filename(session, "md") + '"'
    assert export_filename(session, "md") == f"cachet-{session.pk}-how-long-are-the-notes.md"
    text = body(response).decode()
    assert int(response["Content-Length"]) == len(text.encode())
    assert text.startswith("# How long are the notes?\n\nWorkspace ws · model scripted · exported ")
    assert "## Turn 1\n\n**You:**\n\nHow long are the notes?\n\n**Reply:**\n\nReading.\n" in text
    assert "- `#0001 read notes.md — lines 1-30 of 30`\n- `#0002 list — /" in text and "/ws/notes.md`\n" in text
    assert "The notes have **30** lines." in text
    assert "## Turn 2\n" in text and "Second answer to the second." in text
    assert "First answer to the second." not in text, "only the live branch"
    assert "line 17" not in text, "tool results appear as their one line"


def test_json_export_holds_everything_stored(ada: Client, live_session: ChatSession, model: ScriptedServer) -> None:
    session = chatted(live_session, model)
    response = ada.get(f"/sessions/{session.pk}/export.json")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == f'attachment; filename="cachet-{session.pk}-how-long-are-the-notes.json"'
    data = json.loads(body(response))
    assert (data["format"], data["version"]) == ("cachet-session", 1)
    assert data["session"]["workspace"] == "ws" and data["session"]["endpoint"] == "scripted"
    assert data["session"]["next_result_number"] == 3 and data["session"]["next_turn_number"] == 4
    assert [(turn["number"], turn["parent"], turn["status"]) for turn in data["turns"]] == [
        (1, None, "done"),
        (2, 1, "taken_back"),
        (3, 1, "done"),
    ]
    assert [turn["generation"] for turn in data["turns"]] == [1, 1, 1]
    assert [(step["turn"], step["number"]) for step in data["steps"]] == [(1, 1), (1, 2), (2, 1), (3, 1)]
    result = data["results"][0]
    assert len(data["results"]) == 2
    assert (result["number"], result["turn"], result["step"], result["tool"]) == (1, 1, 1, "read")
    assert result["full_text"] == "".join(f"{n}: line {n}\n" for n in range(1, 31)).rstrip("\n")
    assert result["inserted_text"].startswith("[#0001 ")
    assert len(data["requests"]) == 4 and data["requests"][0]["turn"] == 1
    assert {"prompt_tokens", "cached_tokens", "completion_tokens", "usage"} <= set(data["requests"][0])
    assert data["generations"][0]["system_prompt"] == session.generations.get().system_prompt
    assert json.loads(data["last_request"]["body"])["messages"][-1]["content"].startswith("And the last line?")


def test_another_person_cannot_export(bob: Client, live_session: ChatSession, model: ScriptedServer) -> None:
    chatted(live_session, model)
    for kind in ("md", "json"):
        assert bob.get(f"/sessions/{live_session.pk}/export.{kind}").status_code == 404


def main(response: Any) -> str:
    """The page's main part (the header around it holds the person's name and token)."""
    html = str(response.content.decode())
    return html[html.index("<main") : html.index("</main>")]


def upload(client: Client, raw: bytes, workspace: Workspace, *, name: str = "export.json") -> Any:
    return client.post("/sessions/import", {"file": SimpleUploadedFile(name, raw), "workspace": workspace.pk})


def test_import_brings_an_export_back_for_the_person_importing_it(
    ada: Client, bob: Client, live_session: ChatSession, model: ScriptedServer, other_user: Any
) -> None:
    session = chatted(live_session, model)
    raw = body(ada.get(f"/sessions/{session.pk}/export.json"))
    assert 'id="import-form"' in bob.get("/").content.decode()
    response = upload(bob, raw, session.workspace)
    imported = ChatSession.objects.get(owner=other_user)
    assert response.status_code == 302 and response["Location"] == f"/sessions/{imported.pk}/"
    for number in (1, 2):
        copy = main(bob.get(f"/sessions/{imported.pk}/results/{number}/"))
        first = main(ada.get(f"/sessions/{session.pk}/results/{number}/"))
        assert "<pre" in copy and copy == first.replace(f"/sessions/{session.pk}/", f"/sessions/{imported.pk}/")
    html = bob.get(f"/sessions/{imported.pk}/").content.decode()
    assert "Second answer to the second." in html and '<span class="sibling-at">2 / 2</span>' in html
    assert ada.get(f"/sessions/{imported.pk}/").status_code == 404, "the importer's, not the exporter's"


def test_a_bad_or_too_big_file_is_refused_on_the_session_list(
    ada: Client, live_session: ChatSession, model: ScriptedServer, other_user: Any, settings: Any
) -> None:
    session = chatted(live_session, model)
    response = upload(ada, b'{"format": "cachet-session", "version": 1}', session.workspace)
    assert response.status_code == 200
    html = response.content.decode()
    assert '<details class="import" id="import" open>' in html
    assert 'id="import-error">session: missing</p>' in html
    assert ChatSession.objects.count() == 1
    settings.CACHET_IMPORT_MAX_BYTES = 1_048_576
    response = upload(ada, b" " * (1_048_576 + 10), session.workspace)
    assert "The file is 1.0 MB; an import is at most 1 MB." in response.content.decode()
    assert ChatSession.objects.count() == 1
    private = Workspace.objects.create(name="private", folder="/tmp")
    private.members.add(other_user)
    raw = body(ada.get(f"/sessions/{session.pk}/export.json"))
    refused = upload(ada, raw, private)
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
