"""Walking a workspace folder without leaving it: symlinked folders are never entered, and a
symlinked file counts only when it leads to a regular file inside the workspace."""

from __future__ import annotations

import os
import stat

from .paths import link_target_inside


def entries(folder: str) -> list[os.DirEntry[str]]:
    """The entries of ``folder``; none when it cannot be read."""
    try:
        with os.scandir(folder) as listing:
            return list(listing)
    except OSError:
        return []


def is_real_folder(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a folder and not a symlink to one."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def is_workspace_file(entry: os.DirEntry[str], root: str) -> bool:
    """Whether ``entry`` is a regular file, or a symlink to one inside ``root``."""
    try:
        if entry.is_symlink():
            target = link_target_inside(entry.path, root)
            return target is not None and stat.S_ISREG(os.stat(target).st_mode)
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False
