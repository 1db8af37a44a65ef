"""Read-only links: the owner starts and stops one; anyone signed in who has it sees the live branch and its
results with no controls, and can copy that into a session of their own; nobody else can start, stop or guess
one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from chat.agent.loop import ReplyLoop
from sessions_app.models import ChatSession, ModelRequest, Result, SessionShare, Turn
from sessions_app.services.locks import reply_lock
from sessions_app.services.sessions import session_delete
from sessions_app.services.uploads import upload_record
from sessions_app.services.workspaces import workspace_private
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


def _link(html: str) -> str:
    found = re.search(r'value="http://testserver(/shared/[\w-]+/)"', html)
    assert found, html
    return found.group(1)


def test_a_link_shows_the_live_branch_and_its_results_read_only(
    ada: Client, bob: Client, live_session: ChatSession, model: ScriptedServer
) -> None:
    model.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text="**30** lines."))
    run(ReplyLoop(live_session).send("How long are the notes?"))
    started = ada.post(f"/sessions/{live_session.pk}/share", headers={"HX-Request": "true"})
    link = _link(started.content.decode())
    assert 'id="share-stop"' in started.content.decode()
    assert link in ada.get(f"/sessions/{live_session.pk}/").content.decode().replace("http://testserver", "")
    shown = bob.get(link).content.decode()
    assert "How long are the notes?" in shown and "<strong>30</strong> lines." in shown
    assert "#0001" in shown and "1: line 1" in shown, "the result as the model was sent it"
    assert "shared by ada" in shown
    for control in (
        'class="link edit"',
        'class="link rewind"',
        "ws-connect",
        'id="composer"',
        "full-link",
        "copy-reply",
    ):
        assert control not in shown, control
    assert ada.post(f"/sessions/{live_session.pk}/share", headers={"HX-Request": "true"}).status_code == 200
    assert SessionShare.objects.filter(session=live_session).count() == 1, "one working link"


def test_a_stopped_link_shows_nothing_and_only_the_owner_starts_or_stops_one(
    ada: Client, bob: Client, client: Client, live_session: ChatSession
) -> None:
    assert bob.post(f"/sessions/{live_session.pk}/share").status_code == 404
    link = _link(ada.post(f"/sessions/{live_session.pk}/share", headers={"HX-Request": "true"}).content.decode())
    assert bob.post(f"/sessions/{live_session.pk}/share/stop").status_code == 404
    assert bob.get(link).status_code == 200
    anonymous = Client()
    assert anonymous.get(link).status_code == 302, "signed in to this Cachet only"
    stopped = ada.post(f"/sessions/{live_session.pk}/share/stop", headers={"HX-Request": "true"})
    assert 'id="share-start"' in stopped.content.decode()
    assert bob.get(link).status_code == 404
    again = _link(ada.post(f"/sessions/{live_session.pk}/share", headers={"HX-Request": "true"}).content.decode())
    assert again != link and bob.get(link).status_code == 404 and bob.get(again).status_code == 200
    session_delete(session=live_session)
    assert bob.get(again).status_code == 404, "a deleted session is shown to nobody"
    assert bob.get("/shared/not-a-token/").status_code == 404


def _shared_link(ada: Client, session: ChatSession) -> str:
    return _link(ada.post(f"/sessions/{session.pk}/share", headers={"HX-Request": "true"}).content.decode())


def test_a_copy_holds_what_the_link_shows_and_none_of_the_owners_instructions_settings_or_requests(
    ada: Client, bob: Client, other_user: Any, live_session: ChatSession, model: ScriptedServer, workspace_dir: Path
) -> None:
    (workspace_dir / "AGENTS.md").write_text("Keep the workspace's house style secret.\n")
    ChatSession.objects.filter(pk=live_session.pk).update(instructions="Answer like a pirate.", temperature=0.3)
    model.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text="**30** lines."))
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("How long are the notes?"))
    model.push(Step(text="Taken back later."))
    loop = ReplyLoop(ChatSession.objects.get(pk=live_session.pk))
    run(loop.send("Something to undo"))
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).undo())
    model.push(Step(tool_calls=[("read", {"path": "notes.md", "offset": 5, "limit": 2})]), Step(text="Lines 5 and 6."))
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("Show lines 5 and 6."))
    owner_turns = Turn.objects.filter(session=live_session).count()
    assert "pirate" in Turn.objects.filter(session=live_session).order_by("number").first().message  # type: ignore[union-attr]
    link = _shared_link(ada, live_session)

    copied = bob.post(f"{link}copy")

    assert copied.status_code == 302
    copy = ChatSession.objects.get(owner=other_user)
    assert copied["Location"] == f"/sessions/{copy.pk}/"
    assert copy.workspace == workspace_private(user=other_user)
    assert copy.title == "How long are the notes? (copy)"
    assert (copy.instructions, copy.temperature, copy.max_tokens) == ("", None, None)
    turns = list(Turn.objects.filter(session=copy).order_by("number"))
    assert [turn.words for turn in turns] == ["How long are the notes?", "Show lines 5 and 6."], "the live branch"
    assert [turn.position for turn in turns] == [1, 2]
    for turn in turns:
        assert "pirate" not in turn.message and "house style" not in turn.message
        assert turn.note_instructions is None and turn.note_session_instructions is None
    assert f'Workspace: "{copy.workspace.name}".' in turns[0].message
    assert "Your model: scripted." in turns[0].message and "The permission mode is " in turns[0].message
    assert [r.inserted_text[:7] for r in Result.objects.filter(session=copy).order_by("number")] == [
        "[#0001 ",
        "[#0002 ",
    ]
    assert not ModelRequest.objects.filter(session=copy).exists(), "the owner's requests stay with the owner"
    assert Turn.objects.filter(session=live_session).count() == owner_turns, "the owner's session is as it was"
    assert bob.get(f"/sessions/{copy.pk}/").status_code == 200
    assert ada.get(f"/sessions/{copy.pk}/").status_code == 404, "the copy is Bob's alone"

    model.push(Step(text="Aye."))
    went_on = run(ReplyLoop(ChatSession.objects.get(pk=copy.pk)).send("Go on."))
    assert went_on.turn.status == "done"
    body = model.requests[-1].decode()
    assert "pirate" not in body and "house style" not in body
    assert "How long are the notes?" in body and "Lines 5 and 6." in body, "the conversation goes on"


def test_a_copy_is_refused_while_a_reply_runs_and_for_a_stopped_link(
    ada: Client, bob: Client, client: Client, other_user: Any, live_session: ChatSession
) -> None:
    link = _shared_link(ada, live_session)
    assert bob.get(f"{link}copy").status_code == 405
    assert Client().post(f"{link}copy").status_code == 302, "signed in to this Cachet only"
    with reply_lock(live_session):
        refused = bob.post(f"{link}copy")
    assert refused.status_code == 409
    assert "A reply is running in this session" in refused.content.decode()
    ada.post(f"/sessions/{live_session.pk}/share/stop")
    assert bob.post(f"{link}copy").status_code == 404
    assert not ChatSession.objects.filter(owner=other_user).exists()


def test_a_copy_of_a_compacted_session_goes_on_from_its_summary(
    ada: Client, bob: Client, other_user: Any, live_session: ChatSession, model: ScriptedServer
) -> None:
    model.push(Step(text="Thirty lines."), Step(text="SUMMARY: the notes have thirty lines."), Step(text="Yes."))
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("How long are the notes?"))
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).compact())
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("Sure?"))

    assert bob.post(f"{_shared_link(ada, live_session)}copy").status_code == 302

    copy = ChatSession.objects.get(owner=other_user)
    assert copy.generation_number == 2
    second = Turn.objects.get(session=copy, words="Sure?")
    assert f'Workspace: "{copy.workspace.name}".' in second.message, "a generation's first message: the full note"
    model.push(Step(text="Still thirty."))
    assert run(ReplyLoop(ChatSession.objects.get(pk=copy.pk)).send("And now?")).turn.status == "done"
    body = model.requests[-1].decode()
    assert "SUMMARY: the notes have thirty lines." in body and "Sure?" in body
    assert "How long are the notes?" not in body, "the turns the summary covers stay out"


def test_a_copy_says_what_was_attached_where_the_owner_said_it(
    ada: Client, bob: Client, other_user: Any, live_session: ChatSession, model: ScriptedServer
) -> None:
    upload_record(session=live_session, path="spec.txt", size=3, sha256="0" * 64)
    model.push(Step(text="It says abc."))
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("What is in the spec?"))
    assert "Uploaded: spec.txt, 3 bytes." in Turn.objects.get(session=live_session).message

    assert bob.post(f"{_shared_link(ada, live_session)}copy").status_code == 302

    copied = Turn.objects.get(session__owner=other_user)
    assert copied.message.startswith("What is in the spec?") and "Uploaded: spec.txt, 3 bytes." in copied.message


def test_a_copy_of_an_empty_session_is_named_as_the_list_names_it(
    ada: Client, bob: Client, other_user: Any, live_session: ChatSession
) -> None:
    assert bob.post(f"{_shared_link(ada, live_session)}copy").status_code == 302
    copy = ChatSession.objects.get(owner=other_user)
    assert copy.title == "New session (copy)" and not Turn.objects.filter(session=copy).exists()
