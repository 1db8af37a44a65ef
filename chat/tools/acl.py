"""POSIX ACLs, read and written as the kernel keeps them: the ``system.posix_acl_access`` and
``system.posix_acl_default`` extended attributes, in the kernel's binary form (a little-endian u32 version,
2, then entries of u16 tag, u16 permissions, u32 id, sorted by tag then id). No ``acl`` package, no
``setfacl``. A file without an access ACL has the ACL its mode bits make.

Where Cachet runs as root and commands run as another user, a workspace folder that user may not write is
opened to it with ``grant``: a named user entry on every folder and file of the tree, and on every folder a
default ACL with that entry too, so that files made later inherit it. Ownership never changes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import struct
from collections.abc import Collection, Iterator

logger = logging.getLogger(__name__)

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
UNDEFINED_ID = 0xFFFFFFFF
READ, WRITE, EXECUTE = 4, 2, 1
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
_GROUP_CLASS = (USER, GROUP_OBJ, GROUP)
_NO_ACLS = (errno.EOPNOTSUPP, errno.ENOTSUP)
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

Entry = tuple[int, int, int]


class NoAcls(OSError):
    """The file system of ``filename`` keeps no POSIX ACLs."""


def decode(data: bytes) -> list[Entry]:
    """The entries of an ACL in the kernel's binary form; ``ValueError`` where it is not one."""
    if len(data) < _HEADER.size or (len(data) - _HEADER.size) % _ENTRY.size:
        raise ValueError("not a POSIX ACL")
    if _HEADER.unpack_from(data)[0] != VERSION:
        raise ValueError("not a version 2 POSIX ACL")
    return [_ENTRY.unpack_from(data, offset) for offset in range(_HEADER.size, len(data), _ENTRY.size)]


def encode(entries: Collection[Entry]) -> bytes:
    """An ACL in the kernel's binary form, its entries sorted by tag then id."""
    return _HEADER.pack(VERSION) + b"".join(
        _ENTRY.pack(*entry) for entry in sorted(entries, key=lambda e: (e[0], e[2]))
    )


def from_mode(mode: int) -> list[Entry]:
    """The ACL that mode bits alone make."""
    return [
        (USER_OBJ, mode >> 6 & 7, UNDEFINED_ID),
        (GROUP_OBJ, mode >> 3 & 7, UNDEFINED_ID),
        (OTHER, mode & 7, UNDEFINED_ID),
    ]


def read(target: int | str, name: str = ACCESS) -> list[Entry] | None:
    """The ACL ``name`` of a descriptor (``O_PATH`` ones too) or path, ``None`` where it has none; ``NoAcls``
    where its file system keeps none."""
    try:
        data = os.getxattr(_xattr_target(target), name)
    except OSError as error:
        if error.errno == errno.ENODATA:
            return None
        if error.errno in _NO_ACLS:
            raise NoAcls(error.errno, os.strerror(error.errno), _shown(target)) from None
        raise
    return decode(data)


def write(target: int | str, entries: Collection[Entry], name: str = ACCESS) -> None:
    """Set the ACL ``name`` of a descriptor or path (the kernel sets the mode's bits to match an access ACL);
    ``NoAcls`` where its file system keeps none."""
    try:
        os.setxattr(_xattr_target(target), name, encode(entries))
    except OSError as error:
        if error.errno in _NO_ACLS:
            raise NoAcls(error.errno, os.strerror(error.errno), _shown(target)) from None
        raise


def access_of(target: int | str, info: os.stat_result | None = None) -> list[Entry]:
    """The access ACL in effect: the stored one, else the one the mode bits make."""
    try:
        stored = read(target)
    except NoAcls:
        stored = None
    if stored is not None:
        return stored
    return from_mode((info or _status(target)).st_mode)


def permits(entries: Collection[Entry], info: os.stat_result, uid: int, gid: int, wanted: int) -> bool:
    """Whether the access ACL ``entries`` of a file whose status is ``info`` gives ``wanted`` (bits of
    ``READ | WRITE | EXECUTE``) to a process of ``uid`` whose only group is ``gid``, as the kernel decides."""
    if info.st_uid == uid:
        return all(perm & wanted == wanted for tag, perm, _ in entries if tag == USER_OBJ)
    mask = next((perm for tag, perm, _ in entries if tag == MASK), 7)
    for tag, perm, who in entries:
        if tag == USER and who == uid:
            return perm & mask & wanted == wanted
    matched = False
    for tag, perm, who in entries:
        if (tag == GROUP_OBJ and info.st_gid == gid) or (tag == GROUP and who == gid):
            if perm & mask & wanted == wanted:
                return True
            matched = True
    if matched:
        return False
    return any(perm & wanted == wanted for tag, perm, _ in entries if tag == OTHER)


def may(target: int | str, uid: int, gid: int, wanted: int) -> bool:
    """Whether ``uid`` (with ``gid`` its only group) may ``wanted`` the file or folder ``target`` now, by owner,
    group, ACL entries and mode."""
    info = _status(target)
    return permits(access_of(target, info), info, uid, gid, wanted)


def may_write_folder(fd: int, uid: int, gid: int) -> bool:
    """Whether ``uid`` may make and remove entries in the folder ``fd``: write it, and enter it."""
    return may(fd, uid, gid, WRITE | EXECUTE)


def with_user(entries: Collection[Entry], uid: int, perm: int) -> list[Entry] | None:
    """``entries`` with a named entry giving ``uid`` at least ``perm`` and the mask the union of the group
    class; ``None`` where ``uid`` has that already."""
    kept = [entry for entry in entries if not (entry[0] == USER and entry[2] == uid) and entry[0] != MASK]
    had = next((entry[1] for entry in entries if entry[0] == USER and entry[2] == uid), 0)
    mask = next((entry[1] for entry in entries if entry[0] == MASK), None)
    if had & perm == perm and mask is not None and mask & perm == perm:
        return None
    kept.append((USER, had | perm, uid))
    union = 0
    for tag, bits, _ in kept:
        if tag in _GROUP_CLASS:
            union |= bits
    return [*kept, (MASK, union, UNDEFINED_ID)]


def inherited(default: Collection[Entry], mode: int) -> list[Entry]:
    """The access ACL a file made with ``mode`` gets in a folder whose default ACL is ``default``, as the
    kernel makes it: the owner, mask (group where there is none) and others entries limited by the mode."""
    has_mask = any(tag == MASK for tag, _, _ in default)
    limits = {USER_OBJ: mode >> 6 & 7, MASK if has_mask else GROUP_OBJ: mode >> 3 & 7, OTHER: mode & 7}
    return [(tag, perm & limits.get(tag, 7), who) for tag, perm, who in default]


def grant(fd: int, uid: int, *, skip: Collection[tuple[int, int]] = ()) -> int:
    """Give ``uid`` rwX on the tree of the folder ``fd`` (an ``O_PATH`` descriptor will do): on every folder
    ``rwx`` in its access ACL and in its default ACL (made from its mode where it has none), on every regular
    file ``rw``, and ``x`` where its owner has ``x``; every other entry stays as it was. Each child is opened
    relative to its folder with ``O_NOFOLLOW``: a symbolic link is never followed, and nothing is done to it.
    Left as they are: other kinds of files, a file with more than one name (a hard link, whose other name may
    be outside the tree), other file systems, and the folders ``skip`` names by ``(st_dev, st_ino)``. The
    folder itself is done last, so that a walk cut short is done again. How many folders and files changed;
    ``NoAcls``
    where the file system keeps none, ``OSError`` (``EROFS``) where it is read-only."""
    top = os.open(".", _FOLDER, dir_fd=fd)
    try:
        info = os.fstat(top)
        if (info.st_dev, info.st_ino) in skip:
            return 0
        changed = _grant_below(top, info.st_dev, uid, set(skip))
        return changed + _grant_one(top, info, uid)
    finally:
        os.close(top)


def _grant_below(top: int, device: int, uid: int, skip: set[tuple[int, int]]) -> int:
    """``grant`` on what ``top`` holds, depth first: one open folder per level."""
    changed = 0
    levels: list[tuple[int, Iterator[str]]] = [(top, iter(os.listdir(top)))]
    try:
        while levels:
            folder, names = levels[-1]
            name = next(names, None)
            if name is None:
                levels.pop()
                if folder != top:
                    os.close(folder)
                continue
            child = _open_child(folder, name, device, skip)
            if child is None:
                continue
            fd, info = child
            try:
                changed += _grant_one(fd, info, uid)
                if stat.S_ISDIR(info.st_mode):
                    levels.append((fd, iter(os.listdir(fd))))
                    fd = -1
            except OSError as error:
                if isinstance(error, NoAcls) or error.errno == errno.EROFS:
                    raise
                logger.warning("could not give access with ACLs to part of a tree: %s", error)
            finally:
                if fd >= 0:
                    os.close(fd)
    finally:
        for folder, _ in levels:
            if folder != top:
                os.close(folder)
    return changed


def _open_child(folder: int, name: str, device: int, skip: set[tuple[int, int]]) -> tuple[int, os.stat_result] | None:
    """``name`` in ``folder`` opened without following a link, where ``grant`` changes it; else ``None``."""
    try:
        found = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return None
    is_folder = stat.S_ISDIR(found.st_mode)
    if found.st_dev != device or (found.st_dev, found.st_ino) in skip:
        return None
    if not is_folder and not (stat.S_ISREG(found.st_mode) and found.st_nlink == 1):
        return None
    try:
        fd = os.open(name, _FOLDER if is_folder else _FILE, dir_fd=folder)
    except OSError:
        return None
    info = os.fstat(fd)
    if (info.st_dev, info.st_ino, stat.S_IFMT(info.st_mode)) != (
        found.st_dev,
        found.st_ino,
        stat.S_IFMT(found.st_mode),
    ):
        os.close(fd)
        return None
    return fd, info


def _grant_one(fd: int, info: os.stat_result, uid: int) -> int:
    """Add ``uid``'s entry to one folder or file: 1 where that changed anything. Only ``NoAcls`` and a read-only
    file system stop the walk: any other failure (an immutable file, say) leaves that file as it is."""
    stored = read(fd)
    access = stored if stored is not None else from_mode(info.st_mode)
    owner = next((perm for tag, perm, _ in access if tag == USER_OBJ), 0)
    perm = 7 if stat.S_ISDIR(info.st_mode) else READ | WRITE | (owner & EXECUTE)
    changed = 0
    try:
        if stat.S_ISDIR(info.st_mode):
            default = read(fd, DEFAULT)
            base = [entry for entry in access if entry[0] in (USER_OBJ, GROUP_OBJ, OTHER)]
            made = with_user(default if default is not None else base, uid, 7)
            if made is not None:
                write(fd, made, DEFAULT)
                changed = 1
        made = with_user(access, uid, perm)
        if made is not None:
            write(fd, made)
            changed = 1
    except OSError as error:
        if isinstance(error, NoAcls) or error.errno == errno.EROFS:
            raise
        logger.warning("could not give access with an ACL: %s", error)
    return changed


def copy_access(source: int, target: int) -> None:
    """Give ``target`` the access ACL of ``source``, or none where that has none; nothing where the file system
    keeps no ACLs."""
    with contextlib.suppress(NoAcls):
        entries = read(source)
        if entries is not None:
            write(target, entries)
            return
        try:
            os.removexattr(_xattr_target(target), ACCESS)
        except OSError as error:
            if error.errno not in (errno.ENODATA, *_NO_ACLS):
                raise


def inherit(folder: int, target: int, mode: int) -> None:
    """Give ``target``, made with ``mode`` in ``folder``, the access ACL the folder's default ACL makes for it;
    nothing where the folder has none or where the file system keeps no ACLs."""
    with contextlib.suppress(NoAcls):
        default = read(folder, DEFAULT)
        if default is not None:
            write(target, inherited(default, mode))


def _xattr_target(target: int | str) -> int | str:
    """Where the xattr calls reach ``target``: an ``O_PATH`` descriptor only through ``/proc/self/fd``."""
    if isinstance(target, int) and fcntl.fcntl(target, fcntl.F_GETFL) & os.O_PATH:
        return f"/proc/self/fd/{target}"
    return target


def _status(target: int | str) -> os.stat_result:
    return os.fstat(target) if isinstance(target, int) else os.stat(target)


def _shown(target: int | str) -> str:
    if isinstance(target, str):
        return target
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/self/fd/{target}")
    return f"descriptor {target}"
