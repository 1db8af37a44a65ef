"""What every file change shares: loading the file as it is now, the edit guard, and the answer."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from sessions_app.hygiene.lines import count_lines
from sessions_app.hygiene.outcomes import FileChange

from .context import ToolContext
from .errors import ToolError, shown
from .files import decode_exact, encode_exact, is_binary, unified_diff
from .paths import Resolved, Root
from .writes import PendingWrite


@dataclass(frozen=True)
class Current:
    """An existing file as it is now: where it is, its bytes, its text (bytes kept exactly), hash and mode."""

    target: Resolved
    data: bytes
    text: str
    sha256: str
    mode: int

    @property
    def path(self) -> str:
        """The file's absolute path, as the tools show it."""
        return self.target.path

    @property
    def stored_text(self) -> str | None:
        """The content to store for an undo: the exact text when it is valid UTF-8, else ``None``."""
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            return None


def load_existing(root: Root, target: Resolved, ctx: ToolContext) -> Current:
    """The existing text file at ``target``, refused when binary, too large, or changed since the model
    last saw it in this reply."""
    config = ctx.config
    path = target.path
    with root.open_file(target) as handle:
        status = os.fstat(handle.fileno())
        if status.st_size > ctx.edit_max_bytes:
            raise too_large(path, status.st_size, ctx)
        data = handle.read(ctx.edit_max_bytes + 1)
    if len(data) > ctx.edit_max_bytes:
        raise too_large(path, len(data), ctx)
    if is_binary(data):
        raise ToolError(config.error("binary", path=shown(path)))
    sha = hashlib.sha256(data).hexdigest()
    check_seen(path, sha, ctx)
    return Current(target, data, decode_exact(data), sha, status.st_mode & 0o7777)


def check_seen(path: str, sha_now: str, ctx: ToolContext) -> None:
    """The edit guard: refuse when the model last saw other content of ``path`` in this reply."""
    seen = ctx.last_seen_sha(path)
    if seen is None or seen == sha_now:
        return
    digits = ctx.config.sha_digits
    if seen == "":
        raise ToolError(ctx.config.error("changed_since_deleted", path=shown(path), now=sha_now[:digits]))
    raise ToolError(ctx.config.error("changed_since_seen", path=shown(path), seen=seen[:digits], now=sha_now[:digits]))


def too_large(path: str, size: int, ctx: ToolContext) -> ToolError:
    """The refusal of a file over the size an edit can take."""
    return ToolError(ctx.config.error("too_large", path=shown(path), size=size, limit=ctx.edit_max_bytes))


def new_data(path: str, text: str, ctx: ToolContext) -> bytes:
    """The bytes of new content for ``path``, refused over the size an edit can take."""
    data = encode_exact(text)
    if len(data) > ctx.edit_max_bytes:
        raise too_large(path, len(data), ctx)
    return data


def update(given: str, current: Current, text: str, ctx: ToolContext) -> tuple[FileChange, PendingWrite]:
    """The change of an existing file to ``text``, and the write that makes it."""
    data = new_data(current.path, text, ctx)
    change = FileChange(
        path=given,
        abs_path=current.path,
        action="update",
        sha256=hashlib.sha256(data).hexdigest(),
        diff=unified_diff(current.text, text),
        previous_sha256=current.sha256,
        previous_text=current.stored_text,
    )
    return change, PendingWrite(current.target, data, current.data, current.mode)


def create(given: str, target: Resolved, text: str, ctx: ToolContext) -> tuple[FileChange, PendingWrite]:
    """The creation of a new file holding ``text`` at ``target``, and the write that makes it."""
    data = new_data(target.path, text, ctx)
    change = FileChange(
        path=given,
        abs_path=target.path,
        action="create",
        sha256=hashlib.sha256(data).hexdigest(),
        lines=count_lines(text),
    )
    return change, PendingWrite(target, data, None)


def delete(given: str, current: Current) -> tuple[FileChange, PendingWrite]:
    """The deletion of an existing file, and the write that makes it."""
    change = FileChange(
        path=given,
        abs_path=current.path,
        action="delete",
        sha256="",
        previous_sha256=current.sha256,
        previous_text=current.stored_text,
    )
    return change, PendingWrite(current.target, None, current.data, current.mode)
