from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from sessions_app.models import ChatSession, ModelEndpoint, Upload, Workspace
from sessions_app.services.turns import turn_start

pytestmark = pytest.mark.django_db

FETCH = {"X-Requested-With": "fetch"}


@pytest.fixture
def ada(client: Client, user: Any) -> Client:
    client.force_login(user)
    return client


@pytest.fixture
def bob(other_user: Any) -> Client:
    client = Client()
    client.force_login(other_user)
    return client


def attach(client: Client, session: ChatSession, name: str, data: bytes, **fields: str) -> Any:
    upload = SimpleUploadedFile(name, data)
    return client.post(f"/sessions/{session.pk}/attach", {"files": upload, **fields}, headers=FETCH)


def test_attached_files_wait_for_the_next_message_which_says_they_arrived(
    ada: Client, chat_session: ChatSession, workspace_dir: Path
) -> None:
    shown = attach(ada, chat_session, "spec.pdf", b"%PDF" + b"x" * 34_812).content.decode()
    assert 'id="attachments"' in shown and "spec.pdf" in shown and "spec.pdf attached." in shown
    attach(ada, chat_session, "notes.md", b"hello\n")
    page = ada.get(f"/sessions/{chat_session.pk}/").content.decode()
    assert 'class="attached-file"' in page and "notes.md" in page, "the list survives a reload"
    turn = turn_start(session=chat_session, words="Read them", today="2026-12-05", instructions=None)
    assert turn.message.endswith("Uploaded: spec.pdf, 34 KB; notes.md, 6 bytes.\n</note>")
    assert sorted(Upload.objects.filter(turn=turn).values_list("path", flat=True)) == ["notes.md", "spec.pdf"]
    assert 'class="attached-file"' not in ada.get(f"/sessions/{chat_session.pk}/").content.decode()
    assert (workspace_dir / "spec.pdf").stat().st_size == 34_816


def test_a_taken_name_asks_replace_or_keep_both(ada: Client, chat_session: ChatSession, workspace_dir: Path) -> None:
    (workspace_dir / "notes.md").write_text("mine\n")
    asked = attach(ada, chat_session, "notes.md", b"theirs\n")
    assert asked.json() == {
        "conflict": True,
        "message": "notes.md is already in the workspace.",
        "path": "notes.md",
        "free": "notes (2).md",
    }
    assert (workspace_dir / "notes.md").read_text() == "mine\n" and not Upload.objects.exists()
    kept = attach(ada, chat_session, "notes.md", b"theirs\n", keep_both="1").content.decode()
    assert "notes (2).md attached." in kept and (workspace_dir / "notes (2).md").read_text() == "theirs\n"
    replaced = attach(ada, chat_session, "notes.md", b"theirs\n", replace="1").content.decode()
    assert "notes.md replaced." in replaced and (workspace_dir / "notes.md").read_text() == "theirs\n"


def test_too_large_outside_and_someone_elses_are_refused(
    ada: Client, bob: Client, chat_session: ChatSession, workspace_dir: Path, settings: Any
) -> None:
    settings.CACHET_UPLOAD_MAX_BYTES = 10
    said = attach(ada, chat_session, "big.txt", b"x" * 11).content.decode()
    assert "big.txt is 11 bytes; a file attached is at most 10 bytes." in said and not Upload.objects.exists()
    refused = attach(ada, chat_session, "x.txt", b"x", folder="../up").content.decode()
    assert '<p class="attach-said error" role="alert">A folder for attachments stays inside' in refused
    assert attach(bob, chat_session, "x.txt", b"x").status_code == 404
    attach(ada, chat_session, "mine.txt", b"m")
    upload = Upload.objects.get()
    assert bob.post(f"/sessions/{chat_session.pk}/attachments/{upload.pk}/remove").status_code == 404
    assert ada.post(f"/sessions/{chat_session.pk}/attach", headers=FETCH).status_code == 400, "no file"


def test_removing_an_attachment_takes_it_out_of_the_workspace_and_the_note(
    ada: Client, chat_session: ChatSession, workspace_dir: Path
) -> None:
    attach(ada, chat_session, "draft.txt", b"draft")
    upload = Upload.objects.get()
    shown = ada.post(f"/sessions/{chat_session.pk}/attachments/{upload.pk}/remove").content.decode()
    assert "draft.txt removed." in shown and not (workspace_dir / "draft.txt").exists()
    turn = turn_start(session=chat_session, words="hi", today="2026-12-05", instructions=None)
    assert "Uploaded" not in turn.message


def test_new_chat_sends_its_files_with_the_first_message(
    ada: Client, user: Any, workspace: Workspace, endpoint: ModelEndpoint, workspace_dir: Path
) -> None:
    (workspace_dir / "data.csv").write_text("old\n")
    form = {"workspace": workspace.pk, "endpoint": endpoint.pk, "mode": "edit", "text": "Look at these"}
    files = [SimpleUploadedFile("data.csv", b"a,b\n"), SimpleUploadedFile("chart.png", b"\x89PNG")]
    response = ada.post("/sessions/new", {**form, "files": files})
    session = ChatSession.objects.get(owner=user)
    assert response["Location"] == f"/sessions/{session.pk}/"
    assert (workspace_dir / "data.csv").read_text() == "old\n", "nothing overwritten: both kept"
    waiting = Upload.objects.filter(session=session, turn__isnull=True)
    assert list(waiting.values_list("path", flat=True)) == ["data (2).csv", "chart.png"], "for the first message"
