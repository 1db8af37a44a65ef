"""Notes (spec §10.3): what the system prompt leaves out, and what changed since, goes at the end of a
user message.

The system prompt holds nothing session-specific, so the first message of a generation states the
workspace, the model, the permission mode and the date; a later message states any of them (and the
workspace's instructions, and the session's own) that differ from what the request being built last stated.
The items of a note come in one fixed order: workspace, model, mode, date, the workspace's instructions, the
session's instructions, then the files the person attached since their last message (not context that holds
until it changes: what arrived, said once, on the message it arrived with).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .config import ContextConfig


@dataclass(frozen=True)
class StatedContext:
    """What the request being built last stated; ``None``: not stated (``instructions``: none shown, or
    shown removed). A generation starts from :data:`NOTHING_STATED`: its system prompt states none of it."""

    workspace: str | None = None
    model: str | None = None
    mode: str | None = None
    date: str | None = None
    instructions: str | None = None
    session_instructions: str | None = None
    tool_instructions: tuple[tuple[str, str], ...] = ()  # (server, text), by server: the MCP servers' stated


NOTHING_STATED = StatedContext()


@dataclass(frozen=True)
class UploadedFile:
    """A file the person attached: its path in the workspace, as given to the tools, and its size in bytes;
    ``shown``: an image that goes with the message; ``problem``: why an image cannot, to a model that reads
    images."""

    path: str
    size: int
    shown: bool = False
    problem: str = ""


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".heic", ".avif")


def is_image(path: str) -> bool:
    """Whether an attached file is an image, by its name."""
    return path.lower().endswith(IMAGE_SUFFIXES)


def size_text(size: int) -> str:
    """A file's size as a note says it: ``512 bytes``, ``34 KB``, ``1.2 MB``, ``15 MB`` (1 KB is 1024 bytes)."""
    if size < 1024:
        return f"{size} byte{'' if size == 1 else 's'}"
    if round(size / 1024) < 1024:
        return f"{round(size / 1024)} KB"
    for unit, scale in (("MB", 1024**2), ("GB", 1024**3)):
        value = size / scale
        if value < 10:
            return f"{value:.1f} {unit}"
        if round(value) < 1024 or unit == "GB":
            return f"{round(value):,} {unit}"
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class ComposedMessage:
    """A user message with its note. Each ``*_noted`` is what the note states, ``None`` where it states
    nothing of it; ``instructions_noted`` (``session_instructions_noted``) ``""`` says the workspace's (the
    session's) instructions were removed."""

    text: str
    workspace_noted: str | None = None
    model_noted: str | None = None
    mode_noted: str | None = None
    date_noted: str | None = None
    instructions_noted: str | None = None
    session_instructions_noted: str | None = None
    tool_instructions_noted: dict[str, str] | None = None


def compose_message(
    words: str,
    *,
    today: str,
    workspace: str,
    model: str,
    mode: str,
    mode_text: str,
    instructions: str | None,
    stated: StatedContext,
    config: ContextConfig,
    session_instructions: str | None = None,
    tool_instructions: Mapping[str, str] | None = None,
    uploads: Sequence[UploadedFile] = (),
) -> ComposedMessage:
    """The person's ``words`` with a note of what differs from ``stated``: the workspace's and the model's
    names, the mode (``mode_text``, its file, as the body), the date, the workspace's instructions, the
    session's, and each MCP server's (``tool_instructions``, by server: those of the servers whose tools the
    session lists); and the ``uploads`` that arrived with it, always.

    An empty workspace or model name is not stated. Instructions are compared and shown stripped; blank
    ones count as none.
    """
    note = config.note
    items: list[str] = []
    workspace_noted = model_noted = mode_noted = date_noted = instructions_noted = session_noted = None
    if workspace and stated.workspace != workspace:
        workspace_noted = workspace
        items.append(note["workspace"].format(workspace=workspace))
    if model and stated.model != model:
        model_noted = model
        items.append(note["model"].format(model=model))
    if stated.mode != mode:
        mode_noted = mode
        template = note["mode_start"] if stated.mode is None else note["mode"]
        items.append(template.format(mode=mode, text=mode_text.strip()))
    if stated.date != today:
        date_noted = today
        items.append(note["date"].format(date=today))
    current = _shown_instructions(instructions)
    if current != _shown_instructions(stated.instructions):
        if current is None:
            instructions_noted = ""
            items.append(note["instructions_removed"])
        else:
            instructions_noted = current
            items.append(note["instructions"].format(text=current))
    own = _shown_instructions(session_instructions)
    if own != _shown_instructions(stated.session_instructions):
        if own is None:
            session_noted = ""
            items.append(note["session_instructions_removed"])
        else:
            session_noted = own
            items.append(note["session_instructions"].format(text=own))
    tools_noted: dict[str, str] = {}
    before = dict(stated.tool_instructions)
    now = {server: text.strip() for server, text in (tool_instructions or {}).items() if text.strip()}
    for server in sorted(before.keys() | now.keys()):
        if now.get(server) == before.get(server):
            continue
        tools_noted[server] = now.get(server, "")
        if server in now:
            items.append(note["tool_instructions"].format(server=server, text=now[server]))
        else:
            items.append(note["tool_instructions_removed"].format(server=server))
    if uploads:
        files = note["uploaded_separator"].join(_uploaded_text(upload, note) for upload in uploads)
        items.append(note["uploaded"].format(files=files))
    text = words
    if items:
        text = note["format"].format(message=words, body=note["separator"].join(items))
    return ComposedMessage(
        text,
        workspace_noted,
        model_noted,
        mode_noted,
        date_noted,
        instructions_noted,
        session_noted,
        tools_noted or None,
    )


def restated_message(
    words: str,
    *,
    workspace: str | None,
    model: str | None,
    mode: str | None,
    mode_text: str,
    mode_first: bool,
    date: str | None,
    config: ContextConfig,
    uploads: Sequence[UploadedFile] = (),
) -> ComposedMessage:
    """``words`` with a note that states exactly the items given (``None``: not stated; ``mode_first``: the
    mode's first mention in its generation) and no instructions: a message as a copy of its session states it,
    in a workspace of the copy's own and without the owner's instructions."""
    return compose_message(
        words,
        today=date or "",
        workspace=workspace or "",
        model=model or "",
        mode=mode or "",
        mode_text=mode_text,
        instructions=None,
        stated=StatedContext(mode=(None if mode_first else "") if mode else "", date=None if date else ""),
        config=config,
        uploads=uploads,
    )


def _uploaded_text(upload: UploadedFile, note: Mapping[str, str]) -> str:
    size = size_text(upload.size)
    if upload.shown:
        return note["uploaded_image_shown"].format(path=upload.path, size=size)
    if upload.problem:
        return note["uploaded_image_unshown"].format(path=upload.path, size=size, problem=upload.problem)
    key = "uploaded_image" if is_image(upload.path) else "uploaded_file"
    return note[key].format(path=upload.path, size=size)


def stated_after(stated: StatedContext, composed: ComposedMessage) -> StatedContext:
    """What the request states once ``composed`` is part of it."""
    instructions = stated.instructions
    if composed.instructions_noted is not None:
        instructions = composed.instructions_noted or None
    session_instructions = stated.session_instructions
    if composed.session_instructions_noted is not None:
        session_instructions = composed.session_instructions_noted or None
    tools = dict(stated.tool_instructions) | (composed.tool_instructions_noted or {})
    return StatedContext(
        workspace=_newer(composed.workspace_noted, stated.workspace),
        model=_newer(composed.model_noted, stated.model),
        mode=_newer(composed.mode_noted, stated.mode),
        date=_newer(composed.date_noted, stated.date),
        instructions=instructions,
        session_instructions=session_instructions,
        tool_instructions=tuple(sorted((server, text) for server, text in tools.items() if text)),
    )


def _newer(noted: str | None, earlier: str | None) -> str | None:
    return noted if noted is not None else earlier


def _shown_instructions(instructions: str | None) -> str | None:
    if instructions is None:
        return None
    return instructions.strip() or None
