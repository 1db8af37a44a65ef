"""A person's private workspace: made on first use, theirs alone, one however many ask at once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from sessions_app.errors import PrivateFolderRefused
from sessions_app.models import Workspace
from sessions_app.selectors.sessions import workspaces_for
from sessions_app.services.workspaces import workspace_private


@pytest.mark.django_db
def test_made_on_first_use_in_a_folder_of_its_own_that_only_its_person_uses(
    user: Any, other_user: Any, tmp_path: Path, settings: Any
) -> None:
    settings.CACHET_WORKSPACE_ROOTS = [tmp_path]
    shared = Workspace.objects.create(name="scratch", folder=str(tmp_path / "scratch"))
    mine = workspace_private(user=user)
    assert (mine.name, mine.owner, list(mine.members.all())) == ("ada's files", user, [user])
    assert Path(mine.folder) == (tmp_path / "people" / str(user.pk)).resolve() and Path(mine.folder).is_dir()
    assert workspace_private(user=user) == mine, "made once"
    theirs = workspace_private(user=other_user)
    assert theirs != mine and theirs.folder != mine.folder
    assert set(workspaces_for(user=user)) == {shared, mine}
    assert set(workspaces_for(user=other_user)) == {shared, theirs}


@pytest.mark.django_db
def test_a_name_taken_by_a_shared_workspace_gets_the_persons_id(user: Any, tmp_path: Path, settings: Any) -> None:
    settings.CACHET_WORKSPACE_ROOTS = [tmp_path]
    Workspace.objects.create(name="ada's files", folder=str(tmp_path / "team"))
    assert workspace_private(user=user).name == f"ada's files ({user.pk})"


@pytest.mark.django_db
def test_a_root_cachet_may_not_use_is_a_clear_refusal(user: Any, settings: Any) -> None:
    settings.CACHET_WORKSPACE_ROOTS = [Path("/etc")]
    with pytest.raises(PrivateFolderRefused, match="may not make your own workspace at /etc/people/"):
        workspace_private(user=user)
    assert not Workspace.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_first_uses_at_once_make_one(user: Any, tmp_path: Path, settings: Any) -> None:
    settings.CACHET_WORKSPACE_ROOTS = [tmp_path]
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
