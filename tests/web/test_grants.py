"""Groups decide access: an endpoint closed to everyone is offered to, and usable by, only the people and groups
staff granted it (and staff); a workspace granted to a group is its people's. Checked where a person chooses a
model (New chat, the model menu, Retry with…), where they act (the socket, the worker), and in ``ask``; a grant
taken back refuses the next request to that model, keeps the words, and leaves undo and the model menu working."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.test import Client

from sessions_app.models import ChatSession, ModelEndpoint, Turn, TurnStatus, Workspace
from sessions_app.selectors.sessions import endpoint_list, endpoints_for, workspace_refusal, workspaces_for
from testing.scripted_server import ScriptedServer, Step
from tests.web.test_consumers import ada_cookie, connected, fresh_layer, idle, notice_says, until

__all__ = ["ada_cookie", "fresh_layer"]  # fixtures, used by name

REFUSED = "You may no longer use the model endpoint “paid”"


@pytest.fixture
def paid(model: ScriptedServer) -> ModelEndpoint:
    """An endpoint that holds a paid key: closed to everyone, granted to the group "paid-api"."""
    endpoint = ModelEndpoint.objects.create(
        name="paid", base_url=model.base_url, model="scripted", api_key="sk-paid", open_to_everyone=False
    )
    endpoint.groups.add(Group.objects.create(name="paid-api"))
    return endpoint


def _join(user: Any, group: str) -> None:
    user.groups.add(Group.objects.get_or_create(name=group)[0])


@pytest.mark.django_db
def test_a_closed_endpoint_is_offered_only_to_its_people_groups_and_staff(
    paid: ModelEndpoint,
    live_endpoint: ModelEndpoint,
    user: Any,
    other_user: Any,
    django_user_model: Any,
    workspace: Workspace,
) -> None:
    assert paid not in endpoints_for(user=user) and live_endpoint in endpoints_for(user=user)
    _join(user, "paid-api")
    assert set(endpoints_for(user=user)) == {paid, live_endpoint}
    assert paid not in endpoint_list(user=other_user)
    paid.people.add(other_user)
    assert paid in endpoint_list(user=other_user), "a person granted by name"
    staff = django_user_model.objects.create_user(username="it", password="pw-it-1", is_staff=True)
    assert paid in endpoints_for(user=staff)
    assert paid in endpoint_list(), "a command on the server sees every endpoint"

    client = Client()
    client.force_login(other_user)
    paid.people.remove(other_user)
    page = client.get("/sessions/new").content.decode()
    assert f'value="{live_endpoint.pk}:' in page and f'value="{paid.pk}:' not in page
    refused = client.post(
        "/sessions/new", {"workspace": workspace.pk, "endpoint": f"{paid.pk}:scripted", "mode": "edit", "text": "Hi"}
    )
    assert refused.status_code == 200 and f"There is no model endpoint {paid.pk}." in refused.content.decode()
    assert not ChatSession.objects.filter(owner=other_user).exists()


@pytest.mark.django_db
def test_a_workspace_granted_to_a_group_is_its_peoples_and_leaving_the_group_makes_it_read_only(
    live_session: ChatSession, user: Any
) -> None:
    workspace = live_session.workspace
    Workspace.objects.filter(pk=workspace.pk).update(open_to_everyone=False)
    workspace.groups.add(Group.objects.create(name="writers"))
    assert workspace not in workspaces_for(user=user)
    assert workspace_refusal(session=live_session) is not None
    _join(user, "writers")
    assert workspace in workspaces_for(user=user)
    assert workspace_refusal(session=live_session) is None
    user.groups.clear()
    assert workspace_refusal(session=live_session) is not None


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_grant_taken_back_refuses_the_model_keeps_the_words_and_another_model_goes_on(
    live_session: ChatSession, ada_cookie: str, paid: ModelEndpoint, live_endpoint: ModelEndpoint, model: ScriptedServer
) -> None:
    await database_sync_to_async(_join)(live_session.owner, "paid-api")
    await database_sync_to_async(ChatSession.objects.filter(pk=live_session.pk).update)(endpoint=paid)
    model.push(Step(text="One."), Step(text="Two."))
    communicator, got = await connected(live_session.pk, ada_cookie)
    await communicator.send_json_to({"type": "send", "text": "First"})
    await until(communicator, got, idle)

    await database_sync_to_async(live_session.owner.groups.clear)()
    await communicator.send_json_to({"type": "send", "text": "Still paid?"})
    await until(communicator, got, notice_says(REFUSED))
    assert ">Still paid?</textarea>" in got.puts["composer-text"], "the words go back into the box"
    for message in ({"type": "regenerate"}, {"type": "compact"}):
        got.puts.pop("notice", None)
        await communicator.send_json_to(message)
        await until(communicator, got, notice_says(REFUSED))
    got.puts.pop("notice", None)
    await communicator.send_json_to({"type": "model", "endpoint": f"{paid.pk}:scripted", "model": ""})
    await until(communicator, got, notice_says(f"There is no model endpoint {paid.pk}."))

    await communicator.send_json_to({"type": "model", "endpoint": f"{live_endpoint.pk}:scripted", "model": ""})
    await communicator.send_json_to({"type": "send", "text": "On the open one"})
    await until(communicator, got, lambda message: idle(message) and "On the open one" in got.html())
    turns = await database_sync_to_async(lambda: list(Turn.objects.order_by("number").values_list("words", "status")))()
    assert turns == [("First", TurnStatus.DONE), ("On the open one", TurnStatus.DONE)]
    assert len(model.requests) == 2, "nothing was asked of the paid endpoint once its grant was taken back"
    await communicator.disconnect()


@pytest.mark.django_db
def test_ask_uses_only_an_endpoint_the_person_may_use(
    paid: ModelEndpoint, live_endpoint: ModelEndpoint, user: Any
) -> None:
    with pytest.raises(CommandError, match="ada may not use the model endpoint 'paid': staff grant it in the admin"):
        call_command("ask", "--user", "ada", "--endpoint", "paid", "Hello")
    assert not ChatSession.objects.exists(), "nothing started"


@pytest.mark.django_db
def test_a_person_granted_no_endpoint_is_told_so_in_new_chat_and_the_model_menu(
    live_session: ChatSession, user: Any
) -> None:
    ModelEndpoint.objects.update(open_to_everyone=False)
    client = Client()
    client.force_login(user)
    assert "No workspace or model endpoint is configured for you yet" in client.get("/sessions/new").content.decode()
    menu = client.get(f"/sessions/{live_session.pk}/models").content.decode()
    assert 'id="model-none"' in menu and f'value="{live_session.endpoint_id}:' not in menu
