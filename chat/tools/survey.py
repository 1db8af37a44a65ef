"""One walk of a workspace from its descriptor, never following a link: what its files take on disk (as ``du``
counts: blocks, a hard-linked file once) and where its git repositories are: every ``.git``, folder or file, at
any depth, but none inside another ``.git``, and every other folder git would take for a git folder (one holding a
``HEAD`` that git accepts, as a bare repository's). The quota and ``run``'s guards of git both read it."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass, field

GIT = ".git"
HEAD = "HEAD"
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_HEAD_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_OBJECT_ID = re.compile(rb"[0-9a-fA-F]{40}")


@dataclass
class Survey:
    """``used``: bytes on disk; ``git_entries``: the ``.git`` entries' paths relative to the walked folder;
    ``git_folders``: the other folders git takes for git folders (``""`` for the walked folder itself)."""

    used: int = 0
    git_entries: list[str] = field(default_factory=list)
    git_folders: list[str] = field(default_factory=list)


def is_head(data: bytes) -> bool:
    """Whether git takes a file holding ``data`` for a repository's ``HEAD`` (a symbolic ref or an object id)."""
    if data.startswith(b"ref:"):
        return data[4:].lstrip().startswith(b"refs/")
    return _OBJECT_ID.match(data) is not None


def holds_head(folder_fd: int) -> bool:
    """Whether the folder open as ``folder_fd`` holds a ``HEAD`` git accepts, which makes git take it for a git
    folder (with ``objects`` and ``refs``, which anyone who can write the folder can add)."""
    try:
        info = os.stat(HEAD, dir_fd=folder_fd, follow_symlinks=False)
    except OSError:
        return False
    if stat.S_ISLNK(info.st_mode):
        try:
            return os.readlink(HEAD, dir_fd=folder_fd).startswith("refs/")
        except OSError:
            return False
    if not stat.S_ISREG(info.st_mode):
        return False
    try:
        fd = os.open(HEAD, _HEAD_FLAGS, dir_fd=folder_fd)
    except OSError:
        return False
    try:
        return is_head(os.read(fd, 256))
    except OSError:
        return False
    finally:
        os.close(fd)


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
    if not in_git and any(entry.name == HEAD for entry in entries) and holds_head(fd):
        found.git_folders.append(relative)
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
