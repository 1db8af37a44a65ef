from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from chat.agent.loop import ReplyLoop
from sessions_app.models import BreakCause, ChatSession, InstructionPreset, ModelEndpoint, ModelRequest, Workspace
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


@pytest.fixture
def ada(client: Client, user: Any) -> Client:
    client.force_login(user)
    return client


@pytest.fixture
def bob(other_user: Any) -> Client:
    client = Client()
    client.force_login(other_user)
    return client


def settings_of(session: ChatSession) -> tuple[str, float | None, int | None]:
    session.refresh_from_db()
    return session.instructions, session.temperature, session.max_tokens


def test_the_settings_menu_saves_and_refuses_what_is_out_of_range(
    ada: Client, bob: Client, chat_session: ChatSession
) -> None:
    url = f"/sessions/{chat_session.pk}/settings"
    page = ada.get(f"/sessions/{chat_session.pk}/").content.decode()
    assert 'id="settings-menu"' in page and 'name="instructions"' in page
    saved = ada.post(url, {"instructions": " Be brief.\n", "temperature": "0.3", "max_tokens": "256"}, headers=HTMX)
    assert "Saved: they apply from your next message." in saved.content.decode()
    assert settings_of(chat_session) == ("Be brief.", 0.3, 256)
    for wrong in ({"temperature": "2.5"}, {"max_tokens": "0"}, {"temperature": "warm"}):
        refused = ada.post(url, {"instructions": "", **wrong}, headers=HTMX).content.decode()
        assert "Nothing was saved" in refused
    assert settings_of(chat_session) == ("Be brief.", 0.3, 256)
    cleared = ada.post(url, {"instructions": "", "temperature": "", "max_tokens": ""}, headers=HTMX)
    assert cleared.status_code == 200 and settings_of(chat_session) == ("", None, None)
    assert bob.post(url, {"instructions": "mine now"}).status_code == 404
    assert settings_of(chat_session) == ("", None, None)


def test_presets_are_ones_own_fill_the_instructions_and_start_new_chats(
    ada: Client,
    bob: Client,
    user: Any,
    other_user: Any,
    chat_session: ChatSession,
    workspace: Workspace,
    endpoint: ModelEndpoint,
) -> None:
    url = f"/sessions/{chat_session.pk}/settings"
    kept = ada.post(url, {"action": "save_preset", "preset_name": "French", "instructions": "Answer in French."})
    assert kept.status_code == 302 and InstructionPreset.objects.get(owner=user).text == "Answer in French."
    unnamed = ada.post(url, {"action": "save_preset", "instructions": "x"}, headers=HTMX).content.decode()
    assert "Name the preset." in unnamed
    brief = {"action": "save_preset", "preset_name": "Brief", "instructions": "Be brief.", "preset": ""}
    shown = ada.post(url, brief, headers=HTMX).content.decode()
    kept_brief = InstructionPreset.objects.get(owner=user, name="Brief")
    assert re.search(rf'<option value="{kept_brief.pk}"[^>]* selected', shown), "the list shows it, not '—'"
    kept_brief.delete()
    InstructionPreset.objects.create(owner=other_user, name="Bob's", text="Bob's secret way")
    for page in (f"/sessions/{chat_session.pk}/", "/sessions/new"):
        html = ada.get(page).content.decode()
        assert 'data-text="Answer in French."' in html and "Bob" not in html.split('name="preset"')[1][:400]
    french = InstructionPreset.objects.get(owner=user)
    chose = ada.post(url, {"preset": str(french.pk), "instructions": ""}, headers=HTMX)
    assert chose.status_code == 200 and settings_of(chat_session)[0] == "Answer in French.", "the preset's text"
    theirs = InstructionPreset.objects.get(owner=other_user)
    refused = ada.post(url, {"action": "delete_preset", "preset": str(theirs.pk)}, headers=HTMX).content.decode()
    assert "Select a valid choice" in refused and InstructionPreset.objects.filter(pk=theirs.pk).exists()
    started = ada.post(
        "/sessions/new",
        {"text": "Hi", "workspace": workspace.pk, "endpoint": endpoint.pk, "mode": "edit", "preset": french.pk},
    )
    new = ChatSession.objects.get(pk=int(started["Location"].strip("/").rsplit("/", 1)[1]))
    assert new.instructions == "Answer in French."
    deleted = ada.post(url, {"action": "delete_preset", "preset": str(french.pk)}, headers=HTMX).content.decode()
    assert "Deleted the preset “French”." in deleted and not InstructionPreset.objects.filter(owner=user).exists()


def test_sampling_goes_after_the_conversation_and_changing_it_breaks_no_prefix(
    live_session: ChatSession, model: ScriptedServer
) -> None:
    model.push(Step(text="One."), Step(text="Two."), Step(text="Three."))
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("first"))
    ChatSession.objects.filter(pk=live_session.pk).update(temperature=0.2, max_tokens=64)
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("second"))
    ChatSession.objects.filter(pk=live_session.pk).update(temperature=None, max_tokens=None)
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("third"))
    bodies = model.requests
    assert [json.loads(body).get("temperature") for body in bodies] == [None, 0.2, None]
    assert re.search(rb'\],"temperature":0\.2,"max_tokens":64\}$', bodies[1]), "after the messages"
    assert json.loads(bodies[1])["max_tokens"] == 64
    causes = list(
        ModelRequest.objects.filter(session=live_session).order_by("id").values_list("break_cause", flat=True)
    )
    assert causes == [BreakCause.FIRST, "", ""], "each request continues the one before, sampling or not"


def test_the_database_refuses_sampling_the_service_would(chat_session: ChatSession) -> None:
    from django.db import IntegrityError, transaction

    for wrong in ({"temperature": 2.5}, {"temperature": -0.1}, {"max_tokens": 0}):
        with pytest.raises(IntegrityError), transaction.atomic():
            ChatSession.objects.filter(pk=chat_session.pk).update(**wrong)
    ChatSession.objects.filter(pk=chat_session.pk).update(temperature=2.0, max_tokens=1)


def test_a_preset_staff_share_with_a_group_is_offered_to_its_people_only_and_theirs_to_use_not_delete(
    ada: Client, bob: Client, user: Any, other_user: Any, chat_session: ChatSession, django_user_model: Any
) -> None:
    staff = django_user_model.objects.create_user(username="it", password="pw-it-1", is_staff=True)
    team = Group.objects.create(name="writers")
    shared = InstructionPreset.objects.create(owner=staff, name="House style", text="Write as the style guide says.")
    shared.groups.add(team)
    user.groups.add(team)
    url = f"/sessions/{chat_session.pk}/settings"
    for page in (f"/sessions/{chat_session.pk}/", "/sessions/new"):
        assert f'<option value="{shared.pk}" data-text="Write as the style guide says.">House style (shared)' in (
            ada.get(page).content.decode()
        )
        assert "House style" not in bob.get("/sessions/new").content.decode(), "not in the group"
    chose = ada.post(url, {"preset": str(shared.pk), "instructions": ""}, headers=HTMX)
    assert chose.status_code == 200 and settings_of(chat_session)[0] == "Write as the style guide says."
    refused = ada.post(url, {"action": "delete_preset", "preset": str(shared.pk)}, headers=HTMX).content.decode()
    assert (
        "Choose a preset of your own to delete." in refused and InstructionPreset.objects.filter(pk=shared.pk).exists()
    )
    shared.people.add(other_user)
    assert "House style (shared)" in bob.get("/sessions/new").content.decode(), "granted to a person by name"
    user.groups.remove(team)
    assert "House style" not in ada.get("/sessions/new").content.decode(), "leaving the group takes it away"
