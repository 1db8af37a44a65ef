"""Workspaces in the admin, as the audit tried them with limited staff: no workspace nests in another or reaches a
person's private folder, a private workspace's folder, owner and members never change, and staff are told what
follows when a workspace loses its last member."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from sessions_app.models import Workspace
from sessions_app.selectors.sessions import workspaces_for
from sessions_app.services.workspaces import workspace_private

pytestmark = pytest.mark.django_db


@pytest.fixture
def keeper(django_user_model: Any) -> Client:
    """Staff who may only add, view and change workspaces: the audit's limited account."""
    person = django_user_model.objects.create_user(username="keeper", password="keeper-password-1", is_staff=True)
    person.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_workspace", "change_workspace", "add_workspace"])
    )
    client = Client()
    client.login(username="keeper", password="keeper-password-1")
    return client


@pytest.fixture
def projects(tmp_path: Path, settings: Any) -> Path:
    root = tmp_path / "projects"
    (root / "a" / "sub").mkdir(parents=True)
    settings.CACHET_WORKSPACE_ROOTS = [root, tmp_path / "data" / "workspaces"]
    settings.CACHET_DATA = tmp_path / "data"
    settings.CACHET_PEOPLE = tmp_path / "data" / "people"
    return root


def _errors(response: Any) -> list[str]:
    return [
        html.unescape(error)
        for error in re.findall(r'<ul class="errorlist[^"]*"[^>]*><li>(.*?)</li>', response.content.decode())
    ]


def _messages(response: Any) -> list[str]:
    return [html.unescape(text) for text in re.findall(r'<li class="warning">(.*?)</li>', response.content.decode())]


def test_the_audits_probe_a_workspace_inside_another_is_refused_naming_it(keeper: Client, projects: Path) -> None:
    """Staff with only "add workspace" made a workspace at ``<A>/sub`` inside a workspace A that allows commands;
    a command in A then pointed ``sub`` anywhere."""
    add = reverse("admin:sessions_app_workspace_add")
    assert keeper.post(add, {"name": "A", "folder": str(projects / "a"), "allow_commands": "on", "disk_quota_mb": "0"})
    inner = keeper.post(add, {"name": "sub", "folder": str(projects / "a" / "sub"), "disk_quota_mb": "0"})
    assert _errors(inner) == [
        f"Cachet may not use this folder: {projects / 'a' / 'sub'} lies inside the folder of the workspace 'A' "
        f"({projects / 'a'}); workspaces never nest."
    ]
    outer = keeper.post(add, {"name": "all", "folder": str(projects), "disk_quota_mb": "0"})
    assert _errors(outer) == [
        f"Cachet may not use this folder: {projects} holds the folder of the workspace 'A' ({projects / 'a'}); "
        "workspaces never nest."
    ]
    same = keeper.post(add, {"name": "again", "folder": str(projects / "a"), "disk_quota_mb": "0"})
    assert _errors(same) == [
        f"Cachet may not use this folder: {projects / 'a'} is already the folder of the workspace 'A'."
    ]
    assert list(Workspace.objects.values_list("name", flat=True)) == ["A"]


def test_the_audits_probe_no_workspace_reaches_the_private_folders(
    keeper: Client, projects: Path, user: Any, other_user: Any, settings: Any
) -> None:
    """Workspaces at ``…/workspaces``, ``…/workspaces/people`` and ``…/people/3`` were accepted, and another person
    read the files person 3 attached."""
    mine = workspace_private(user=user)
    (Path(mine.folder) / "attached.txt").write_text("ada's\n")
    data = Path(settings.CACHET_DATA)
    add = reverse("admin:sessions_app_workspace_add")
    for folder, reason in (
        (data / "people", f"{data}/people is the private workspaces' folder"),
        (Path(mine.folder), f"{mine.folder} lies inside the private workspaces' folder ({data}/people)"),
        (data, f"{data} is Cachet's data"),
    ):
        response = keeper.post(add, {"name": "squat", "folder": str(folder), "disk_quota_mb": "0"})
        assert _errors(response) == [f"Cachet may not use this folder: {reason}."], folder
    assert not Workspace.objects.filter(name="squat").exists()
    assert mine not in workspaces_for(user=other_user)


def test_a_private_workspaces_folder_owner_and_members_never_change(
    keeper: Client, projects: Path, user: Any, other_user: Any
) -> None:
    mine = workspace_private(user=user)
    change = reverse("admin:sessions_app_workspace_change", args=[mine.pk])
    page = keeper.get(change).content.decode()
    assert 'name="members"' not in page and 'name="folder"' not in page and 'name="owner"' not in page
    assert 'name="open_to_everyone"' not in page
    keeper.post(
        change,
        {
            "name": mine.name,
            "folder": str(projects),
            "owner": str(other_user.pk),
            "members": [str(other_user.pk)],
            "open_to_everyone": "on",
            "disk_quota_mb": "5",
        },
    )
    kept = Workspace.objects.get(pk=mine.pk)
    assert (kept.folder, kept.owner, list(kept.members.all()), kept.open_to_everyone) == (
        mine.folder,
        user,
        [user],
        False,
    )
    assert kept.disk_quota_mb == 5


def test_removing_the_last_member_says_what_follows_and_opens_it_to_no_one(
    keeper: Client, projects: Path, user: Any
) -> None:
    team = Workspace.objects.create(name="team", folder=str(projects / "a"), allow_commands=True)
    team.members.add(user)
    change = reverse("admin:sessions_app_workspace_change", args=[team.pk])
    form = {"name": "team", "folder": str(projects / "a"), "allow_commands": "on", "disk_quota_mb": "0"}
    response = keeper.post(change, form, follow=True)
    assert _messages(response) == [
        "“team” has no members or groups now and is not open to everyone: only staff can use it, and the sessions "
        "others have on it are read-only. Add members or groups, or tick “Open to everyone” to let every person in."
    ]
    assert team not in workspaces_for(user=user)
    opened = keeper.post(change, {**form, "open_to_everyone": "on"}, follow=True)
    assert _messages(opened) == [
        "Every person can use “team” now, and run commands in it: it is open to everyone and allows commands."
    ]
    assert team in workspaces_for(user=user)
