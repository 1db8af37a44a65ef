"""What the loop needs from a session's workspace: the tool context, AGENTS.md, and file restores."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from chat.agent.mcp import tool_schema, tools_of
from chat.tools import Sandbox, ToolContext, ToolError, listed_names, tool_list
from chat.tools.context import Documents, never_cancelled
from chat.tools.paths import Resolved, Root, is_inside, open_workspace
from chat.tools.quota import commit_within_quota
from chat.tools.sandbox import Identity, closed_on_the_way, command_identity, give_to_commands, open_to_commands
from chat.tools.writes import PendingWrite
from sessions_app import prompts
from sessions_app.hygiene import PriorResult, format_id, last_seen_sha
from sessions_app.hygiene.config import ContextConfig
from sessions_app.models import ChatSession, McpServer, Result, Workspace
from sessions_app.selectors.sessions import current_generation, stored_full_text, workspace_roots_for

INSTRUCTIONS_FILE = "AGENTS.md"


def workspace_root(session: ChatSession) -> Path:
    """The workspace's folder as stored (resolved when it was set); never resolved again, so a folder swapped
    for a symbolic link is refused when an action opens it (``chat.tools.paths.open_workspace``), not followed."""
    return Path(session.workspace.folder)


def workspace_context(session: ChatSession, *, config: ContextConfig | None = None) -> ToolContext:
    """The session's workspace as the tools see it, outside any reply (nothing seen yet)."""
    return replace(
        folder_context(session.workspace, config=config),
        root=workspace_root(session),
        mode=session.mode,
        tools=listed_names(json.loads(current_generation(session).tools_json)),
        recall=lambda number: stored_full_text(session, number),
    )


def folder_context(workspace: Workspace, *, config: ContextConfig | None = None) -> ToolContext:
    """A workspace as the tools see it outside any session: no tools listed, nothing to recall (an MCP server's
    command asked for its tools runs in it)."""
    loop = prompts.loop_settings()
    return ToolContext(
        root=Path(workspace.folder),
        config=config or prompts.rules_config(),
        mode="edit",
        tools=(),
        allow_commands=workspace.allow_commands,
        last_seen_sha=lambda abs_path: None,
        recall=lambda number: None,
        run_timeout=loop.run_timeout,
        run_max_timeout=loop.run_max_timeout,
        edit_max_bytes=loop.edit_max_bytes,
        grep_timeout=loop.grep_timeout,
        grep_max_bytes=loop.grep_max_bytes,
        allow_network=workspace.allow_network,
        sandbox=sandbox_settings(),
        disk_quota=workspace.disk_quota_bytes,
        roots=workspace_roots_for(workspace=workspace),
        documents=document_settings(),
    )


def document_settings() -> Documents:
    """How documents are read as text here: ``loop.json``'s limits, and their text kept in Cachet's data folder
    (by the SHA-256 of the file's bytes, so a file is converted once whoever reads it)."""
    loop = prompts.loop_settings()
    return Documents(
        cache=Path(settings.CACHET_DATA) / "documents",
        max_bytes=loop.document_max_bytes,
        max_pages=loop.document_max_pages,
        max_chars=loop.document_max_chars,
        memory_bytes=loop.document_memory_bytes,
        timeout=loop.document_timeout,
    )


def sandbox_settings() -> Sandbox:
    """How ``run`` confines commands here: the settings' bubblewrap and sandbox user, ``loop.json``'s limits,
    and Cachet's data folder and database socket folder hidden should a workspace hold them."""
    loop = prompts.loop_settings()
    host = connection.get_connection_params().get("host")
    hidden = [str(settings.CACHET_DATA), *([host] if isinstance(host, str) and host.startswith("/") else [])]
    return Sandbox(
        bwrap=settings.CACHET_BWRAP,
        memory_bytes=loop.run_memory_bytes,
        max_processes=loop.run_max_processes,
        file_max_bytes=loop.run_file_max_bytes,
        output_max_bytes=loop.run_output_max_bytes,
        hidden=tuple(hidden),
        user=settings.CACHET_SANDBOX_USER,
    )


def commands_folder_line(workspace: Workspace) -> str | None:
    """Where Cachet runs as root, at start: a workspace folder Cachet keeps (under its data folder) is given to
    the user commands run as, and said so once; any other folder of a workspace that allows commands that user
    may not write is opened to it with ACLs (ownership unchanged), and said so; a warning where that user cannot
    reach it or the file system keeps no ACLs. The folder is opened as an action opens it: under the allowed
    roots, and never through a symbolic link (refused, and said so). ``None`` where there is nothing to say."""
    sandbox, config = sandbox_settings(), prompts.rules_config()
    folder = os.path.normpath(os.path.abspath(workspace.folder))
    try:
        identity = command_identity(sandbox, config)
        if not identity.dropped:
            return None
        try:
            fd = open_workspace(folder, roots=workspace_roots_for(workspace=workspace), config=config)
        except FileNotFoundError:
            return None
        try:
            return _opened_to_commands(workspace, fd, folder, identity, sandbox, config)
        finally:
            os.close(fd)
    except ToolError as error:
        return f"Workspace {workspace.name}: {error.message}"
    except OSError as error:
        return f"Workspace {workspace.name}: {folder}: {error.strerror}"


def _opened_to_commands(
    workspace: Workspace, fd: int, folder: str, identity: Identity, sandbox: Sandbox, config: ContextConfig
) -> str | None:
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode):
        return None
    kept = is_inside(folder, str((settings.CACHET_DATA / "workspaces").resolve()))
    if kept and info.st_uid != identity.uid:
        give_to_commands(folder, sandbox, config)
        return f"Workspace {workspace.name}: gave {folder} to {identity.user}, the user its commands run as."
    if kept or not workspace.allow_commands:
        return None
    closed = closed_on_the_way(os.path.dirname(folder), identity)
    if closed is None:
        if open_to_commands(fd, folder, identity, sandbox, config):
            return (
                f"Workspace {workspace.name}: commands run as {identity.user}; gave it access to {folder} with "
                "ACLs (ownership unchanged)."
            )
        closed = closed_on_the_way(folder, identity)
    if closed is not None:
        return f"Workspace {workspace.name}: commands run as {identity.user}, who may not enter {closed}."
    return None


def tool_context(
    session: ChatSession,
    *,
    table: Sequence[PriorResult],
    cancelled: Callable[[], bool] = never_cancelled,
    config: ContextConfig | None = None,
) -> ToolContext:
    """The context the tools of one call run in; ``table`` is what the model has seen in this reply."""
    return replace(
        workspace_context(session, config=config),
        last_seen_sha=lambda abs_path: last_seen_sha(table, abs_path),
        cancelled=cancelled,
    )


def read_instructions(session: ChatSession) -> str | None:
    """The workspace's ``AGENTS.md`` when it is a text file inside the workspace, else ``None``."""
    try:
        with Root(workspace_context(session)) as root:
            handle = root.open_file(root.resolve(INSTRUCTIONS_FILE))
    except (ToolError, OSError):
        return None
    with handle:
        data = handle.read()
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace").strip() or None


@dataclass(frozen=True)
class RestoreReport:
    restored: list[str]
    conflicts: list[str]


def _current(root: Root, target: Resolved) -> tuple[bytes | None, int | None]:
    """The bytes and mode of the regular file at ``target``, or ``(None, None)`` where there is none."""
    if target.kind != "file":
        return None, None
    try:
        handle = root.open_file(target)
    except ToolError:
        return None, None
    with handle:
        return handle.read(), os.fstat(handle.fileno()).st_mode & 0o7777


def restore_files(session: ChatSession, edits: list[Result]) -> RestoreReport:
    """Undo the file changes of taken-back edits, newest first, where a file still has what the edit left."""
    restored: list[str] = []
    conflicts: list[str] = []
    ctx = workspace_context(session)
    try:
        root = Root(ctx)
    except (OSError, ToolError) as error:
        why = error.message if isinstance(error, ToolError) else error.strerror
        paths = [change["abs_path"] for edit in edits for change in edit.changed_files]
        return RestoreReport(restored=[], conflicts=[f"{path}: {why}; left as it is" for path in paths])
    with root:
        for edit in edits:
            for change in reversed(edit.changed_files):
                try:
                    target = root.resolve(change["abs_path"])
                except ToolError:
                    conflicts.append(f"{change['abs_path']}: outside the workspace now")
                    continue
                path = target.path
                data, mode = _current(root, target)
                if (hashlib.sha256(data).hexdigest() if data is not None else "") != change["sha256"]:
                    conflicts.append(f"{path}: changed since {edit_id(edit)}; left as it is")
                    continue
                if change["action"] == "create":
                    write = PendingWrite(target, None, data, mode)
                elif change["previous_text"] is None:
                    conflicts.append(f"{path}: the earlier content was not stored; left as it is")
                    continue
                else:
                    write = PendingWrite(target, change["previous_text"].encode("utf-8"), data, mode)
                try:
                    commit_within_quota([write], ctx, root)
                except ToolError as error:  # a git folder, or past the disk quota
                    conflicts.append(f"{path}: {error.message.removeprefix('Refused: ')}; left as it is")
                    continue
                restored.append(path)
    return RestoreReport(restored=restored, conflicts=conflicts)


def edit_id(result: Result) -> str:
    return format_id(result.number, prompts.rules_config().id_digits)


def session_tools(workspace: Workspace, *, config: ContextConfig | None = None) -> list[dict[str, Any]]:
    """The tool list a new session in ``workspace`` fixes (spec §10.4): Cachet's, then each enabled MCP server's
    (by name), its tools as the server last listed them, each named ``server__tool``."""
    tools = tool_list(allow_commands=workspace.allow_commands, config=config)
    for server in McpServer.objects.filter(workspace=workspace, enabled=True).order_by("name"):
        tools += [schema for tool in tools_of(server.tools_json) if (schema := tool_schema(server.name, tool))]
    return tools
