"""Making workspaces: a person's private one (made on first use under the people folder, theirs alone, closed on
disk, one however many ask at once), and the rule every maker shares: workspaces never nest."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from sessions_app.errors import PrivateFolderRefused
from sessions_app.folders import people_folder, private_folder
from sessions_app.models import Workspace
from sessions_app.selectors.sessions import workspace_folder_refusal, workspaces_for
from sessions_app.services.setup import workspaces_seed
from sessions_app.services.workspaces import ShellFolderRefused, workspace_from_shell, workspace_private


@pytest.fixture
def people(tmp_path: Path, settings: Any) -> Path:
    settings.CACHET_PEOPLE = tmp_path / "data" / "people"
    settings.CACHET_WORKSPACE_ROOTS = [tmp_path / "projects"]
    return people_folder()


@pytest.mark.django_db
def test_made_on_first_use_in_the_people_folder_closed_to_everyone_else(
    user: Any, other_user: Any, tmp_path: Path, people: Path
) -> None:
    shared = Workspace.objects.create(name="scratch", folder=str(tmp_path / "projects"), open_to_everyone=True)
    mine = workspace_private(user=user)
    assert (mine.name, mine.owner, list(mine.members.all())) == ("ada's files", user, [user])
    assert Path(mine.folder) == people / str(user.pk) == private_folder(user.pk) and Path(mine.folder).is_dir()
    assert stat.S_IMODE(os.stat(mine.folder).st_mode) == 0o700, "closed to other local accounts"
    assert stat.S_IMODE(os.stat(people).st_mode) == 0o711, "passed through, never listed"
    assert workspace_private(user=user) == mine, "made once"
    theirs = workspace_private(user=other_user)
    assert theirs != mine and theirs.folder != mine.folder
    assert set(workspaces_for(user=user)) == {shared, mine}
    assert set(workspaces_for(user=other_user)) == {shared, theirs}
    assert workspace_folder_refusal(workspace=mine) == ""


@pytest.mark.django_db
def test_a_name_taken_by_a_shared_workspace_gets_the_persons_id(user: Any, tmp_path: Path, people: Path) -> None:
    Workspace.objects.create(name="ada's files", folder=str(tmp_path / "projects" / "team"))
    assert workspace_private(user=user).name == f"ada's files ({user.pk})"


@pytest.mark.django_db
def test_the_audits_probe_a_workspace_made_first_at_a_persons_folder_keeps_it_closed(
    user: Any, tmp_path: Path, people: Path
) -> None:
    """Limited staff made workspaces at ``…/workspaces``, ``…/people`` and ``…/people/3``; the private workspace
    made later at ``people/3`` did not check, and another person read its files. Now no other workspace can be
    there (the folder rules refuse the data folder), and a row made before the rules stops the private one."""
    squatter = Workspace.objects.create(name="squat", folder=str(people / str(user.pk)), open_to_everyone=True)
    with pytest.raises(PrivateFolderRefused, match="is already the folder of the workspace 'squat'"):
        workspace_private(user=user)
    assert not Workspace.objects.filter(owner=user).exists()
    squatter.delete()
    Workspace.objects.create(name="above", folder=str(people.parent), open_to_everyone=True)
    with pytest.raises(
        PrivateFolderRefused, match=f"lies inside the folder of the workspace 'above' \\({people.parent}\\)"
    ):
        workspace_private(user=user)


@pytest.mark.django_db
def test_a_private_workspace_elsewhere_is_refused_at_use(user: Any, tmp_path: Path, people: Path) -> None:
    moved = Workspace.objects.create(name="old", folder=str(tmp_path / "projects" / "people" / "1"), owner=user)
    assert workspace_folder_refusal(workspace=moved) == (
        f"a private workspace lives at {people / str(user.pk)}, not {moved.folder}"
    )


@pytest.mark.django_db
def test_workspaces_never_nest_wherever_they_are_made(user: Any, tmp_path: Path, people: Path) -> None:
    projects = tmp_path / "projects"
    (projects / "a" / "sub").mkdir(parents=True)
    seeded = workspaces_seed(spec=f"a={projects / 'a'},sub={projects / 'a' / 'sub'}", default_folder=projects)
    assert [workspace.name for workspace in seeded.workspaces] == ["a"]
    assert [(refused.name, refused.reason) for refused in seeded.refused] == [
        (
            "sub",
            f"{projects / 'a' / 'sub'} lies inside the folder of the workspace 'a' ({projects / 'a'}); "
            "workspaces never nest",
        )
    ]
    again = workspaces_seed(spec=f"a={projects / 'a'}", default_folder=projects)
    assert again.refused == [], "a workspace never nests with itself"
    with pytest.raises(ShellFolderRefused, match="holds the folder of the workspace 'a'"):
        workspace_from_shell(user=user, folder=projects)
    made = workspace_from_shell(user=user, folder=projects / "b")
    assert (made.from_shell, list(made.members.all()), made.open_to_everyone) == (True, [user], False)
    assert workspace_from_shell(user=user, folder=projects / "b") == made
    assert made.name == "b", "named by the folder's own name, not its full path"
    Workspace.objects.create(name="c", folder=str(tmp_path / "elsewhere" / "c"))
    assert workspace_from_shell(user=user, folder=projects / "c").name == "c 2", "numbered where the name is taken"


@pytest.mark.django_db
def test_a_nested_workspace_made_before_the_rule_is_refused_at_use(user: Any, tmp_path: Path, people: Path) -> None:
    outer = Workspace.objects.create(name="outer", folder=str(tmp_path / "projects" / "a"))
    inner = Workspace.objects.create(name="inner", folder=str(tmp_path / "projects" / "a" / "sub"))
    assert "lies inside the folder of the workspace 'outer'" in workspace_folder_refusal(workspace=inner)
    assert "holds the folder of the workspace 'inner'" in workspace_folder_refusal(workspace=outer)


@pytest.mark.django_db(transaction=True)
def test_two_first_uses_at_once_make_one(user: Any, people: Path) -> None:
    made: list[Workspace] = []
    start = threading.Barrier(4)

    def first_use() -> None:
        try:
            start.wait()
            made.append(workspace_private(user=user))
        finally:
            connection.close()

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 4 and len({workspace.pk for workspace in made}) == 1
    assert Workspace.objects.filter(owner=user).count() == 1
