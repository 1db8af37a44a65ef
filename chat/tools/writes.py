"""Writing the files of one call all together, through descriptors: every new content is staged beside
its file first (created relative to the folder's descriptor), then moved into place with ``renameat``;
missing folders are made with ``mkdirat`` and deletions are ``unlinkat``. A failure on the way puts back
what was already changed. No path string is resolved again after ``paths`` resolved it.

Where Cachet runs as root, what it writes keeps the owner a command would see: a replaced file its own
owner, a new file or folder the owner of the folder it is made in. So a workspace that belongs to the user
commands run as stays theirs to change. Likewise its POSIX ACLs: a replaced file keeps its access ACL, and a new
file gets the one its folder's default ACL makes (as the kernel would, had the mode not been set after)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from . import acl
from .context import ToolContext
from .errors import ToolError, shown
from .paths import FOLDER_FLAGS, Resolved, named

_STAGE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_STAGE_ATTEMPTS = 100


@dataclass(frozen=True)
class PendingWrite:
    """One file to change: ``data`` ``None`` deletes it; ``original`` ``None`` means it is new."""

    target: Resolved
    data: bytes | None
    original: bytes | None
    mode: int | None = None

    @property
    def path(self) -> str:
        """The file's absolute path, as the tools show it."""
        return self.target.path


@dataclass(frozen=True)
class _Place:
    """A name in an open folder: ``fd`` is the folder's descriptor, ``path`` the name's absolute path."""

    fd: int
    name: str
    path: str

    def beside(self, name: str) -> str:
        return os.path.join(os.path.dirname(self.path), name)


def check_parent(target: Resolved, ctx: ToolContext) -> None:
    """Refuse a new file whose nearest existing ancestor is not a folder."""
    if target.blocker is not None:
        raise ToolError(ctx.config.error("not_folder", path=shown(target.blocker)))


def commit(writes: Sequence[PendingWrite]) -> None:
    """Apply ``writes`` in order, all or (as far as the file system lets) none."""
    with contextlib.ExitStack() as folders:
        created: list[_Place] = []
        staged: list[tuple[PendingWrite, _Place, str | None]] = []
        try:
            for write in writes:
                place = _place(write.target, created, folders)
                staged.append((write, place, None if write.data is None else _stage(place, write.data, write.mode)))
        except BaseException:
            _discard(staged, created)
            raise
        done = 0
        try:
            for _, place, temporary in staged:
                with _naming(place.path):
                    if temporary is None:
                        os.unlink(place.name, dir_fd=place.fd)
                    else:
                        os.replace(temporary, place.name, src_dir_fd=place.fd, dst_dir_fd=place.fd)
                done += 1
        except BaseException:
            for write, place, _ in reversed(staged[:done]):
                _restore(write, place)
            _discard(staged[done:], created)
            raise


def _place(target: Resolved, created: list[_Place], folders: contextlib.ExitStack) -> _Place:
    """Where ``target`` goes: its folder's descriptor, the missing folders on the way made first."""
    fd, folder = target.dir_fd, target.dir_path
    for name in target.names[:-1]:
        path = os.path.join(folder, name)
        with _naming(path):
            try:
                os.mkdir(name, dir_fd=fd)
                created.append(_Place(fd, name, path))
                _own_like(fd, name, os.fstat(fd))
            except FileExistsError:
                pass
            child = os.open(name, FOLDER_FLAGS, dir_fd=fd)
        folders.callback(os.close, child)
        fd, folder = child, path
    return _Place(fd, target.name, os.path.join(folder, target.name))


def _stage(place: _Place, data: bytes, mode: int | None) -> str:
    for _ in range(_STAGE_ATTEMPTS):
        temporary = f".{place.name}.{secrets.token_hex(4)}.cachet"
        try:
            fd = os.open(temporary, _STAGE_FLAGS, 0o600, dir_fd=place.fd)
        except FileExistsError:
            continue
        except OSError as error:
            raise named(error, place.beside(temporary)) from None
        break
    else:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), place.path)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode if mode is not None else 0o666 & ~_umask())
            if os.geteuid() == 0:
                owner = _owner_of(place)
                with contextlib.suppress(OSError):  # an owner this user namespace does not map
                    os.fchown(handle.fileno(), owner.st_uid, owner.st_gid)
            _acl_like(place, handle.fileno(), 0o666 if mode is None else mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=place.fd)
        raise
    return temporary


def _owner_of(place: _Place) -> os.stat_result:
    """Whose a file written at ``place`` is: the file's there now, else its folder's."""
    try:
        return os.stat(place.name, dir_fd=place.fd, follow_symlinks=False)
    except OSError:
        return os.fstat(place.fd)


def _acl_like(place: _Place, fd: int, mode: int) -> None:
    """Give the staged file ``fd`` the access ACL of the file it replaces (none where that has none), or for a
    new file the one its folder's default ACL makes for ``mode``: the ``fchmod`` undid the kernel's."""
    try:
        original = os.open(place.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=place.fd)
    except OSError:
        acl.inherit(place.fd, fd, mode)
        return
    try:
        if stat.S_ISREG(os.fstat(original).st_mode):
            acl.copy_access(original, fd)
        else:
            acl.inherit(place.fd, fd, mode)
    finally:
        os.close(original)


def _own_like(folder_fd: int, name: str, owner: os.stat_result) -> None:
    """As root, give ``name`` in the folder the owner of ``owner``."""
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            os.chown(name, owner.st_uid, owner.st_gid, dir_fd=folder_fd, follow_symlinks=False)


def _restore(write: PendingWrite, place: _Place) -> None:
    with contextlib.suppress(OSError):
        if write.original is None:
            os.unlink(place.name, dir_fd=place.fd)
        else:
            temporary = _stage(place, write.original, write.mode)
            os.replace(temporary, place.name, src_dir_fd=place.fd, dst_dir_fd=place.fd)


def _discard(staged: Sequence[tuple[PendingWrite, _Place, str | None]], created: Sequence[_Place]) -> None:
    for _, place, temporary in staged:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=place.fd)
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            os.rmdir(folder.name, dir_fd=folder.fd)


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """Name ``path`` in an ``OSError`` of a call relative to a descriptor, which only knows the last name."""
    try:
        yield
    except OSError as error:
        raise named(error, path) from None


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
