"""A workspace's disk quota: what its files take on disk, measured by walking it as ``du`` does.

Checked before every write of Cachet's own file tools (with the growth the write brings) and before a command
runs; while a command runs, ``run`` measures again every ``WATCH_EVERY`` seconds (or ten times as long as a
measurement takes, whichever is longer) and stops the command once the workspace passes its quota. A measure is
kept ``KEEP_SECONDS`` for the file tools, with their own writes added to it.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .context import ToolContext
from .errors import ToolError, shown
from .writes import PendingWrite, commit

KEEP_SECONDS = 10.0
WATCH_EVERY = 1.0
WATCH_FACTOR = 10.0

_lock = threading.Lock()
_kept: dict[str, tuple[int, float]] = {}


def disk_usage(root: str) -> int:
    """Bytes the files and folders under ``root`` take on disk, a hard-linked file once; links not followed."""
    total = 0
    seen: set[tuple[int, int]] = set()
    folders = [root]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                key = (info.st_dev, info.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += info.st_blocks * 512
            if stat.S_ISDIR(info.st_mode):
                folders.append(entry.path)
    return total


def measured(root: str, *, fresh: bool = False) -> int:
    """The workspace's usage, measured again when ``fresh`` or when the kept measure is old."""
    now = time.monotonic()
    with _lock:
        kept = _kept.get(root)
    if kept is not None and not fresh and now - kept[1] < KEEP_SECONDS:
        return kept[0]
    used = disk_usage(root)
    with _lock:
        _kept[root] = (used, time.monotonic())
    return used


def _grown(root: str, growth: int) -> None:
    with _lock:
        kept = _kept.get(root)
        if kept is not None:
            _kept[root] = (max(0, kept[0] + growth), kept[1])


def size_text(count: int) -> str:
    """``count`` bytes as a person reads them: ``512 bytes``, ``900 KB``, ``12.5 MB``, ``1.3 GB``."""
    if count < 1024:
        return f"{count} bytes"
    for unit, scale in (("KB", 1024), ("MB", 1024**2), ("GB", 1024**3)):
        if count < scale * 1024 or unit == "GB":
            value = count / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    raise AssertionError("unreachable")


def refuse_when_full(ctx: ToolContext) -> None:
    """``ToolError`` where the workspace already holds more than its quota (measured now)."""
    if ctx.disk_quota is None:
        return
    root = os.path.realpath(ctx.root)
    used = measured(root, fresh=True)
    if used > ctx.disk_quota:
        raise ToolError(ctx.config.error("disk_quota_full", used=size_text(used), quota=size_text(ctx.disk_quota)))


def check_writes(writes: Sequence[PendingWrite], ctx: ToolContext) -> int:
    """The bytes ``writes`` add to the workspace; ``ToolError`` where that takes it past its quota."""
    growth = sum(len(write.data or b"") - len(write.original or b"") for write in writes)
    if ctx.disk_quota is None or growth <= 0:
        return growth
    root = os.path.realpath(ctx.root)
    used = measured(root)
    if used + growth > ctx.disk_quota:
        path = shown(writes[0].path) if len(writes) == 1 else f"{len(writes)} files"
        raise ToolError(
            ctx.config.error(
                "disk_quota", path=path, used=size_text(used), quota=size_text(ctx.disk_quota), size=size_text(growth)
            )
        )
    return growth


def commit_within_quota(writes: Sequence[PendingWrite], ctx: ToolContext) -> None:
    """``writes.commit`` where the workspace's quota has room for them, else ``ToolError`` and nothing written."""
    growth = check_writes(writes, ctx)
    commit(writes)
    if ctx.disk_quota is not None:
        _grown(os.path.realpath(ctx.root), growth)


@dataclass
class Watch:
    """Measures a workspace while a command runs: ``due`` says when, ``over`` whether it passed its quota."""

    root: str
    quota: int
    next_at: float = 0.0
    used: int = 0

    def due(self, now: float) -> float:
        return self.next_at - now

    def over(self) -> bool:
        started = time.monotonic()
        self.used = measured(self.root, fresh=True)
        took = time.monotonic() - started
        self.next_at = time.monotonic() + max(WATCH_EVERY, WATCH_FACTOR * took)
        return self.used > self.quota
