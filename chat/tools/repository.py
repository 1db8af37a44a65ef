"""What of a git repository in the workspace a command may not change: what git on the host reads as code.

A command can write the workspace, and a repository's ``.git/config`` (``core.fsmonitor``, ``core.pager``,
filters, aliases), its hooks, and a ``.git`` file's ``gitdir:`` line all make git run programs. Someone who
runs ``git status`` in the folder on the host would run what a command put there, outside the sandbox. So,
for the repository at the workspace's top (and its submodules' git folders under ``.git/modules``), these
are bound read-only into the sandbox: ``config``, ``hooks`` (made, empty, where missing, so that none can be
added), the folder ``core.hooksPath`` names and the files ``include.path`` names where they lie inside the
workspace, and a ``.git`` file. A symbolic link among them would let a command point it elsewhere, so ``run``
refuses such a workspace and says which.

Every entry is opened from the workspace's descriptor one component at a time without following a link, and
handed to bubblewrap as a descriptor; nothing is resolved by name twice.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

GIT = ".git"
MODULES_DEPTH = 3
CONFIG_MAX_BYTES = 1 << 20
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_SECTION = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(.*)$')
_ENTRY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*=\s*(.*?)\s*$")


class LinkedEntry(Exception):
    """A file git runs code from is a symbolic link: ``path`` names it."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


@dataclass(frozen=True)
class Guard:
    """A file or folder to bind read-only: ``fd`` is an ``O_PATH`` descriptor of it, ``path`` where it is."""

    fd: int
    path: str


@dataclass
class Guards:
    """The guards of one call; ``close`` closes their descriptors."""

    items: list[Guard] = field(default_factory=list)

    def close(self) -> None:
        for guard in self.items:
            with contextlib.suppress(OSError):
                os.close(guard.fd)
        self.items.clear()


@contextlib.contextmanager
def repository_guards(root: str) -> Iterator[Guards]:
    """The entries of the workspace's repository a command may not change (none where there is no
    repository); ``LinkedEntry`` where one of them is a symbolic link."""
    guards = Guards()
    try:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield guards
        return
    try:
        _guard_repository(root, root_fd, guards)
        yield guards
    finally:
        guards.close()
        os.close(root_fd)


def _guard_repository(root: str, root_fd: int, guards: Guards) -> None:
    entry = _open(root_fd, GIT, root)
    if entry is None:
        return
    fd, mode = entry
    path = os.path.join(root, GIT)
    if stat.S_ISREG(mode):
        guards.items.append(Guard(fd, path))
        return
    if not stat.S_ISDIR(mode):
        os.close(fd)
        return
    try:
        config = _guard_git_folder(root, fd, path, guards, depth=0)
    finally:
        os.close(fd)
    for relative in _named_in_config(config, git_dir=path, worktree=root):
        _guard_inside(root, root_fd, relative, guards)


def _guard_git_folder(root: str, git_fd: int, git_path: str, guards: Guards, *, depth: int) -> bytes:
    """Guard a git folder's ``config`` and ``hooks`` (and its submodules'); its config's text."""
    config = _take(git_fd, "config", git_path, guards, make=_make_file)
    _take(git_fd, "hooks", git_path, guards, make=_make_folder)
    text = _read(config) if config is not None else b""
    if depth < MODULES_DEPTH:
        modules = _open(git_fd, "modules", git_path)
        if modules is not None and stat.S_ISDIR(modules[1]):
            try:
                _guard_modules(root, modules[0], os.path.join(git_path, "modules"), guards, depth=depth)
            finally:
                os.close(modules[0])
        elif modules is not None:
            os.close(modules[0])
    return text


def _guard_modules(root: str, modules_fd: int, modules_path: str, guards: Guards, *, depth: int) -> None:
    readable = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=modules_fd)
    try:
        names = sorted(os.listdir(readable))
    finally:
        os.close(readable)
    for name in names:
        entry = _open(modules_fd, name, modules_path)
        if entry is None:
            continue
        fd, mode = entry
        try:
            if stat.S_ISDIR(mode) and _exists(fd, "HEAD"):
                _guard_git_folder(root, fd, os.path.join(modules_path, name), guards, depth=depth + 1)
            elif stat.S_ISDIR(mode):  # a submodule named with a slash: its folders nest
                _guard_modules(root, fd, os.path.join(modules_path, name), guards, depth=depth + 1)
        finally:
            os.close(fd)


def _take(folder_fd: int, name: str, folder: str, guards: Guards, *, make: Callable[[int, str], None]) -> int | None:
    """Guard ``name`` in the folder, made first where missing; its descriptor, or ``None``."""
    entry = _open(folder_fd, name, folder)
    if entry is None:
        with contextlib.suppress(OSError):
            make(folder_fd, name)
        entry = _open(folder_fd, name, folder)
    if entry is None:
        return None
    guards.items.append(Guard(entry[0], os.path.join(folder, name)))
    return entry[0]


def _make_file(folder_fd: int, name: str) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder_fd)
    try:
        _own_as_folder(folder_fd, fd=fd)
    finally:
        os.close(fd)


def _make_folder(folder_fd: int, name: str) -> None:
    os.mkdir(name, 0o755, dir_fd=folder_fd)
    fd = os.open(name, _PATH_FLAGS | os.O_DIRECTORY, dir_fd=folder_fd)
    try:
        _own_as_folder(folder_fd, fd=fd)
    finally:
        os.close(fd)


def _own_as_folder(folder_fd: int, *, fd: int) -> None:
    """As root, give what Cachet made the owner of the folder it lies in, as everything else there."""
    if os.geteuid() != 0:
        return
    folder = os.fstat(folder_fd)
    with contextlib.suppress(OSError):
        os.chown(f"/proc/self/fd/{fd}", folder.st_uid, folder.st_gid)


def _open(folder_fd: int, name: str, folder: str) -> tuple[int, int] | None:
    """``name`` in the folder, opened without following a link, and its mode; ``None`` where missing."""
    try:
        fd = os.open(name, _PATH_FLAGS, dir_fd=folder_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    mode = os.fstat(fd).st_mode
    if stat.S_ISLNK(mode):
        os.close(fd)
        raise LinkedEntry(os.path.join(folder, name))
    return fd, mode


def _exists(folder_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _read(path_fd: int) -> bytes:
    try:
        fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, CONFIG_MAX_BYTES)
    finally:
        os.close(fd)


def _named_in_config(config: bytes, *, git_dir: str, worktree: str) -> list[str]:
    """The paths the config's ``core.hooksPath`` and ``include.path`` / ``includeIf.*.path`` name, absolute."""
    named: list[str] = []
    section = ""
    for raw in config.decode("utf-8", "replace").splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0] if '"' not in raw else raw
        header = _SECTION.match(line)
        if header is not None:
            section = header.group(1).lower()
            line = header.group(3)
        entry = _ENTRY.match(line)
        if entry is None:
            continue
        key, value = entry.group(1).lower(), _unquote(entry.group(2))
        if not value:
            continue
        if section == "core" and key == "hookspath":
            named.append(os.path.normpath(os.path.join(worktree, os.path.expanduser(value))))
        elif section in ("include", "includeif") and key == "path":
            named.append(os.path.normpath(os.path.join(git_dir, os.path.expanduser(value))))
    return named


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return value.replace('\\"', '"').replace("\\\\", "\\")


def _guard_inside(root: str, root_fd: int, path: str, guards: Guards) -> None:
    """Guard ``path`` where it lies inside the workspace and exists, walking to it without following a link."""
    if path != root and not path.startswith(root.rstrip(os.sep) + os.sep):
        return
    parts = [part for part in os.path.relpath(path, root).split(os.sep) if part not in ("", ".")]
    if not parts or ".." in parts:
        return
    fd = os.dup(root_fd)
    folder = root
    try:
        for name in parts[:-1]:
            entry = _open(fd, name, folder)
            if entry is None or not stat.S_ISDIR(entry[1]):
                if entry is not None:
                    os.close(entry[0])
                return
            os.close(fd)
            fd, folder = entry[0], os.path.join(folder, name)
        leaf = _open(fd, parts[-1], folder)
        if leaf is not None:
            guards.items.append(Guard(leaf[0], path))
    finally:
        os.close(fd)
