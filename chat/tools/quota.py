"""A workspace's disk quota: what its files take on disk, measured by walking it as ``du`` does.

Checked before every write of Cachet's own file tools, attachments and restores (with the growth the write
brings; a write that frees space always goes). A command gets the space left as the most any file it writes may
hold (``run``), and while it runs ``run`` measures again every second (or ten times as long as a measurement
takes, whichever is longer) and stops it once the workspace passes its quota (or what it held at the start, where
that was more), and once more when it ends. A measure is kept ``KEEP_SECONDS`` for the file tools, with their own
writes added.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

from .context import ToolContext
from .errors import ToolError, shown
from .paths import Root
from .survey import GIT, HEAD, holds_head, is_head, survey
from .writes import PendingWrite, commit

KEEP_SECONDS = 10.0
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_lock = threading.Lock()
_kept: dict[str, tuple[int, float]] = {}


def disk_usage(folder_fd: int) -> int:
    """Bytes the files and folders below the folder open as ``folder_fd`` take on disk, a hard-linked file once;
    links not followed."""
    return survey(folder_fd).used


def measured(root: Root, *, fresh: bool = False) -> int:
    """The workspace's usage, measured again when ``fresh`` or when the kept measure is old."""
    now = time.monotonic()
    with _lock:
        kept = _kept.get(root.path)
    if kept is not None and not fresh and now - kept[1] < KEEP_SECONDS:
        return kept[0]
    return keep(root.path, disk_usage(root.fd))


def keep(path: str, used: int) -> int:
    """Keep ``used`` as the workspace's usage measured now (a walk made for something else measured it too)."""
    with _lock:
        _kept[path] = (used, time.monotonic())
    return used


def _grown(path: str, growth: int) -> None:
    with _lock:
        kept = _kept.get(path)
        if kept is not None:
            _kept[path] = (max(0, kept[0] + growth), kept[1])


def size_text(count: int) -> str:
    """``count`` bytes as a person reads them: ``512 bytes``, ``900 KB``, ``12.5 MB``, ``1.3 GB``."""
    if count < 1024:
        return f"{count} bytes"
    for unit, scale in (("KB", 1024), ("MB", 1024**2), ("GB", 1024**3)):
        if count < scale * 1024 or unit == "GB":
            value = count / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    raise AssertionError("unreachable")


def check_writes(writes: Sequence[PendingWrite], ctx: ToolContext, root: Root) -> int:
    """The bytes ``writes`` add to the workspace; ``ToolError`` where that takes it past its quota. A write that
    frees space is never refused, over the quota or not."""
    growth = sum(len(write.data or b"") - len(write.original or b"") for write in writes)
    if ctx.disk_quota is None or growth <= 0:
        return growth
    used = measured(root)
    if used + growth > ctx.disk_quota:
        path = shown(writes[0].path) if len(writes) == 1 else f"{len(writes)} files"
        raise ToolError(
            ctx.config.error(
                "disk_quota", path=path, used=size_text(used), quota=size_text(ctx.disk_quota), size=size_text(growth)
            )
        )
    return growth


def commit_within_quota(writes: Sequence[PendingWrite], ctx: ToolContext, root: Root) -> None:
    """``writes.commit`` where none of them is in a git folder and the workspace's quota has room for them, else
    ``ToolError`` and nothing written. Every write of the file tools, attachments and restores comes here."""
    refuse_git_paths(writes, ctx, root)
    growth = check_writes(writes, ctx, root)
    commit(writes)
    if ctx.disk_quota is not None:
        _grown(root.path, growth)


def refuse_git_paths(writes: Sequence[PendingWrite], ctx: ToolContext, root: Root) -> None:
    """``ToolError`` where a write's path (as resolved, links followed) has a ``.git`` component below the
    workspace, lies in another folder git takes for a git folder (one holding a ``HEAD`` git accepts), or would
    make its folder one (a ``HEAD`` git accepts): the model never changes what git on the host reads as
    configuration or runs."""
    for write in writes:
        below = os.path.relpath(write.path, root.path).split(os.sep)
        if any(part.lower() == GIT for part in below):
            raise ToolError(ctx.config.error("git_path", path=shown(write.path)))
        folder = _git_folder_on_the_way(root, below[:-1])
        if folder is not None:
            raise ToolError(ctx.config.error("git_folder_path", path=shown(write.path), folder=shown(folder)))
        if below[-1] == HEAD and write.data is not None and is_head(write.data):
            raise ToolError(ctx.config.error("git_head", path=shown(write.path)))


def _git_folder_on_the_way(root: Root, folders: Sequence[str]) -> str | None:
    """The first of the workspace and ``folders`` (its folders on the way down to a file) that holds a ``HEAD``
    git accepts, opened one by one without following a link; ``None`` where none does."""
    fd = os.dup(root.fd)
    walked = root.path
    try:
        for name in ("", *folders):
            if name:
                try:
                    child = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
                except OSError:
                    return None
                os.close(fd)
                fd = child
                walked = os.path.join(walked, name)
            if holds_head(fd):
                return walked
    finally:
        os.close(fd)
    return None
