"""What of a workspace's git repositories a command may not change: everything git on the host reads as its
configuration or runs.

A command can write the workspace, and git runs programs that a repository names: ``core.fsmonitor``,
``core.pager``, ``core.sshCommand``, filters and aliases in its config, its hooks, a ``commondir`` or a ``.git``
file that points git at another folder's config, and files its config includes. Someone who runs ``git status``
in the folder on the host would run what a command put there, outside the sandbox. So:

- every ``.git`` of the workspace (folder or file, at any depth, as :mod:`.survey` finds them) is bound
  read-only into the sandbox, its ``commondir``, ``worktrees/``, ``modules/`` and ``info/`` with it;
- every folder on the way to one, from the workspace down, is bound onto itself: a mount point cannot be
  renamed, removed or replaced, so no command can move a repository aside and put another ``.git`` in its place;
- what a repository's configuration names inside the workspace (a hooks folder, an included file, a program
  it runs), and a git folder that a ``.git`` file or a ``commondir`` points to inside it, are read-only too.

A symbolic link among what git reads as code (a ``.git``, a config, ``hooks`` and what it holds, ``commondir``,
``info``, a path the config names) would let a command point it elsewhere, so ``run`` refuses such a workspace
and says which (:class:`LinkedEntry`). Every entry is opened from the workspace's descriptor one component at a
time without following a link, and handed to bubblewrap as a descriptor; nothing is resolved by name twice.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

MODULES_DEPTH = 3
INCLUDE_DEPTH = 10
CONFIG_MAX_BYTES = 1 << 20
MAX_GUARDS = 4000
CODE_ENTRIES = ("config", "config.worktree", "commondir", "gitdir", "hooks", "info")
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SECTION = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(.*)$')
_ENTRY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*=\s*(.*?)\s*$")
# Keys whose value is a program git runs (by the key's last name, or every key of the section): its first word.
_PROGRAM_NAMES = {
    "askpass",
    "clean",
    "cmd",
    "command",
    "driver",
    "editor",
    "external",
    "fsmonitor",
    "helper",
    "packobjectshook",
    "pager",
    "process",
    "program",
    "receivepack",
    "smudge",
    "sshcommand",
    "textconv",
    "uploadpack",
}
_PROGRAM_SECTIONS = {"alias", "pager"}
_PATH_KEYS = {("core", "hookspath"), ("core", "attributesfile"), ("include", "path"), ("includeif", "path")}


class LinkedEntry(Exception):
    """Something git reads as code is a symbolic link (or lies behind one): ``path`` names it."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class MissingNamed(Exception):
    """A repository's configuration (``config``, relative to the workspace) names ``path`` inside the workspace,
    which does not exist: a command could create it, and git on the host would read or run it."""

    def __init__(self, path: str, config: str, key: str) -> None:
        super().__init__(path)
        self.path = path
        self.config = config
        self.key = key


class WorkspaceIsGitFolder(Exception):
    """The workspace folder itself is a git folder (it holds a ``HEAD`` git accepts): a command could change its
    configuration, and the folder cannot be made read-only without the whole workspace."""


class TooManyRepositories(Exception):
    """More repositories and named files than a sandbox can guard."""


@dataclass(frozen=True)
class Guard:
    """A folder or file to bind into the sandbox over itself: ``fd`` is an ``O_PATH`` descriptor of it, ``path``
    where it is, ``read_only`` whether commands may not change it (else it is only pinned in place)."""

    fd: int
    path: str
    read_only: bool


@dataclass
class Guards:
    """The guards of one call, shallowest first; ``close`` closes their descriptors."""

    items: list[Guard] = field(default_factory=list)

    def close(self) -> None:
        for guard in self.items:
            with contextlib.suppress(OSError):
                os.close(guard.fd)
        self.items.clear()


@contextlib.contextmanager
def repository_guards(
    root_fd: int, root: str, git_entries: Sequence[str], git_folders: Sequence[str] = ()
) -> Iterator[Guards]:
    """The guards of the repositories whose ``.git`` entries (relative to the workspace open as ``root_fd`` at
    ``root``) are ``git_entries``, and of the other git folders ``git_folders`` (bare repositories);
    :class:`LinkedEntry` where something git reads as code is a link."""
    planned = _Plan(root_fd, root)
    for entry in git_entries:
        planned.repository(entry)
    for folder in git_folders:
        if not folder:
            raise WorkspaceIsGitFolder(root)
        planned.git_folder(folder)
    guards = Guards()
    try:
        planned.open_all(guards)
        yield guards
    finally:
        guards.close()


class _Plan:
    """The read-only paths of one workspace (relative to it), found by reading its repositories."""

    def __init__(self, root_fd: int, root: str) -> None:
        self.root_fd = root_fd
        self.root = root
        self.read_only: set[str] = set()

    def repository(self, entry: str) -> None:
        kind = self._kind(entry)
        if kind is None:
            return
        self.read_only.add(entry)
        worktree = os.path.dirname(entry)
        if kind == "file":
            pointed = _gitdir_line(self._read(entry))
            if pointed is not None:
                self._git_folder(self._inside(os.path.join(worktree, pointed)), worktree, depth=0)
            return
        self._git_folder(entry, worktree, depth=0)

    def git_folder(self, folder: str) -> None:
        """Guard a git folder that is not named ``.git`` (a bare repository's), its worktree its parent."""
        self._git_folder(folder, os.path.dirname(folder), depth=0)

    def _git_folder(self, folder: str | None, worktree: str, *, depth: int) -> None:
        """Guard a git folder (relative; ``None`` where it lies outside the workspace) and what it points to."""
        if folder is None or self._kind(folder) != "folder":
            return
        self.read_only.add(folder)
        for name in CODE_ENTRIES:
            self._kind(os.path.join(folder, name))
        for hook in self._names(os.path.join(folder, "hooks")):
            self._kind(os.path.join(folder, "hooks", hook))
        self._kind(os.path.join(folder, "info", "attributes"))
        for config in ("config", "config.worktree"):
            self._config(os.path.join(folder, config), worktree, depth=0)
        common = self._read(os.path.join(folder, "commondir")).decode("utf-8", "replace").strip()
        if common and depth < MODULES_DEPTH:
            self._git_folder(self._inside(os.path.join(folder, common)), worktree, depth=depth + 1)
        for linked in self._names(os.path.join(folder, "worktrees")):
            place = os.path.join(folder, "worktrees", linked)
            for name in CODE_ENTRIES:
                self._kind(os.path.join(place, name))
            self._config(os.path.join(place, "config.worktree"), worktree, depth=0)
        if depth < MODULES_DEPTH:
            self._modules(os.path.join(folder, "modules"), depth=depth)

    def _modules(self, folder: str, *, depth: int) -> None:
        for name in self._names(folder):
            module = os.path.join(folder, name)
            if self._kind(module) != "folder":
                continue
            if self._kind(os.path.join(module, "HEAD")) is not None:
                self._git_folder(module, module, depth=depth + 1)
            else:  # a submodule named with a slash: its folders nest
                self._modules(module, depth=depth + 1)

    def _config(self, path: str, worktree: str, *, depth: int) -> None:
        """Guard what the config file at ``path`` names inside the workspace, and what its includes name."""
        if self._kind(path) != "file":
            return
        self.read_only.add(path)
        for key, value in _entries(self._read(path)):
            for named, required in _named(key, value, config_folder=os.path.dirname(path), worktree=worktree):
                inside = self._inside(named)
                if inside is None:
                    continue
                if self._kind(inside) is None:
                    if required:
                        raise MissingNamed(
                            os.path.join(self.root, inside), os.path.join(self.root, path), ".".join(key)
                        )
                    continue
                self.read_only.add(inside)
                if key[0] in ("include", "includeif") and depth < INCLUDE_DEPTH:
                    self._config(inside, worktree, depth=depth + 1)

    def _inside(self, path: str) -> str | None:
        """``path`` (relative to the workspace, or absolute) relative to the workspace where it lies inside it."""
        absolute = os.path.normpath(os.path.join(self.root, path))
        if absolute == self.root:
            return ""
        prefix = self.root.rstrip(os.sep) + os.sep
        return absolute[len(prefix) :] if absolute.startswith(prefix) else None

    def _kind(self, relative: str) -> str | None:
        """What ``relative`` is, reached without following a link: ``folder``, ``file``, ``other``, or ``None``
        where it is missing; :class:`LinkedEntry` where it or a folder on the way is a link."""
        fd = self._open(relative)
        if fd is None:
            return None
        try:
            mode = os.fstat(fd).st_mode
        finally:
            os.close(fd)
        return "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"

    def _open(self, relative: str) -> int | None:
        parts = [part for part in relative.split("/") if part not in ("", ".")]
        fd = os.dup(self.root_fd)
        walked = self.root
        try:
            for name in parts:
                walked = os.path.join(walked, name)
                try:
                    child = os.open(name, _PATH_FLAGS, dir_fd=fd)
                except (FileNotFoundError, NotADirectoryError):
                    return None
                os.close(fd)
                fd = child
                if stat.S_ISLNK(os.fstat(fd).st_mode):
                    raise LinkedEntry(walked)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read(self, relative: str) -> bytes:
        fd = self._open(relative)
        if fd is None:
            return b""
        try:
            readable = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return b""
        finally:
            os.close(fd)
        try:
            return os.read(readable, CONFIG_MAX_BYTES) if stat.S_ISREG(os.fstat(readable).st_mode) else b""
        finally:
            os.close(readable)

    def _names(self, relative: str) -> list[str]:
        fd = self._open(relative)
        if fd is None:
            return []
        try:
            listing = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return []
        finally:
            os.close(fd)
        try:
            return sorted(os.listdir(listing))
        finally:
            os.close(listing)

    def open_all(self, guards: Guards) -> None:
        """Open every read-only path and every folder on the way to one, shallowest first, none inside another
        read-only path (it is read-only with it)."""
        read_only = {path for path in self.read_only if path and not _below_any(path, self.read_only)}
        pinned = {
            os.path.join(*parts[:depth])
            for parts in (path.split("/") for path in read_only)
            for depth in range(1, len(parts))
        }
        pinned -= read_only
        wanted = sorted(
            [(path, True) for path in read_only] + [(path, False) for path in pinned],
            key=lambda item: (item[0].count("/"), item[0]),
        )
        if len(wanted) > MAX_GUARDS:
            raise TooManyRepositories(str(len(wanted)))
        for path, is_read_only in wanted:
            fd = self._open(path)
            if fd is not None:
                guards.items.append(Guard(fd, os.path.join(self.root, path), is_read_only))


def disarm(root_fd: int, root: str, folder: str) -> str | None:
    """Rename the ``HEAD`` of ``folder`` (relative to the workspace open as ``root_fd`` at ``root``; ``""`` for the
    workspace itself) so that git no longer takes the folder for a git folder; the new name's path, or ``None``
    where the folder or its ``HEAD`` is gone (or reached through a link)."""
    try:
        fd = os.open(".", _FOLDER_FLAGS, dir_fd=root_fd)
    except OSError:
        return None
    try:
        for name in (part for part in folder.split("/") if part):
            child = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        names = set(os.listdir(fd))
        renamed = next(
            f"HEAD.disarmed{suffix}"
            for suffix in ("", *map(str, range(2, 10_000)))
            if f"HEAD.disarmed{suffix}" not in names
        )
        os.rename("HEAD", renamed, src_dir_fd=fd, dst_dir_fd=fd)
    except (OSError, StopIteration):
        return None
    finally:
        os.close(fd)
    return os.path.join(root, folder, renamed)


def _below_any(path: str, others: set[str]) -> bool:
    return any(other and other != path and path.startswith(other + "/") for other in others)


def _gitdir_line(data: bytes) -> str | None:
    text = data.decode("utf-8", "replace").strip()
    return text[len("gitdir:") :].strip() or None if text.startswith("gitdir:") else None


def _entries(config: bytes) -> Iterator[tuple[tuple[str, str], str]]:
    """Each ``((section, key), value)`` of a git config file, names lowercased and values unquoted."""
    section = ""
    for raw in config.decode("utf-8", "replace").splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0] if '"' not in raw else raw
        header = _SECTION.match(line)
        if header is not None:
            section = header.group(1).lower()
            line = header.group(3)
        entry = _ENTRY.match(line)
        if entry is not None:
            yield (section, entry.group(1).lower()), _unquote(entry.group(2))


def _named(key: tuple[str, str], value: str, *, config_folder: str, worktree: str) -> list[tuple[str, bool]]:
    """The paths a config value names, each with whether git needs it to exist to read or run it: the whole
    value for a key that is a path (an include relative to its config file's folder, others to the worktree),
    else each word of a program line that is a path, the program itself (its first word) needed."""
    if not value or value.startswith("~"):
        return []
    if key in _PATH_KEYS:
        base = config_folder if key[0] in ("include", "includeif") else worktree
        return [(os.path.join(base, value), True)]
    runs = key[1] in _PROGRAM_NAMES or key[0] in _PROGRAM_SECTIONS
    words = value.removeprefix("!").split()
    return [
        (os.path.join(worktree, word), runs and position == 0)
        for position, word in enumerate(words)
        if "/" in word and not word.startswith("~")
    ]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return value.replace('\\"', '"').replace("\\\\", "\\")
