"""Read-only links: the owner starts and stops one; anyone signed in who has it sees the live branch and its
results with no controls; nobody else can start, stop or guess one."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from chat.agent.loop import ReplyLoop
from sessions_app.models import ChatSession, SessionShare
from sessions_app.services.sessions import session_delete
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
