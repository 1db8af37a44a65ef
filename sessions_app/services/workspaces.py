"""Making workspaces: a person's private one on their first use, and the checks every way of making one shares
(the folder rules, and that workspaces never nest), taken under one lock so that two at once cannot nest."""

from __future__ import annotations

import os
from pathlib import Path

from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction

from sessions_app.errors import PrivateFolderRefused, StoreError
from sessions_app.folders import people_folder, private_folder
from sessions_app.models import Workspace
from sessions_app.selectors.sessions import workspace_nesting

PEOPLE_MODE = 0o711  # others may pass through to their own folder, never list who has one
PRIVATE_MODE = 0o700  # closed to every other local account
_WORKSPACE_FOLDERS_LOCK = 0x63616368_6574_7773  # pg_advisory_xact_lock's key: "cachet" "ws"


def workspace_folders_lock() -> None:
    """Hold, until the transaction ends, the lock every maker of a workspace takes before it checks that the new
    folder nests with no other: two made at once are checked one after the other."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_WORKSPACE_FOLDERS_LOCK])


def private_folder_make(folder: Path) -> None:
    """Make ``folder`` (a person's, under the people folder) and the people folder where missing, and close them as
    they must be: the people folder 0711, the person's 0700. Nothing else of the folder is changed."""
    people = folder.parent
    people.mkdir(parents=True, exist_ok=True)
    os.chmod(people, PEOPLE_MODE)
    folder.mkdir(exist_ok=True)
    mode = os.stat(folder).st_mode & 0o7777
    if _has_acl(folder):  # granted to the commands' user: its group bits are the ACL's mask, kept
        os.chmod(folder, mode & ~0o007)
    else:
        os.chmod(folder, PRIVATE_MODE)


def _has_acl(folder: Path) -> bool:
    try:
        return bool(os.getxattr(folder, "system.posix_acl_access", follow_symlinks=False))
    except OSError:
        return False


def workspace_private(*, user: User) -> Workspace:
    """``user``'s private workspace, made where missing at the people folder's ``ID``, named "NAME's files", with
    ``user`` its only member, for good. Two first uses at once make one."""
    found = Workspace.objects.filter(owner=user).first()
    if found is not None:
        return found
    folder = private_folder(user.pk)
    private_folder_make(folder)
    try:
        return _made(user, folder)
    except IntegrityError:  # made meanwhile by another request of the same person
        return Workspace.objects.get(owner=user)


@transaction.atomic
def _made(user: User, folder: Path) -> Workspace:
    workspace_folders_lock()
    made_meanwhile = Workspace.objects.filter(owner=user).first()
    if made_meanwhile is not None:
        return made_meanwhile
    refusal = workspace_nesting(folder=folder)
    if refusal:
        raise PrivateFolderRefused(str(folder), refusal)
    name = f"{user.get_username()}'s files"[:90]
    if Workspace.objects.filter(name=name).exists():
        name = f"{name} ({user.pk})"
    workspace = Workspace.objects.create(name=name, folder=str(folder), owner=user)
    workspace.members.add(user)
    return workspace


def private_folders_close() -> None:
    """Close every private workspace's folder as :func:`private_folder_make` makes them (folders made before this
    rule were 0755)."""
    for user_id in Workspace.objects.filter(owner__isnull=False).values_list("owner_id", flat=True):
        folder = private_folder(user_id)
        if folder.is_dir() and not folder.is_symlink():
            private_folder_make(folder)
    if people_folder().is_dir():
        os.chmod(people_folder(), PEOPLE_MODE)


class ShellFolderRefused(StoreError):
    """A folder named from a shell that cannot be a workspace, with why."""


@transaction.atomic
def _shell_name(folder: Path) -> str:
    """The folder's own name ("repo"), numbered where another workspace has it ("repo 2")."""
    base = (folder.name or "workspace")[:90]
    taken = set(Workspace.objects.filter(name__startswith=base).values_list("name", flat=True))
    return next(name for name in (base, *(f"{base} {n}" for n in range(2, 10_000))) if name not in taken)


def workspace_from_shell(*, user: User, folder: Path) -> Workspace:
    """The workspace of a folder someone with a shell on the server named (``ask --workspace``): ``folder``
    (resolved, checked by the folder rules with ``anywhere``) may lie outside ``CACHET_WORKSPACE_ROOTS``. Made
    where missing, named by the folder's own name, with ``user`` its member; refused where it nests with another
    workspace's folder, or where a workspace of that folder from a shell is one ``user`` may not use."""
    workspace_folders_lock()
    found = Workspace.objects.filter(folder=str(folder), from_shell=True).first()
    if found is not None:
        if not found.members.filter(pk=user.pk).exists():
            person = user.get_username()
            raise ShellFolderRefused(f"The workspace {found.name!r} exists and is not one {person} may use here.")
        return found
    refusal = workspace_nesting(folder=folder)
    if refusal:
        raise ShellFolderRefused(f"Cachet may not use {folder} as a workspace: {refusal}.")
    workspace = Workspace.objects.create(name=_shell_name(folder), folder=str(folder), from_shell=True)
    workspace.members.add(user)
    return workspace
