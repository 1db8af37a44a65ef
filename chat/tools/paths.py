"""Confinement without races: every path a tool uses is resolved from the workspace folder's descriptor,
one component at a time, and every open, listing, write, rename and delete then goes through descriptors.

A path string is never resolved twice: a folder swapped for a symlink to an outside folder while a call
runs (``renameat2(RENAME_EXCHANGE)``) cannot lead the call outside, because each step opens the next
folder relative to the descriptor of the one before, with ``O_NOFOLLOW``.

The semantics are those of ``realpath`` confined to the workspace:

- ``..`` goes to the parent of the folder reached so far (after any symlink was followed);
- a symlink is followed (at most 40 hops, else the ``symlink_loop`` error) when it leads inside: a
  relative target is walked on from the link's folder, an absolute one from the workspace's descriptor;
- a path that leaves the workspace (``..`` at its top, or an absolute target elsewhere) is resolved by
  ``realpath`` only to see where it ends: when it ends outside, the ``outside`` error names the resolved
  absolute path (a path into ``/proc`` as it left, so that ``/proc/self`` never names the server's process);
  when it comes back inside (``link_out/../ws/x``), the walk starts again from the workspace's descriptor
  with the path it came back to. Nothing outside is ever opened;
- missing components are kept as names, so a new file's resolved path and missing folders are known.

Where the kernel has ``openat2`` (Linux 5.6), a path without ``..`` is first opened in one call with
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS``; any path it refuses (a symlink on the
way, a missing folder, anything else) is resolved by the walk, so both give the same answer.
(``RESOLVE_BENEATH`` alone would refuse absolute symlinks that lead inside, which the walk follows.)

The API, used by every tool:

- ``Root(ctx)``: a context manager holding the workspace folder's descriptor; every descriptor handed
  out through it is closed when it closes. ``Root.resolve(given) -> Resolved``;
  ``Root.open_file(target) -> BinaryIO`` (a regular file, else the tool's error);
  ``Root.require_folder(target)``; ``Root.kind_of(path)`` (what a path leads to, ``missing`` when
  refused); ``Root.release(target)`` closes a result's descriptors early.
- ``Resolved``: ``path`` (the absolute resolved path the tools show), ``kind``, ``dir_fd`` (the
  deepest existing folder on the way to the leaf, usually its parent) with ``dir_path``, ``names`` (the
  components from there to the leaf: missing folders, then the leaf's name), ``fd`` (the folder itself
  when ``kind`` is ``folder``) and ``blocker`` (a non-folder standing where a folder is needed).
- ``open_file(ctx, given)``: a context manager giving ``(resolved path, binary handle)``;
  ``open_folder(ctx, given) -> int``: a readable ``O_DIRECTORY`` descriptor of a workspace folder,
  for the caller to close; ``resolve_in_workspace(given, ctx) -> Path``: the resolved path alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Literal

from sessions_app.hygiene.config import ContextConfig

from .context import ToolContext
from .errors import ToolError, shown

Kind = Literal["folder", "file", "other", "missing"]
MAX_SYMLINK_HOPS = 40
FOLDER_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
LISTING_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_FAST_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}
_MISSING_ERRORS = (errno.ENOENT, errno.ENOTDIR)


def workspace_root(ctx: ToolContext) -> str:
    """The workspace folder as an absolute path, as stored (resolved when it was set)."""
    return os.path.normpath(os.path.abspath(ctx.root))


def open_workspace(folder: str, *, roots: tuple[str, ...] | None, config: ContextConfig | None = None) -> int:
    """The workspace folder's ``O_PATH`` descriptor, opened once for an action: walked from ``/`` one component at
    a time without following a link, so that a folder on the way swapped for a symbolic link is refused, never
    followed; and refused where it no longer lies under one of ``roots`` (``None``: anywhere)."""
    if roots is not None and not any(is_inside(folder, root) for root in roots):
        raise _workspace_error(config, "workspace_outside_roots", folder=folder, roots=", ".join(roots) or "none")
    fd = os.open("/", FOLDER_FLAGS)
    walked = "/"
    try:
        for name in (part for part in folder.split("/") if part):
            walked = os.path.join(walked, name)
            try:
                child = os.open(name, FOLDER_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, name):
                    raise _workspace_error(config, "workspace_link", folder=folder, link=walked) from None
                raise named(error, walked) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(folder_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _workspace_error(config: ContextConfig | None, key: str, **values: str) -> ToolError:
    return ToolError(config.error(key, **values) if config is not None else key)


def is_inside(path: str, root: str) -> bool:
    """Whether the resolved ``path`` is ``root`` or lies below it."""
    if path == root:
        return True
    prefix = root if root.endswith(os.sep) else root + os.sep
    return path.startswith(prefix)


@dataclass(frozen=True)
class Resolved:
    """Where a path leads inside the workspace; its descriptors belong to the ``Root`` that made it."""

    path: str
    kind: Kind
    dir_fd: int
    dir_path: str
    names: tuple[str, ...]
    fd: int | None = None
    blocker: str | None = None

    @property
    def name(self) -> str:
        """The leaf's name in its folder (empty for the workspace folder itself)."""
        return self.names[-1] if self.names else ""


@dataclass
class _Frame:
    path: str
    name: str
    kind: Kind
    fd: int | None = None


class _Refused(Exception):
    def __init__(self, key: str, path: str) -> None:
        super().__init__(key, path)
        self.key = key
        self.path = path


class Root:
    """The workspace folder's descriptor and every descriptor opened below it for one call.

    ``config`` gives the error texts; without it (a caller that only skips what is refused) a refusal's
    message is its key.
    """

    def __init__(self, ctx: ToolContext | None = None, *, path: str | None = None) -> None:
        self.path = workspace_root(ctx) if ctx is not None else os.path.realpath(path or ".")
        self.config: ContextConfig | None = ctx.config if ctx is not None else None
        self._owned: set[int] = set()
        if ctx is None:
            try:
                self.fd = os.open(self.path, FOLDER_FLAGS & ~os.O_NOFOLLOW)
            except OSError as error:
                raise named(error, self.path) from None
        else:
            self.fd = open_workspace(self.path, roots=ctx.roots, config=ctx.config)

    def __enter__(self) -> Root:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close every descriptor of this root, its own last."""
        for fd in self._owned:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._owned.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def resolve(self, given: str) -> Resolved:
        """Where ``given`` (relative to the workspace, or absolute) leads; refused outside it."""
        if not given or "\x00" in given or not _encodable(given):
            raise self.error("bad_path", given)
        joined = os.path.join(self.path, given)
        try:
            if os.path.isabs(given) and not is_inside(given, self.path):
                parts = self._come_back(given, joined)
            else:
                parts = self._below(given) if os.path.isabs(given) else given.split("/")
            fast = _fast_path(self, parts) if ".." not in parts else None
            return fast if fast is not None else self._walk(parts, joined)
        except _Refused as refusal:
            raise self.error(refusal.key, refusal.path) from None

    def open_file(self, target: Resolved) -> BinaryIO:
        """Open ``target`` for reading; refused unless it is a regular file.

        ``O_NOFOLLOW`` keeps a symlink swapped in after resolution from being followed, and ``O_NONBLOCK``
        keeps a FIFO from blocking the call.
        """
        if target.kind == "missing":
            raise self.error("not_found", target.path)
        if target.kind != "file":
            raise self.error("is_folder" if target.kind == "folder" else "special_file", target.path)
        try:
            fd = os.open(target.name, READ_FLAGS, dir_fd=target.dir_fd)
        except OSError as error:
            if error.errno in _MISSING_ERRORS:
                raise self.error("not_found", target.path) from None
            if error.errno == errno.ELOOP:
                raise self.error("symlink_loop", target.path) from None
            raise named(error, target.path) from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise self.error("is_folder" if stat.S_ISDIR(mode) else "special_file", target.path)
        return os.fdopen(fd, "rb")

    def require_folder(self, target: Resolved) -> int:
        """The descriptor of ``target`` when it is a folder; else the error naming it."""
        if target.kind == "missing":
            raise self.error("not_found", target.path)
        if target.fd is None:
            raise self.error("not_folder", target.path)
        return target.fd

    def kind_of(self, path: str) -> Kind:
        """What ``path`` leads to inside the workspace; ``missing`` when it does not exist or is refused."""
        try:
            target = self.resolve(path)
        except ToolError:
            return "missing"
        self.release(target)
        return target.kind

    def release(self, target: Resolved) -> None:
        """Close the descriptors of ``target`` now rather than with the root."""
        for fd in (target.dir_fd, target.fd):
            if fd is not None:
                self.discard(fd)

    def discard(self, fd: int) -> None:
        """Close ``fd`` now when it is this root's (never the root's own)."""
        if fd in self._owned:
            self._owned.discard(fd)
            os.close(fd)

    def adopt(self, fd: int) -> int:
        """Make ``fd`` this root's to close, and give it back."""
        self._owned.add(fd)
        return fd

    def error(self, key: str, path: str) -> ToolError:
        """The tool error ``key`` naming ``path`` (``given`` for ``bad_path``)."""
        if self.config is None:
            return ToolError(key)
        if key == "bad_path":
            return ToolError(self.config.error(key, given=path))
        return ToolError(self.config.error(key, path=shown(path)))

    def _below(self, path: str) -> list[str]:
        return path[len(self.path.rstrip("/")) :].split("/")

    def _walk(self, parts: list[str], joined: str) -> Resolved:
        stack = [_Frame(self.path, "", "folder", self.fd)]
        pending = list(reversed(parts))
        hops = 0
        try:
            while pending:
                name = pending.pop()
                if name in ("", "."):
                    continue
                top = stack[-1]
                if name == "..":
                    if len(stack) > 1:
                        self._close_frame(stack.pop())
                        continue
                    hops = self._hop(hops, joined)
                    back = self._come_back(os.path.join(self.path, "..", *reversed(pending)), joined)
                    pending = list(reversed(back))
                    continue
                path = os.path.join(top.path, name)
                if top.fd is None:
                    stack.append(_Frame(path, name, "missing"))
                    continue
                try:
                    mode = os.stat(name, dir_fd=top.fd, follow_symlinks=False).st_mode
                except OSError as error:
                    if error.errno not in _MISSING_ERRORS:
                        raise named(error, os.path.join(path, *reversed(pending))) from None
                    stack.append(_Frame(path, name, "missing"))
                    continue
                if stat.S_ISLNK(mode):
                    hops = self._hop(hops, joined)
                    try:
                        target = os.readlink(name, dir_fd=top.fd)
                    except OSError:
                        pending.append(name)
                        continue
                    if not target.startswith("/"):
                        pending.extend(reversed(target.split("/")))
                        continue
                    for frame in stack[1:]:
                        self._close_frame(frame)
                    del stack[1:]
                    if is_inside(target, self.path):
                        pending.extend(reversed(self._below(target)))
                    else:
                        pending = list(reversed(self._come_back(os.path.join(target, *reversed(pending)), joined)))
                    continue
                if not stat.S_ISDIR(mode):
                    stack.append(_Frame(path, name, "file" if stat.S_ISREG(mode) else "other"))
                    continue
                try:
                    fd = os.open(name, FOLDER_FLAGS, dir_fd=top.fd)
                except OSError as error:
                    if error.errno not in (*_MISSING_ERRORS, errno.ELOOP):
                        raise named(error, os.path.join(path, *reversed(pending))) from None
                    hops = self._hop(hops, joined)
                    pending.append(name)
                    continue
                stack.append(_Frame(path, name, "folder", self.adopt(fd)))
        except BaseException:
            for frame in stack[1:]:
                self._close_frame(frame)
            raise
        return self._result(stack)

    def _result(self, stack: list[_Frame]) -> Resolved:
        leaf = stack[-1]
        if len(stack) == 1:
            return Resolved(self.path, "folder", self.fd, self.path, (), self.fd)
        last_folder = max(index for index, frame in enumerate(stack[:-1]) if frame.kind == "folder")
        holder = stack[last_folder]
        below = stack[last_folder + 1 :]
        for frame in stack[1:]:
            if frame is not holder and frame is not leaf:
                self._close_frame(frame)
        blocker = below[0].path if len(below) > 1 and below[0].kind != "missing" else None
        names = tuple(frame.name for frame in below)
        assert holder.fd is not None
        return Resolved(leaf.path, leaf.kind, holder.fd, holder.path, names, leaf.fd, blocker)

    def _come_back(self, path: str, joined: str) -> list[str]:
        """Name a path that left the workspace by ``realpath``: refused outside, else its parts below the root.
        A refusal names the resolved path, but a path into ``/proc`` as it was given, made absolute: ``/proc/self``
        resolves to the server's own process id."""
        resolved = os.path.realpath(path)
        if os.path.realpath(resolved) != resolved or _is_loop(resolved):
            raise _Refused("symlink_loop", joined)
        if not is_inside(resolved, self.path):
            lexical = "/" + os.path.normpath(path).lstrip("/")  # POSIX keeps a leading //
            raise _Refused("outside", lexical if is_inside(lexical, "/proc") else resolved)
        return self._below(resolved)

    def _hop(self, hops: int, joined: str) -> int:
        if hops >= MAX_SYMLINK_HOPS:
            raise _Refused("symlink_loop", joined)
        return hops + 1

    def _close_frame(self, frame: _Frame) -> None:
        if frame.fd is not None:
            self.discard(frame.fd)


def named(error: OSError, path: str) -> OSError:
    """``error`` naming ``path``: a call relative to a descriptor only knows the last name."""
    return OSError(error.errno, error.strerror, path)


def resolve_in_workspace(given: str, ctx: ToolContext) -> Path:
    """The resolved absolute path of ``given`` (relative to the workspace); refused outside it."""
    with Root(ctx) as root:
        return Path(root.resolve(given).path)


@contextlib.contextmanager
def open_file(ctx: ToolContext, given: str) -> Iterator[tuple[str, BinaryIO]]:
    """The resolved path of ``given`` and the regular file there, open for reading."""
    with Root(ctx) as root:
        target = root.resolve(given)
        handle = root.open_file(target)
    with handle:
        yield target.path, handle


def open_folder(ctx: ToolContext, given: str) -> int:
    """A readable ``O_DIRECTORY`` descriptor of the workspace folder ``given``; the caller closes it."""
    with Root(ctx) as root:
        target = root.resolve(given)
        return os.open(".", LISTING_FLAGS, dir_fd=root.require_folder(target))


def _fast_path(root: Root, parts: list[str]) -> Resolved | None:
    """The walk's answer in one ``openat2`` call for a path with no symlink on the way; ``None`` to walk."""
    names = [name for name in parts if name not in ("", ".")]
    if not names or not OPENAT2.usable:
        return None
    folders, leaf = names[:-1], names[-1]
    dir_fd = root.fd
    if folders:
        dir_fd = OPENAT2.open_folder(root.fd, "/".join(folders))
        if dir_fd < 0:
            return None
        root.adopt(dir_fd)
    dir_path = os.path.join(root.path, *folders)
    kind = _leaf_kind(dir_fd, leaf)
    fd = None
    if kind == "folder":
        try:
            fd = root.adopt(os.open(leaf, FOLDER_FLAGS, dir_fd=dir_fd))
        except OSError:
            kind = None
    if kind is None:
        root.discard(dir_fd)
        return None
    return Resolved(os.path.join(dir_path, leaf), kind, dir_fd, dir_path, (leaf,), fd)


def _leaf_kind(dir_fd: int, name: str) -> Kind | None:
    """What ``name`` is in the folder ``dir_fd``, not following a symlink: ``None`` for a symlink or an error."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return None
    return "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class Openat2:
    """``openat2`` through ``syscall(2)``, switched off for the process where the kernel lacks it (or a
    seccomp filter refuses it). Importing looks nothing up: the C library is found on first use."""

    def __init__(self) -> None:
        number = _SYS_OPENAT2.get(platform.machine())
        self.number = number or 0
        self.usable = number is not None
        self._syscall: Callable[..., int] | None = None

    def open_folder(self, dir_fd: int, path: str) -> int:
        """A descriptor of the folder ``path`` below ``dir_fd``, reached with no symlink and no ``..``; -1 if not."""
        if self._syscall is None:
            function = ctypes.CDLL(None, use_errno=True).syscall
            function.restype = ctypes.c_long
            self._syscall = function
        how = _OpenHow(FOLDER_FLAGS & ~os.O_NOFOLLOW, 0, _FAST_RESOLVE)
        fd = int(
            self._syscall(
                ctypes.c_long(self.number),
                ctypes.c_int(dir_fd),
                ctypes.c_char_p(os.fsencode(path)),
                ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )
        )
        if fd < 0 and ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            self.usable = False
        return fd


OPENAT2 = Openat2()


def _encodable(given: str) -> bool:
    try:
        os.fsencode(given)
    except UnicodeEncodeError:
        return False
    return True


def _is_loop(resolved: str) -> bool:
    try:
        os.stat(resolved)
    except OSError as error:
        return error.errno == errno.ELOOP
    return False
