"""Who may use a workspace, the one rule every read of it follows: the session list, the page, the socket and the
reply loop."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.errors import FolderRefused, NotAMember
from sessions_app.models import ChatSession, ModelEndpoint, ModelRequest, RequestStatus, Workspace
from sessions_app.selectors.requests import finished_requests, last_time_to_first_token
from sessions_app.selectors.sessions import (
    Standing,
    session_by_id,
    session_standing,
    unusable_workspace_ids,
    workspace_refusal,
    workspaces_for,
)
from sessions_app.services.sessions import session_start

pytestmark = pytest.mark.django_db


def test_membership_is_explicit_and_open_to_everyone_is_a_switch(
    user: Any, other_user: Any, django_user_model: Any, workspace: Workspace
) -> None:
    """A workspace with members is theirs; with none, no one's but staff's; everyone's only where staff opened it
    to everyone (the ``workspace`` fixture is)."""
    staff = django_user_model.objects.create_user(username="carol", is_staff=True)
    team = Workspace.objects.create(name="team", folder=str(workspace.folder))
    team.members.add(user, other_user)
    private = Workspace.objects.create(name="private", folder=str(workspace.folder))
    private.members.add(other_user)
    nobodys = Workspace.objects.create(name="nobody's", folder=str(workspace.folder))
    assert list(workspaces_for(user=user)) == [team, workspace]
    assert list(workspaces_for(user=other_user)) == [private, team, workspace]
    assert list(workspaces_for(user=staff)) == [nobodys, workspace]
    Workspace.objects.filter(pk=nobodys.pk).update(open_to_everyone=True)
    assert list(workspaces_for(user=user)) == [nobodys, team, workspace]
    staff.is_active = False
    staff.save()
    Workspace.objects.filter(pk=nobodys.pk).update(open_to_everyone=False)
    assert list(workspaces_for(user=staff)) == [workspace]


def test_a_removed_owner_is_refused_and_the_list_marks_the_workspace(
    user: Any, other_user: Any, chat_session: ChatSession, endpoint: ModelEndpoint
) -> None:
    workspace = chat_session.workspace
    Workspace.objects.filter(pk=workspace.pk).update(open_to_everyone=False)
    workspace.members.add(user, other_user)
    assert workspace_refusal(session=chat_session) is None
    assert unusable_workspace_ids(owner=user) == set()
    assert session_standing(session=chat_session) == Standing("edit", True, False, True)
    workspace.members.remove(user)
    refused = workspace_refusal(session=chat_session)
    assert isinstance(refused, NotAMember)
    assert str(refused) == "You are no longer a member of the workspace “ws”: this session is read-only."
    assert unusable_workspace_ids(owner=user) == {workspace.pk}
    assert unusable_workspace_ids(owner=other_user) == set()
    assert session_standing(session=chat_session) == Standing("edit", True, False, False)
    workspace.members.remove(other_user)
    assert isinstance(workspace_refusal(session=chat_session), NotAMember), "no members: no one's but staff's"
    workspace.members.add(user)
    assert workspace_refusal(session=chat_session) is None
    assert session_standing(session=chat_session).member is True


def test_the_standing_before_a_tool_call_is_one_query(chat_session: ChatSession) -> None:
    session_standing(session=chat_session)
    Workspace.objects.filter(pk=chat_session.workspace_id).update(allow_commands=False, allow_network=True)
    ChatSession.objects.filter(pk=chat_session.pk).update(mode="plan")
    with CaptureQueriesContext(connection) as queries:
        assert session_standing(session=chat_session) == Standing("plan", False, True, True)
    assert len(queries.captured_queries) == 1
    with pytest.raises(ChatSession.DoesNotExist):
        session_standing(session=ChatSession(pk=2_000_000_000))


def test_a_workspace_on_a_forbidden_folder_is_refused(user: Any, endpoint: ModelEndpoint) -> None:
    workspace = Workspace.objects.create(name="old", folder="/", open_to_everyone=True)
    session = session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="m", tools=[])
    refused = workspace_refusal(session=session)
    assert isinstance(refused, FolderRefused)
    assert str(refused) == (
        "The workspace “old” is on a folder Cachet may not use (/ is the root of the file system): this session "
        "is read-only until staff change the folder in the admin."
    )


def test_a_session_by_id_comes_with_its_workspace_and_endpoint_in_one_query(chat_session: ChatSession) -> None:
    with CaptureQueriesContext(connection) as queries:
        session = session_by_id(session_id=chat_session.pk)
        assert (session.workspace.name, session.endpoint.name) == (
            chat_session.workspace.name,
            chat_session.endpoint.name,
        )
    assert len(queries) == 1
    with pytest.raises(ChatSession.DoesNotExist):
        session_by_id(session_id=chat_session.pk + 1000)


def test_the_finished_requests_and_the_last_time_to_first_token(chat_session: ChatSession) -> None:
    def request(status: str, ttft: float | None) -> ModelRequest:
        return ModelRequest.objects.create(
            session=chat_session,
            endpoint_url="http://model",
            model_name="m",
            body_sha256="0" * 64,
            bytes_sent=1,
            shared_prefix_bytes=0,
            status=status,
            time_to_first_token=ttft,
        )

    assert last_time_to_first_token(finished_requests(session=chat_session)) is None
    first = request(RequestStatus.DONE, 0.5)
    failed = request(RequestStatus.FAILED, None)
    request(RequestStatus.SENDING, 0.9)
    finished = finished_requests(session=chat_session)
    assert list(finished.order_by("id")) == [first, failed]
    assert last_time_to_first_token(finished) == 0.5, "the newest that has one, never a request still being sent"
