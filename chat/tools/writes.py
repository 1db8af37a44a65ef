"""Writing the files of one call all together: every new content is staged beside its file first,
then moved into place; a failure on the way puts back what was already changed."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .context import ToolContext
from .errors import ToolError, shown


@dataclass(frozen=True)
class PendingWrite:
    """One file to change: ``data`` ``None`` deletes it; ``original`` ``None`` means it is new."""

    path: Path
    data: bytes | None
    original: bytes | None
    mode: int | None = None


def check_parent(path: Path, ctx: ToolContext) -> None:
    """Refuse a new file whose nearest existing ancestor is not a folder."""
    ancestor = path.parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not os.path.isdir(ancestor):
        raise ToolError(ctx.config.error("not_folder", path=shown(ancestor)))


def commit(writes: Sequence[PendingWrite]) -> None:
    """Apply ``writes`` in order, all or (as far as the file system lets) none."""
    created: list[Path] = []
    staged: list[tuple[PendingWrite, str | None]] = []
    try:
        for write in writes:
            if write.data is None:
                staged.append((write, None))
                continue
            _make_folders(write.path.parent, created)
            staged.append((write, _stage(write.path, write.data, write.mode)))
    except BaseException:
        _discard(staged, created)
        raise
    done = 0
    try:
        for write, temporary in staged:
            if temporary is None:
                os.unlink(write.path)
            else:
                os.replace(temporary, write.path)
            done += 1
    except BaseException:
        for write, _ in reversed(staged[:done]):
            _restore(write)
        _discard(staged[done:], created)
        raise


def _make_folders(folder: Path, created: list[Path]) -> None:
    missing: list[Path] = []
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        os.mkdir(path)
        created.append(path)


def _stage(path: Path, data: bytes, mode: int | None) -> str:
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".cachet", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(temporary, mode if mode is not None else 0o666 & ~_umask())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return temporary


def _restore(write: PendingWrite) -> None:
    with contextlib.suppress(OSError):
        if write.original is None:
            os.unlink(write.path)
        else:
            os.replace(_stage(write.path, write.original, write.mode), write.path)


def _discard(staged: Sequence[tuple[PendingWrite, str | None]], created: Sequence[Path]) -> None:
    for _, temporary in staged:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
