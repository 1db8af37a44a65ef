"""Workspaces for tests that run commands: as root, commands run as the sandbox user, so a test's workspace
folder is given to that user and the folders on the way to it are opened to it (pytest makes them 0700)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from django.conf import settings


def sandbox_ids() -> tuple[int, int] | None:
    """The uid and gid commands run as where this process is root, else ``None``."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(settings.CACHET_SANDBOX_USER)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def for_commands(folder: Path) -> Path:
    """``folder``, as root given to the sandbox user (with what it holds) and reachable by that user."""
    ids = sandbox_ids()
    if ids is None:
        return folder
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, *ids, follow_symlinks=False)
    return open_the_way(folder)


def open_the_way(folder: Path) -> Path:
    """``folder``, the folders on the way to it (not it) opened to everyone's search, as root."""
    if os.geteuid() == 0:
        for parent in folder.parents:
            mode = parent.stat().st_mode
            if not mode & 0o001:
                parent.chmod((mode & 0o7777) | 0o711)
    return folder
