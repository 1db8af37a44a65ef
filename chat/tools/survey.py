"""One walk of a workspace from its descriptor, never following a link: what its files take on disk (as ``du``
counts: blocks, a hard-linked file once) and where its git repositories are (every ``.git``, folder or file, at
any depth, but none inside another ``.git``). The quota and ``run``'s guards of git both read it."""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field

GIT = ".git"
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass
class Survey:
    """``used``: bytes on disk; ``git_entries``: the ``.git`` entries' paths relative to the walked folder."""

    used: int = 0
    git_entries: list[str] = field(default_factory=list)


def survey(folder_fd: int) -> Survey:
    """Walk the folder open as ``folder_fd`` (any descriptor of it) and everything below it."""
    found = Survey()
    seen: set[tuple[int, int]] = set()
    try:
        top = os.open(".", _FOLDER_FLAGS, dir_fd=folder_fd)
    except OSError:
        return found
    # Each level keeps its descriptor and the folders left to enter: as many descriptors as the tree is deep.
    stack: list[tuple[int, str, bool, list[str]]] = []
    with contextlib.ExitStack() as closing:
        closing.callback(_close_levels, stack)
        stack.append((top, "", False, _visit(top, "", False, found, seen)))
        while stack:
            fd, relative, in_git, folders = stack[-1]
            if not folders:
                os.close(fd)
                stack.pop()
                continue
            name = folders.pop()
            try:
                child = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
            except OSError:
                continue
            below = os.path.join(relative, name) if relative else name
            inside = in_git or name == GIT
            try:
                folders_below = _visit(child, below, inside, found, seen)
            except BaseException:
                os.close(child)
                raise
            stack.append((child, below, inside, folders_below))
    return found


def _close_levels(stack: list[tuple[int, str, bool, list[str]]]) -> None:
    for level in stack:
        os.close(level[0])


def _visit(fd: int, relative: str, in_git: bool, found: Survey, seen: set[tuple[int, int]]) -> list[str]:
    """Count the entries of one folder; the names of its folders, to enter next."""
    folders: list[str] = []
    try:
        with os.scandir(fd) as listing:
            entries = list(listing)
    except OSError:
        return folders
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        is_folder = stat.S_ISDIR(info.st_mode)
        if info.st_nlink > 1 and not is_folder:
            key = (info.st_dev, info.st_ino)
            if key in seen:
                continue
            seen.add(key)
        found.used += info.st_blocks * 512
        if entry.name == GIT and not in_git:
            found.git_entries.append(os.path.join(relative, GIT) if relative else GIT)
        if is_folder:
            folders.append(entry.name)
    return folders
