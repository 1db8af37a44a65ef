"""Files a person attaches, written into the session's workspace through the same confined paths the tools use:
a name made safe, never outside the workspace (symlinks included), within its disk quota, and never over an
existing file unless the person said to replace it."""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import unicodedata
from dataclasses import dataclass

from chat.agent.workspace import workspace_context
from chat.tools.errors import ToolError
from chat.tools.paths import Resolved, Root
from chat.tools.quota import commit_within_quota
from chat.tools.writes import PendingWrite, check_parent
from sessions_app.models import ChatSession

NAME_CHARS = 120
FOLDER_CHARS = 400
_UNSAFE = re.compile(r'[\x00-\x1f\x7f/\\:*?"<>|]+')
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{n}" for n in range(1, 10)), *(f"lpt{n}" for n in range(1, 10))}


class UploadRefused(Exception):
    """An attachment not written, with the one line that says why."""


class UploadExists(UploadRefused):
    """The name is taken: the person chooses to replace the file or to keep both (``free`` is the other name)."""

    def __init__(self, path: str, free: str) -> None:
        super().__init__(f"{path} is already in the workspace.")
        self.path = path
        self.free = free


@dataclass(frozen=True)
class Written:
    path: str
    size: int
    sha256: str
    replaced: bool


def safe_name(name: str) -> str:
    """``name`` as a file of the workspace is called: its last part only, Unicode kept (NFC), control characters,
    separators and characters other systems refuse made ``_``, no leading dot or dash, no trailing dot or space,
    at most 120 characters (the extension kept); ``file`` where nothing is left."""
    name = unicodedata.normalize("NFC", name.replace("\\", "/").rsplit("/", 1)[-1])
    name = _UNSAFE.sub("_", name).strip().lstrip(".-").rstrip(". ")
    stem, extension = posixpath.splitext(name)
    if stem.lower() in _RESERVED:
        stem = f"{stem}_"
    if len(stem) + len(extension) > NAME_CHARS:
        extension = extension[:20]
        stem = stem[: NAME_CHARS - len(extension)]
    return (stem + extension) or "file"


def safe_folder(folder: str) -> str:
    """A folder typed for attachments, relative to the workspace: each part made safe, ``.`` and ``..`` refused."""
    parts = [part for part in folder.replace("\\", "/").split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UploadRefused("A folder for attachments stays inside the workspace: no '..'.")
    joined = "/".join(safe_name(part) for part in parts)
    if len(joined) > FOLDER_CHARS:
        raise UploadRefused(f"A folder for attachments is at most {FOLDER_CHARS} characters.")
    return joined


def _numbered(path: str, number: int) -> str:
    stem, extension = posixpath.splitext(path)
    return f"{stem} ({number}){extension}"


def upload_write(
    session: ChatSession, *, name: str, data: bytes, folder: str = "", replace: bool = False, keep_both: bool = False
) -> Written:
    """Write ``data`` as ``name`` (made safe) into ``folder`` of the session's workspace. A name already taken is
    refused with :class:`UploadExists` unless ``replace`` (the file is replaced) or ``keep_both`` (the first free
    ``name (2).ext``)."""
    ctx = workspace_context(session)
    path = posixpath.join(safe_folder(folder), safe_name(name)) if folder.strip() else safe_name(name)
    try:
        with Root(ctx) as root:
            target = _unlinked(root, path)
            if target.kind != "missing" and keep_both:
                path = _free(root, path)
                target = _unlinked(root, path)
            if target.kind in ("folder", "other"):
                raise UploadRefused(f"{path} is not a file in the workspace; give the file another name.")
            original: bytes | None = None
            if target.kind != "missing":
                if not replace:
                    raise UploadExists(path, _free(root, path))
                with root.open_file(target) as handle:
                    original = handle.read()
            check_parent(target, ctx)
            commit_within_quota([PendingWrite(target, data, original)], ctx, root)
    except ToolError as error:
        raise UploadRefused(error.message) from None
    except OSError as error:
        raise UploadRefused(f"{path} could not be written: {os.strerror(error.errno or 0)}.") from None
    return Written(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest(), replaced=original is not None)


def _unlinked(root: Root, path: str) -> Resolved:
    """Where ``path`` (made safe, relative) leads, refused where a symbolic link stands on the way or is the file
    itself: an attachment is written at the name it shows, never through a link to somewhere else."""
    target = root.resolve(path)
    if target.path != os.path.join(root.path, path):
        root.release(target)
        raise UploadRefused(f"{path} is a symbolic link or lies behind one; attachments are never written through one.")
    return target


def _free(root: Root, path: str) -> str:
    """The first ``name (N).ext`` beside ``path`` that nothing holds."""
    for number in range(2, 1000):
        candidate = _numbered(path, number)
        if root.kind_of(candidate) == "missing":
            return candidate
    raise UploadRefused(f"{path} and 998 files named like it are already in the workspace.")


def upload_unwrite(session: ChatSession, *, path: str, sha256: str) -> bool:
    """Remove the attached file at ``path`` where it still holds what was attached (``sha256``); whether it did."""
    ctx = workspace_context(session)
    try:
        with Root(ctx) as root:
            target = _unlinked(root, path)
            if target.kind != "file":
                return False
            with root.open_file(target) as handle:
                data = handle.read()
            if hashlib.sha256(data).hexdigest() != sha256:
                return False
            commit_within_quota([PendingWrite(target, None, data)], ctx, root)
    except (ToolError, UploadRefused, OSError):
        return False
    return True
