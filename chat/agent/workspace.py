"""What the loop needs from a session's workspace: the tool context, AGENTS.md, and file restores."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from django.conf import settings

from chat.tools import Sandbox, ToolContext, ToolError, resolve_in_workspace
from chat.tools.context import never_cancelled
from sessions_app import prompts
from sessions_app.hygiene import format_id, last_seen_sha
from sessions_app.hygiene.config import ContextConfig
from sessions_app.models import ChatSession, Result, Turn
from sessions_app.selectors.sessions import stored_full_text
from sessions_app.services.results import reply_table

INSTRUCTIONS_FILE = "AGENTS.md"


def workspace_root(session: ChatSession) -> Path:
    return Path(session.workspace.folder).resolve()


def workspace_context(session: ChatSession, *, config: ContextConfig | None = None) -> ToolContext:
    """The session's workspace as the tools see it, outside any reply (nothing seen yet)."""
    loop = prompts.loop_settings()
    return ToolContext(
        root=workspace_root(session),
        config=config or prompts.rules_config(),
        mode=session.mode,
        allow_commands=session.workspace.allow_commands,
        last_seen_sha=lambda abs_path: None,
        recall=lambda number: stored_full_text(session, number),
        run_timeout=int(loop["run_timeout"]),
        run_max_timeout=int(loop["run_max_timeout"]),
        edit_max_bytes=int(loop["edit_max_bytes"]),
        grep_timeout=float(loop["grep_timeout"]),
        grep_max_bytes=int(loop["grep_max_bytes"]),
        allow_network=session.workspace.allow_network,
        sandbox=sandbox_settings(),
    )


def sandbox_settings() -> Sandbox:
    """How ``run`` confines commands here: the settings' bubblewrap, ``loop.json``'s limits, and Cachet's
    data folder and database socket folder hidden should a workspace hold them."""
    loop = prompts.loop_settings()
    database = settings.DATABASES["default"]
    hosts = (database.get("HOST"), database.get("OPTIONS", {}).get("host"))
    hidden = [str(settings.CACHET_DATA), *(host for host in hosts if isinstance(host, str) and host.startswith("/"))]
    return Sandbox(
        bwrap=settings.CACHET_BWRAP,
        memory_bytes=int(loop["run_memory_bytes"]),
        max_processes=int(loop["run_max_processes"]),
        hidden=tuple(hidden),
    )


def tool_context(
    session: ChatSession,
    turn: Turn,
    *,
    config: ContextConfig | None = None,
    cancelled: Callable[[], bool] = never_cancelled,
) -> ToolContext:
    """The context the tools of one call run in; what the model has seen is read from the reply's results,
    and ``cancelled`` is the reply's Stop, which a long tool polls."""
    table = reply_table(turn)
    return replace(
        workspace_context(session, config=config),
        last_seen_sha=lambda abs_path: last_seen_sha(table, abs_path),
        cancelled=cancelled,
    )


def _inside(context: ToolContext, path: str) -> Path | None:
    """``path`` resolved by the tools' own confinement, or ``None`` where they would refuse it."""
    try:
        return resolve_in_workspace(path, context)
    except ToolError:
        return None


def read_instructions(session: ChatSession) -> str | None:
    """The workspace's ``AGENTS.md`` when it is a text file inside the workspace, else ``None``."""
    path = _inside(workspace_context(session), INSTRUCTIONS_FILE)
    if path is None or not path.is_file():
        return None
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace").strip() or None


@dataclass(frozen=True)
class RestoreReport:
    restored: list[str]
    conflicts: list[str]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def restore_files(session: ChatSession, edits: list[Result]) -> RestoreReport:
    """Undo the file changes of taken-back edits, newest first, where a file still has what the edit left."""
    context = workspace_context(session)
    restored: list[str] = []
    conflicts: list[str] = []
    for edit in edits:
        for change in reversed(edit.changed_files):
            path = _inside(context, change["abs_path"])
            if path is None:
                conflicts.append(f"{change['abs_path']}: outside the workspace now")
                continue
            left_sha = change["sha256"]
            if _sha256(path) != left_sha:
                conflicts.append(f"{path}: changed since {edit_id(edit)}; left as it is")
                continue
            if change["action"] == "create":
                path.unlink()
            elif change["previous_text"] is None:
                conflicts.append(f"{path}: the earlier content was not stored; left as it is")
                continue
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(change["previous_text"].encode("utf-8"))
            restored.append(str(path))
    return RestoreReport(restored=restored, conflicts=conflicts)


def edit_id(result: Result) -> str:
    return format_id(result.number, prompts.rules_config().id_digits)
