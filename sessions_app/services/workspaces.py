"""A person's private workspace: made on their first use, a folder of their own that only they use."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from sessions_app.errors import PrivateFolderRefused
from sessions_app.folders import folder_check, workspace_roots
from sessions_app.models import Workspace

PRIVATE_FOLDER = "people"


def workspace_private(*, user: User, root: Path | None = None) -> Workspace:
    """``user``'s private workspace, made where missing: ``ROOT/people/ID`` (``ROOT`` the first of
    ``CACHET_WORKSPACE_ROOTS``), named "NAME's files", with ``user`` its only member. Two first uses at once
    make one."""
    found = Workspace.objects.filter(owner=user).first()
    if found is not None:
        return found
    root = root or (workspace_roots() or [Path(settings.CACHET_DATA) / "workspaces"])[0]
    folder = root / PRIVATE_FOLDER / str(user.pk)
    checked = folder_check(folder)
    if not checked.allowed:
        raise PrivateFolderRefused(str(folder), checked.refusal)
    checked.folder.mkdir(parents=True, exist_ok=True)
    try:
        return _made(user, checked.folder)
    except IntegrityError:  # made meanwhile by another request of the same person
        return Workspace.objects.get(owner=user)


@transaction.atomic
def _made(user: User, folder: Path) -> Workspace:
    name = f"{user.get_username()}'s files"[:90]
    if Workspace.objects.filter(name=name).exists():
        name = f"{name} ({user.pk})"
    workspace = Workspace.objects.create(name=name, folder=str(folder), owner=user)
    workspace.members.add(user)
    return workspace
