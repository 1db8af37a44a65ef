"""Walking a workspace folder without leaving it, by descriptors: each folder is listed through its own
descriptor and entered by opening the child relative to it with ``O_NOFOLLOW | O_DIRECTORY``, so
symlinked folders are never entered, and a symlinked file counts only when it leads to a regular file
inside the workspace."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from .paths import FOLDER_FLAGS, LISTING_FLAGS, Root

EntryKind = Literal["folder", "file", "link", "other"]
State = TypeVar("State")


@dataclass(frozen=True)
class Entry:
    """One entry of a folder: its name, its absolute path as the tools show it, and what it is itself."""

    name: str
    path: str
    kind: EntryKind


def entries(folder_fd: int, folder_path: str) -> list[Entry]:
    """The entries of the folder open as ``folder_fd``; none when it cannot be read."""
    try:
        fd = os.open(".", LISTING_FLAGS, dir_fd=folder_fd)
    except OSError:
        return []
    try:
        with os.scandir(fd) as listing:
            return [Entry(item.name, os.path.join(folder_path, item.name), _kind(item)) for item in listing]
    except OSError:
        return []
    finally:
        os.close(fd)


def is_workspace_file(root: Root, entry: Entry) -> bool:
    """Whether ``entry`` is a regular file, or a symlink to one inside the workspace."""
    return entry.kind == "file" or (entry.kind == "link" and root.kind_of(entry.path) == "file")


def shows_as_folder(root: Root, entry: Entry) -> bool:
    """Whether ``entry`` is a folder, or a symlink to one inside the workspace."""
    return entry.kind == "folder" or (entry.kind == "link" and root.kind_of(entry.path) == "folder")


Visit = Callable[[str, State, list[Entry]], Sequence[tuple[str | None, State]]]


def walk_folders(folder_fd: int, folder_path: str, state: State, visit: Visit[State]) -> None:
    """Depth first from the folder open as ``folder_fd``: ``visit(path, state, entries)`` names the
    children to enter next, each with its state (a name ``None`` enters the same folder again). A child
    is opened relative to its parent, never followed through a symlink; one descriptor is open per level."""
    stack: list[tuple[int, str, Iterator[tuple[str | None, State]]]] = []

    def enter(fd: int, path: str, entered: State) -> None:
        try:
            children = iter(visit(path, entered, entries(fd, path)))
        except BaseException:
            os.close(fd)
            raise
        stack.append((fd, path, children))

    try:
        enter(os.dup(folder_fd), folder_path, state)
        while stack:
            fd, path, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                os.close(fd)
                continue
            name, child_state = child
            child_fd = os.dup(fd) if name is None else _open_child(fd, name)
            if child_fd is not None:
                enter(child_fd, path if name is None else os.path.join(path, name), child_state)
    finally:
        for fd, _, _ in stack:
            with contextlib.suppress(OSError):
                os.close(fd)


def _open_child(fd: int, name: str) -> int | None:
    try:
        return os.open(name, FOLDER_FLAGS, dir_fd=fd)
    except OSError:
        return None


def _kind(item: os.DirEntry[str]) -> EntryKind:
    try:
        if item.is_symlink():
            return "link"
        if item.is_dir(follow_symlinks=False):
            return "folder"
        return "file" if item.is_file(follow_symlinks=False) else "other"
    except OSError:
        return "other"
